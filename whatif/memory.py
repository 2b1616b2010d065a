"""The memory timeline of a trace recorded with ``profile_memory`` (``whatif record --memory``):
allocated and reserved bytes per device over time, the peak and what held it, per step and per
operator.

Every allocator record of every rank counts (``Trace.memory``, :mod:`whatif.tracer.memory`);
records are grouped by rank and device (each GPU, the CPU). A record belongs to

* the **step** whose ``ProfilerStep#N`` window on its rank holds its time (any thread), and
* the **operator** that made it: the innermost aten op enclosing it on its own thread, else the
  innermost annotation or module there (``(no op)`` outside any CPU event).

The allocated bytes after each record are the allocator's own ``Total Allocated`` when every
record of the device carries it, else the running sum of the records' sizes from 0 (2021 traces;
``baseline`` says which). At the peak, the blocks still allocated are matched to the records that
allocated them by address, so each operator's ``held_at_peak_bytes`` is what it allocated and had
not freed at the peak; what no record allocated was allocated before the recording began.

>>> from whatif.tracer.trace import load_trace
>>> doc = memory(load_trace("../shared/traces/hta/df_index_resolver_v100_rank1of2.json.gz"))  # doctest: +SKIP
>>> doc.devices[0].device, doc.devices[0].peak_allocated_bytes                                   # doctest: +SKIP
('GPU 1', 6375419904)
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from whatif.core.bounds import check_fields
from whatif.depgraph.graph import TaskGraph
from whatif.depgraph.hierarchy import OUTSIDE_STEPS, CpuHierarchy, build_hierarchy, enclosing, record_steps
from whatif.documents import MemoryDevice, MemoryDocument, MemoryOp, MemorySeries, MemoryStep
from whatif.predictors.steps import exclusion_reasons
from whatif.tracer.kinds import EventKind
from whatif.tracer.memory import (
    FIRST_ADDED_ADDR,
    GPU_DEVICE_TYPES,
    UNKNOWN,
    UNSEEN_FREE_OP,
    RecordEdit,
    allocated_bytes,
    composed_edit,
    device_label,
)
from whatif.tracer.trace import Trace
from whatif.transforms.base import Transform, TransformError

__all__ = ["NO_OP", "OUTSIDE_STEPS", "MemoryOptions", "device_order", "memory", "memory_edits", "memory_table",
           "thin"]

NO_OP = "(no op)"
"""The operator of a record made outside any CPU event of its thread."""


@dataclass(frozen=True)
class MemoryOptions:
    max_points: int = field(default=2000, metadata={
        "minimum": 4, "maximum": 10_000_000,
        "help": "points per device in the timeline of the JSON document and the dashboard (default 2000; "
                "each bucket keeps its lowest and highest point, so the peak is always kept)"})

    def __post_init__(self) -> None:
        check_fields(self)


def device_order(device_type: int, device_id: int) -> tuple[int, int]:
    """Sort key of a device: GPUs first, by index, then the CPU and others.

    >>> sorted([(0, -1), (1, 1), (1, 0)], key=lambda d: device_order(*d))
    [(1, 0), (1, 1), (0, -1)]
    """
    return (0 if device_type in GPU_DEVICE_TYPES else 1, device_id)


def thin(values: np.ndarray, max_points: int) -> np.ndarray:
    """Indices of at most ``max_points`` points of a series that keep its shape: the series cut
    into ``max_points // 2`` runs of consecutive points, each keeping its lowest and highest one
    (so the global maximum is always kept), in order.

    >>> thin(np.array([0, 5, 1, 9, 2, 3, 8, 0]), 4).tolist()
    [0, 3, 6, 7]
    >>> thin(np.array([1, 2]), 4).tolist()
    [0, 1]
    """
    n = len(values)
    if n <= max_points:
        return np.arange(n)
    bounds = np.linspace(0, n, max_points // 2 + 1).astype(np.int64)
    keep: list[int] = []
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        if b > a:
            part = values[a:b]
            keep.extend((a + int(np.argmin(part)), a + int(np.argmax(part))))
    return np.unique(np.asarray(keep, dtype=np.int64))


@dataclass
class _Device:
    """One device's records of one rank, in time order, with what the analysis derives."""

    rank: int
    device_type: int
    device_id: int
    frame: pd.DataFrame        # rows of Trace.memory
    ops: np.ndarray            # object: the operator of each record
    steps: np.ndarray          # int: the step of each record
    allocated: np.ndarray      # int64: allocated bytes after each record
    recorded: bool             # allocated is the allocator's Total Allocated

    @property
    def label(self) -> str:
        return device_label(self.device_type, self.device_id)

    @property
    def sizes(self) -> np.ndarray:
        return self.frame["bytes"].to_numpy()

    @property
    def reserved(self) -> np.ndarray | None:
        """Reserved bytes after each record, when every record says and they are not all 0 (the
        CPU allocator reserves nothing)."""
        values = self.frame["total_reserved_bytes"].to_numpy()
        return values if len(values) and (values != UNKNOWN).all() and values.any() else None

    @property
    def peak(self) -> int:
        """Position of the (first) highest allocated value."""
        return int(np.argmax(self.allocated))

    def held_at_peak(self) -> dict[str, int] | None:
        """Operator -> bytes it allocated that were still allocated at the peak; None without
        addresses. Frees and reallocations are matched by address, in record order."""
        addrs = self.frame["addr"].to_numpy()
        if (addrs == UNKNOWN).all():
            return None
        live: dict[int, tuple[str, int]] = {}
        sizes = self.sizes
        for i in range(self.peak + 1):
            addr, size = int(addrs[i]), int(sizes[i])
            if addr == UNKNOWN:
                continue
            if size > 0:
                live[addr] = (str(self.ops[i]), size)
            elif size < 0:
                live.pop(addr, None)
        held: dict[str, int] = {}
        for op, size in live.values():
            held[op] = held.get(op, 0) + size
        return held


