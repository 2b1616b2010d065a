"""Cross-rank collectives: link the same NCCL/RCCL collective on every loaded rank.

Ranks' clocks are independent (per-host clocks, separate profiler starts), so they are aligned
first (dPRO: without alignment replay error reaches 36.7 %): a collective ends at nearly the
same instant on every participant, so rank ``r``'s offset is the median over matched
collectives of ``end(ref) - end(r)``.

Then each collective kernel ``c_i`` is split: a zero-length ARRIVE task takes its place in
the stream (its launch and stream predecessors), a virtual BARRIER waits for every rank's
arrival, and ``c_i`` keeps only its transfer time ``end_i - max_j start_j``: a rank that
arrives early waits for the last one, and that wait is recomputed by the replay. With only a
subset of a job's ranks loaded, the wait for the ranks not loaded stays inside the transfer.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from whatif.tracer.args import Arg

from .graph import EdgeKind, ResourceKind, TaskGraph, TaskKind

if TYPE_CHECKING:
    from .state import Resources


def collective_key(name: str, collective_name: str, process_group: str | int) -> str:
    """What identifies a collective across ranks: its collective name and process group when the
    trace records them, else the kernel name.

    >>> collective_key("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", "allreduce", "0")
    'allreduce@0'
    >>> collective_key("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "", "")
    'ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)'
    """
    return f"{collective_name}@{process_group}" if collective_name else name


def _groups(graph: TaskGraph) -> list[list[int]]:
    """Matched collectives: the k-th occurrence of each key on every rank, in stream order."""
    t = graph.tasks
    comm = np.flatnonzero(t["kind"].to_numpy() == int(TaskKind.COMM))
    if len(comm) == 0 or graph.trace is None:
        return []
    coll_names, groups = graph.trace.arg(Arg.COLLECTIVE_NAME), graph.trace.arg(Arg.PROCESS_GROUP)
    start = t["measured_start_ns"].to_numpy()
    ranks = t["rank"].to_numpy()
    names = t["name"].astype(str).to_numpy()
    events = t["event"].to_numpy()
    comm = comm[np.lexsort((start[comm], ranks[comm]))]
    seen: dict[tuple[int, str], int] = {}
    by_occurrence: dict[tuple[str, int], list[int]] = {}
    for c in comm.tolist():
        key = collective_key(names[c], coll_names[events[c]], groups[events[c]])
        n = seen.get((int(ranks[c]), key), 0)
        seen[(int(ranks[c]), key)] = n + 1
        by_occurrence.setdefault((key, n), []).append(c)
    return [members for members in by_occurrence.values() if len({int(ranks[m]) for m in members}) > 1]


def align_clocks(graph: TaskGraph, groups: list[list[int]]) -> dict[int, int]:
    """Shift every rank's measured times onto the lowest rank's clock; return the offsets (ns)."""
    t = graph.tasks
    ranks = t["rank"].to_numpy()
    end = t["measured_end_ns"].to_numpy()
    ref = int(ranks.min())
    diffs: dict[int, list[int]] = {}
    for members in groups:
        ref_end = [int(end[m]) for m in members if ranks[m] == ref]
        if not ref_end:
            continue
        for m in members:
            if ranks[m] != ref:
                diffs.setdefault(int(ranks[m]), []).append(ref_end[0] - int(end[m]))
    offsets = {r: int(np.median(d)) for r, d in diffs.items()}
    shift = np.asarray([offsets.get(int(r), 0) for r in ranks], dtype=np.int64)
    valid = t["measured_start_ns"].to_numpy() >= 0
    t.loc[valid, "measured_start_ns"] = t["measured_start_ns"].to_numpy()[valid] + shift[valid]
    t.loc[valid, "measured_end_ns"] = end[valid] + shift[valid]
    return offsets


def link_collectives(graph: TaskGraph, origin_of_rank: dict[int, int], resources: Resources) -> TaskGraph:
    """Align ranks and link matched collectives (see the module docstring). Single-rank graphs
    are returned as they are."""
    report = graph.report
    t = graph.tasks
    report["collective_kernels"] = int((t["kind"].to_numpy() == int(TaskKind.COMM)).sum())
    if len(origin_of_rank) < 2:
        return graph
    groups = _groups(graph)
    report["collectives_matched"] = len(groups)
    report["collective_kernels_unmatched"] = report["collective_kernels"] - sum(len(g) for g in groups)
    if not groups:
        return graph
    offsets = align_clocks(graph, groups)
    report["clock_offsets_ns_max_abs"] = max((abs(v) for v in offsets.values()), default=0)

    t = graph.tasks
    start = t["measured_start_ns"].to_numpy()
    end = t["measured_end_ns"].to_numpy()
    resource = t["resource"].to_numpy()
    ranks = t["rank"].to_numpy()
    n0 = len(t)
    members = np.asarray([m for g in groups for m in g], dtype=np.int64)
    arrive_ids = np.arange(n0, n0 + len(members), dtype=np.int64)
    barrier_ids = np.arange(n0 + len(members), n0 + len(members) + len(groups), dtype=np.int64)
    group_of = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
    last_arrival = np.asarray([start[g].max() for g in groups], dtype=np.int64)
    dur = t["dur_ns"].to_numpy().copy()
    transfer = np.clip(end[members] - last_arrival[group_of], 0, end[members] - start[members])
    dur[members] = transfer

    b_rank = np.asarray([int(ranks[g].min()) for g in groups], dtype=np.int64)
    b_res = np.asarray([resources.get(int(r), ResourceKind.VIRTUAL, -1, 1, "collective barriers", ordered=False)
                        for r in b_rank], dtype=np.int64)
    names = t["name"].astype(str).to_numpy()
    new = pd.DataFrame({
        "event": np.concatenate([t["event"].to_numpy()[members], np.full(len(groups), -1)]),
        "kind": np.concatenate([np.full(len(members), int(TaskKind.ARRIVE)),
                                np.full(len(groups), int(TaskKind.BARRIER))]),
        "resource": np.concatenate([resource[members], b_res]),
        "rank": np.concatenate([ranks[members], b_rank]),
        "dur_ns": 0,
        "measured_start_ns": np.concatenate([start[members], last_arrival]),
        "measured_end_ns": np.concatenate([start[members], last_arrival]),
        "step": np.concatenate([t["step"].to_numpy()[members], np.full(len(groups), -1)]),
        "phase": list(t["phase"].to_numpy()[members]) + [None] * len(groups),
        "layer": list(t["layer"].to_numpy()[members]) + [None] * len(groups),
        "op": list(t["op"].to_numpy()[members]) + [None] * len(groups),
        "name": [f"arrive {n}" for n in names[members]] + [f"barrier {names[g[0]]}" for g in groups],
    })
    tasks = t.copy()
    tasks["dur_ns"] = dur
    for col in ("phase", "layer", "op", "name"):
        tasks[col] = tasks[col].astype(object)
    tasks = pd.concat([tasks, new], ignore_index=True)
    for col in ("phase", "layer", "op", "name"):
        tasks[col] = pd.Categorical(tasks[col])

    e = graph.edges
    redirect = np.arange(len(tasks), dtype=np.int64)
    redirect[members] = arrive_ids
    e = e.assign(dst=redirect[e["dst"].to_numpy()])
    kind = int(EdgeKind.COLLECTIVE)
    extra = pd.DataFrame({
        "src": np.concatenate([arrive_ids, arrive_ids, barrier_ids[group_of]]),
        "dst": np.concatenate([members, barrier_ids[group_of], members]),
        "lat_ns": 0,
        "kind": np.concatenate([np.full(len(members), int(EdgeKind.STREAM)), np.full(2 * len(members), kind)]),
    }).astype({"src": np.int64, "dst": np.int64, "lat_ns": np.int64, "kind": np.int8})
    graph.tasks = tasks
    graph.edges = pd.concat([e, extra], ignore_index=True)
    return graph
