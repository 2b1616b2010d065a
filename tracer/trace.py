"""The normalized event table: one row per complete trace event, all ranks together.

The table is the source of truth (as in HolisticTraceAnalysis); the dependency graph's tasks
hold integer row ids into it. Columns (all times integer nanoseconds on the rank's own clock):

============== ======= =========================================================
column         dtype   meaning
============== ======= =========================================================
rank           int32   rank of the file the event came from
ts_ns          int64   start, absolute (``baseTimeNanoseconds`` applied)
dur_ns         int64   duration (0 for 2021 kernels shorter than 1 us)
kind           int8    :class:`~whatif.tracer.kinds.EventKind`
name           category event name
pid, tid       int64   process/thread (GPU events: device/stream as in the file)
device         int32   GPU device index, -1 on CPU events
stream         int64   GPU stream id, -1 on CPU events
correlation    int64   CUPTI/roctracer correlation id, -1 when absent
external_id    int64   ``External id`` linking ops, runtime calls and GPU work, -1 when absent
============== ======= =========================================================

Each event's ``args`` dict (shapes, collective metadata), or None, is held beside the table in
``Trace.args`` (:class:`~whatif.tracer.args.EventArgs`, same row order) and read through
:meth:`Trace.arg` (one typed argument) or :meth:`Trace.raw_args` (the dicts themselves).

A loaded trace is kept in the columnar trace cache (:mod:`whatif.tracer.cache`): later loads of
the same files read it back instead of parsing them.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from whatif.core.errors import TraceError
from whatif.core.heap import release_freed_memory
from whatif.core.kernels import CONV_FORWARD_OPS, conv_outputs_from_neighbours, op_key
from whatif.hardware.devices import device_of_properties, get_device

from . import cache
from .args import Arg, EventArgs, arg_column
from .kinds import GPU_ACTIVITY_KINDS, EventKind, codes
from .kineto import gc_paused, step_number
from .memory import memory_frame
from .readers import FileTrace, Flow, accepted, is_trace_file, read_file, reader_for, stated_rank

INPUT_LOG = logging.getLogger("whatif.input")
"""Where a loaded trace's data problems that do not stop the analysis are reported (the CLI prints
them as ``whatif: warning: ...`` lines on stderr)."""

LAUNCH_NAMES = ("LaunchKernel", "GraphLaunch", "LaunchCooperativeKernel", "ModuleLaunchKernel")


def _categorical(names: pd.Series) -> pd.Series:
    """A name column as categorical (the event table's is; a graph's tasks' may not be once a
    transform has renamed some)."""
    return names if isinstance(names.dtype, pd.CategoricalDtype) else names.astype("category")


def per_name(names: pd.Series, predicate: Callable[[str], bool]) -> np.ndarray:
    """``predicate`` of every event's name, evaluated once per distinct name.

    >>> per_name(pd.Series(["a", "bb", "a"], dtype="category"), lambda n: len(n) > 1).tolist()
    [False, True, False]
    >>> per_name(pd.Series(["a", "bb"]), lambda n: n == "a").tolist()
    [True, False]
    """
    cat = _categorical(names).cat
    per_category = np.fromiter((predicate(str(n)) for n in cat.categories), dtype=bool, count=len(cat.categories))
    return per_category[cat.codes.to_numpy()]


def name_texts(names: pd.Series, rows: np.ndarray | None = None) -> np.ndarray:
    """The names of every row (or of ``rows``) of a categorical name column (the event table's,
    a graph's tasks'), as an object array of the column's own category strings: one string per
    distinct name, shared, never a new string per row (``astype(str)`` makes one per row).

    >>> name_texts(pd.Series(["a", "bb", "a"], dtype="category"), np.array([2, 1])).tolist()
    ['a', 'bb']
    """
    cat = _categorical(names).cat
    texts = np.asarray([str(c) for c in cat.categories], dtype=object)
    codes = cat.codes.to_numpy()
    return texts[codes if rows is None else codes[rows]]


@dataclass
class RankInfo:
    """Per-rank facts: where they came from, what ran it. A rank recorded as several processes
    (``whatif record`` following children: a front-end and its engine core) has one file per
    process: ``files`` lists them, ``path`` is the first; ``metadata`` is the first file's, the
    names and counts are those of all of them."""

    rank: int
    path: Path
    world_size: int | None
    device_names: list[str]
    metadata: dict[str, Any]
    thread_names: dict[tuple[int, int], str]
    process_names: dict[int, str]
    category_counts: dict[str, int]
    skipped: dict[str, int]
    files: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.files:
            self.files = [self.path]

    @property
    def gpu_name(self) -> str | None:
        """Name of the recorded GPU (first listed device with a name)."""
        return next((n for n in self.device_names if n), None)

    @property
    def recorded_device_names(self) -> list[str]:
        """Each listed device's name as the trace records it ("" for an unnamed one, which
        ``device_names`` may name from its properties)."""
        return [str(p.get("name", "")) for p in _device_properties(self.metadata)]


@dataclass
class Trace:
    """Events of one run (one or several ranks) with per-rank information."""

    events: pd.DataFrame
    ranks: list[RankInfo]
    flows: list[tuple[int, Flow]] = field(default_factory=list)  # (rank, flow end)
    memory: pd.DataFrame = field(default_factory=lambda: memory_frame([], []))
    """Allocator records (``profile_memory``) of every rank: :data:`~whatif.tracer.memory.MEMORY_COLUMNS`."""
    args: EventArgs = field(default_factory=lambda: EventArgs.of([]), repr=False, compare=False)
    """Each event's ``args`` (same rows as ``events``); left out, no event has any."""
    _arg_columns: dict[Arg, np.ndarray] = field(default_factory=dict, repr=False, compare=False)
    _op_index: pd.Series | None = field(default=None, repr=False, compare=False)
    _conv_outputs: dict[int, tuple[int, ...]] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.args) != len(self.events):
            if len(self.args):
                raise ValueError(f"{len(self.args)} args for {len(self.events)} events")
            self.args = EventArgs.of([None] * len(self.events))

    def arg(self, arg: Arg) -> np.ndarray:
        """The typed column of one event argument (declared in :mod:`whatif.tracer.args`), one
        value per event, read once per trace."""
        column = self._arg_columns.get(arg)
        if column is None:
            column = self._arg_columns[arg] = arg_column(self.args, arg)
        return column

    def conv_outputs(self) -> dict[int, tuple[int, ...]]:
        """Per event row of a forward convolution op whose stride and padding are not recorded:
        its output's spatial size, read from the op that takes it
        (:func:`~whatif.core.kernels.conv_outputs_from_neighbours`); computed once per trace."""
        if self._conv_outputs is None:
            ev = self.events
            conv = per_name(ev["name"], lambda n: op_key(n) in CONV_FORWARD_OPS)
            ops = np.flatnonzero(ev["kind"].to_numpy() == int(EventKind.CPU_OP))
            found: dict[int, tuple[int, ...]] = {}
            if conv[ops].any():
                thread = ev[["rank", "pid", "tid"]].iloc[ops].groupby(["rank", "pid", "tid"], sort=False).ngroup()
                order = np.lexsort((ev["ts_ns"].to_numpy()[ops], thread.to_numpy()))
                rows = ops[order]
                start = ev["ts_ns"].to_numpy()[rows]
                hints = conv_outputs_from_neighbours(
                    name_texts(ev["name"], rows), self.arg(Arg.INPUT_DIMS)[rows], self.arg(Arg.CONCRETE_INPUTS)[rows],
                    thread.to_numpy()[order], start, start + ev["dur_ns"].to_numpy()[rows])
                found = {int(rows[i]): v for i, v in hints.items()}
            self._conv_outputs = found
        return self._conv_outputs

    def raw_args(self, rows: np.ndarray | None = None) -> np.ndarray:
        """The ``args`` dict (or None) of every event, or of ``rows``, as an object array. For
        the arguments :mod:`whatif.tracer.args` declares, read :meth:`arg` instead."""
        return self.args.values(rows)

    @property
    def gpu_name(self) -> str | None:
        """Name of the recorded GPU: the first rank's that names one."""
        return next((r.gpu_name for r in self.ranks if r.gpu_name), None)

    @property
    def source(self) -> str:
        paths = sorted({str(f) for r in self.ranks for f in r.files})
        return paths[0] if len(paths) == 1 else f"{Path(paths[0]).parent} ({len(paths)} files)"

    def rank_info(self, rank: int) -> RankInfo:
        return next(r for r in self.ranks if r.rank == rank)

    def count(self, kind: EventKind) -> int:
        return int((self.events["kind"].to_numpy() == kind).sum())

    def launching_op_rows(self, rows: np.ndarray) -> np.ndarray:
        """Per event row (GPU work, or a launch call): the row of the CPU op that launched it, the
        innermost op of its rank with its ``External id`` (ops are sorted by start, longer
        first, so the last one is innermost); NaN when there is none or ``rows`` holds -1."""
        rows = np.asarray(rows, dtype=np.int64)
        index = self._op_index
        ev = self.events
        if index is None:
            ops = ev[(ev["kind"].to_numpy() == int(EventKind.CPU_OP)) & (ev["external_id"].to_numpy() >= 0)]
            series = pd.Series(ops.index.to_numpy(), index=pd.MultiIndex.from_arrays(
                [ops["rank"].to_numpy(), ops["external_id"].to_numpy()]))
            index = self._op_index = series[~series.index.duplicated(keep="last")]
        valid = rows >= 0
        safe = np.maximum(rows, 0)
        keys = pd.MultiIndex.from_arrays([np.where(valid, ev["rank"].to_numpy()[safe], -1),
                                          np.where(valid, ev["external_id"].to_numpy()[safe], -1)])
        found = index.reindex(keys).to_numpy().astype(float)
        found[~valid | (ev["external_id"].to_numpy()[safe] < 0)] = np.nan
        return found


