"""Cross-rank collectives: link the same NCCL/RCCL collective on every loaded rank.

Ranks' clocks are independent (per-host clocks, separate profiler starts), so they are aligned
first (dPRO: without alignment replay error reaches 36.7 %): a collective ends at nearly the
same instant on every participant, so rank ``r``'s offset is the median over matched
collectives of ``end(ref) - end(r)`` (:class:`ClockAlignment`).

Then each collective kernel ``c_i`` is split (:class:`CollectiveSplit`): a zero-length ARRIVE
task takes its place in the stream (its launch and stream predecessors), a virtual BARRIER waits
for every rank's arrival, and ``c_i`` keeps only its transfer time ``end_i - max_j start_j``: a
rank that arrives early waits for the last one, and that wait is recomputed by the replay. With
only a subset of a job's ranks loaded, the wait for the ranks not loaded stays inside the transfer.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from whatif.tracer.args import Arg

from ..graph import EdgeKind, ResourceKind, TaskKind
from ..state import Arrivals, BuildState, EdgeSet
from .base import Adjustment, EdgeRule


def collective_key(name: str, collective_name: str, process_group: str | int) -> str:
    """What identifies a collective across ranks: its collective name and process group when the
    trace records them, else the kernel name.

    >>> collective_key("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", "allreduce", "0")
    'allreduce@0'
    >>> collective_key("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "", "")
    'ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)'
    """
    return f"{collective_name}@{process_group}" if collective_name else name


def match_collectives(state: BuildState) -> list[list[int]]:
    """Matched collectives: the k-th occurrence of each key on every rank, in stream order."""
    t = state.tasks
    comm = np.flatnonzero(t["kind"].to_numpy() == int(TaskKind.COMM))
    if len(comm) == 0:
        return []
    coll_names, groups = state.trace.arg(Arg.COLLECTIVE_NAME), state.trace.arg(Arg.PROCESS_GROUP)
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


def clock_offsets(state: BuildState, groups: list[list[int]]) -> dict[int, int]:
    """Per rank other than the lowest: the shift (ns) that puts it on the lowest rank's clock."""
    ranks = state.column("rank")
    end = state.end_ns
    ref = int(ranks.min())
    diffs: dict[int, list[int]] = {}
    for members in groups:
        ref_end = [int(end[m]) for m in members if ranks[m] == ref]
        if not ref_end:
            continue
        for m in members:
            if ranks[m] != ref:
                diffs.setdefault(int(ranks[m]), []).append(ref_end[0] - int(end[m]))
    return {r: int(np.median(d)) for r, d in diffs.items()}


class ClockAlignment(Adjustment):
    """Match collectives across ranks and shift every rank's measured times onto the lowest
    rank's clock. Single-rank builds only count their collective kernels."""

    def apply(self, state: BuildState) -> None:
        report = state.report
        report["collective_kernels"] = int((state.column("kind") == int(TaskKind.COMM)).sum())
        if len(state.origin_of_rank) < 2:
            return
        groups = match_collectives(state)
        report["collectives_matched"] = len(groups)
        report["collective_kernels_unmatched"] = report["collective_kernels"] - sum(len(g) for g in groups)
        if not groups:
            return
        offsets = clock_offsets(state, groups)
        shift = np.asarray([offsets.get(int(r), 0) for r in state.column("rank")], dtype=np.int64)
        valid = np.flatnonzero(state.start_ns >= 0)
        start, end = state.start_ns, state.end_ns
        state.set_column("measured_start_ns", valid, start[valid] + shift[valid])
        state.set_column("measured_end_ns", valid, end[valid] + shift[valid])
        report["clock_offsets_ns_max_abs"] = max((abs(v) for v in offsets.values()), default=0)
        state.collective_groups = groups


class CollectiveSplit(Adjustment):
    """Each matched collective kernel becomes ARRIVE (in its place: the edges into it now reach
    the arrival) + its transfer time; each matched group gets a BARRIER."""

    needs = (ClockAlignment,)

    def apply(self, state: BuildState) -> None:
        groups = state.collective_groups
        if not groups:
            return
        t = state.tasks
        start, end = state.start_ns, state.end_ns
        resource, ranks = state.column("resource"), state.column("rank")
        n0 = len(t)
        members = np.asarray([m for g in groups for m in g], dtype=np.int64)
        arrive_ids = np.arange(n0, n0 + len(members), dtype=np.int64)
        barrier_ids = np.arange(n0 + len(members), n0 + len(members) + len(groups), dtype=np.int64)
        group_of = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
        last_arrival = np.asarray([start[g].max() for g in groups], dtype=np.int64)
        dur = t["dur_ns"].to_numpy().copy()
        dur[members] = np.clip(end[members] - last_arrival[group_of], 0, end[members] - start[members])

        b_rank = np.asarray([int(ranks[g].min()) for g in groups], dtype=np.int64)
        b_res = np.asarray([state.resources.get(int(r), ResourceKind.VIRTUAL, -1, 1, "collective barriers",
                                                ordered=False) for r in b_rank], dtype=np.int64)
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
        state.replace_tasks(tasks)

        redirect = np.arange(len(tasks), dtype=np.int64)
        redirect[members] = arrive_ids
        state.edges = {rule: EdgeSet(found.kind, found.src, redirect[found.dst], found.lat_ns)
                       for rule, found in state.edges.items()}
        state.arrivals = Arrivals(member=members, arrive=arrive_ids, barrier=barrier_ids[group_of])


class ArrivalOrder(EdgeRule):
    """STREAM edges ARRIVE -> its collective's transfer, on the collective's stream; latency 0."""

    kind = EdgeKind.STREAM
    needs = (CollectiveSplit,)

    def edges(self, state: BuildState) -> EdgeSet:
        a = state.arrivals
        return EdgeSet.of(self.kind, a.arrive, a.member, np.zeros(len(a.member), dtype=np.int64))


class CollectiveBarriers(EdgeRule):
    """COLLECTIVE edges: every rank's ARRIVE -> the BARRIER -> every rank's transfer; latency 0."""

    kind = EdgeKind.COLLECTIVE
    needs = (CollectiveSplit,)

    def edges(self, state: BuildState) -> EdgeSet:
        a = state.arrivals
        return EdgeSet.of(self.kind, np.concatenate([a.arrive, a.barrier]), np.concatenate([a.barrier, a.member]),
                          np.zeros(2 * len(a.member), dtype=np.int64))
