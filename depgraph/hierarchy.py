"""Nesting of CPU events on each thread, and what every CPU event belongs to.

Daydream's task->layer mapping: layer boundaries are marked on the CPU; an event inside a
layer's window belongs to it. For each CPU event we find its parent by interval nesting on its
thread and inherit, from the innermost enclosing event of each sort:

* ``step``  -- the N of ``ProfilerStep#N``
* ``phase`` -- an annotation ``phase:<name>`` (written by :func:`whatif.phase`) or one named
  exactly ``prefill``/``decode``/``denoise``...
* ``layer`` -- an ``nn.Module: X`` python frame or a user annotation (not a step or phase)
* ``op``    -- an aten/framework operator (``cpu_op``)
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from whatif.tracer.kinds import EventKind
from whatif.tracer.kineto import step_number
from whatif.tracer.markers import PHASE_PREFIX
from whatif.tracer.trace import per_name

BACKWARD_NODE = "autograd::engine::evaluate_function: "
"""The name prefix of an autograd node's CPU op (the backward of one forward op)."""
KNOWN_PHASES = frozenset({"prefill", "decode", "denoise", "denoising", "forward", "backward", "optimizer"})
CPU_KINDS = (EventKind.CPU_OP, EventKind.ANNOTATION, EventKind.PYTHON, EventKind.RUNTIME, EventKind.DRIVER)


def phase_name(name: str) -> str | None:
    """The phase an annotation names, or None.

    >>> phase_name("phase:prefill"), phase_name("Decode"), phase_name("aten::mm")
    ('prefill', 'decode', None)
    """
    if name.startswith(PHASE_PREFIX):
        return name[len(PHASE_PREFIX):]
    low = name.lower()
    return low if low in KNOWN_PHASES else None


@dataclass
class CpuHierarchy:
    """Per CPU event (arrays aligned with ``rows``, the event-table rows of CPU events)."""

    rows: np.ndarray          # event rows, grouped by thread, in (ts, -dur) order
    parent: np.ndarray        # position in ``rows`` of the parent, -1 at top level
    step: np.ndarray          # step number, -1 outside steps
    phase: np.ndarray         # object: phase name or None
    layer: np.ndarray         # object: layer name or None
    op: np.ndarray            # object: aten op name or None
    has_call: np.ndarray      # a runtime/driver call is this event or below it
    has_structure: np.ndarray  # a step or phase annotation is this event or below it
    is_structure: np.ndarray  # this event is a step or phase annotation


