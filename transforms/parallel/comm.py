"""Communication as graph tasks: collectives inserted as ``COMM`` tasks on a communication stream.

A collective becomes one task on an ordered STREAM resource of its rank (NCCL runs each
communicator on its own stream), chained in program order with the other collectives of that
stream, with FLOW edges from the work that produces its input and to the work that consumes its
output. Its duration comes from the cost model in the transform context
(:meth:`whatif.transforms.base.CostModel.collective_time_ns`, i.e. the alpha-beta models of
:mod:`whatif.hardware.collectives`, calibrated on the trace's own collective kernels when it
has some). Transforms here run on one device's trace and model **one representative rank**:
with symmetric parallelism every rank runs the same schedule, so the rank's step time is the
job's (the wait for the slowest peer is not modeled; a multi-rank trace keeps its measured skew
in the collectives it already has).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from whatif.depgraph.graph import Change, EdgeKind, ResourceKind, TaskGraph, TaskKind

from ..base import TransformContext, TransformError

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast", "reduce")
_CAT = ("phase", "layer", "op", "name")


@dataclass(frozen=True)
class Collective:
    """One collective: ``kind``, ``message_bytes`` (the full buffer: the all-reduced tensor, the
    gathered output, the scattered input, everything a rank sends in an all-to-all), the number of
    ``ranks`` in the group, the ``topology`` preset (``whatif.hardware.topology``) and how many
    of the group's ranks share a machine (None: packed)."""

    kind: str
    message_bytes: float
    ranks: int
    topology: str
    ranks_per_machine: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise TransformError(f"unknown collective {self.kind!r} (known: {', '.join(KINDS)})")
        if self.ranks < 1 or self.message_bytes < 0:
            raise TransformError(f"a collective needs ranks >= 1 and bytes >= 0 (got {self.ranks}, "
                                 f"{self.message_bytes})")

    def time_ns(self, ctx: TransformContext, transform: str) -> int:
        """Predicted duration (ns) from the context's cost model."""
        if self.ranks == 1:
            return 0
        cost = ctx.require_cost(transform)
        return int(round(cost.collective_time_ns(self.kind, float(self.message_bytes), int(self.ranks),
                                                 self.topology, self.ranks_per_machine)))

    def label(self) -> str:
        return f"{self.kind} {self.message_bytes / 2**20:.2f} MiB x{self.ranks}"


def comm_stream(graph: TaskGraph, rank: int, label: str) -> tuple[TaskGraph, int]:
    """The id of rank ``rank``'s stream named ``label`` (a new ordered STREAM resource when the
    graph has none), and the graph (a copy when a resource was added)."""
    res = graph.resources
    name = f"{label} (rank {rank})"
    hit = np.flatnonzero((res["name"].astype(str).to_numpy() == name) & (res["rank"].to_numpy() == rank)) \
        if len(res) else np.empty(0, np.int64)
    if len(hit):
        return graph, int(hit[0])
    out = graph.copy()
    device = res.loc[(res["rank"] == rank) & (res["kind"] == int(ResourceKind.STREAM)), "device"]
    row = {"rank": rank, "kind": int(ResourceKind.STREAM), "device": int(device.iat[0]) if len(device) else -1,
           "key": -1 - len(res), "name": name, "ordered": True}
    out.resources = pd.concat([res, pd.DataFrame([row])], ignore_index=True)
    return out, len(res)


def insert_tasks(graph: TaskGraph, *, resource: int, after: Sequence[int], before: Sequence[int],
                 dur_ns: Sequence[int], names: Sequence[str], reason: str, transform: str,
                 kind: TaskKind = TaskKind.COMM, extra_after: Sequence[Sequence[int]] | None = None) -> tuple[
                     TaskGraph, np.ndarray]:
    """Insert tasks in bulk on ``resource`` (an ordered stream), chained in the order given.

    Task ``i`` depends on ``after[i]`` (and on ``extra_after[i]``) and ``before[i]`` depends on it
    (FLOW edges; -1 for none); it inherits step, phase, layer and op from ``after[i]``.
    Returns the new graph and the new task ids (aligned with the inputs).
    """
    n_new = len(dur_ns)
    if n_new == 0:
        return graph, np.empty(0, dtype=np.int64)
    if not (len(after) == len(before) == len(names) == n_new):
        raise TransformError("after, before, dur_ns and names must have one entry per task")
    dur = np.asarray(dur_ns, dtype=np.int64)
    if (dur < 0).any():
        raise TransformError("inserted durations must be >= 0 ns")
    out = graph.copy()
    t = out.tasks
    base = len(t)
    ids = np.arange(base, base + n_new, dtype=np.int64)
    a = np.asarray(after, dtype=np.int64)
    src_rows = np.where(a >= 0, a, 0)
    rank = int(out.resources["rank"].iat[resource])
    new = pd.DataFrame({
        "event": -1, "kind": int(kind), "resource": resource, "rank": rank, "dur_ns": dur,
        "measured_start_ns": -1, "measured_end_ns": -1,
        "step": np.where(a >= 0, t["step"].to_numpy()[src_rows], -1),
        **{c: np.where(a >= 0, t[c].astype(object).to_numpy()[src_rows], None) for c in ("phase", "layer", "op")},
        "name": list(names)})
    for c in _CAT:
        if c in t and isinstance(t[c].dtype, pd.CategoricalDtype):
            t[c] = t[c].astype(object)
    extra_cols = [c for c in t.columns if c not in new.columns]
    for c in extra_cols:
        new[c] = None
    out.tasks = pd.concat([t, new[t.columns]], ignore_index=True)
    src, dst, kinds = [a[a >= 0]], [ids[a >= 0]], [np.full(int((a >= 0).sum()), int(EdgeKind.FLOW))]
    b = np.asarray(before, dtype=np.int64)
    src.append(ids[b >= 0]), dst.append(b[b >= 0]), kinds.append(np.full(int((b >= 0).sum()), int(EdgeKind.FLOW)))
    if extra_after is not None:
        for i, deps in enumerate(extra_after):
            d = np.asarray([x for x in deps if x >= 0], dtype=np.int64)
            src.append(d), dst.append(np.full(len(d), ids[i])), kinds.append(np.full(len(d), int(EdgeKind.FLOW)))
    # chain on the stream: after whatever the stream already holds, then in the given order
    on_res = np.flatnonzero(t["resource"].to_numpy() == resource)
    chain = np.concatenate([on_res[-1:], ids]) if len(on_res) else ids
    src.append(chain[:-1]), dst.append(chain[1:]), kinds.append(np.full(len(chain) - 1, int(EdgeKind.STREAM)))
    s = np.concatenate(src).astype(np.int64)
    edges = pd.DataFrame({"src": s, "dst": np.concatenate(dst).astype(np.int64), "lat_ns": np.zeros(len(s), np.int64),
                          "kind": np.concatenate(kinds).astype(np.int8)})
    out.edges = pd.concat([out.edges, edges], ignore_index=True)
    out.cache.clear()
    out.changes.append(Change(transform=transform, action=f"insert on {out.resources['name'].iat[resource]}",
                              tasks=n_new, before_ns=0, after_ns=int(dur.sum()), reason=reason))
    return out, ids