def _record_ops(trace: Trace, hierarchy: CpuHierarchy) -> np.ndarray:
    """Per row of ``trace.memory``: the innermost aten op enclosing the record on its thread, else
    the innermost annotation or module, else :data:`NO_OP`."""
    mem = trace.memory
    out = np.full(len(mem), NO_OP, dtype=object)
    out[mem["tid"].to_numpy() == UNKNOWN] = UNSEEN_FREE_OP
    if not len(mem) or not len(hierarchy.rows):
        return out
    sub = trace.events.iloc[hierarchy.rows]
    names = sub["name"].astype(str).to_numpy()
    label = np.where(pd.isna(hierarchy.op), np.where(pd.isna(hierarchy.layer), names, hierarchy.layer), hierarchy.op)
    kinds = sub["kind"].to_numpy()
    label = np.where((kinds == int(EventKind.ANNOTATION)) & pd.isna(hierarchy.op) & pd.isna(hierarchy.layer),
                     NO_OP, label)  # a bare step or phase window names no operator
    pos = enclosing(hierarchy, trace.events, mem)
    found = (pos >= 0) & (mem["tid"].to_numpy() != UNKNOWN)
    out[found] = label[pos[found]]
    return out


def _edited(d: _Device, rows: np.ndarray, dropped: np.ndarray, added: pd.DataFrame) -> _Device:
    """``d`` with a what-if's records: the dropped rows gone, the added ones in place, the
    allocated bytes after each moved by what was dropped and added before it (so a device
    nothing touches keeps its recorded values). Reserved bytes are not predicted."""
    at = pd.Index(rows).get_indexer(added["anchor"].to_numpy())
    mine = at >= 0
    added, at = added[mine], at[mine]
    n, k = len(rows), len(added)
    sizes = d.sizes
    after = added["after"].to_numpy()
    # each item's place: (position, 0 before / 1 the record / 2 after, order listed)
    place = np.concatenate([np.arange(n), at])
    side = np.concatenate([np.ones(n, dtype=np.int64), np.where(after, 2, 0)])
    order = np.lexsort((np.arange(n + k), side, place))
    gone = np.concatenate([np.isin(rows, dropped), np.zeros(k, dtype=bool)])
    base = np.concatenate([d.allocated, d.allocated[at] - np.where(after, 0, sizes[at])])
    delta = np.concatenate([np.where(gone[:n], -sizes, 0), added["bytes"].to_numpy()])
    allocated = (base[order] + np.cumsum(delta[order]))[~gone[order]]
    keep = order[~gone[order]]
    source = np.concatenate([np.arange(n), at])[keep]
    frame = d.frame.iloc[source].copy()
    new = keep >= n
    frame["bytes"] = np.concatenate([sizes, added["bytes"].to_numpy()])[keep]
    frame["addr"] = np.concatenate([d.frame["addr"].to_numpy(), added["addr"].to_numpy()])[keep]
    frame["total_allocated_bytes"] = allocated
    frame["total_reserved_bytes"] = UNKNOWN
    named = np.concatenate([d.ops, added["op"].to_numpy()])[keep]
    ops = np.where(new & pd.notna(named), named, d.ops[source])
    return _Device(d.rank, d.device_type, d.device_id, frame, ops, d.steps[source], allocated, d.recorded)