def find_trace_files(path: Path) -> list[Path]:
    """Trace files in a folder (non-recursive, HTA's per-rank layout), sorted."""
    files = [p for p in sorted(path.iterdir()) if is_trace_file(p)]
    if not files:
        raise TraceError(path, f"folder holds no trace files ({accepted()})")
    return files


def _device_properties(metadata: dict[str, Any]) -> list[dict[str, Any]]:
    props = metadata.get("deviceProperties") or metadata.get("computeProperties") or []
    return [p for p in props if isinstance(p, dict)] if isinstance(props, list) else []


def _device_names(metadata: dict[str, Any]) -> list[str]:
    """Each listed device's name; an unnamed one's the catalog GPU its properties describe
    (:func:`~whatif.hardware.devices.device_of_properties`), or empty."""
    out = []
    for p in _device_properties(metadata):
        found = None if str(p.get("name", "")) else device_of_properties(p)
        out.append(found.name if found is not None else str(p.get("name", "")))
    return out


def check_usable(ft: FileTrace) -> None:
    """Refuse, with the reason, a file whose activity cannot be analyzed."""
    cats = {k.lower(): v for k, v in ft.category_counts.items()}
    if any(c.startswith("mtia") for c in cats):
        raise TraceError(ft.path, "not a GPU trace: MTIA accelerator events (mtia_runtime/mtia_ccp_events) "
                                  "are not supported")
    kinds = ft.columns.kind
    if kinds.size == 0:
        bad = ft.skipped.get("malformed", 0)
        raise TraceError(ft.path, f"none of its complete (ph 'X') events has a numeric ts and dur ({bad:,} events "
                                  f"without)" if bad else "trace has no complete (ph 'X') events")
    gpu = np.isin(kinds, codes(GPU_ACTIVITY_KINDS)).sum()
    if gpu:
        return
    launching = [i for i, n in enumerate(ft.columns.names)
                 if any(s in n for s in LAUNCH_NAMES) or "Memcpy" in n or "Memset" in n]
    host = np.isin(kinds, [EventKind.RUNTIME, EventKind.DRIVER])
    calls = int((host & np.isin(ft.columns.name_code, launching)).sum()) if launching else 0
    if calls:
        why = "the CUPTI range profiler was on" if cats.get("cuda_profiler_range") else \
            "GPU activity tracing was off or its buffers were lost"
        raise TraceError(ft.path, f"no GPU activity recorded: {calls} kernel launches/copies but no "
                                  f"kernel, memcpy or memset events ({why})")


