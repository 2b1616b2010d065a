"""Graph-transformation primitives (Daydream's Scale / Insert / Remove / Schedule, extended).

Every primitive is a free function ``f(graph, ..., reason=...) -> TaskGraph`` that returns a new
graph and never mutates its input, appends one :class:`~whatif.depgraph.graph.Change` to the
new graph's change log (named after the transform being applied, see :func:`applying`) and bumps
the graph's ``version`` (and ``structure_version`` when tasks are added, removed, renamed or
reclassified), which keys every memoized per-task fact. They are the only code that writes a
graph's tables (``tests/test_one_home.py`` checks). Task ids are positions in ``graph.tasks``;
primitives that delete tasks renumber the rest (the ``event`` column still points into the trace).

>>> import pandas as pd
>>> from whatif.depgraph.graph import TaskGraph
>>> tasks = pd.DataFrame({"kind": [0, 4, 4], "resource": [0, 1, 1], "rank": 0, "dur_ns": [0, 100, 50],
...                       "measured_start_ns": [0, 0, 100], "measured_end_ns": [0, 100, 150], "event": -1,
...                       "step": 0, "phase": None, "layer": None, "op": None, "name": ["origin", "a", "b"]})
>>> edges = pd.DataFrame({"src": [0, 1], "dst": [1, 2], "lat_ns": [0, 5], "kind": [0, 2]})
>>> g = TaskGraph(tasks=tasks, edges=edges, resources=pd.DataFrame({"kind": [2, 1], "ordered": [False, True]}),
...               steps=pd.DataFrame({"begin_task": [0], "end_task": [-1]}))
>>> h = scale(g, [1], 0.5, reason="faster gemm")
>>> h.tasks["dur_ns"].tolist(), g.tasks["dur_ns"].tolist()
([0, 50, 50], [0, 100, 50])
>>> str(h.changes[-1])
'scale: scale x0.5 1 tasks (-0.000 ms of task time): faster gemm'
>>> r = remove(g, [1], reason="gone")
>>> r.tasks["name"].tolist(), r.edges[["src", "dst", "lat_ns"]].values.tolist()
(['origin', 'b'], [[0, 1, 5]])
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from whatif.core import limits
from whatif.depgraph.graph import (
    END_BOUND_EDGE_KINDS,
    Change,
    ChangeTarget,
    EdgeKind,
    GraphError,
    ResourceKind,
    TaskGraph,
    TaskKind,
)
from whatif.depgraph.schema import DEVICE_COLUMN, FOLLOWS_COLUMN, FOLLOWS_GROUP_COLUMN
from whatif.tracer.kinds import codes

ORDER_KINDS = (int(EdgeKind.THREAD), int(EdgeKind.STREAM))
Tasks = Sequence[int] | np.ndarray


def _unique(a: np.ndarray) -> np.ndarray:
    """Sorted distinct values of an int array (sort-based: numpy 2.4's hash-based ``np.unique``
    is ~10x slower on 100k-element arrays)."""
    s = np.sort(np.asarray(a, dtype=np.int64), kind="stable")
    return s[np.r_[True, s[1:] != s[:-1]]] if len(s) else s


def _ids(graph: TaskGraph, tasks: Tasks | Iterable[int]) -> np.ndarray:
    ids = _unique(np.asarray(list(tasks) if not isinstance(tasks, np.ndarray) else tasks, dtype=np.int64))
    if len(ids) and (ids[0] < 0 or ids[-1] >= len(graph.tasks)):
        raise GraphError(f"task id out of range: {ids[0] if ids[0] < 0 else ids[-1]} "
                         f"(the graph has {len(graph.tasks)} tasks)")
    return ids


_APPLYING: ContextVar[str | None] = ContextVar("whatif_applying_transform", default=None)
CATEGORICAL_TEXT = ("phase", "layer", "op", "name")
"""Task columns stored as categoricals by the builder; a primitive that writes new values into
them turns them into plain object columns first."""


@contextmanager
def applying(transform: str, *, outer_wins: bool = False) -> Iterator[None]:
    """Name every change the primitives log inside the block after ``transform`` (every
    transform's ``apply`` runs inside it, so transforms never pass their name along). With
    ``outer_wins``, an enclosing block's name is kept.

    >>> with applying("reshard"), applying("tensor_parallel", outer_wins=True):
    ...     _transform_name("scale")
    'reshard'
    """
    current = _APPLYING.get()
    token = _APPLYING.set(current if outer_wins and current else transform)
    try:
        yield
    finally:
        _APPLYING.reset(token)


def outermost() -> bool:
    """Whether no transform's ``apply`` is running (one that runs now is not inside another's)."""
    return _APPLYING.get() is None


def _transform_name(primitive: str, explicit: str | None = None) -> str:
    return explicit or _APPLYING.get() or primitive


def _log(graph: TaskGraph, transform: str, action: str, n: int, before: int, after: int, reason: str,
         target: ChangeTarget = ChangeTarget.TASKS, *, structural: bool = False) -> None:
    graph.changes.append(Change(transform=transform, action=action, count=int(n), before_ns=int(before),
                                after_ns=int(after), reason=reason, target=target))
    graph.version += 1
    if structural:
        graph.structure_version += 1


def _text_columns_as_object(tasks: pd.DataFrame) -> None:
    for col in CATEGORICAL_TEXT:
        if col in tasks and isinstance(tasks[col].dtype, pd.CategoricalDtype):
            tasks[col] = tasks[col].astype(object)


def _order_kind_of_resource(graph: TaskGraph, resource: int) -> int:
    return int(EdgeKind.STREAM) if int(graph.resources["kind"].to_numpy()[resource]) == int(ResourceKind.STREAM) \
        else int(EdgeKind.THREAD)


def _edge_frame(src: Any, dst: Any, lat_ns: Any, kind: Any) -> pd.DataFrame:
    s = np.asarray(src, dtype=np.int64)
    return pd.DataFrame({"src": s, "dst": np.asarray(dst, dtype=np.int64),
                         "lat_ns": np.broadcast_to(np.asarray(lat_ns, dtype=np.int64), s.shape),
                         "kind": np.broadcast_to(np.asarray(kind, dtype=np.int8), s.shape)})


def durations_ns(values: Any) -> np.ndarray:
    """``values`` as int64 nanoseconds, refused unless every one is finite and within
    ``0..MAX_DURATION_NS`` (a factor of 1e308 or a NaN would otherwise wrap around int64).

    >>> durations_ns([1.4, 2]).tolist()
    [1, 2]
    >>> durations_ns([float("inf")])
    Traceback (most recent call last):
    whatif.depgraph.graph.GraphError: durations must be finite and within 0..2**60 ns (got inf)
    """
    arr = np.asarray(values)
    if arr.dtype.kind in "iub":
        bad = (arr < 0) | (arr > limits.MAX_DURATION_NS)
    else:
        arr = arr.astype(np.float64)
        bad = ~np.isfinite(arr) | (arr < 0) | (arr > limits.MAX_DURATION_NS)
    if bad.any():
        raise GraphError(f"durations must be finite and within 0..2**60 ns (got {arr[bad].flat[0].item()!r})")
    return np.rint(arr).astype(np.int64)


def set_duration(graph: TaskGraph, tasks: Tasks, dur_ns: float | np.ndarray, *, reason: str,
                 transform: str | None = None) -> TaskGraph:
    """Set the replay duration of ``tasks`` (one value, or one per task in sorted id order; rounded to
    whole ns, refused unless finite and within 0..2**60 ns: :func:`durations_ns`)."""
    ids = _ids(graph, tasks)
    out = graph.copy()
    new = np.broadcast_to(durations_ns(dur_ns), ids.shape)
    before = int(out.tasks["dur_ns"].to_numpy()[ids].sum())
    out.tasks.loc[ids, "dur_ns"] = new
    _log(out, _transform_name("set_duration", transform), "set duration of", len(ids), before, int(new.sum()), reason)
    return out


def scale(graph: TaskGraph, tasks: Tasks, factor: float | np.ndarray, *, reason: str,
          transform: str | None = None) -> TaskGraph:
    """Multiply the duration of ``tasks`` by ``factor`` (one value or one per task)."""
    ids = _ids(graph, tasks)
    factor_arr = np.asarray(factor, dtype=float)
    if (factor_arr < 0).any():
        raise GraphError("scale factors must be >= 0")
    dur = graph.tasks["dur_ns"].to_numpy()[ids]
    label = f"scale x{float(factor_arr):g}" if factor_arr.ndim == 0 else "scale"
    out = set_duration(graph, ids, dur * factor_arr, reason=reason, transform=transform)
    last = out.changes.pop()
    _log(out, _transform_name("scale", transform), label, last.count, last.before_ns, last.after_ns, reason)
    return out


def add_edges(graph: TaskGraph, src: Tasks, dst: Tasks, lat_ns: int | Sequence[int] = 0,
              kind: EdgeKind = EdgeKind.FLOW, *, reason: str, transform: str | None = None) -> TaskGraph:
    """Add dependencies ``src[i] -> dst[i]`` (``dst.start >= src.end + lat``; SYNC bounds the end)."""
    s = np.asarray(src, dtype=np.int64)
    d = np.asarray(dst, dtype=np.int64)
    if s.shape != d.shape:
        raise GraphError("src and dst must have the same length")
    _ids(graph, np.concatenate([s, d]))
    out = graph.copy()
    new = pd.DataFrame({"src": s, "dst": d, "lat_ns": np.broadcast_to(np.asarray(lat_ns, dtype=np.int64), s.shape),
                        "kind": np.full(len(s), int(kind), dtype=np.int8)})
    out.edges = pd.concat([out.edges, new], ignore_index=True)
    _log(out, _transform_name("add_edges", transform), f"add {EdgeKind(kind).name}", len(s), 0,
         int(new["lat_ns"].sum()), reason, ChangeTarget.EDGES)
    return out


def remove_edges(graph: TaskGraph, mask: np.ndarray, *, reason: str, transform: str | None = None) -> TaskGraph:
    """Drop the edges where ``mask`` (aligned with ``graph.edges``) is True."""
    mask = np.asarray(mask, dtype=bool)
    out = graph.copy()
    n = int(mask.sum())
    out.edges = out.edges[~mask].reset_index(drop=True)
    _log(out, _transform_name("remove_edges", transform), "remove", n,
         int(graph.edges["lat_ns"].to_numpy()[mask].sum()), 0, reason, ChangeTarget.EDGES)
    return out


def _order_kind(graph: TaskGraph, tasks: np.ndarray) -> np.ndarray:
    """STREAM for tasks on a GPU stream, THREAD otherwise: the order-edge kind of their resource."""
    res_kind = graph.resources["kind"].to_numpy()[graph.tasks["resource"].to_numpy()[tasks]]
    return np.where(res_kind == int(ResourceKind.STREAM), int(EdgeKind.STREAM), int(EdgeKind.THREAD)).astype(np.int8)


def _order_links(edges: pd.DataFrame, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per task: its order (thread/stream) predecessor and successor and those edges' latencies."""
    order = edges[edges["kind"].isin(ORDER_KINDS)]
    pred = np.full(n, -1, dtype=np.int64)
    pred_lat = np.zeros(n, dtype=np.int64)
    succ = np.full(n, -1, dtype=np.int64)
    succ_lat = np.zeros(n, dtype=np.int64)
    s, d, lat = order["src"].to_numpy(), order["dst"].to_numpy(), order["lat_ns"].to_numpy()
    pred[d], pred_lat[d] = s, lat
    succ[s], succ_lat[s] = d, lat
    return pred, pred_lat, succ, succ_lat


