"""Replay a task graph: a deterministic discrete-event list scheduler.

A task becomes ready when all its predecessors are done; it starts at
``max(end(u) + lat)`` over its start-bound in-edges and, on a shared resource (link, copy
engine, PIM unit), not before the resource is free; it ends at
``max(start + dur, max(end(u) + lat) over end-bound in-edges)`` (SYNC, LAUNCH_QUEUE:
:data:`~whatif.depgraph.graph.END_BOUND_EDGE_KINDS`). Ready tasks are taken from a heap
keyed ``(ready time, task id)``, so ties break the same way every run (simpy/vidur).
Only each rank's ORIGIN task takes its time from the trace; every other start is computed.
ORIGIN and BARRIER tasks are instants: they occupy no resource, so they never wait for one.

:class:`ReplayEngine` is the scheduler; :func:`replay` runs it over a whole graph. The
rank-parallel replay (:mod:`whatif.scale`) runs one engine per rank group, with the barriers
that other groups share *held*: the engine stops at them, and the caller releases each one at
the time every group's arrivals give.
"""
from __future__ import annotations

import heapq
from array import array
from dataclasses import dataclass, field

import numpy as np

from whatif.core.heap import release_freed_memory
from whatif.depgraph.graph import END_BOUND_EDGE_KINDS, GraphError, TaskGraph, TaskKind
from whatif.tracer.kinds import codes
from whatif.transforms.edit import set_duration, set_state
from whatif.transforms.sharing import MAX_PASSES, SHARE_REF, TOLERANCE, repriced, settled, shared_durations

RESOURCE_BOUND = -2  # start_by value: the task waited for its shared resource, not for an edge
INSTANT_KINDS = (TaskKind.ORIGIN, TaskKind.BARRIER)
"""Zero-length points in time that occupy no resource (a rank's origin, a collective's barrier)."""
_NEG = -(1 << 62)


@dataclass
class Replay:
    """Predicted times of every task of ``graph`` (ns, on the aligned trace clock).

    ``start_by[v]``: the edge that set ``v``'s start (-1 for origins and unconstrained tasks,
    ``RESOURCE_BOUND`` when a shared resource was busy; ``resource_prev[v]`` then names the task
    it waited for). ``end_by[v]``: the end-bound edge that set ``v``'s end, -1 when its own duration did.
    """

    graph: TaskGraph
    start_ns: np.ndarray
    end_ns: np.ndarray
    start_by: np.ndarray
    end_by: np.ndarray
    resource_prev: np.ndarray
    cache: dict[str, object] = field(default_factory=dict, repr=False)  # derived per-replay tables


@dataclass(frozen=True)
class HeldTask:
    """A held task whose in-graph predecessors are all done: ``ready_ns`` is the start they give
    (``_NEG`` when it has none), ``by_edge`` the edge that set it (-1)."""

    task: int
    ready_ns: int
    by_edge: int