@dataclass(frozen=True)
class FileFacts:
    """What assigning ranks reads of a file: its path, the rank and world size it states, and
    the processes whose CPU events it holds. Small, so that a rank-parallel load
    (:mod:`whatif.scale`) assigns the ranks of files read in several processes at once."""

    path: Path
    rank_hint: int | None
    world_size: int | None
    cpu_pids: frozenset[int]

    @classmethod
    def of(cls, ft: FileTrace) -> FileFacts:
        return cls(path=ft.path, rank_hint=ft.rank_hint(), world_size=ft.world_size_hint(),
                   cpu_pids=frozenset(_cpu_pids(ft)))


def assign_ranks(files: list[FileFacts]) -> list[int]:
    """The rank of each file of a folder (in the folder's order): the rank each states, else its
    position.

    Raises
    ------
    TraceError
        Some files state a rank and others do not; two files claim the same rank while their
        processes overlap (or one holds no CPU events); the files disagree on the world size.
    """
    hints = [f.rank_hint for f in files]
    if len(files) == 1:
        return [hints[0] if hints[0] is not None else 0]
    if all(h is None for h in hints):
        return list(range(len(files)))
    if any(h is None for h in hints):
        missing = next(f.path.name for f, h in zip(files, hints) if h is None)
        raise TraceError(files[0].path.parent, f"mixed ranks: {missing} names no rank while other files do")
    known = [h for h in hints if h is not None]
    seen: dict[int, list[FileFacts]] = {}
    for f, h in zip(files, known):
        for other in seen.get(h, []):
            if f.cpu_pids & other.cpu_pids or not f.cpu_pids:
                raise TraceError(f.path.parent, f"mixed ranks: {other.path.name} and {f.path.name} both claim rank {h}")
        seen.setdefault(h, []).append(f)
    sizes: dict[int, str] = {}  # world size -> first file that says so
    for f in files:
        if f.world_size is not None:
            sizes.setdefault(f.world_size, f.path.name)
    if len(sizes) > 1:
        (a, file_a), (b, file_b) = list(sizes.items())[:2]
        raise TraceError(files[0].path.parent, f"mixed ranks: files disagree on world size "
                                               f"({file_a} says {a}, {file_b} says {b})")
    return known