def _jump(start: np.ndarray, step: np.ndarray, step_lat: np.ndarray, removed: np.ndarray) -> tuple[np.ndarray,
                                                                                                   np.ndarray]:
    """From each node in ``start``: if it is removed, follow ``step`` until a surviving node,
    summing ``step_lat`` of the removed nodes passed; return (that node or -1, the sum).
    Synchronous pointer doubling: O(log chain length) vectorized passes.

    >>> step = np.array([-1, 0, 1, 2]); lat = np.array([0, 1, 2, 3]); gone = np.array([False, True, True, False])
    >>> [x.tolist() for x in _jump(np.array([2, 3, -1]), step, lat, gone)]
    [[0, 3, -1], [3, 0, 0]]
    """
    jump, acc = step.copy(), step_lat.copy()
    rem = np.flatnonzero(removed)
    while len(rem):
        j = jump[rem]
        need = (j >= 0) & removed[np.maximum(j, 0)]
        if not need.any():
            break
        x = rem[need]
        jx = jump[x]
        acc[x], jump[x] = acc[x] + acc[jx], jump[jx]
        rem = x
    valid = start >= 0
    is_removed = valid & removed[np.maximum(start, 0)]
    safe = np.maximum(start, 0)
    node = np.where(is_removed, jump[safe], start)
    total = np.where(is_removed, acc[safe], 0)
    return np.where(valid, node, -1), np.where(valid, total, 0)


