"""The task graph: tasks are integer ids whose ``event`` column points into the trace's
event table (HTA's split: the table is the source of truth, the graph indexes it).

Edge semantics (Daydream, Lumos): for every edge ``u -> v`` of a kind not in
:data:`END_BOUND_EDGE_KINDS`, ``start(v) >= end(u) + lat_ns``; a ``SYNC`` or ``LAUNCH_QUEUE``
edge bounds the *end* of ``v`` instead, ``end(v) >= end(u) + lat_ns``: a synchronizing CPU
call, or a launch call that found the launch queue full, returns only after the GPU work it
waits on is done, and that wait is recomputed in every replay.
Tasks on an *ordered* resource (a CPU thread, a GPU stream) run in the order their
THREAD/STREAM edges give; tasks on a *shared* resource (a link, a copy engine, a PIM unit)
are served in ready-time order, one at a time.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, TypeVar

import networkx as nx
import numpy as np
import pandas as pd

from whatif.core.errors import WhatifError
from whatif.tracer.kinds import EventKind, codes

if TYPE_CHECKING:
    from whatif.tracer.trace import Trace


T = TypeVar("T")


class TaskKind(IntEnum):
    ORIGIN = 0    # a rank's time origin (its first measured timestamp)
    MARKER = 1    # zero-length step boundary on a CPU thread
    CPU_CALL = 2  # CUDA/HIP runtime or driver API call
    CPU_WORK = 3  # CPU operator work that launches nothing
    KERNEL = 4
    MEMCPY = 5
    MEMSET = 6
    COMM = 7      # collective kernel (NCCL/RCCL)
    ARRIVE = 8    # zero-length arrival of a rank at a collective (multi-rank graphs)
    BARRIER = 9   # virtual: a collective starts when every rank has arrived
    WAIT = 10     # the blocking part of a synchronous copy call: returns once its copy is done

    @property
    def on_gpu(self) -> bool:
        """Placed on a GPU stream (GPU work and a rank's zero-length arrival at a collective)."""
        return self in GPU_STREAM_KINDS


GPU_WORK_KINDS = frozenset({TaskKind.KERNEL, TaskKind.MEMCPY, TaskKind.MEMSET, TaskKind.COMM})
"""Work that occupies a GPU: busy time, kernel tables, what another GPU or a precision changes."""
LOCAL_GPU_WORK_KINDS = GPU_WORK_KINDS - {TaskKind.COMM}
"""GPU work that involves this GPU alone. The deliberate exception to ``GPU_WORK_KINDS``: CUDA
graphs here capture no collective (a collective's time depends on its peers), and the timeline
draws collectives in their own colour."""
GPU_STREAM_KINDS = GPU_WORK_KINDS | {TaskKind.ARRIVE}
"""Tasks placed on a GPU stream (GPU work, and a rank's zero-length arrival at a collective)."""
CPU_KINDS = frozenset({TaskKind.CPU_CALL, TaskKind.CPU_WORK, TaskKind.WAIT})
"""Tasks that are a CPU thread's own work (calls, operator work, blocking waits)."""


TASK_OF_GPU_EVENT = {EventKind.KERNEL: TaskKind.KERNEL, EventKind.MEMCPY: TaskKind.MEMCPY,
                     EventKind.MEMSET: TaskKind.MEMSET}
"""The task kind of each GPU activity event (the builder then marks collective kernels COMM)."""


def task_kind_codes(event_kinds: np.ndarray) -> np.ndarray:
    """Task-kind codes (int8) of an array of GPU-activity event-kind codes.

    >>> task_kind_codes(np.array([int(EventKind.MEMSET), int(EventKind.KERNEL)])).tolist()
    [6, 4]
    """
    lut = np.full(max(int(k) for k in EventKind) + 1, -1, dtype=np.int8)
    for event, task in TASK_OF_GPU_EVENT.items():
        lut[int(event)] = int(task)
    return lut[np.asarray(event_kinds, dtype=np.int64)]


def kind_codes(kinds: frozenset[TaskKind]) -> list[int]:
    """The integer codes of a set of task kinds, sorted (:func:`whatif.tracer.kinds.codes`).

    >>> kind_codes(LOCAL_GPU_WORK_KINDS)
    [4, 5, 6]
    """
    return codes(kinds)


class EdgeKind(IntEnum):
    ANCHOR = 0      # origin -> a task with no other predecessor (lat = measured offset)
    THREAD = 1      # CPU program order (lat = CPU gap between calls)
    STREAM = 2      # GPU stream order (lat = measured idle between queued kernels)
    LAUNCH = 3      # launch call -> kernel/copy/memset (lat = launch latency after the call ends)
    SYNC = 4        # GPU work -> synchronizing CPU call: bounds the call's END
    EVENT_WAIT = 5  # cudaEventRecord'ed work -> first work after cudaStreamWaitEvent on another stream
    COLLECTIVE = 6  # arrival -> barrier -> collective transfer, across ranks
    FLOW = 7        # cross-thread dependency shown by the trace (fwdbwd flows)
    LAUNCH_QUEUE = 8  # GPU work of the launch DEPTH entries back on a stream -> launch call: bounds the call's END
    CONTENTION = 9  # another stream's kernel that occupied the device -> the kernel it held back


END_BOUND_EDGE_KINDS = frozenset({EdgeKind.SYNC, EdgeKind.LAUNCH_QUEUE})
"""Edges that bound the end of their destination (a CPU call waiting on GPU work), not its start."""


class ResourceKind(IntEnum):
    THREAD = 0
    STREAM = 1
    VIRTUAL = 2      # no capacity limit (origins, barriers)
    LINK = 3
    COPY_ENGINE = 4
    PIM = 5


class GraphError(WhatifError):
    """The graph violates an invariant (e.g. it has a cycle)."""


@dataclass
class TaskGraph:
    """Tasks, edges and resources of one run (all ranks).

    ``tasks`` columns: ``event`` (row in ``trace.events``, -1 for synthetic tasks), ``kind``
    (:class:`TaskKind`), ``resource`` (row in ``resources``), ``rank``, ``dur_ns`` (duration
    used by replay), ``measured_start_ns``/``measured_end_ns`` (from the trace, aligned across
    ranks; -1 for tasks a transform inserted), ``step`` (-1 if outside every step), ``phase``,
    ``layer`` (innermost nn.Module or annotation), ``op`` (innermost aten op), ``name``.
    ``edges`` columns: ``src``, ``dst``, ``lat_ns``, ``kind`` (:class:`EdgeKind`).
    ``resources`` columns: ``rank``, ``kind`` (:class:`ResourceKind`), ``device``, ``key``
    (thread id or stream id), ``name``, ``ordered``.
    ``steps`` columns: ``rank``, ``step``, ``begin_task``, ``end_task``, ``measured_begin_ns``,
    ``measured_end_ns``.
    """

    tasks: pd.DataFrame
    edges: pd.DataFrame
    resources: pd.DataFrame
    steps: pd.DataFrame
    trace: Trace | None = None
    report: dict[str, int] = field(default_factory=dict)
    changes: list[Change] = field(default_factory=list)
    version: int = 0
    """Bumped by every primitive (:mod:`whatif.transforms.edit`)."""
    structure_version: int = 0
    """Bumped by the primitives that add, remove, rename or reclassify tasks (not by duration or
    latency edits): what per-task facts such as kernel classes depend on."""
    _memo: dict[str, tuple[int, object]] = field(default_factory=dict, repr=False)

    @property
    def num_tasks(self) -> int:
        return len(self.tasks)

    @property
    def num_edges(self) -> int:
        return len(self.edges)

    def copy(self) -> TaskGraph:
        """A deep copy of tasks, edges, resources, steps and the change log (the trace is shared,
        read-only; versions and memoized values are carried over)."""
        return TaskGraph(tasks=self.tasks.copy(), edges=self.edges.copy(), resources=self.resources.copy(),
                         steps=self.steps.copy(), trace=self.trace, report=dict(self.report),
                         changes=list(self.changes), version=self.version, structure_version=self.structure_version,
                         _memo=dict(self._memo))

    def memo(self, key: str, compute: Callable[[], T], *, structural: bool = True) -> T:
        """``compute()`` once per version of the graph: per ``structure_version`` when the value
        depends only on which tasks exist and what they are (``structural``), else per ``version``.

        >>> g = TaskGraph(tasks=pd.DataFrame({"dur_ns": [1]}), edges=pd.DataFrame(), resources=pd.DataFrame(),
        ...               steps=pd.DataFrame())
        >>> g.memo("n", lambda: len(g.tasks)), g.memo("n", lambda: -1)
        (1, 1)
        """
        stamp = self.structure_version if structural else self.version
        hit = self._memo.get(key)
        if hit is not None and hit[0] == stamp:
            return hit[1]  # type: ignore[return-value]
        value = compute()
        self._memo[key] = (stamp, value)
        return value


class ChangeTarget(IntEnum):
    """What a change edited: task durations (or the task set), edge latencies, resources, or
    nothing (a NOTE records a decision, e.g. the plan a search chose)."""

    TASKS = 0
    EDGES = 1
    RESOURCES = 2
    NOTE = 3


_CHANGE_UNITS = {ChangeTarget.TASKS: ("tasks", "task time"), ChangeTarget.EDGES: ("edges", "edge latency"),
                 ChangeTarget.RESOURCES: ("resources", "")}


@dataclass(frozen=True)
class Change:
    """One entry of a graph's change log: which transform did what to how many tasks or edges, and why.

    ``count``: how many tasks (or edges, resources) the change touched; ``before_ns``/``after_ns``:
    their total duration (edges: latency) before and after.

    >>> str(Change("fuse", "set duration of", 3, 9_000_000, 6_000_000, "fused"))
    'fuse: set duration of 3 tasks (-3.000 ms of task time): fused'
    >>> str(Change("gpu", "scale latency x0.5 of", 2, 4_000_000, 2_000_000, "faster host", ChangeTarget.EDGES))
    'gpu: scale latency x0.5 of 2 edges (-2.000 ms of edge latency): faster host'
    """

    transform: str
    action: str
    count: int
    before_ns: int
    after_ns: int
    reason: str
    target: ChangeTarget = ChangeTarget.TASKS

    @property
    def delta_ns(self) -> int:
        return self.after_ns - self.before_ns

    @property
    def tasks(self) -> int:
        """Tasks touched (0 for changes of edges, resources, or notes)."""
        return self.count if self.target is ChangeTarget.TASKS else 0

    def __str__(self) -> str:
        if self.target is ChangeTarget.NOTE:
            return f"{self.transform}: {self.action}: {self.reason}"
        noun, quantity = _CHANGE_UNITS[self.target]
        delta = f" ({self.delta_ns / 1e6:+.3f} ms of {quantity})" if quantity else ""
        return f"{self.transform}: {self.action} {self.count:,} {noun}{delta}: {self.reason}"


def to_networkx(graph: TaskGraph) -> nx.MultiDiGraph:
    """A networkx view of the graph for algorithms; node ids are task ids.

    Node attributes: ``kind``, ``resource``, ``dur_ns``, ``name``; edge attributes ``kind``, ``lat_ns``.

    >>> import pandas as pd
    >>> g = TaskGraph(
    ...     tasks=pd.DataFrame({"kind": [2, 4], "resource": [0, 1], "dur_ns": [5, 10], "name": ["launch", "k"]}),
    ...     edges=pd.DataFrame({"src": [0], "dst": [1], "lat_ns": [3], "kind": [3]}),
    ...     resources=pd.DataFrame(), steps=pd.DataFrame())
    >>> nxg = to_networkx(g)
    >>> list(nxg.edges(data="lat_ns"))
    [(0, 1, 3)]
    """
    nxg = nx.MultiDiGraph()
    t = graph.tasks
    nxg.add_nodes_from(
        (i, {"kind": TaskKind(k), "resource": int(r), "dur_ns": int(d), "name": str(n)})
        for i, k, r, d, n in zip(range(len(t)), t["kind"], t["resource"], t["dur_ns"], t["name"]))
    e = graph.edges
    nxg.add_edges_from(
        (int(s), int(d), {"kind": EdgeKind(k), "lat_ns": int(lat)})
        for s, d, lat, k in zip(e["src"], e["dst"], e["lat_ns"], e["kind"]))
    return nxg


def topological_order(num_tasks: int, src: np.ndarray, dst: np.ndarray, deterministic: bool = True) -> np.ndarray:
    """Task ids in a topological order (Kahn; with ``deterministic``, smallest id first among ready ones).

    Raises :class:`GraphError` naming a task on a cycle.

    >>> topological_order(3, np.array([2, 0]), np.array([0, 1])).tolist()
    [2, 0, 1]
    """
    import heapq

    indeg = np.bincount(dst, minlength=num_tasks).tolist()
    order_idx = np.argsort(src, kind="stable")
    succ_ptr = np.concatenate(([0], np.cumsum(np.bincount(src, minlength=num_tasks)))).tolist()
    succ = dst[order_idx].tolist()
    ready = np.flatnonzero(np.asarray(indeg) == 0).tolist()
    heapq.heapify(ready)
    out: list[int] = []
    pop, push = (heapq.heappop, heapq.heappush) if deterministic else (list.pop, list.append)
    while ready:
        v = pop(ready)
        out.append(v)
        for j in range(succ_ptr[v], succ_ptr[v + 1]):
            w = succ[j]
            indeg[w] -= 1
            if indeg[w] == 0:
                push(ready, w)
    if len(out) != num_tasks:
        stuck = next(i for i in range(num_tasks) if indeg[i] > 0)
        raise GraphError(f"the task graph has a cycle through task {stuck}")
    return np.asarray(out, dtype=np.int64)


def check_acyclic(graph: TaskGraph) -> None:
    """Raise :class:`GraphError` if the graph has a cycle."""
    topological_order(graph.num_tasks, graph.edges["src"].to_numpy(np.int64), graph.edges["dst"].to_numpy(np.int64),
                      deterministic=False)