def _cpu_pids(f: FileTrace) -> set[int]:
    """The processes whose CPU events a file holds (GPU events carry the device as their pid)."""
    c = f.columns
    return set(np.unique(c.pid[c.device < 0]).tolist())


_ID_MAX = np.iinfo(np.int64).max


def _shifted(values: np.ndarray, base: int, path: Path) -> np.ndarray:
    """``values`` with every id >= 0 moved up by ``base`` (-1, absent, stays)."""
    if base == 0:
        return values
    valid = values >= 0
    if valid.any() and int(values[valid].max()) > _ID_MAX - base:
        raise TraceError(path, "ids too large to keep the processes of one rank apart")
    return np.where(valid, values + base, values)


@dataclass
class _FreeIds:
    """The first ids that no earlier file of a rank uses."""

    correlation: int = 0
    external: int = 0
    flow: int = 0


def _separate_processes(files: list[FileTrace], ranks: list[int]) -> list[FileTrace]:
    """Every process numbers its correlation ids, ``External id`` and flow ids from 1: in a rank
    of several files (processes), each later file's ids are moved past the earlier files' so that
    a launch, an op or a flow of one process never matches another process's. The first file of
    a rank (every file of a one-file rank) is returned unchanged."""
    free: dict[int, _FreeIds] = {}
    out: list[FileTrace] = []
    for ft, r in zip(files, ranks):
        seen = r in free
        ids = free.setdefault(r, _FreeIds())
        if seen:
            c = replace(ft.columns, correlation=_shifted(ft.columns.correlation, ids.correlation, ft.path),
                        external_id=_shifted(ft.columns.external_id, ids.external, ft.path))
            ft = replace(ft, columns=c, flows=[replace(fl, flow_id=fl.flow_id + ids.flow) if fl.flow_id >= 0 else fl
                                               for fl in ft.flows])
        ids.correlation = max(ids.correlation, int(ft.columns.correlation.max(initial=-1)) + 1)
        ids.external = max(ids.external, int(ft.columns.external_id.max(initial=-1)) + 1)
        ids.flow = max([ids.flow, *(fl.flow_id + 1 for fl in ft.flows)])
        out.append(ft)
    return out