def remove(graph: TaskGraph, tasks: Tasks, *, reason: str, transform: str | None = None) -> TaskGraph:
    """Delete ``tasks`` while keeping the order they enforced (Daydream's Remove).

    The time of a removed task disappears; the latencies around it (CPU gaps, stream idles)
    are kept: along a thread or stream, ``u -gap1-> v -gap2-> w`` becomes ``u -(gap1+gap2)-> w``;
    other edges into ``v`` move to its next surviving task on the same resource, edges out of
    ``v`` start from its previous surviving task; SYNC edges into ``v`` are dropped (a removed
    wait no longer waits). Step markers and origins cannot be removed.
    """
    ids = _ids(graph, tasks)
    kinds = graph.tasks["kind"].to_numpy()
    if np.isin(kinds[ids], [int(TaskKind.MARKER), int(TaskKind.ORIGIN)]).any():
        raise GraphError("step markers and origins cannot be removed")
    n = len(graph.tasks)
    removed = np.zeros(n, dtype=bool)
    removed[ids] = True
    e = graph.edges
    src, dst = e["src"].to_numpy(), e["dst"].to_numpy()
    lat, ekind = e["lat_ns"].to_numpy(), e["kind"].to_numpy()
    pred, pred_lat, succ, succ_lat = _order_links(e, n)
    is_order = np.isin(ekind, ORDER_KINDS)
    keep = ~removed[src] & ~removed[dst]
    new_src, new_dst, new_lat, new_kind = [src[keep]], [dst[keep]], [lat[keep]], [ekind[keep]]

    # Order edges: a surviving task whose order predecessor was removed links to the first
    # surviving predecessor, with the latencies in between summed.
    w = np.flatnonzero(~removed & (pred >= 0) & removed[np.maximum(pred, 0)])
    p, acc = _jump(pred[w], pred, pred_lat, removed)
    ok = p >= 0
    new_src.append(p[ok])
    new_dst.append(w[ok])
    new_lat.append(acc[ok] + pred_lat[w][ok])
    new_kind.append(_order_kind(graph, w[ok]))

    # Other edges into a removed task move forward to its next surviving task on the resource.
    into = ~is_order & removed[dst] & ~removed[src] & ~np.isin(ekind, codes(END_BOUND_EDGE_KINDS))
    fwd, fwd_acc = _jump(dst[into], succ, succ_lat, removed)
    ok = fwd >= 0
    new_src.append(src[into][ok])
    new_dst.append(fwd[ok])
    new_lat.append(lat[into][ok] + fwd_acc[ok])
    new_kind.append(ekind[into][ok])
    # Edges out of a removed task start from its previous surviving task on the resource.
    out_mask = ~is_order & removed[src] & ~removed[dst]
    back, back_acc = _jump(src[out_mask], pred, pred_lat, removed)
    ok = back >= 0
    new_src.append(back[ok])
    new_dst.append(dst[out_mask][ok])
    new_lat.append(lat[out_mask][ok] + back_acc[ok])
    new_kind.append(ekind[out_mask][ok])

    out = graph.copy()
    before = int(graph.tasks["dur_ns"].to_numpy()[ids].sum())
    remap = np.cumsum(~removed) - 1
    out.tasks = graph.tasks[~removed].reset_index(drop=True)
    edges = pd.DataFrame({"src": remap[np.concatenate(new_src)], "dst": remap[np.concatenate(new_dst)],
                          "lat_ns": np.concatenate(new_lat).astype(np.int64),
                          "kind": np.concatenate(new_kind).astype(np.int8)})
    out.edges = edges.drop_duplicates().reset_index(drop=True)
    steps = out.steps.copy()
    if len(steps):
        steps["begin_task"] = remap[steps["begin_task"].to_numpy()]
        end = steps["end_task"].to_numpy()
        steps["end_task"] = np.where(end >= 0, remap[np.maximum(end, 0)], -1)
    out.steps = steps
    _log(out, _transform_name("remove", transform), "remove", len(ids), before, 0, reason, structural=True)
    return out


def insert(graph: TaskGraph, *, name: str, kind: TaskKind, resource: int, dur_ns: int,
           after: Iterable[int] = (), before: Iterable[int] = (), lat_ns: int = 0, splice_after: int | None = None,
           step: int | None = None, reason: str, transform: str | None = None) -> tuple[TaskGraph, int]:
    """Add one task; return the new graph and the new task's id.

    ``after``/``before``: tasks it depends on / that depend on it (edges of kind FLOW, latency
    ``lat_ns`` on the incoming ones). ``splice_after``: a task on the same ordered resource after
    which the new task runs; the resource's order edge out of it is split around the new task.
    """
    dur_ns = int(durations_ns(dur_ns))
    if not 0 <= resource < len(graph.resources):
        raise GraphError(f"resource {resource} does not exist")
    out = graph.copy()
    new_id = len(out.tasks)
    anchor_rank = int(out.resources["rank"].to_numpy()[resource]) if "rank" in out.resources else 0
    row: dict[str, Any] = {c: np.nan if pd.api.types.is_float_dtype(out.tasks[c].dtype) else None
                           for c in out.tasks.columns}
    row.update(event=-1, kind=int(kind), resource=resource, rank=anchor_rank, dur_ns=int(dur_ns),
               measured_start_ns=-1, measured_end_ns=-1, step=-1 if step is None else step, name=name)
    _text_columns_as_object(out.tasks)
    out.tasks = pd.concat([out.tasks, pd.DataFrame([row])], ignore_index=True)
    src, dst, lats, kinds = [], [], [], []
    for a in after:
        src.append(int(a))
        dst.append(new_id)
        lats.append(lat_ns)
        kinds.append(int(EdgeKind.FLOW))
    for b in before:
        src.append(new_id)
        dst.append(int(b))
        lats.append(0)
        kinds.append(int(EdgeKind.FLOW))
    edges = out.edges
    if splice_after is not None:
        order_kind = _order_kind_of_resource(out, resource)
        out_edge = (edges["src"] == splice_after) & edges["kind"].isin(ORDER_KINDS)
        if out_edge.any():
            i = int(np.flatnonzero(out_edge.to_numpy())[0])
            nxt, gap = int(edges["dst"].to_numpy()[i]), int(edges["lat_ns"].to_numpy()[i])
            edges = edges.drop(index=edges.index[i])
            src += [int(splice_after), new_id]
            dst += [new_id, nxt]
            lats += [gap, 0]
            kinds += [order_kind, order_kind]
        else:
            src.append(int(splice_after))
            dst.append(new_id)
            lats.append(0)
            kinds.append(order_kind)
    if not src:
        origin = np.flatnonzero((out.tasks["kind"].to_numpy() == int(TaskKind.ORIGIN))
                                & (out.tasks["rank"].to_numpy() == anchor_rank))
        if len(origin):
            src.append(int(origin[0]))
            dst.append(new_id)
            lats.append(0)
            kinds.append(int(EdgeKind.ANCHOR))
    add = pd.DataFrame({"src": np.asarray(src, dtype=np.int64), "dst": np.asarray(dst, dtype=np.int64),
                        "lat_ns": np.asarray(lats, dtype=np.int64), "kind": np.asarray(kinds, dtype=np.int8)})
    out.edges = pd.concat([edges, add], ignore_index=True)
    _log(out, _transform_name("insert", transform), "insert", 1, 0, int(dur_ns), reason, structural=True)
    return out, new_id