def _devices(trace: Trace, edits: Sequence[RecordEdit] = ()) -> Iterator[_Device]:
    mem = trace.memory
    if not len(mem):
        return
    hierarchy = build_hierarchy(trace.events)
    ops = _record_ops(trace, hierarchy)
    steps = record_steps(trace.events, trace.memory)
    dropped, added = _joined(edits)
    groups: dict[tuple[int, int, int], np.ndarray] = {}
    keys = mem[["rank", "device_type", "device_id"]].to_numpy()
    for rows in mem.groupby(["rank", "device_type", "device_id"], sort=False).indices.values():
        rows = np.asarray(rows)
        r, t, d = keys[rows[0]].tolist()
        groups[(r, t, d)] = rows
    for rank, dtype, dev in sorted(groups, key=lambda k: (k[0], *device_order(k[1], k[2]))):
        rows = groups[(rank, dtype, dev)]
        frame = mem.iloc[rows]
        allocated, recorded = allocated_bytes(frame)
        d = _Device(rank, dtype, dev, frame, ops[rows], steps[rows], allocated, recorded)
        yield _edited(d, rows, dropped, added) if edits else d


def _joined(edits: Sequence[RecordEdit]) -> tuple[np.ndarray, pd.DataFrame]:
    """The edits' dropped rows and added records together, each edit's addresses moved below the
    previous edit's so that blocks of two edits stay apart."""
    parts, floor = [], 0
    for e in edits:
        part = e.added.copy()
        part["addr"] = part["addr"] + floor
        floor = int(part["addr"].min()) - FIRST_ADDED_ADDR - 1 if len(part) else floor
        parts.append(part)
    dropped = np.unique(np.concatenate([e.dropped for e in edits])) if edits else np.empty(0, dtype=np.int64)
    return dropped, (pd.concat(parts, ignore_index=True) if parts else pd.DataFrame())


def _device_entry(d: _Device, held: dict[str, int] | None) -> MemoryDevice:
    sizes, allocated, peak = d.sizes, d.allocated, d.peak
    reserved = d.reserved
    ts = d.frame["ts_ns"].to_numpy()
    unrecorded = int(allocated[peak]) - sum(held.values()) if held is not None and d.recorded else None
    return MemoryDevice(
        rank=d.rank, device=d.label, records=len(sizes), allocations=int((sizes > 0).sum()),
        frees=int((sizes < 0).sum()), allocated_bytes=int(sizes[sizes > 0].sum()),
        freed_bytes=int(-sizes[sizes < 0].sum()), baseline="recorded" if d.recorded else "relative",
        first_ns=int(ts[0]), last_ns=int(ts[-1]), start_allocated_bytes=int(allocated[0] - sizes[0]),
        end_allocated_bytes=int(allocated[-1]), peak_allocated_bytes=int(allocated[peak]), peak_ns=int(ts[peak]),
        peak_step=int(d.steps[peak]), peak_op=str(d.ops[peak]),
        peak_reserved_bytes=int(reserved.max()) if reserved is not None else None,
        held_at_peak_unrecorded_bytes=unrecorded)