def _step_count(ft: FileTrace) -> int:
    return sum(step_number(n) is not None for n in ft.columns.names)


def _one_step_sequence(files: list[FileTrace], ranks: list[int]) -> list[FileTrace]:
    """A rank has one sequence of steps: in a rank of several processes it is that of the process
    with the most ``ProfilerStep#N`` (the first such file on a tie; the engine core that calls
    ``whatif.step()``, not its front-end). The other processes' step annotations are renamed
    ``ProfilerStep#N (process P)``: annotations still, no step boundaries."""
    stepping: dict[int, tuple[int, int]] = {}  # rank -> (steps, file index)
    for i, (ft, r) in enumerate(zip(files, ranks)):
        count = _step_count(ft)
        if r not in stepping or count > stepping[r][0]:
            stepping[r] = (count, i)
    out: list[FileTrace] = []
    for i, (ft, r) in enumerate(zip(files, ranks)):
        if stepping[r][1] != i and _step_count(ft):
            pid = min(_cpu_pids(ft), default=-1)
            names = [f"{n} (process {pid})" if step_number(n) is not None else n for n in ft.columns.names]
            ft = replace(ft, columns=replace(ft.columns, names=names))
        out.append(ft)
    return out


def _merged_rank(rank: int, group: list[FileTrace]) -> RankInfo:
    """One rank's facts from its files (one per process), the first file's metadata."""
    first = group[0]
    names = [n for ft in group for n in [_device_names(ft.metadata)] if n]
    counts: dict[str, int] = {}
    skipped: dict[str, int] = {}
    for ft in group:
        for k, v in ft.category_counts.items():
            counts[k] = counts.get(k, 0) + v
        for k, v in ft.skipped.items():
            skipped[k] = skipped.get(k, 0) + v
    sizes = [size for ft in group if (size := ft.world_size_hint()) is not None]
    return RankInfo(rank=rank, path=first.path, world_size=sizes[0] if sizes else None,
                    device_names=names[0] if names else [], metadata=first.metadata,
                    thread_names={k: v for ft in group for k, v in ft.thread_names.items()},
                    process_names={k: v for ft in group for k, v in ft.process_names.items()},
                    category_counts=counts, skipped=skipped, files=[ft.path for ft in group])


COLUMNS = ("rank", "ts_ns", "dur_ns", "kind", "name", "pid", "tid", "device", "stream",
           "correlation", "external_id")
_NUMERIC = ("ts_ns", "dur_ns", "kind", "pid", "tid", "device", "stream", "correlation", "external_id")


def _frame(columns: dict[str, np.ndarray], codes: np.ndarray, categories: list[str]) -> pd.DataFrame:
    """The event table from its numeric columns (:data:`COLUMNS` but ``name``) and the names'
    codes into ``categories`` (sorted)."""
    index = pd.Index(categories) if categories else pd.Index([], dtype=object)
    name = pd.Categorical.from_codes(codes, categories=index)
    return pd.DataFrame({k: name if k == "name" else columns[k] for k in COLUMNS}, copy=False)