def _merge_float_columns(tasks: pd.DataFrame, ids: np.ndarray, g_of: np.ndarray, heads: np.ndarray) -> None:
    """A fused task's per-task numbers (the analysis' annotations: fractions and factors) are its
    members' mean weighted by their durations; NaN when a member has none."""
    dur = tasks["dur_ns"].to_numpy(dtype=float)[ids]
    weight = np.bincount(g_of, weights=dur)
    count = np.bincount(g_of).astype(float)
    for col in [c for c in tasks.columns if pd.api.types.is_float_dtype(tasks[c].dtype)]:
        v = tasks[col].to_numpy(dtype=float)[ids]
        weighted = np.bincount(g_of, weights=np.nan_to_num(v) * dur)
        plain = np.bincount(g_of, weights=np.nan_to_num(v))
        merged = np.where(weight > 0, weighted / np.maximum(weight, 1e-300), plain / count)
        missing = np.bincount(g_of, weights=np.isnan(v).astype(float)) > 0
        tasks.loc[heads, col] = np.where(missing, np.nan, merged)


def fuse(graph: TaskGraph, tasks: Tasks, dur_ns: int | np.ndarray, *, name: str | Sequence[str] | None = None,
         drop_launches: bool = True, groups: Sequence[int] | np.ndarray | None = None, reason: str,
         transform: str | None = None) -> TaskGraph:
    """Fuse ``tasks`` (on one ordered resource) into the first of them, which takes ``dur_ns``.

    The others are removed; edges that reached them from outside the set now reach the fused
    task, and edges that left them leave it. With ``drop_launches``, the launch calls of the
    other members are removed too (one launch instead of many). ``groups`` (a label per task,
    aligned with ``tasks``) fuses several disjoint sets in one pass, each into its first task;
    ``dur_ns`` and ``name`` are then one value or one per group in sorted label order.
    """
    ids_in = np.asarray(list(tasks) if not isinstance(tasks, np.ndarray) else tasks, dtype=np.int64)
    labels = np.zeros(len(ids_in), dtype=np.int64) if groups is None else np.asarray(groups)
    if labels.shape != ids_in.shape:
        raise GraphError("groups must give one label per task")
    _, gidx = np.unique(labels, return_inverse=True)
    order = np.lexsort((ids_in, gidx))
    ids, g_of = ids_in[order], gidx[order]
    if len(_ids(graph, ids)) != len(ids):
        raise GraphError("a task can be fused into one group only")
    first = np.r_[True, g_of[1:] != g_of[:-1]] if len(ids) else np.zeros(0, dtype=bool)
    heads = ids[first]
    if len(ids) == 0 or (np.bincount(g_of) < 2).any():
        raise GraphError("fuse needs at least two tasks")
    res = graph.tasks["resource"].to_numpy()
    if (res[ids] != res[heads][g_of]).any():
        raise GraphError("fused tasks must run on one resource")
    n = len(graph.tasks)
    head_of = np.full(n, -1, dtype=np.int64)
    head_of[ids] = heads[g_of]
    other = np.zeros(n, dtype=bool)
    other[ids[~first]] = True
    durs = np.broadcast_to(np.asarray(dur_ns, dtype=np.int64), heads.shape)
    before = int(graph.tasks["dur_ns"].to_numpy()[ids].sum())
    e = graph.edges
    src, dst, ekind = e["src"].to_numpy(), e["dst"].to_numpy(), e["kind"].to_numpy()
    launches = ekind == int(EdgeKind.LAUNCH)
    if drop_launches:  # calls whose every launch reaches a member that goes away
        calls, to_other = src[launches], other[dst[launches]]
        keep_call = np.zeros(n, dtype=bool)
        keep_call[calls[~to_other]] = True
        drop_calls = np.setdiff1d(calls[to_other], np.flatnonzero(keep_call))
    else:
        drop_calls = np.empty(0, np.int64)
    dropped_launch = launches & other[dst] & drop_launches
    # Edges from outside into other members -> head; from other members to outside -> from head.
    new = e.copy()
    internal = (head_of[src] >= 0) & (head_of[src] == head_of[dst])
    into = other[dst] & ~internal & ~dropped_launch
    new.loc[into, "dst"] = head_of[dst[into]]
    leave = other[src] & ~internal
    new.loc[leave, "src"] = head_of[src[leave]]
    new = new[~internal & ~dropped_launch]
    staged = graph.copy()
    staged.edges = new.reset_index(drop=True)
    _merge_float_columns(staged.tasks, ids, g_of, heads)
    staged.tasks.loc[heads, "dur_ns"] = durs
    if name is not None:
        _text_columns_as_object(staged.tasks)
        staged.tasks.loc[heads, "name"] = name
    out = remove(staged, np.concatenate([ids[~first], drop_calls]).astype(np.int64), reason=reason,
                 transform=transform)
    out.changes.pop()
    _log(out, _transform_name("fuse", transform),
         f"fuse {len(ids)} tasks into {len(heads)} (and drop {len(drop_calls)} launches) for",
         len(ids), before, int(durs.sum()), reason, structural=True)
    return out