def next_on_resource(graph: TaskGraph, tasks: np.ndarray) -> np.ndarray:
    """Per task: the task after it on its ordered resource (its STREAM/THREAD successor), -1 when last."""
    e = graph.edges
    order = e[e["kind"].isin([int(EdgeKind.STREAM), int(EdgeKind.THREAD)])]
    succ = np.full(len(graph.tasks), -1, dtype=np.int64)
    succ[order["src"].to_numpy()] = order["dst"].to_numpy()
    return succ[np.asarray(tasks, dtype=np.int64)]


def splice_tasks(graph: TaskGraph, *, anchors: Sequence[int], durs: Sequence[Sequence[int]], name: str,
                 deps: Sequence[Sequence[int]], reason: str, transform: str,
                 kind: TaskKind = TaskKind.KERNEL) -> tuple[TaskGraph, list[np.ndarray]]:
    """After each ``anchors[i]`` on its ordered resource, splice a chain of new tasks with
    durations ``durs[i]``; the j-th new task also depends on ``deps[i][j]`` (FLOW, -1: none).
    Returns the graph and, per anchor, the new ids."""
    out = graph.copy()
    t = out.tasks
    e = out.edges
    order = e["kind"].isin([int(EdgeKind.STREAM), int(EdgeKind.THREAD)]).to_numpy()
    src_e = e["src"].to_numpy()
    base = len(t)
    rows, new_ids, drop = [], [], np.zeros(len(e), dtype=bool)
    src, dst, lat, kinds = [], [], [], []
    nxt = base
    for a, ds, dep in zip(anchors, durs, deps):
        ids = np.arange(nxt, nxt + len(ds), dtype=np.int64)
        nxt += len(ds)
        new_ids.append(ids)
        if not len(ids):
            continue
        res = int(t["resource"].iat[a])
        okind = int(EdgeKind.STREAM) if int(out.resources["kind"].iat[res]) == int(ResourceKind.STREAM) \
            else int(EdgeKind.THREAD)
        hit = np.flatnonzero(order & (src_e == a))
        chain = [a, *ids.tolist()]
        gaps = [0] * len(ids)
        if len(hit):
            drop[hit[0]] = True
            chain.append(int(e["dst"].iat[hit[0]]))
            gaps.append(int(e["lat_ns"].iat[hit[0]]))
        src += chain[:-1]
        dst += chain[1:]
        lat += gaps
        kinds += [okind] * (len(chain) - 1)
        for j, (i, d) in enumerate(zip(ids, ds)):
            rows.append({"event": -1, "kind": int(kind), "resource": res, "rank": int(t["rank"].iat[a]),
                         "dur_ns": int(d), "measured_start_ns": -1, "measured_end_ns": -1,
                         "step": int(t["step"].iat[a]), "phase": t["phase"].iat[a], "layer": t["layer"].iat[a],
                         "op": t["op"].iat[a], "name": f"{name} {j + 1}/{len(ds)}"})
            if dep[j] >= 0:
                src.append(int(dep[j])), dst.append(int(i)), lat.append(0), kinds.append(int(EdgeKind.FLOW))
    for c in _CAT:
        if c in t and isinstance(t[c].dtype, pd.CategoricalDtype):
            t[c] = t[c].astype(object)
    new = pd.DataFrame(rows, columns=list(t.columns)) if rows else t.iloc[:0]
    out.tasks = pd.concat([t, new], ignore_index=True)
    add = pd.DataFrame({"src": np.asarray(src, np.int64), "dst": np.asarray(dst, np.int64),
                        "lat_ns": np.asarray(lat, np.int64), "kind": np.asarray(kinds, np.int8)})
    out.edges = pd.concat([e[~drop], add], ignore_index=True)
    out.cache.clear()
    out.changes.append(Change(transform=transform, action="splice", tasks=len(rows), before_ns=0,
                              after_ns=int(sum(r["dur_ns"] for r in rows)), reason=reason))
    return out, new_ids