def _step_entries(d: _Device, excluded: dict[tuple[int, int], str]) -> list[MemoryStep]:
    out = []
    before = d.allocated - d.sizes
    for step in sorted(set(d.steps.tolist()) - {OUTSIDE_STEPS}):
        rows = np.flatnonzero(d.steps == step)
        sizes = d.sizes[rows]
        out.append(MemoryStep(rank=d.rank, device=d.label, step=step, excluded=excluded.get((d.rank, step)),
                              records=len(rows), allocated_bytes=int(sizes[sizes > 0].sum()),
                              start_allocated_bytes=int(before[rows[0]]),
                              peak_allocated_bytes=int(max(before[rows[0]], d.allocated[rows].max())),
                              end_allocated_bytes=int(d.allocated[rows[-1]])))
    return out


def _op_entries(d: _Device, held: dict[str, int] | None) -> list[MemoryOp]:
    frame = pd.DataFrame({"op": d.ops.astype(str), "alloc": np.maximum(d.sizes, 0), "free": np.maximum(-d.sizes, 0),
                          "n": (d.sizes > 0).astype(np.int64)})
    sums = frame.groupby("op", sort=True)[["alloc", "free", "n"]].sum()
    entries = [MemoryOp(rank=d.rank, device=d.label, op=str(op), allocations=int(r.n), allocated_bytes=int(r.alloc),
                        freed_bytes=int(r.free), net_bytes=int(r.alloc - r.free),
                        held_at_peak_bytes=None if held is None else held.get(str(op), 0))
               for op, r in sums.iterrows()]
    return sorted(entries, key=lambda e: (-(e.held_at_peak_bytes or 0), -e.allocated_bytes, e.op))


def _series(d: _Device, max_points: int) -> MemorySeries:
    keep = thin(d.allocated, max_points)
    reserved = d.reserved
    return MemorySeries(rank=d.rank, device=d.label, points=len(d.allocated),
                        ts_ns=d.frame["ts_ns"].to_numpy()[keep].tolist(), allocated_bytes=d.allocated[keep].tolist(),
                        reserved_bytes=None if reserved is None else reserved[keep].tolist())


def memory(trace: Trace, graph: TaskGraph | None = None, options: MemoryOptions = MemoryOptions(),
           edits: Sequence[RecordEdit] = (), predicted: Sequence[str] | None = None) -> MemoryDocument:
    """The memory timeline of ``trace`` (its ``profile_memory`` allocator records), as recorded or
    as a what-if predicts it.

    Parameters
    ----------
    trace : the event table (:func:`whatif.tracer.trace.load_trace`); a trace recorded without
        ``profile_memory`` gives a document with no devices.
    graph : its dependency graph, for the steps left out of means (warm-up, partial); None: no
        step is marked.
    options : :class:`MemoryOptions`.
    edits : what transforms change in the records (:meth:`whatif.transforms.base.Transform.memory_edit`):
        the timeline is the recorded one with their records dropped and added; empty: as recorded.
    predicted : lines saying what the edits are (the document's ``predicted``); None: as recorded.

    Raises
    ------
    WhatifError : from :class:`MemoryOptions` for a ``max_points`` out of bounds.
    """
    excluded = exclusion_reasons(graph) if graph is not None else {}
    devices, steps, ops, timeline = [], [], [], []
    for d in _devices(trace, edits):
        held = d.held_at_peak()
        devices.append(_device_entry(d, held))
        steps.extend(_step_entries(d, excluded))
        ops.extend(_op_entries(d, held))
        timeline.append(_series(d, options.max_points))
    return MemoryDocument(source=trace.source, max_points=options.max_points, devices=devices, steps=steps, ops=ops,
                          timeline=timeline, predicted=list(predicted) if predicted is not None else None)