def move(graph: TaskGraph, tasks: Tasks, resource: int, *, reason: str, transform: str | None = None) -> TaskGraph:
    """Move ``tasks`` to another ordered resource (a stream, a thread): they leave their old
    chains (which close up around them) and join the new one in measured start order."""
    ids = _ids(graph, tasks)
    if not 0 <= resource < len(graph.resources):
        raise GraphError(f"resource {resource} does not exist")
    t = graph.tasks
    n = len(t)
    moved = np.zeros(n, dtype=bool)
    moved[ids] = True
    e = graph.edges
    is_order = e["kind"].isin(ORDER_KINDS).to_numpy()
    pred, pred_lat, _succ, _succ_lat = _order_links(e, n)
    src, dst = e["src"].to_numpy(), e["dst"].to_numpy()
    # close up the old chains: a staying task whose order pred moved links to the first staying pred
    w = np.flatnonzero(~moved & (pred >= 0) & moved[np.maximum(pred, 0)])
    p, acc = _jump(pred[w], pred, pred_lat, moved)
    keep = ~(is_order & (moved[src] | moved[dst]))
    kinds_keep = e[keep]
    old_kind = _order_kind(graph, w)
    closed = pd.DataFrame({"src": p[p >= 0], "dst": w[p >= 0], "lat_ns": (acc + pred_lat[w])[p >= 0],
                           "kind": old_kind[p >= 0].astype(np.int8)})
    # join the new chain by measured start (tasks a transform inserted sort by id at the end)
    out = graph.copy()
    out.tasks.loc[ids, "resource"] = resource
    on_new = np.flatnonzero(out.tasks["resource"].to_numpy() == resource)
    start = out.tasks["measured_start_ns"].to_numpy()[on_new]
    order = on_new[np.lexsort((on_new, np.where(start < 0, np.iinfo(np.int64).max, start)))]
    new_kind = int(_order_kind(out, on_new[:1])[0]) if len(on_new) else int(EdgeKind.THREAD)
    rest = pd.concat([kinds_keep, closed], ignore_index=True)
    rest = rest[~(rest["kind"].isin(ORDER_KINDS) & np.isin(rest["dst"], on_new) & np.isin(rest["src"], on_new))]
    chain = pd.DataFrame({"src": order[:-1], "dst": order[1:], "lat_ns": 0, "kind": new_kind})
    out.edges = pd.concat([rest, chain.astype({"lat_ns": np.int64, "kind": np.int8})], ignore_index=True)
    _log(out, _transform_name("move", transform), f"move to {graph.resources['name'].iat[resource]}", len(ids),
         int(t["dur_ns"].to_numpy()[ids].sum()), int(t["dur_ns"].to_numpy()[ids].sum()), reason)
    return out


def duplicate(graph: TaskGraph, tasks: Tasks, *, measured: bool = True, reason: str,
              transform: str | None = None) -> tuple[TaskGraph, np.ndarray]:
    """Copy ``tasks`` and the edges among them (a subgraph), return the graph and the new ids
    (aligned with the sorted input ids). Edges from outside into the subgraph are copied too,
    so the copy depends on what the original depended on; nothing depends on the copy yet.
    ``measured=False`` marks the copies as modeled (no measured times), like inserted tasks."""
    ids = _ids(graph, tasks)
    out = graph.copy()
    base = len(out.tasks)
    new_ids = np.arange(base, base + len(ids), dtype=np.int64)
    mapping = np.full(base, -1, dtype=np.int64)
    mapping[ids] = new_ids
    _text_columns_as_object(out.tasks)
    copies = out.tasks.iloc[ids].copy()
    if not measured:
        copies["measured_start_ns"] = -1
        copies["measured_end_ns"] = -1
    out.tasks = pd.concat([out.tasks, copies], ignore_index=True)
    e = out.edges
    d_in = mapping[e["dst"].to_numpy()] >= 0
    copy = e[d_in].copy()
    s_map = mapping[copy["src"].to_numpy()]
    copy["src"] = np.where(s_map >= 0, s_map, copy["src"].to_numpy())
    copy["dst"] = mapping[copy["dst"].to_numpy()]
    out.edges = pd.concat([e, copy], ignore_index=True)
    _log(out, _transform_name("duplicate", transform), "duplicate", len(ids), 0,
         int(out.tasks["dur_ns"].to_numpy()[new_ids].sum()), reason, structural=True)
    return out, new_ids


@dataclass(frozen=True)
class NewEdges:
    """Edges to add with :func:`insert_many`: ``src``/``dst`` are task ids, where a negative
    value ``-1 - i`` names the i-th new task (so edges can reach tasks that do not exist yet)."""

    src: Sequence[int] | np.ndarray
    dst: Sequence[int] | np.ndarray
    lat_ns: int | Sequence[int] | np.ndarray = 0
    kind: EdgeKind | Sequence[int] | np.ndarray = EdgeKind.FLOW


def new_task(i: int | np.ndarray) -> Any:
    """How :class:`NewEdges` names the i-th task :func:`insert_many` adds.

    >>> new_task(0), new_task(np.array([1, 2])).tolist()
    (-1, [-2, -3])
    """
    return -1 - i