def _to_frame(files: list[FileTrace], ranks: list[int]) -> tuple[pd.DataFrame, EventArgs]:
    """All files' columns in one frame, sorted by (rank, ts_ns, longer first), stable, and the
    events' ``args`` in the same order. Built one column at a time: besides the files' own
    columns, one unsorted column is held at once."""
    cols = [f.columns for f in files]
    rank = np.concatenate([np.full(len(c), r, dtype=np.int32) for c, r in zip(cols, ranks)])
    ts_ns = np.concatenate([c.ts_ns for c in cols])
    # Sort by (rank, start, longer first) so that parents precede the events they enclose.
    order = np.lexsort((-np.concatenate([c.dur_ns for c in cols]), ts_ns, rank))
    data: dict[str, np.ndarray] = {"rank": rank[order], "ts_ns": ts_ns[order]}
    del rank, ts_ns
    for key in _NUMERIC[1:]:
        data[key] = np.concatenate([getattr(c, key) for c in cols])[order]
    # Names: one sorted category list for all files (pandas' own order), codes remapped.
    categories = sorted({n for c in cols for n in c.names})
    index = {n: i for i, n in enumerate(categories)}
    codes = np.concatenate([np.array([index[n] for n in c.names], dtype=np.int32)[c.name_code]
                            if len(c) else np.zeros(0, dtype=np.int32) for c in cols])[order]
    args = EventArgs.gather([c.args if isinstance(c.args, EventArgs) else EventArgs.of(c.args) for c in cols], order)
    return _frame(data, codes, categories), args


def load_trace(path: str | Path) -> Trace:
    """Load a trace file, a folder of per-rank trace files, or a ``whatif record`` run folder.
    Each file is read by the reader of its suffix (:mod:`whatif.tracer.readers`).

    Raises :class:`~whatif.core.errors.TraceError` naming the file and the problem.
    """
    path = Path(path)
    paths = trace_files(path)
    with gc_paused():
        key, found = cached_trace(paths) if cache.enabled() else (None, None)
        if found is None:
            found = _load_files(paths)
            release_freed_memory(len(found.events))  # the files' parse
            if key is not None:
                cache_trace(key, found, paths)
    for line in input_warnings(found):
        INPUT_LOG.warning(line)
    return found


def input_warnings(trace: Trace) -> list[str]:
    """One line per rank file whose events were dropped or changed at read time: complete events
    whose ts or dur is not a number (dropped), negative durations (read as 0), a GPU named from
    its properties; and one line for a folder of several files none of which names its rank (read
    as the ranks of one job in file order)."""
    out = []
    for r in trace.ranks:
        bad, negative = r.skipped.get("malformed", 0), r.skipped.get("negative_dur", 0)
        if bad:
            out.append(f"{r.path}: {bad:,} event{'s' * (bad != 1)} skipped: a ts or dur that is not a number "
                       f"(or a flow or instant event without its time or id)")
        if negative:
            out.append(f"{r.path}: {negative:,} negative duration{'s' * (negative != 1)} read as 0")
        recorded = r.recorded_device_names
        inferred = [(p, n) for p, n, given in zip(_device_properties(r.metadata), r.device_names, recorded)
                    if n and not given]
        if inferred and not any(recorded):
            p, name = inferred[0]
            out.append(f"{r.path}: the GPU is not named in the trace; taken as {name} from its properties "
                       f"({p.get('numSms')} SMs or compute units, {get_device(name).mem_bytes / 2**30:,.0f} GiB)")
    unranked = [r for r in trace.ranks if stated_rank(r.metadata, r.path) is None]
    if len(trace.ranks) > 1 and len(unranked) == len(trace.ranks):
        out.append(f"{trace.ranks[0].path.parent}: {len(unranked)} files name no rank (neither distributedInfo nor "
                   f"rank<k> in the file name): read as "
                   f"ranks 0-{len(unranked) - 1} of one job in file order; if they are separate runs, analyze each "
                   f"file on its own")
    return out