def memory_edits(graph: TaskGraph, transforms: Sequence[Transform]) -> tuple[list[RecordEdit], list[str]]:
    """What ``transforms`` change in the allocator records of ``graph``'s trace, and a line each
    for the reader (:meth:`~whatif.transforms.base.Transform.memory_edit`; a transform that does
    not model memory leaves its records as recorded and says so). Each transform's edit is read
    on ``graph`` as recorded, not on what the ones before it made; edits that scale blocks and
    add bursts of buffers (:func:`~whatif.tracer.memory.scaled_edit`: ``batch``,
    ``tensor_parallel``, ``pipeline_parallel``, ``sequence_parallel``) compose into one, each block
    at the product of their factors and each burst at the others' factor of the block it follows
    (:func:`~whatif.tracer.memory.composed_edit`).

    Raises
    ------
    TransformError : a transform that models memory cannot apply to this trace, or two of them
        change the same records (each edit is read on the records as recorded, so they do not compose).
    """
    edits: list[RecordEdit] = []
    lines: list[str] = []
    names: list[str] = []
    for t in transforms:
        edit = t.memory_edit(graph)
        if edit is None:
            lines.append(f"{t.setting()}: memory not modelled (its allocations stay as recorded)")
            continue
        lines.append(edit.what)
        scaled = [i for i, other in enumerate(edits) if other.scaling is not None]
        at, name = len(edits), t.label()
        if edit.scaling is not None and scaled and graph.trace is not None:
            at = scaled[0]
            edit, name = composed_edit(graph.trace.memory, edits[at], edit), f"{names[at]} and {name}"
            grown = " (the buffers each adds grow with the blocks they follow)" if edit.bursts else ""
            lines.append(f"{name}: each block at the product of their factors{grown} (a largest batch that fits, "
                         f"above, is one GPU's without the others)")
        for i, (other, other_name) in enumerate(zip(edits, names)):
            both = np.intersect1d(other.dropped, edit.dropped)
            if i != at and len(both):
                raise TransformError(f"{other_name} and {t.label()} both change {len(both):,} of the same allocator "
                                     f"records: their memory is predicted one transform at a time (a scenario each)")
        if at == len(edits):
            edits.append(edit)
            names.append(name)
        else:
            edits[at], names[at] = edit, name
    return edits, lines


def memory_table(trace: Trace, edits: Sequence[RecordEdit] = ()) -> pd.DataFrame:
    """Every allocator record with what the timeline derives from it, one row each (what
    ``whatif memory -o`` writes): ``rank``, ``device``, ``ts_ns``, ``bytes`` (negative: a free),
    ``allocated_bytes`` and ``reserved_bytes`` after it (reserved: <NA> when not recorded),
    ``step`` (-1 outside steps), ``op``; grouped by rank and device, in time order; with
    ``edits``, the records a what-if predicts (as :func:`memory`)."""
    parts = []
    for d in _devices(trace, edits):
        reserved = d.reserved
        parts.append(pd.DataFrame({
            "rank": np.full(len(d.sizes), d.rank, dtype=np.int32), "device": d.label,
            "ts_ns": d.frame["ts_ns"].to_numpy(), "bytes": d.sizes, "allocated_bytes": d.allocated,
            "reserved_bytes": pd.array(reserved if reserved is not None else [None] * len(d.sizes), dtype="Int64"),
            "step": d.steps, "op": d.ops.astype(str)}))
    columns = ["rank", "device", "ts_ns", "bytes", "allocated_bytes", "reserved_bytes", "step", "op"]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({c: [] for c in columns})