def thread_keys(rank: np.ndarray, pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """One int64 per (rank, pid, tid): equal for the events of one CPU thread of one rank."""
    return rank.astype(np.int64) * 0x1000003 + pid.astype(np.int64) * 0x10001 + tid.astype(np.int64)


def autograd_nodes(events: pd.DataFrame) -> np.ndarray:
    """Rows of the autograd nodes' CPU ops (:data:`BACKWARD_NODE`), in table order."""
    return np.flatnonzero(per_name(events["name"], lambda n: n.startswith(BACKWARD_NODE))
                          & (events["kind"].to_numpy() == int(EventKind.CPU_OP)))


def build_hierarchy(events: pd.DataFrame) -> CpuHierarchy:
    """Nest the CPU events of every (rank, pid, tid) and propagate step/phase/layer/op."""
    kinds = events["kind"].to_numpy()
    cpu_mask = np.isin(kinds, [int(k) for k in CPU_KINDS])
    rows = np.flatnonzero(cpu_mask)
    rank, pid, tid = (events[k].to_numpy()[rows] for k in ("rank", "pid", "tid"))
    # Stable sort by thread keeps the table's (ts, -dur) order within a thread.
    order = np.lexsort((np.arange(len(rows)), tid, pid, rank))
    rows = rows[order]
    thread = thread_keys(rank[order], pid[order], tid[order])
    del rank, pid, tid
    segments = _thread_segments(thread)
    parent_arr = _parents(events["ts_ns"].to_numpy()[rows], events["dur_ns"].to_numpy()[rows], segments)

    # What each event itself defines (per distinct name: names are categorical). Each attribute
    # is inherited and resolved in turn, its temporaries freed before the next (a big trace's
    # CPU events are millions: every array here is 8 bytes per event).
    kind_arr = kinds[rows]
    codes = events["name"].cat.codes.to_numpy()[rows]
    cats = [str(c) for c in events["name"].cat.categories]
    names_of_code = np.asarray(cats, dtype=object)
    step_of_name = np.asarray([step_number(c) if step_number(c) is not None else -1 for c in cats], dtype=np.int64)
    phase_of_name = np.asarray([phase_name(c) for c in cats], dtype=object)
    module_of_name = np.asarray([c[len("nn.Module: "):] if c.startswith("nn.Module: ") else None for c in cats],
                                dtype=object)
    is_ann = kind_arr == int(EventKind.ANNOTATION)
    own_step = np.where(is_ann, step_of_name[codes], -1)
    own_phase = is_ann & (own_step < 0) & (phase_of_name[codes] != None)  # noqa: E711
    own_layer = (is_ann & (own_step < 0) & ~own_phase) | ((kind_arr == int(EventKind.PYTHON))
                                                          & (module_of_name[codes] != None))  # noqa: E711
    del is_ann
    is_structure = (own_step >= 0) | own_phase
    none = np.array(None)  # the fill as an array: numpy's stubs do not take a bare None

    src = _source(own_step >= 0, parent_arr)
    step = np.where(src >= 0, own_step[np.maximum(src, 0)], -1).astype(np.int64)
    del own_step
    src = _source(own_phase, parent_arr)
    phase = np.where(src >= 0, phase_of_name[codes[np.maximum(src, 0)]], none)
    del own_phase
    src = _source(own_layer, parent_arr)
    at = np.maximum(src, 0)
    layer = np.where(src < 0, none, np.where(kind_arr[at] == int(EventKind.PYTHON), module_of_name[codes[at]],
                                             names_of_code[codes[at]]))
    del own_layer, at
    src = _source(kind_arr == int(EventKind.CPU_OP), parent_arr)
    op = np.where(src >= 0, names_of_code[codes[np.maximum(src, 0)]], none)
    del src, codes

    has_call = np.isin(kind_arr, [int(EventKind.RUNTIME), int(EventKind.DRIVER)])
    return CpuHierarchy(rows=rows, parent=parent_arr, step=step, phase=phase, layer=layer, op=op,
                        has_call=_upward(has_call, parent_arr, segments),
                        has_structure=_upward(is_structure, parent_arr, segments), is_structure=is_structure)


def _source(own: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Per event, the position of the nearest event at or above it with ``own`` set, -1."""
    return inherit(np.where(own, np.arange(len(own), dtype=np.int64), -1), parent)


def _thread_segments(thread: np.ndarray) -> list[tuple[int, int]]:
    """The [begin, end) positions of each thread's run of events (``thread`` is grouped)."""
    bounds = [0, *(np.flatnonzero(thread[1:] != thread[:-1]) + 1).tolist(), len(thread)]
    return [(a, b) for a, b in itertools.pairwise(bounds) if b > a]


def _parents(ts_ns: np.ndarray, dur_ns: np.ndarray, segments: list[tuple[int, int]]) -> np.ndarray:
    """Per event, the position of the innermost event of its thread that encloses it (the last
    one still open at its start), -1 at top level. One thread at a time, so that the Python
    lists of the loop hold one thread's events, not the job's.

    >>> _parents(np.array([0, 1, 2, 5, 0]), np.array([10, 3, 1, 1, 4]), [(0, 4), (4, 5)]).tolist()
    [-1, 0, 1, 0, -1]
    """
    parent = np.full(len(ts_ns), -1, dtype=np.int64)
    for a, b in segments:
        ts = ts_ns[a:b].tolist()
        end = (ts_ns[a:b] + dur_ns[a:b]).tolist()
        out = [-1] * (b - a)
        stack: list[int] = []
        for i, t in enumerate(ts):
            while stack and end[stack[-1]] <= t:
                stack.pop()
            if stack:
                out[i] = stack[-1] + a
            stack.append(i)
        parent[a:b] = out
    return parent


def _upward(flag: np.ndarray, parent: np.ndarray, segments: list[tuple[int, int]]) -> np.ndarray:
    """``flag`` set on every event at or above a flagged one. Children come after parents in
    their thread's run, so one reverse sweep per thread propagates the flags upward.

    >>> _upward(np.array([False, False, True, False]), np.array([-1, 0, 1, -1]), [(0, 4)]).tolist()
    [True, True, True, False]
    """
    out = flag.copy()
    for a, b in segments:
        up = (parent[a:b] - a).tolist()
        seen = flag[a:b].tolist()
        for i in range(b - a - 1, -1, -1):
            p = up[i]
            if p >= 0 and seen[i]:
                seen[p] = True
        out[a:b] = seen
    return out


def inherit(source: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """For every event, the ``source`` of the nearest event at or above it (itself first) whose
    ``source`` is set (>= 0), -1 if none, by pointer jumping: O(log depth) vectorized passes.

    >>> inherit(np.array([0, -1, -1, 3]), np.array([-1, 0, 1, 1])).tolist()
    [0, 0, 0, 3]
    """
    val = source.copy()
    up = parent.copy()
    while True:
        need = (val < 0) & (up >= 0)
        if not need.any():
            return val
        val[need] = val[up[need]]
        up[need] = up[up[need]]


def enclosing(hierarchy: CpuHierarchy, events: pd.DataFrame, table: pd.DataFrame) -> np.ndarray:
    """Per row of ``table`` (columns ``rank``, ``pid``, ``tid``, ``ts_ns``: allocator records,
    instants): the position in ``hierarchy.rows`` of the innermost CPU event of its thread that
    encloses its time, -1 outside every one.

    >>> ev = pd.DataFrame({"kind": [int(EventKind.CPU_OP)] * 2, "rank": [0, 0], "pid": [1, 1], "tid": [1, 1],
    ...                    "ts_ns": [0, 2], "dur_ns": [10, 3], "name": pd.Categorical(["aten::a", "aten::b"])})
    >>> at = pd.DataFrame({"rank": [0, 0, 0], "pid": [1, 1, 1], "tid": [1, 1, 1], "ts_ns": [1, 3, 12]})
    >>> enclosing(build_hierarchy(ev), ev, at).tolist()
    [0, 1, -1]
    """
    out = np.full(len(table), -1, dtype=np.int64)
    if not len(table) or not len(hierarchy.rows):
        return out
    sub = events.iloc[hierarchy.rows]
    ts = sub["ts_ns"].to_numpy()
    end = ts + sub["dur_ns"].to_numpy()
    threads = pd.DataFrame({"rank": sub["rank"].to_numpy(), "pid": sub["pid"].to_numpy(),
                            "tid": sub["tid"].to_numpy()})
    starts = threads.groupby(["rank", "pid", "tid"], sort=False).indices
    parent = hierarchy.parent
    at_ns = table["ts_ns"].to_numpy()
    for key, rows in table.groupby(["rank", "pid", "tid"], sort=False).indices.items():
        mine = starts.get(key)
        if mine is None:
            continue
        mine_ts = ts[mine]
        rows = np.asarray(rows)
        for row, t in zip(rows.tolist(), at_ns[rows].tolist()):
            j = int(np.searchsorted(mine_ts, t, side="right")) - 1
            pos = int(mine[j]) if j >= 0 else -1
            while pos >= 0 and end[pos] < t:
                pos = int(parent[pos])
            out[row] = pos
    return out


OUTSIDE_STEPS = -1
"""The step of a record outside every ``ProfilerStep`` window of its rank."""


def step_windows(events: pd.DataFrame) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per rank: the ``ProfilerStep#N`` windows of a trace's events (begin, end, N), in begin order."""
    ann = events[events["kind"].to_numpy() == int(EventKind.ANNOTATION)]
    numbers = ann["name"].astype(str).map(step_number)
    ann = ann[numbers.notna().to_numpy()]
    numbers = numbers[numbers.notna()].astype(np.int64)
    out = {}
    for rank in np.unique(ann["rank"].to_numpy()).tolist():
        mine = ann["rank"].to_numpy() == rank
        begin = ann["ts_ns"].to_numpy()[mine]
        order = np.argsort(begin, kind="stable")
        out[int(rank)] = (begin[order], (begin + ann["dur_ns"].to_numpy()[mine])[order],
                          numbers.to_numpy()[mine][order])
    return out


def record_steps(events: pd.DataFrame, table: pd.DataFrame) -> np.ndarray:
    """Per row of ``table`` (columns ``rank``, ``ts_ns``: allocator records, events): the step
    whose window on its rank holds its time, else :data:`OUTSIDE_STEPS`."""
    out = np.full(len(table), OUTSIDE_STEPS, dtype=np.int64)
    ranks = table["rank"].to_numpy()
    ts = table["ts_ns"].to_numpy()
    for rank, (begin, end, number) in step_windows(events).items():
        rows = np.flatnonzero(ranks == rank)
        j = np.searchsorted(begin, ts[rows], side="right") - 1
        inside = (j >= 0) & (ts[rows] <= end[np.maximum(j, 0)])
        out[rows[inside]] = number[j[inside]]
    return out