def insert_many(graph: TaskGraph, *, kind: TaskKind | Sequence[int] | np.ndarray,
                resource: int | Sequence[int] | np.ndarray, dur_ns: Sequence[int] | np.ndarray,
                names: Sequence[str], attribute_from: Sequence[int] | np.ndarray | None = None,
                edges: NewEdges | None = None, drop_edges: np.ndarray | None = None, action: str = "insert",
                reason: str, transform: str | None = None) -> tuple[TaskGraph, np.ndarray]:
    """Add many tasks at once; return the new graph and their ids (in input order).

    Task ``i`` runs on ``resource`` (one value or one per task) for ``dur_ns[i]``. It takes its
    step, phase, layer, op and the GPU it is priced on (``cost_device``: a part of a moved kernel
    runs where the kernel does) from task ``attribute_from[i]`` (-1: none) and its rank from its
    resource. ``edges`` (see :class:`NewEdges`) connect the new tasks among themselves and to the
    graph; ``drop_edges`` (a mask over ``graph.edges``) removes edges they replace, e.g. the order
    edge a chain of new tasks is spliced into. A task with no incoming edge is anchored to its
    rank's origin.

    >>> import pandas as pd
    >>> g = TaskGraph(tasks=pd.DataFrame({"event": [-1, 0], "kind": [0, 4], "resource": [0, 1], "rank": 0,
    ...                                   "dur_ns": [0, 100], "measured_start_ns": [0, 0], "measured_end_ns": [0, 100],
    ...                                   "step": 0, "phase": None, "layer": None, "op": None, "name": ["o", "k"]}),
    ...               edges=pd.DataFrame({"src": [0], "dst": [1], "lat_ns": [0], "kind": [0]}),
    ...               resources=pd.DataFrame({"rank": [0, 0], "kind": [2, 1], "ordered": [False, True]}),
    ...               steps=pd.DataFrame())
    >>> h, ids = insert_many(g, kind=TaskKind.KERNEL, resource=1, dur_ns=[5, 7], names=["a", "b"],
    ...                      attribute_from=[1, 1], edges=NewEdges(src=[1, new_task(0)], dst=[new_task(0), new_task(1)],
    ...                                                           kind=EdgeKind.STREAM), reason="demo")
    >>> ids.tolist(), h.edges[["src", "dst"]].values.tolist()
    ([2, 3], [[0, 1], [1, 2], [2, 3]])
    """
    dur = durations_ns(dur_ns)
    n_new = len(dur)
    if len(names) != n_new:
        raise GraphError("insert_many needs one name per task")
    res = np.broadcast_to(np.asarray(resource, dtype=np.int64), dur.shape)
    if n_new and (res.min() < 0 or res.max() >= len(graph.resources)):
        raise GraphError(f"resource {int(res.max() if res.max() >= len(graph.resources) else res.min())} "
                         f"does not exist")
    out = graph.copy()
    t = out.tasks
    base = len(t)
    ids = np.arange(base, base + n_new, dtype=np.int64)
    src_of = np.full(n_new, -1, dtype=np.int64) if attribute_from is None \
        else np.asarray(attribute_from, dtype=np.int64)
    if len(src_of) != n_new:
        raise GraphError("attribute_from needs one task per new task")
    has = src_of >= 0
    rows = np.where(has, src_of, 0)
    _text_columns_as_object(t)
    new = pd.DataFrame({c: np.full(n_new, np.nan) if pd.api.types.is_float_dtype(t[c].dtype)
                        else np.full(n_new, None, dtype=object) for c in t.columns})   # a number per task: NaN
    new["event"] = -1
    new["kind"] = np.broadcast_to(np.asarray(kind, dtype=np.int64), dur.shape)
    new["resource"] = res
    new["rank"] = out.resources["rank"].to_numpy()[res] if "rank" in out.resources else 0
    new["dur_ns"] = dur
    new["measured_start_ns"] = -1
    new["measured_end_ns"] = -1
    new["step"] = np.where(has, t["step"].to_numpy()[rows], -1)
    for c in ("phase", "layer", "op", DEVICE_COLUMN):
        if c in t:
            inherited = t[c].to_numpy(dtype=object)[rows]
            inherited[~has] = None
            new[c] = inherited
    new["name"] = list(names)
    out.tasks = pd.concat([t, new.astype({c: t[c].dtype for c in ("event", "kind", "resource", "rank", "dur_ns",
                                                                    "measured_start_ns", "measured_end_ns", "step")
                                          if c in t})], ignore_index=True) if n_new else t
    kept = out.edges if drop_edges is None else out.edges[~np.asarray(drop_edges, dtype=bool)]
    parts = [kept]
    if edges is not None:
        add = _edge_frame(edges.src, edges.dst, edges.lat_ns, edges.kind)
        for col in ("src", "dst"):
            v = add[col].to_numpy()
            add[col] = np.where(v < 0, base + (-1 - v), v)
        if len(add) and (add[["src", "dst"]].to_numpy() >= base + n_new).any():
            raise GraphError("an edge names a task that does not exist")
        parts.append(add)
    all_edges = pd.concat(parts, ignore_index=True)
    if n_new:
        fed = np.zeros(n_new, dtype=bool)
        d = all_edges["dst"].to_numpy()
        fed[d[d >= base] - base] = True
        origins = out.tasks["kind"].to_numpy() == int(TaskKind.ORIGIN)
        origin_of = {int(r): int(i) for i, r in zip(np.flatnonzero(origins), out.tasks["rank"].to_numpy()[origins])}
        loose = [(origin_of[int(r)], int(i)) for i, r, f in zip(ids, new["rank"], fed) if not f and int(r) in origin_of]
        if loose:
            all_edges = pd.concat([all_edges, _edge_frame([a for a, _ in loose], [b for _, b in loose], 0,
                                                          int(EdgeKind.ANCHOR))], ignore_index=True)
    out.edges = all_edges
    on = f" on {out.resources['name'].iat[int(res[0])]}" if n_new and "name" in out.resources \
        and (res == res[0]).all() else ""
    _log(out, _transform_name("insert_many", transform), f"{action}{on}", n_new, 0, int(dur.sum()), reason,
         structural=True)
    return out, ids


def splice_tasks(graph: TaskGraph, *, anchors: Sequence[int], durs: Sequence[Sequence[int]], name: str,
                 deps: Sequence[Sequence[int]], reason: str,
                 kind: TaskKind = TaskKind.KERNEL) -> tuple[TaskGraph, list[np.ndarray]]:
    """After each ``anchors[i]`` on its ordered resource, splice a chain of new tasks with
    durations ``durs[i]``; the j-th new task also depends on ``deps[i][j]`` (FLOW, -1: none).
    Returns the graph and, per anchor, the new ids."""
    t, e = graph.tasks, graph.edges
    order = e["kind"].isin([int(EdgeKind.STREAM), int(EdgeKind.THREAD)]).to_numpy()
    src_e, dst_e, lat_e = e["src"].to_numpy(), e["dst"].to_numpy(), e["lat_ns"].to_numpy()
    res_kind = graph.resources["kind"].to_numpy()
    drop = np.zeros(len(e), dtype=bool)
    src: list[int] = []
    dst: list[int] = []
    lat: list[int] = []
    kinds: list[int] = []
    all_dur: list[int] = []
    names: list[str] = []
    resources: list[int] = []
    attribute: list[int] = []
    per_anchor: list[np.ndarray] = []
    for a, ds, dep in zip(anchors, durs, deps):
        first = len(all_dur)
        per_anchor.append(np.arange(first, first + len(ds), dtype=np.int64))
        if not len(ds):
            continue
        res = int(t["resource"].to_numpy()[a])
        okind = int(EdgeKind.STREAM) if int(res_kind[res]) == int(ResourceKind.STREAM) else int(EdgeKind.THREAD)
        chain = [int(a), *(new_task(first + j) for j in range(len(ds)))]
        gaps = [0] * len(ds)
        hit = np.flatnonzero(order & (src_e == a))
        if len(hit):
            drop[hit[0]] = True
            chain.append(int(dst_e[hit[0]]))
            gaps.append(int(lat_e[hit[0]]))
        src += chain[:-1]
        dst += chain[1:]
        lat += gaps
        kinds += [okind] * (len(chain) - 1)
        for j, d in enumerate(ds):
            all_dur.append(int(d))
            names.append(f"{name} {j + 1}/{len(ds)}")
            resources.append(res)
            attribute.append(int(a))
            if dep[j] >= 0:
                src.append(int(dep[j]))
                dst.append(new_task(first + j))
                lat.append(0)
                kinds.append(int(EdgeKind.FLOW))
    if not all_dur:
        return graph, per_anchor
    out, ids = insert_many(graph, kind=kind, resource=np.asarray(resources, dtype=np.int64), dur_ns=all_dur,
                           names=names, attribute_from=attribute, edges=NewEdges(src, dst, lat, kinds),
                           drop_edges=drop, action="splice", reason=reason)
    return out, [ids[p] for p in per_anchor]