class ReplayEngine:
    """The scheduler's state over one graph; :meth:`run` advances it as far as it can.

    Parameters
    ----------
    graph : TaskGraph
        The graph to replay.
    held : array of task ids, optional
        Tasks whose start is decided outside this graph (a barrier other rank groups share).
        When a held task's predecessors here are done, :meth:`run` reports it (a
        :class:`HeldTask`) instead of starting it; :meth:`release` then starts it.
    dur_ns : array, optional
        Each task's duration, instead of the graph's (:func:`replay`'s passes that re-price kernels
        beside collectives).

    Raises
    ------
    GraphError
        An edge names a task that does not exist; :meth:`result` when tasks were never reached
        (a cycle, or a held task never released).

    >>> import pandas as pd
    >>> tasks = pd.DataFrame({"kind": [0, 2, 9, 4], "resource": [0, 1, 2, 3], "rank": [0, 0, 0, 0],
    ...                       "dur_ns": [0, 5, 0, 100], "measured_start_ns": [1000, 1000, 1000, 1010]})
    >>> edges = pd.DataFrame({"src": [0, 1, 2], "dst": [1, 2, 3], "lat_ns": [0, 0, 0], "kind": [0, 0, 0]})
    >>> g = TaskGraph(tasks=tasks, edges=edges, resources=pd.DataFrame({"ordered": [False, True, False, True]}),
    ...               steps=pd.DataFrame())
    >>> engine = ReplayEngine(g, held=np.array([2]))
    >>> engine.run()
    [HeldTask(task=2, ready_ns=1005, by_edge=1)]
    >>> engine.release(2, 1040)  # the other ranks arrived later
    >>> engine.run()
    []
    >>> engine.result().end_ns.tolist()
    [1000, 1005, 1040, 1140]
    """

    def __init__(self, graph: TaskGraph, held: np.ndarray | None = None, dur_ns: np.ndarray | None = None) -> None:
        t = graph.tasks
        n = len(t)
        e = graph.edges
        src = e["src"].to_numpy(np.int64)
        dst = e["dst"].to_numpy(np.int64)
        if len(src) and (src.max() >= n or dst.max() >= n or src.min() < 0 or dst.min() < 0):
            raise GraphError("an edge points to a task that does not exist")
        self.graph = graph
        self.n = n
        order = np.argsort(src, kind="stable")
        # Typed arrays (8 bytes an entry, no int object kept per entry): a 1.1 M-task replay peaks
        # ~320 MB lower than with lists of ints, and is no slower.
        self._succ_ptr = _packed(np.concatenate(([0], np.cumsum(np.bincount(src, minlength=n)))))
        self._succ_dst = _packed(dst[order], narrow=True)
        self._succ_lat = _packed(e["lat_ns"].to_numpy(np.int64)[order])
        self._succ_sync = _flags(np.isin(e["kind"].to_numpy()[order], codes(END_BOUND_EDGE_KINDS)))
        self._succ_eid = _packed(order, narrow=True)
        del src, order
        self._indeg = _packed(np.bincount(dst, minlength=n), narrow=True)
        del dst
        self._dur = _packed(t["dur_ns"].to_numpy(np.int64) if dur_ns is None else np.asarray(dur_ns, dtype=np.int64))
        res = t["resource"].to_numpy(np.int64)
        ordered = graph.resources["ordered"].to_numpy(bool) if len(graph.resources) else np.ones(0, bool)
        kinds = t["kind"].to_numpy()
        shared = ~ordered[res] if len(ordered) else np.zeros(n, dtype=bool)
        self._shared = _flags(shared & ~np.isin(kinds, codes(INSTANT_KINDS)))
        self._res = _packed(res, narrow=True)
        self._ranks = t["rank"].to_numpy()
        is_origin = kinds == int(TaskKind.ORIGIN)
        measured = t["measured_start_ns"].to_numpy(np.int64)
        self._origin_time = {int(r): int(m) for r, m in zip(self._ranks[is_origin], measured[is_origin])}
        self._default_origin = min(self._origin_time.values()) if self._origin_time else 0
        self._held = np.zeros(n, dtype=bool)
        if held is not None and len(held):
            self._held[np.asarray(held, dtype=np.int64)] = True

        self.start_ready = array("q", [_NEG]) * n
        self.end_ready = array("q", [_NEG]) * n
        self.start_by = array("q", [-1]) * n
        self.end_by = array("q", [-1]) * n
        self.resource_prev = array("q", [-1]) * n
        self.start = array("q", [0]) * n
        self.end = array("q", [0]) * n
        self._free: dict[int, int] = {}
        self._last_on: dict[int, int] = {}
        self.done = 0
        self._heap: list[tuple[int, int]] = []
        self._reported: list[HeldTask] = []
        for v in np.flatnonzero(np.asarray(self._indeg) == 0).tolist():
            if self._held[v]:
                self._reported.append(HeldTask(v, _NEG, -1))
                continue
            self.start_ready[v] = int(measured[v]) if is_origin[v] else self._origin_of(v)
            self._heap.append((self.start_ready[v], v))
        heapq.heapify(self._heap)

    def _origin_of(self, v: int) -> int:
        return self._origin_time.get(int(self._ranks[v]), self._default_origin)

    def run(self) -> list[HeldTask]:
        """Start every task that can start; returns the held tasks whose predecessors here became
        all done since the last call (in task id order)."""
        heap, held, dur, shared, res_list = self._heap, self._held, self._dur, self._shared, self._res
        start_ready, end_ready, start_by, end_by = self.start_ready, self.end_ready, self.start_by, self.end_by
        succ_ptr, succ_dst, succ_lat, succ_sync, succ_eid = (self._succ_ptr, self._succ_dst, self._succ_lat,
                                                             self._succ_sync, self._succ_eid)
        indeg, free, last_on, start, end = self._indeg, self._free, self._last_on, self.start, self.end
        reported = self._reported
        pop, push = heapq.heappop, heapq.heappush
        done = 0
        while heap:
            ready, v = pop(heap)
            s = ready
            if shared[v]:
                r = res_list[v]
                f = free.get(r, _NEG)
                if f > s:
                    s = f
                    start_by[v] = RESOURCE_BOUND
                    self.resource_prev[v] = last_on[r]
            fin = s + dur[v]
            if end_ready[v] > fin:
                fin = end_ready[v]
            else:
                end_by[v] = -1
            if shared[v]:
                free[res_list[v]] = fin
                last_on[res_list[v]] = v
            start[v] = s
            end[v] = fin
            done += 1
            for j in range(succ_ptr[v], succ_ptr[v + 1]):
                w = succ_dst[j]
                when = fin + succ_lat[j]
                if succ_sync[j]:
                    if when > end_ready[w]:
                        end_ready[w] = when
                        end_by[w] = succ_eid[j]
                elif when > start_ready[w]:
                    start_ready[w] = when
                    start_by[w] = succ_eid[j]
                indeg[w] -= 1
                if indeg[w] == 0:
                    if held[w]:
                        reported.append(HeldTask(w, start_ready[w], start_by[w]))
                        continue
                    if start_ready[w] == _NEG:  # only end-bound predecessors: it may start at its rank's origin
                        start_ready[w] = self._origin_of(w)
                    push(heap, (start_ready[w], w))
        self.done += done
        out = sorted(reported, key=lambda h: h.task)
        reported.clear()
        return out

    def release(self, task: int, start_ns: int, by_edge: int = -1) -> None:
        """Start held ``task`` at ``start_ns`` (an instant: it ends there too) and make its
        successors here ready; :meth:`run` then goes on from them.

        Raises
        ------
        GraphError
            ``task`` is not held, or was released already.
        """
        if not (0 <= task < self.n and self._held[task] and self._indeg[task] == 0):
            raise GraphError(f"task {task} is not a held task waiting for its release")
        self._held[task] = False
        self.start_ready[task] = start_ns
        self.start_by[task] = by_edge
        heapq.heappush(self._heap, (start_ns, task))

    def result(self) -> Replay:
        """The replay, once every task has run.

        Raises
        ------
        GraphError
            A task was never reached: the graph has a cycle, or a held task was not released.
        """
        if self.done != self.n:
            stuck = next(i for i in range(self.n) if self._indeg[i] > 0 or self._held[i])
            raise GraphError(f"the task graph has a cycle through task {stuck}")
        return Replay(graph=self.graph, start_ns=np.asarray(self.start, dtype=np.int64),
                      end_ns=np.asarray(self.end, dtype=np.int64),
                      start_by=np.asarray(self.start_by, dtype=np.int64),
                      end_by=np.asarray(self.end_by, dtype=np.int64),
                      resource_prev=np.asarray(self.resource_prev, dtype=np.int64))


