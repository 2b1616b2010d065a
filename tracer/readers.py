"""Trace readers by file suffix: the one place that knows which files are traces.

A reader turns one file into a :class:`FileTrace` (its complete events as columns, its flows and
metadata); :func:`whatif.tracer.load_trace` merges the files of a run into one event table.
Whoever needs to know what a trace file is (folder discovery, dashboard uploads, error messages)
asks this registry: :func:`reader_for`, :func:`is_trace_file`, :func:`suffixes`, :func:`accepted`.

Built-in: the Kineto / Chrome-trace JSON reader (``.json``, ``.json.gz``, in
:mod:`whatif.tracer.kineto`). Another format is one file with a :class:`TraceReader` subclass,
made known by :func:`register_reader` or by the entry-point group ``whatif.trace_readers``
(``[project.entry-points."whatif.trace_readers"] mine = "pkg.mod:MyReader"``). See
docs/extending.md.

>>> suffixes()
('.json', '.json.gz')
>>> reader_for("run/rank0.pt.trace.json.gz").name
'kineto'
>>> reader_for("run/rank0.nsys-rep")
Traceback (most recent call last):
...
whatif.core.errors.TraceError: run/rank0.nsys-rep: not a trace file (accepted: *.json, *.json.gz)
"""
from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from whatif.core import limits
from whatif.core.errors import TraceError
from whatif.core.plugins import load_plugins

from .args import EventArgs
from .kinds import EventKind
from .memory import MemoryColumns

ENTRY_POINT_GROUP = "whatif.trace_readers"
BUILTIN_MODULES = ("whatif.tracer.kineto",)
RUN_META_NAME = "meta.jsonc"
"""A ``whatif record`` run folder's metadata (plain JSON). Not ``*.json``: HolisticTraceAnalysis
opens every ``*.json``/``*.gz`` file of a folder as a trace, so a ``meta.json`` became a rank."""
OLD_RUN_META_NAME = "meta.json"  # what folders recorded before the rename hold; still read
NOT_TRACES = frozenset({OLD_RUN_META_NAME})  # a run folder's metadata, not a trace
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def stated_rank(metadata: dict[str, Any], path: Path) -> int | None:
    """The rank a trace file states: its ``distributedInfo``'s, else a ``rank<k>`` in its name.

    >>> stated_rank({}, Path("rank3.pt.trace.json")), stated_rank({"distributedInfo": {"rank": 1}}, Path("t.json"))
    (3, 1)
    >>> stated_rank({}, Path("Qwen.json.gz")) is None
    True
    """
    info = metadata.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, dict) else None
    if not (isinstance(rank, int) and rank >= 0):
        match = _RANK_IN_NAME.search(path.name)
        rank = int(match.group(1)) if match else None
    return rank