def add_resource(graph: TaskGraph, *, rank: int, kind: ResourceKind, name: str, device: int = -1,
                 ordered: bool = True, reason: str, transform: str | None = None) -> tuple[TaskGraph, int]:
    """Add a resource (a stream, a link, a copy engine, a PIM unit); return the graph and its id.
    Ordered resources run their tasks in edge order, shared ones in ready-time order.

    >>> g = TaskGraph(tasks=pd.DataFrame(), edges=pd.DataFrame(), steps=pd.DataFrame(),
    ...               resources=pd.DataFrame({"rank": [0], "kind": [1], "device": [0], "key": [7], "name": ["s7"],
    ...                                       "ordered": [True]}))
    >>> h, rid = add_resource(g, rank=0, kind=ResourceKind.LINK, name="NVLink", ordered=False, reason="demo")
    >>> rid, h.resources["name"].tolist(), h.resources["key"].tolist()
    (1, ['s7', 'NVLink'], [7, -2])
    """
    out = graph.copy()
    res = out.resources
    row = {"rank": int(rank), "kind": int(kind), "device": int(device), "key": -1 - len(res), "name": name,
           "ordered": bool(ordered)}
    out.resources = pd.concat([res, pd.DataFrame([row])], ignore_index=True)
    _log(out, _transform_name("add_resource", transform), f"add {ResourceKind(kind).name} {name!r}", 1, 0, 0,
         reason, ChangeTarget.RESOURCES)
    return out, len(res)


def set_edge_latency(graph: TaskGraph, edges: np.ndarray, lat_ns: int | np.ndarray, *, reason: str,
                     action: str = "set latency of", transform: str | None = None) -> TaskGraph:
    """Set the latency of the edges selected by ``edges`` (a mask over ``graph.edges``, or edge
    row ids) to ``lat_ns`` (one value or one per selected edge)."""
    e = graph.edges
    sel = np.flatnonzero(edges) if np.asarray(edges).dtype == bool else np.asarray(edges, dtype=np.int64)
    new = np.broadcast_to(np.asarray(lat_ns, dtype=np.int64), sel.shape)
    if (new < 0).any():
        raise GraphError("edge latencies must be >= 0 ns")
    out = graph.copy()
    before = int(e["lat_ns"].to_numpy()[sel].sum())
    lat = out.edges["lat_ns"].to_numpy().copy()
    lat[sel] = new
    out.edges["lat_ns"] = lat
    _log(out, _transform_name("set_edge_latency", transform), action, len(sel), before, int(new.sum()), reason,
         ChangeTarget.EDGES)
    return out


def scale_edge_latency(graph: TaskGraph, edges: np.ndarray, factor: float | np.ndarray, *, reason: str,
                       transform: str | None = None) -> TaskGraph:
    """Multiply the latency of the selected edges (mask or row ids) by ``factor``.

    >>> g = TaskGraph(tasks=pd.DataFrame(), resources=pd.DataFrame(), steps=pd.DataFrame(),
    ...               edges=pd.DataFrame({"src": [0, 1], "dst": [1, 2], "lat_ns": [1000, 400], "kind": [1, 1]}))
    >>> h = scale_edge_latency(g, np.array([True, False]), 0.5, reason="faster CPU")
    >>> h.edges["lat_ns"].tolist(), str(h.changes[-1])
    ([500, 400], 'scale_edge_latency: scale latency x0.5 of 1 edges (-0.001 ms of edge latency): faster CPU')
    """
    f = np.asarray(factor, dtype=float)
    if (f < 0).any():
        raise GraphError("scale factors must be >= 0")
    sel = np.flatnonzero(edges) if np.asarray(edges).dtype == bool else np.asarray(edges, dtype=np.int64)
    new = durations_ns(graph.edges["lat_ns"].to_numpy()[sel] * f)
    label = f"scale latency x{float(f):g} of" if f.ndim == 0 else "scale latency of"
    return set_edge_latency(graph, sel, new, reason=reason, action=label,
                            transform=_transform_name("scale_edge_latency", transform))


def rename(graph: TaskGraph, tasks: Tasks, names: str | Sequence[str], *, reason: str,
           transform: str | None = None) -> TaskGraph:
    """Give ``tasks`` (sorted ids) new names (one, or one per task)."""
    ids = _ids(graph, tasks)
    out = graph.copy()
    _text_columns_as_object(out.tasks)
    out.tasks.loc[ids, "name"] = names if isinstance(names, str) else list(names)
    _log(out, _transform_name("rename", transform), "rename", len(ids), 0, 0, reason, structural=True)
    return out


def reclassify(graph: TaskGraph, tasks: Tasks, kind: TaskKind, *, reason: str,
               transform: str | None = None) -> TaskGraph:
    """Change the :class:`TaskKind` of ``tasks``."""
    ids = _ids(graph, tasks)
    out = graph.copy()
    out.tasks.loc[ids, "kind"] = int(kind)
    _log(out, _transform_name("reclassify", transform), f"make {TaskKind(kind).name}", len(ids), 0, 0, reason,
         structural=True)
    return out