def trace_files(path: Path) -> list[Path]:
    """The trace files ``path`` names: a folder's (:func:`find_trace_files`), or the one file.

    Raises
    ------
    TraceError
        No such file or folder, a folder with no trace file, a file no reader takes (refused
        before anything is read).
    """
    if not path.exists():
        raise TraceError(path, "no such file or folder")
    if path.is_dir():
        return find_trace_files(path)
    reader_for(path)
    return [path]


def cached_trace(paths: list[Path], salt: str = "") -> tuple[str | None, Trace | None]:
    """The cache key of the trace of ``paths`` (:func:`~whatif.tracer.cache.trace_key`, None when a
    file cannot be hashed) and its cached trace, None when there is no trusted entry."""
    key = cache.trace_key(paths, salt)
    found = cache.fetch(key, len(paths)) if key is not None else None
    return key, (_from_cache(found, paths) if found is not None else None)


def cache_trace(key: str, trace: Trace, paths: list[Path]) -> None:
    """Keep ``trace`` (of ``paths``) in the cache under ``key``; nothing when it cannot be kept."""
    entry = _to_cache(trace, paths)
    if entry is not None:
        cache.store(key, len(paths), entry)


def _to_cache(trace: Trace, paths: list[Path]) -> cache.Cached | None:
    ev = trace.events
    file_of = {p: i for i, p in enumerate(paths)}
    if any(f not in file_of for r in trace.ranks for f in r.files):  # a reader that renamed its file
        return None
    ranks = [cache.CachedRank(files=[file_of[f] for f in r.files], rank=r.rank, world_size=r.world_size,
                              device_names=r.device_names,
                              metadata=r.metadata, thread_names=[(p, t, n) for (p, t), n in r.thread_names.items()],
                              process_names=r.process_names, category_counts=r.category_counts, skipped=r.skipped)
             for r in trace.ranks]
    return cache.Cached(columns={k: ev[k].to_numpy() for k in COLUMNS if k != "name"},
                        codes=ev["name"].cat.codes.to_numpy().astype(np.int32),
                        names=[str(n) for n in ev["name"].cat.categories], args=trace.args, memory=trace.memory,
                        flows=trace.flows, ranks=ranks)


def _from_cache(found: cache.Cached, paths: list[Path]) -> Trace:
    ranks = [RankInfo(rank=r.rank, path=paths[r.files[0]], files=[paths[f] for f in r.files],
                      world_size=r.world_size, device_names=r.device_names,
                      metadata=r.metadata, thread_names={(p, t): n for p, t, n in r.thread_names},
                      process_names=r.process_names, category_counts=r.category_counts, skipped=r.skipped)
             for r in found.ranks]
    return Trace(events=_frame(found.columns, found.codes, found.names), ranks=ranks, flows=found.flows,
                 memory=found.memory, args=found.args)


def _load_files(paths: list[Path]) -> Trace:
    files = read_usable(paths)
    return trace_of_files(files, assign_ranks([FileFacts.of(ft) for ft in files]))


def read_usable(paths: list[Path]) -> list[FileTrace]:
    """Read each file with its reader and refuse one that cannot be analyzed
    (:func:`check_usable`)."""
    files = [read_file(p) for p in paths]
    for ft in files:
        check_usable(ft)
    return files


def trace_of_files(files: list[FileTrace], ranks: list[int]) -> Trace:
    """The trace of files read, with their ranks: one event table sorted by (rank, start), each
    rank's processes kept apart and one sequence of steps per rank. The events of a rank are the
    same rows, in the same order, whichever other ranks are loaded with it."""
    files = _one_step_sequence(_separate_processes(files, ranks), ranks)
    groups: dict[int, list[FileTrace]] = {}
    for ft, r in zip(files, ranks):
        groups.setdefault(r, []).append(ft)
    infos = [_merged_rank(r, group) for r, group in groups.items()]
    flows = [(r, fl) for ft, r in zip(files, ranks) for fl in ft.flows]
    events, args = _to_frame(files, ranks)
    return Trace(events=events, ranks=sorted(infos, key=lambda i: i.rank), flows=flows,
                 memory=memory_frame([ft.memory for ft in files], ranks), args=args)
