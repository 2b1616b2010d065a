"""Replay a task graph: a deterministic discrete-event list scheduler.

A task becomes ready when all its predecessors are done; it starts at
``max(end(u) + lat)`` over its start-bound in-edges and, on a shared resource (link, copy
engine, PIM unit), not before the resource is free; it ends at
``max(start + dur, max(end(u) + lat) over end-bound in-edges)`` (SYNC, LAUNCH_QUEUE:
:data:`~whatif.depgraph.graph.END_BOUND_EDGE_KINDS`). Ready tasks are taken from a heap
keyed ``(ready time, task id)``, so ties break the same way every run (simpy/vidur).
Only each rank's ORIGIN task takes its time from the trace; every other start is computed.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from whatif.depgraph.graph import END_BOUND_EDGE_KINDS, GraphError, TaskGraph, TaskKind
from whatif.tracer.kinds import codes

RESOURCE_BOUND = -2  # start_by value: the task waited for its shared resource, not for an edge


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
    t = graph.tasks
    n = len(t)
    e = graph.edges
    src = e["src"].to_numpy(np.int64)
    dst = e["dst"].to_numpy(np.int64)
    if len(src) and (src.max() >= n or dst.max() >= n or src.min() < 0 or dst.min() < 0):
        raise GraphError("an edge points to a task that does not exist")
    order = np.argsort(src, kind="stable")
    succ_ptr = np.concatenate(([0], np.cumsum(np.bincount(src, minlength=n)))).tolist()
    succ_dst = dst[order].tolist()
    succ_lat = e["lat_ns"].to_numpy(np.int64)[order].tolist()
    succ_sync = np.isin(e["kind"].to_numpy()[order], codes(END_BOUND_EDGE_KINDS)).tolist()
    succ_eid = order.tolist()
    indeg = np.bincount(dst, minlength=n).tolist()
    dur = t["dur_ns"].to_numpy(np.int64).tolist()
    res = t["resource"].to_numpy(np.int64)
    ordered = graph.resources["ordered"].to_numpy(bool) if len(graph.resources) else np.ones(0, bool)
    shared_task = (~ordered[res]).tolist() if len(ordered) else [False] * n
    kinds = t["kind"].to_numpy()
    is_origin = kinds == int(TaskKind.ORIGIN)
    shared_task = [s and not o for s, o in zip(shared_task, is_origin.tolist())]
    res_list = res.tolist()

    NEG = -(1 << 62)
    start_ready = [NEG] * n
    end_ready = [NEG] * n
    start_by = [-1] * n
    end_by = [-1] * n
    resource_prev = [-1] * n
    start = [0] * n
    end = [0] * n
    free: dict[int, int] = {}
    last_on: dict[int, int] = {}
    measured = t["measured_start_ns"].to_numpy(np.int64)
    ranks = t["rank"].to_numpy()
    origin_time = {int(r): int(m) for r, m in zip(ranks[is_origin], measured[is_origin])}
    default_origin = min(origin_time.values()) if origin_time else 0

    heap: list[tuple[int, int]] = []
    for v in np.flatnonzero(np.asarray(indeg) == 0).tolist():
        start_ready[v] = int(measured[v]) if is_origin[v] else origin_time.get(int(ranks[v]), default_origin)
        heap.append((start_ready[v], v))
    heapq.heapify(heap)
    done = 0
    pop, push = heapq.heappop, heapq.heappush
    while heap:
        ready, v = pop(heap)
        s = ready
        if shared_task[v]:
            r = res_list[v]
            f = free.get(r, NEG)
            if f > s:
                s = f
                start_by[v] = RESOURCE_BOUND
                resource_prev[v] = last_on[r]
        fin = s + dur[v]
        if end_ready[v] > fin:
            fin = end_ready[v]
        else:
            end_by[v] = -1
        if shared_task[v]:
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
                if start_ready[w] == NEG:  # only end-bound predecessors: it may start at its rank's origin
                    start_ready[w] = origin_time.get(int(ranks[w]), default_origin)
                push(heap, (start_ready[w], w))
    if done != n:
        stuck = next(i for i in range(n) if indeg[i] > 0)
        raise GraphError(f"the task graph has a cycle through task {stuck}")
    return Replay(graph=graph, start_ns=np.asarray(start, dtype=np.int64), end_ns=np.asarray(end, dtype=np.int64),
                  start_by=np.asarray(start_by, dtype=np.int64), end_by=np.asarray(end_by, dtype=np.int64),
                  resource_prev=np.asarray(resource_prev, dtype=np.int64))