def set_state(graph: TaskGraph, tasks: Tasks, column: str, values: Any, *, reason: str,
              transform: str | None = None) -> TaskGraph:
    """Record per-task state that cost models read (``cost_precision``, ``cost_device``): set
    ``column`` of ``tasks`` (sorted ids) to ``values`` (one, or one per task); other tasks keep
    theirs (None where the column is new; NaN where it is new and ``values`` are numbers)."""
    ids = _ids(graph, tasks)
    out = graph.copy()
    if column not in out.tasks and np.asarray(values).dtype.kind in "fiu":
        col = np.full(len(out.tasks), np.nan)
    elif column in out.tasks and pd.api.types.is_float_dtype(out.tasks[column].dtype):
        col = out.tasks[column].to_numpy(dtype=float).copy()   # a number per task stays one
    elif column in out.tasks and pd.api.types.is_integer_dtype(out.tasks[column].dtype) \
            and np.asarray(values).dtype.kind in "iu":
        col = out.tasks[column].to_numpy().copy()   # an integer column (a task's trace row) stays one
    else:
        col = out.tasks[column].to_numpy(dtype=object).copy() if column in out.tasks \
            else np.full(len(out.tasks), None, dtype=object)
    col[ids] = values
    out.tasks[column] = col
    _log(out, _transform_name("set_state", transform), f"set {column} of", len(ids), 0, 0, reason)
    return out


def set_follows(graph: TaskGraph, tasks: Tasks, factor: float | np.ndarray, *, reason: str,
                of: Sequence[Sequence[int]] | None = None, transform: str | None = None) -> TaskGraph:
    """Make ``tasks`` (sorted ids of derived tasks: a pipeline bubble, an overlap's later
    nano-batches) last ``factor`` (one, or one per task) times the kernels they follow, now and
    after every later transform (:func:`follow_kernels`), so that a wait or a copy of work moves
    with the work it derives from. ``of``: per task, the kernels it follows (tasks given the same
    kernels share them; a kernel follows no task and is followed by one group at most); None:
    the kernels of its rank and step, other than such tasks.

    Raises
    ------
    GraphError
        When a task of ``of`` already belongs to another group, or is itself a follower.

    >>> import pandas as pd
    >>> from whatif.depgraph.graph import TaskGraph, TaskKind
    >>> g = TaskGraph(tasks=pd.DataFrame({"kind": [int(TaskKind.KERNEL)] * 4, "rank": 0, "step": 0,
    ...                                   "dur_ns": [100, 300, 0, 0]}), edges=pd.DataFrame(),
    ...               resources=pd.DataFrame(), steps=pd.DataFrame())
    >>> g = set_follows(g, [2], 2.0, of=[[0]], reason="a copy of kernel 0, twice as long")
    >>> g = set_follows(g, [3], 0.5, reason="a bubble: half the step's kernels")
    >>> set_duration(g, [0, 1], [50, 150], reason="twice as fast").tasks["dur_ns"].tolist()
    [50, 150, 200, 300]
    >>> follow_kernels(set_duration(g, [0, 1], [50, 150], reason="twice as fast")).tasks["dur_ns"].tolist()
    [50, 150, 100, 150]
    """
    ids = _ids(graph, tasks)
    out = graph.copy()
    factors, groups = _float_column(out.tasks, FOLLOWS_COLUMN), _float_column(out.tasks, FOLLOWS_GROUP_COLUMN)
    factors[ids] = factor
    if of is not None:
        if len(of) != len(ids):
            raise GraphError(f"set_follows: {len(ids)} tasks but {len(of)} lists of kernels they follow")
        known: dict[tuple[int, ...], int] = {}
        next_group = int(np.nanmax(groups)) + 1 if np.isfinite(groups).any() else 0
        for task, kernels in zip(ids.tolist(), of):
            key = tuple(sorted(int(k) for k in kernels))
            if key not in known:
                followed = np.asarray(key, dtype=np.int64)
                if np.isfinite(groups[followed]).any() or np.isfinite(factors[followed]).any():
                    raise GraphError("set_follows: a followed kernel already belongs to a group or follows one")
                known[key] = next_group
                groups[followed] = next_group
                next_group += 1
            groups[task] = known[key]
    out.tasks[FOLLOWS_COLUMN] = factors
    out.tasks[FOLLOWS_GROUP_COLUMN] = groups
    _log(out, _transform_name("set_state", transform), f"set {FOLLOWS_COLUMN} of", len(ids), 0, 0, reason)
    return follow_kernels(out, transform=transform)


def _float_column(tasks: pd.DataFrame, column: str) -> np.ndarray:
    """A copy of a float state column of ``tasks`` (NaN throughout where it does not exist yet)."""
    return tasks[column].to_numpy(dtype=float).copy() if column in tasks else np.full(len(tasks), np.nan)


def follow_kernels(graph: TaskGraph, transform: str | None = None) -> TaskGraph:
    """``graph`` with each task of :func:`set_follows` at its factor times the kernels it follows
    now: first those that follow a group (which the rank and step's sum then includes), then those
    of rank and step (the graph itself when none has changed)."""
    if FOLLOWS_COLUMN not in graph.tasks:
        return graph
    t = graph.tasks
    factor = t[FOLLOWS_COLUMN].to_numpy(dtype=float)
    group = t[FOLLOWS_GROUP_COLUMN].to_numpy(dtype=float)
    dur = t["dur_ns"].to_numpy().copy()
    follower = np.isfinite(factor)
    by_group = follower & np.isfinite(group)
    by_step = follower & ~np.isfinite(group)
    followed = ~follower & np.isfinite(group)
    if by_group.any():
        sums = pd.Series(dur[followed]).groupby(group[followed]).sum()
        idx = np.flatnonzero(by_group)
        dur[idx] = np.rint(factor[idx] * sums.reindex(group[idx], fill_value=0).to_numpy())
    if by_step.any():
        rank, step = t["rank"].to_numpy(), t["step"].to_numpy()
        work = (t["kind"].to_numpy() == int(TaskKind.KERNEL)) & ~by_step
        busy = pd.Series(dur[work]).groupby([rank[work], step[work]]).sum()
        idx = np.flatnonzero(by_step)
        keys = pd.MultiIndex.from_arrays([rank[idx], step[idx]])
        dur[idx] = np.rint(factor[idx] * busy.reindex(keys, fill_value=0).to_numpy())
    changed = np.flatnonzero(dur != t["dur_ns"].to_numpy())
    if not len(changed):
        return graph
    return set_duration(graph, changed, dur[changed], transform=transform,
                        reason="derived tasks follow the kernels they derive from (a pipeline bubble, later "
                               "nano-batches)")


def note(graph: TaskGraph, action: str, *, reason: str, transform: str | None = None) -> TaskGraph:
    """Log a decision that edits nothing itself (a plan a search chose, a replica count)."""
    out = graph.copy()
    _log(out, _transform_name("note", transform), action, 0, 0, 0, reason, ChangeTarget.NOTE)
    return out