@dataclass
class FileColumns:
    """The complete events of one file as parallel arrays, in file order.

    Times are integer nanoseconds (``baseTimeNanoseconds`` applied); ids are int64 (-1 when
    absent; unsigned 64-bit ids above 2**63 wrap to negative). Names are stored once:
    ``name_code[i]`` indexes ``names``. ``args`` are each event's dict (or None): a list, or
    held encoded (:class:`~whatif.tracer.args.EventArgs`, what the Kineto reader makes so that
    no file's dicts outlive its parse).
    """

    ts_ns: np.ndarray        # int64
    dur_ns: np.ndarray       # int64, >= 0
    kind: np.ndarray         # int8, EventKind
    name_code: np.ndarray    # int32 index into names
    names: list[str]         # distinct event names, first-seen order
    pid: np.ndarray          # int64
    tid: np.ndarray          # int64
    device: np.ndarray       # int32, -1 on CPU events
    stream: np.ndarray       # int64, -1 on CPU events
    correlation: np.ndarray  # int64
    external_id: np.ndarray  # int64
    args: list[dict[str, Any] | None] | EventArgs  # a reader of JSON keeps them encoded (EventArgs.of_json)

    def __len__(self) -> int:
        return len(self.ts_ns)

    @property
    def name(self) -> list[str]:
        """Each event's name (decoded from ``name_code``)."""
        names = self.names
        return [names[c] for c in self.name_code.tolist()]

    @classmethod
    def from_events(cls, *, ts_ns: Sequence[int], dur_ns: Sequence[int], kind: Sequence[EventKind],
                    name: Sequence[str], pid: Sequence[int], tid: Sequence[int],
                    device: Sequence[int] | None = None, stream: Sequence[int] | None = None,
                    correlation: Sequence[int] | None = None, external_id: Sequence[int] | None = None,
                    args: Sequence[dict[str, Any] | None] | None = None) -> FileColumns:
        """Columns from one sequence per field (a reader's rows, transposed); the optional ids
        default to -1 (absent), ``args`` to None, and names are stored once.

        >>> c = FileColumns.from_events(ts_ns=[0, 5], dur_ns=[4, 9], kind=[EventKind.RUNTIME, EventKind.KERNEL],
        ...                             name=["cudaLaunchKernel", "gemm"], pid=[1, 0], tid=[1, 7])
        >>> c.name, c.names, c.correlation.tolist()
        (['cudaLaunchKernel', 'gemm'], ['cudaLaunchKernel', 'gemm'], [-1, -1])
        """
        n = len(ts_ns)

        def ids(values: Sequence[int] | np.ndarray | None, dtype: type) -> np.ndarray:
            out: np.ndarray = np.full(n, -1, dtype=dtype) if values is None else np.asarray(values, dtype=dtype)
            if out.shape != (n,):
                raise ValueError(f"every column needs {n} values, one has {out.size}")
            return out

        index: dict[str, int] = {}
        codes = np.array([index.setdefault(str(x), len(index)) for x in name], dtype=np.int32)
        dur = ids(dur_ns, np.int64)
        if (dur < 0).any():
            raise ValueError("durations must be >= 0")
        return cls(ts_ns=ids(ts_ns, np.int64), dur_ns=dur, kind=ids(kind, np.int8), name_code=ids(codes, np.int32),
                   names=list(index), pid=ids(pid, np.int64), tid=ids(tid, np.int64), device=ids(device, np.int32),
                   stream=ids(stream, np.int64), correlation=ids(correlation, np.int64),
                   external_id=ids(external_id, np.int64), args=list(args) if args is not None else [None] * n)


@dataclass(slots=True)
class Flow:
    """One end of a non-launch flow (e.g. ``fwdbwd``), located by thread and time (slotted: a
    job holds one per flow end, tens of thousands per rank)."""

    category: str
    flow_id: int
    phase: str  # "s" or "f"
    pid: int
    tid: int
    ts_ns: int


@dataclass
class FileTrace:
    """What one file holds: its events, flows, and the top-level metadata (what a reader returns)."""

    path: Path
    columns: FileColumns
    flows: list[Flow]
    metadata: dict[str, Any]
    thread_names: dict[tuple[int, int], str]
    process_names: dict[int, str]
    category_counts: dict[str, int]
    skipped: dict[str, int]
    memory: MemoryColumns = field(default_factory=MemoryColumns.empty)

    @property
    def distributed_info(self) -> dict[str, Any]:
        info = self.metadata.get("distributedInfo")
        return info if isinstance(info, dict) else {}

    def rank_hint(self) -> int | None:
        """Rank from ``distributedInfo``, else from a ``rank<k>`` in the file name (:func:`stated_rank`)."""
        rank = stated_rank(self.metadata, self.path)
        if rank is not None and rank > limits.MAX_RANK:
            raise TraceError(self.path, f"rank {rank} out of range (0..{limits.MAX_RANK})")
        return rank

    def world_size_hint(self) -> int | None:
        size = self.distributed_info.get("world_size")
        if not (isinstance(size, int) and size > 0):
            return None
        if size > limits.MAX_RANK + 1:
            raise TraceError(self.path, f"world size {size} out of range (1..{limits.MAX_RANK + 1})")
        return size


class TraceReader(ABC):
    """One trace format: the file-name suffixes it owns and how to read such a file.

    ``suffixes`` are lower-case and start with a dot; a longer suffix wins over a shorter one
    (``.json.gz`` over ``.gz``). :meth:`read` raises :class:`~whatif.core.errors.TraceError`
    naming the file and the problem for unusable input.
    """

    name: ClassVar[str]
    suffixes: ClassVar[tuple[str, ...]]

    @abstractmethod
    def read(self, path: Path) -> FileTrace:
        """The events of the file at ``path``."""

    def check_bytes(self, filename: str, data: bytes) -> str | None:
        """A cheap look at an upload's bytes before it is stored: the problem (``"not gzip data"``),
        or None when they may be this format. The default accepts anything; :meth:`read` decides."""
        return None

    def check_file(self, filename: str, path: Path) -> str | None:
        """A bounded-memory look at a whole upload named ``filename``, stored at ``path`` (a gzip
        bomb, a corrupt stream): the problem :meth:`read` would refuse, or None. The default finds
        none; :meth:`read` decides."""
        return None