def _packed(values: np.ndarray, narrow: bool = False) -> array:
    """``values`` as a typed array: int64, or int32 when ``narrow`` and they fit (ids, counts):
    what the engine indexes, at 4 or 8 bytes an entry instead of a Python list's 8 plus an int
    object each."""
    fits = narrow and (not len(values) or (int(values.max()) < 2**31 and int(values.min()) >= -2**31))
    code = "i" if fits else "q"
    out = array(code)
    out.frombytes(np.ascontiguousarray(values, dtype=np.int32 if code == "i" else np.int64).tobytes())
    return out


def _flags(values: np.ndarray) -> bytearray:
    """Booleans as one byte each (0 or 1)."""
    return bytearray(np.ascontiguousarray(values, dtype=np.uint8).tobytes())


def replay(graph: TaskGraph) -> Replay:
    """Predict start and end of every task of ``graph``. Deterministic: same graph, same result.

    >>> import pandas as pd
    >>> from whatif.depgraph.graph import TaskGraph
    >>> tasks = pd.DataFrame({"kind": [0, 2, 4], "resource": [0, 1, 2], "rank": [0, 0, 0], "dur_ns": [0, 5, 100],
    ...                       "measured_start_ns": [1000, 1000, 1010]})
    >>> edges = pd.DataFrame({"src": [0, 1], "dst": [1, 2], "lat_ns": [0, 3], "kind": [0, 3]})
    >>> resources = pd.DataFrame({"ordered": [False, True, True]})
    >>> r = replay(TaskGraph(tasks=tasks, edges=edges, resources=resources, steps=pd.DataFrame()))
    >>> r.start_ns.tolist(), r.end_ns.tolist()
    ([1000, 1000, 1008], [1000, 1005, 1108])
    """
    result = _run(graph)
    given = graph.tasks["dur_ns"].to_numpy(np.int64)
    durations = given
    for i in range(MAX_PASSES):
        shared = shared_durations(graph, result.start_ns, result.end_ns, durations, tolerance=TOLERANCE if i else 0.0)
        if shared is None:
            break
        durations = shared
        result = _run(graph, durations)
    changed = np.flatnonzero(durations != given)
    if len(changed):   # the replay's graph holds the durations it ran with, and what they were priced at
        why = "compute kernels re-priced by the time they share the GPU with collectives (transforms/sharing.py)"
        priced = set_duration(graph, changed, durations[changed], transform="replay", reason=why)
        ref = settled(priced, result.start_ns, result.end_ns)
        ids = repriced(priced)
        ids = ids[ref[ids] != priced.tasks[SHARE_REF].to_numpy(dtype=float)[ids]]   # the fractions that moved
        result.graph = set_state(priced, ids, SHARE_REF, ref[ids], transform="replay",
                                 reason="their time beside collectives in this replay: what their durations are for")
    return result


def _run(graph: TaskGraph, dur_ns: np.ndarray | None = None) -> Replay:
    """One pass of the scheduler, with ``dur_ns`` instead of the graph's durations when given."""
    engine = ReplayEngine(graph, dur_ns=dur_ns)
    engine.run()
    result = engine.result()
    del engine
    release_freed_memory(len(result.start_ns))  # the engine's edge arrays and lists
    return result