_READERS: dict[str, TraceReader] = {}  # suffix -> reader
_loaded = False


def register_reader(reader: TraceReader) -> TraceReader:
    """Make ``reader`` read the files of its suffixes. A suffix belongs to one reader: claiming
    one that another reader has is an error (unregister that one first)."""
    if not reader.suffixes:
        raise TypeError(f"{type(reader).__name__} has no suffixes")
    for s in reader.suffixes:
        if not s.startswith(".") or s != s.lower():
            raise TypeError(f"{type(reader).__name__}: suffix {s!r} must be lower-case and start with '.'")
        taken = _READERS.get(s)
        if taken is not None and type(taken) is not type(reader):
            raise TypeError(f"{type(reader).__name__}: suffix {s} is read by {type(taken).__name__} already")
    for s in reader.suffixes:
        _READERS[s] = reader
    return reader


def unregister_reader(reader: TraceReader) -> None:
    """Forget ``reader`` (its suffixes are no trace files any more)."""
    for s in [s for s, r in _READERS.items() if r is reader]:
        del _READERS[s]


def _accept(cls: object) -> None:
    if not (isinstance(cls, type) and issubclass(cls, TraceReader)):
        raise TypeError("not a whatif TraceReader class")
    register_reader(cls())


def _load() -> None:
    global _loaded
    if _loaded:
        return
    load_plugins(BUILTIN_MODULES, ENTRY_POINT_GROUP, _accept, what="trace reader")
    _loaded = True


def suffixes() -> tuple[str, ...]:
    """Every suffix a reader owns, in registration order."""
    _load()
    return tuple(_READERS)


def accepted() -> str:
    """The accepted file names, for messages: ``*.json, *.json.gz``."""
    return ", ".join(f"*{s}" for s in suffixes())


def _suffix_of(name: str) -> str | None:
    low = name.lower()
    return max((s for s in suffixes() if low.endswith(s) and len(low) > len(s)), key=len, default=None)


def reader_for(path: str | Path) -> TraceReader:
    """The reader of ``path`` by its suffix, or :class:`TraceError` listing the accepted ones."""
    suffix = _suffix_of(Path(path).name)
    if suffix is None:
        raise TraceError(path, f"not a trace file (accepted: {accepted()})")
    return _READERS[suffix]


def run_meta_path(folder: Path) -> Path | None:
    """The metadata file of a run folder: :data:`RUN_META_NAME`, else an older folder's
    ``meta.json``; None when neither is there.

    >>> run_meta_path(Path("no/such/run")) is None
    True
    """
    for name in (RUN_META_NAME, OLD_RUN_META_NAME):
        if (folder / name).is_file():
            return folder / name
    return None


def run_folders(root: Path) -> list[Path]:
    """Every run folder at or under ``root``, sorted: a folder with run metadata
    (:func:`run_meta_path`) and at least one trace file of its own. A recording whose traces were
    not kept (metadata and logs only) is no run folder.

    >>> run_folders(Path("no/such/folder"))
    []
    """
    if not root.is_dir():
        return []
    found = [d for d in [root, *sorted(p for p in root.rglob("*") if p.is_dir())]
             if run_meta_path(d) is not None and any(is_trace_name(f.name) for f in d.iterdir() if f.is_file())]
    return sorted(found)


def is_trace_name(name: str) -> bool:
    """Whether a file of this name is a trace (a reader owns its suffix, and it is not an old run
    folder's ``meta.json``)."""
    return name not in NOT_TRACES and _suffix_of(name) is not None


def is_trace_file(path: Path) -> bool:
    """Whether ``path`` is an existing file that a reader reads (see :func:`is_trace_name`)."""
    return is_trace_name(path.name) and path.is_file()


def read_file(path: Path) -> FileTrace:
    """Read one trace file with the reader of its suffix."""
    return reader_for(path).read(path)
