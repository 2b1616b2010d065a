"""Cross-rank collectives: link the same NCCL/RCCL collective on every loaded rank.

Ranks' clocks are independent (per-host clocks, separate profiler starts), so they are aligned
first (dPRO: without alignment replay error reaches 36.7 %): a collective ends at nearly the
same instant on every participant, so rank ``r``'s offset is the median over matched
collectives of ``end(ref) - end(r)`` (:class:`ClockAlignment`).

Collectives are matched by their key (:func:`call_keys`): a collective by its name and process
group; a point-to-point ``send``/``recv`` by its two ends, so the k-th send from rank a to rank b
pairs with the k-th recv on b from a (not with every rank's k-th send).

Then each collective kernel ``c_i`` is split (:class:`CollectiveSplit`): a zero-length ARRIVE
task takes its place in the stream (its launch and stream predecessors), a virtual BARRIER waits
for every rank's arrival, and ``c_i`` keeps only its transfer time ``end_i - max_j start_j``: a
rank that arrives early waits for the last one, and that wait is recomputed by the replay. With
only a subset of a job's ranks loaded, the wait for the ranks not loaded stays inside the transfer.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from whatif.core.kernels import P2pDirection, p2p_direction
from whatif.tracer.args import Arg, EventArgs, arg_columns, rank_list, rank_value
from whatif.tracer.trace import name_texts

from ..graph import EdgeKind, ResourceKind, TaskKind
from ..state import Arrivals, BuildState, EdgeSet, LocalCollectives
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


def p2p_key(sender: int, receiver: int, process_group: str | int) -> str:
    """What identifies a point-to-point transfer across ranks: its sender, its receiver and its
    process group (the send on one rank and the recv on the other share it).

    >>> p2p_key(0, 1, "0")
    'send/recv 0->1@0'
    """
    return f"send/recv {sender}->{receiver}@{process_group}"


def p2p_peer(rank: int, recorded: object, group: object) -> int:
    """The other end of a send (its receiver) or a recv (its sender) on ``rank``: the rank PyTorch
    recorded (``Dst Rank``/``Src Rank``), else the other member of a two-rank process group, else -1.

    >>> p2p_peer(1, 3, "[0, 1, 2, 3]"), p2p_peer(1, -1, "[1, 5]"), p2p_peer(1, -1, "[0, 1, 2, 3]")
    (3, 5, -1)
    """
    peer = rank_value(recorded)
    if peer >= 0:
        return peer
    members = rank_list(group)
    if len(members) == 2 and rank in members:
        return members[1] if members[0] == rank else members[0]
    return -1


def call_keys(args: EventArgs, events: np.ndarray, names: list[str], ranks: np.ndarray,
              with_members: bool = False) -> list[str]:
    """Per collective kernel (its event row, kernel name and rank): its key across ranks. A
    collective: :func:`collective_key`; with ``with_members``, followed by the process group's
    ranks when recorded (subgroups that share a name, as groups made by ``split_group`` on each
    rank can, are then told apart). A ``send``/``recv``: :func:`p2p_key` of its two ends; one
    whose peer the trace does not say gets a key of its own rank (it is matched with nothing
    rather than with the other ranks' sends)."""
    cols = arg_columns(args, (Arg.COLLECTIVE_NAME, Arg.PROCESS_GROUP, Arg.PROCESS_GROUP_RANKS,
                              Arg.P2P_SRC, Arg.P2P_DST), events)
    coll, group, members = cols[Arg.COLLECTIVE_NAME], cols[Arg.PROCESS_GROUP], cols[Arg.PROCESS_GROUP_RANKS]
    src, dst = cols[Arg.P2P_SRC], cols[Arg.P2P_DST]
    keys = []
    for i, name in enumerate(names):
        direction = p2p_direction(coll[i])
        if direction is None:
            key = collective_key(name, coll[i], group[i])
            listed = rank_list(members[i]) if with_members else ()
            keys.append(f"{key} {list(listed)}" if listed else key)
            continue
        rank = int(ranks[i])
        send = direction is P2pDirection.SEND
        peer = p2p_peer(rank, dst[i] if send else src[i], members[i])
        if peer < 0:
            keys.append(f"{coll[i]}@{group[i]} on rank {rank} (peer not recorded)")
        else:
            keys.append(p2p_key(rank, peer, group[i]) if send else p2p_key(peer, rank, group[i]))
    return keys


@dataclass(frozen=True)
class CollectiveCalls:
    """The collective kernels of one or more build states: what matching them across ranks reads.
    ``owner`` says which state a row came from (0 for one state); ``task`` is its id there."""

    owner: np.ndarray
    task: np.ndarray
    rank: np.ndarray
    key: np.ndarray  # object: :func:`collective_key` per call
    start_ns: np.ndarray
    end_ns: np.ndarray
    ranks: tuple[int, ...]  # every rank the states hold; the lowest is the reference clock

    @classmethod
    def of(cls, state: BuildState, owner: int = 0) -> CollectiveCalls:
        """The COMM tasks of ``state`` (before :class:`ClockAlignment` shifts them)."""
        t = state.tasks
        comm = np.flatnonzero(t["kind"].to_numpy() == int(TaskKind.COMM))
        names = name_texts(t["name"], comm)
        events = t["event"].to_numpy()[comm]
        rank = t["rank"].to_numpy()[comm].astype(np.int64)
        keys = call_keys(state.trace.args, events, names.tolist(), rank, with_members=True)
        return cls(owner=np.full(len(comm), owner, dtype=np.int64), task=comm.astype(np.int64),
                   rank=rank, key=np.asarray(keys, dtype=object),
                   start_ns=state.start_ns[comm].astype(np.int64), end_ns=state.end_ns[comm].astype(np.int64),
                   ranks=tuple(sorted({int(r) for r in state.origin_of_rank})))

    @classmethod
    def concat(cls, parts: list[CollectiveCalls]) -> CollectiveCalls:
        """The calls of several states (rank groups), in the order given."""
        return cls(**{f: np.concatenate([getattr(p, f) for p in parts]) if parts else np.empty(0, dtype=np.int64)
                      for f in ("owner", "task", "rank", "start_ns", "end_ns")},
                   key=np.concatenate([p.key for p in parts]) if parts else np.empty(0, dtype=object),
                   ranks=tuple(sorted({r for p in parts for r in p.ranks})))


@dataclass(frozen=True)
class CollectivePlan:
    """Collectives matched across ranks: per matched collective (a *group*), the rows of
    :class:`CollectiveCalls` of its members (one per rank, rank order), the time its last member
    arrives on the aligned clock, and the rank that holds its BARRIER (the lowest member);
    per rank, the shift onto the reference clock."""

    members: list[np.ndarray]
    last_arrival_ns: np.ndarray
    barrier_rank: np.ndarray
    offsets_ns: dict[int, int]

    def for_owner(self, calls: CollectiveCalls, owner: int) -> LocalCollectives:
        """The part of the plan a state (``owner``) applies: its members' task ids per group it
        takes part in, and those groups' ids in the whole plan."""
        groups, members = [], []
        for g, rows in enumerate(self.members):
            mine = rows[calls.owner[rows] == owner]
            if len(mine):
                groups.append(g)
                members.append(calls.task[mine])
        return LocalCollectives(members=members, group=np.asarray(groups, dtype=np.int64),
                                last_arrival_ns=self.last_arrival_ns[groups],
                                barrier_rank=self.barrier_rank[groups], offsets_ns=self.offsets_ns)


def plan_collectives(calls: CollectiveCalls) -> CollectivePlan:
    """Match collectives across ranks: the k-th occurrence of each key on every rank, in stream
    order (a group needs members on two ranks at least); align the clocks on them
    (:func:`clock_offsets`) and find each group's last arrival.

    >>> calls = CollectiveCalls(owner=np.zeros(4, dtype=np.int64), task=np.arange(4), rank=np.array([0, 0, 1, 1]),
    ...     key=np.array(["ar@0", "ar@0", "ar@0", "ar@0"], dtype=object), start_ns=np.array([0, 50, 1005, 1070]),
    ...     end_ns=np.array([20, 80, 1020, 1080]), ranks=(0, 1))
    >>> plan = plan_collectives(calls)
    >>> [m.tolist() for m in plan.members], plan.offsets_ns, plan.last_arrival_ns.tolist()
    ([[0, 2], [1, 3]], {0: 0, 1: -1000}, [5, 70])
    """
    order = np.lexsort((calls.start_ns, calls.rank))
    seen: dict[tuple[int, str], int] = {}
    by_occurrence: dict[tuple[str, int], list[int]] = {}
    for c in order.tolist():
        rank, key = int(calls.rank[c]), str(calls.key[c])
        n = seen.get((rank, key), 0)
        seen[(rank, key)] = n + 1
        by_occurrence.setdefault((key, n), []).append(c)
    members = [np.asarray(rows, dtype=np.int64) for rows in by_occurrence.values()
               if len({int(calls.rank[m]) for m in rows}) > 1]
    offsets = clock_offsets(calls, members)
    shift = np.asarray([offsets.get(int(r), 0) for r in calls.rank], dtype=np.int64)
    start = calls.start_ns + shift
    return CollectivePlan(members=members,
                          last_arrival_ns=np.asarray([start[m].max() for m in members], dtype=np.int64),
                          barrier_rank=np.asarray([calls.rank[m].min() for m in members], dtype=np.int64),
                          offsets_ns=offsets)


def clock_offsets(calls: CollectiveCalls, groups: list[np.ndarray]) -> dict[int, int]:
    """Per aligned rank (the lowest, 0, and each rank matched calls link to it): the shift (ns)
    that puts it on the lowest rank's clock, the median over matched collectives of
    ``end(lowest) - end(rank)``. A rank that shares no
    collective with the lowest (a pipeline's last stage, whose sends and recvs reach only its
    neighbours) is aligned the same way on a rank already aligned, pass after pass.

    >>> calls = CollectiveCalls(owner=np.zeros(4, dtype=np.int64), task=np.arange(4), rank=np.array([0, 1, 1, 2]),
    ...     key=np.array(["a", "a", "b", "b"], dtype=object), start_ns=np.zeros(4, dtype=np.int64),
    ...     end_ns=np.array([100, 1100, 1500, 2000]), ranks=(0, 1, 2))
    >>> clock_offsets(calls, [np.array([0, 1]), np.array([2, 3])])   # rank 2 through rank 1
    {0: 0, 1: -1000, 2: -1500}
    """
    ranks, end = calls.rank, calls.end_ns
    ref = min(calls.ranks) if calls.ranks else 0
    aligned = {ref: 0}
    while True:
        diffs: dict[int, list[int]] = {}
        for members in groups:
            anchors = sorted((int(ranks[m]), int(end[m])) for m in members if int(ranks[m]) in aligned)
            if not anchors:
                continue
            anchor_rank, anchor_end = anchors[0]
            on_ref = anchor_end + aligned[anchor_rank]
            for m in members:
                r = int(ranks[m])
                if r not in aligned:
                    diffs.setdefault(r, []).append(on_ref - int(end[m]))
        if not diffs:
            break
        aligned.update({r: int(np.median(d)) for r, d in diffs.items()})
    return dict(sorted(aligned.items()))


class ClockAlignment(Adjustment):
    """Match collectives across ranks and shift every rank's measured times onto the lowest
    rank's clock. Single-rank builds only count their collective kernels. A rank-parallel build
    (:mod:`whatif.scale`) plans the collectives of every rank group at once and gives each
    group's state its part (``state.collective_plan``); a whole-job build plans them here."""

    def apply(self, state: BuildState) -> None:
        report = state.report
        report["collective_kernels"] = int((state.column("kind") == int(TaskKind.COMM)).sum())
        local = state.collective_plan
        if local is None:
            if len(state.origin_of_rank) < 2:
                return
            calls = CollectiveCalls.of(state)
            local = plan_collectives(calls).for_owner(calls, 0)
        report["collectives_matched"] = len(local.members)
        report["collective_kernels_unmatched"] = report["collective_kernels"] - sum(len(g) for g in local.members)
        if not local.members:
            return
        ranks, rank_at = np.unique(state.column("rank"), return_inverse=True)
        shift = np.asarray([local.offsets_ns.get(int(r), 0) for r in ranks], dtype=np.int64)[rank_at]
        valid = np.flatnonzero(state.start_ns >= 0)
        start, end = state.start_ns, state.end_ns
        state.set_column("measured_start_ns", valid, start[valid] + shift[valid])
        state.set_column("measured_end_ns", valid, end[valid] + shift[valid])
        report["clock_offsets_ns_max_abs"] = max((abs(v) for v in local.offsets_ns.values()), default=0)
        # ranks no matched call links to the lowest keep their own clock: nothing relates them
        report["clock_unaligned_ranks"] = int(sum(int(r) not in local.offsets_ns for r in ranks))
        state.collectives = local


class CollectiveSplit(Adjustment):
    """Each matched collective kernel becomes ARRIVE (in its place: the edges into it now reach
    the arrival) + its transfer time; each matched group gets a BARRIER."""

    needs = (ClockAlignment,)

    def apply(self, state: BuildState) -> None:
        local = state.collectives
        if local is None or not local.members:
            return
        groups = local.members
        t = state.tasks
        start, end = state.start_ns, state.end_ns
        resource, ranks = state.column("resource"), state.column("rank")
        n0 = len(t)
        members = np.asarray([m for g in groups for m in g], dtype=np.int64)
        arrive_ids = np.arange(n0, n0 + len(members), dtype=np.int64)
        barrier_ids = np.arange(n0 + len(members), n0 + len(members) + len(groups), dtype=np.int64)
        group_of = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
        last_arrival = local.last_arrival_ns
        dur = t["dur_ns"].to_numpy().copy()
        dur[members] = np.clip(end[members] - last_arrival[group_of], 0, end[members] - start[members])

        b_rank = local.barrier_rank
        b_res = np.asarray([state.resources.get(int(r), ResourceKind.VIRTUAL, -1, 1, "collective barriers",
                                                ordered=False) for r in b_rank], dtype=np.int64)
        member_names = name_texts(t["name"], members)
        first_names = member_names[np.r_[0, np.cumsum([len(g) for g in groups])[:-1]]]
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
            "phase": t["phase"].iloc[members].tolist() + [None] * len(groups),
            "layer": t["layer"].iloc[members].tolist() + [None] * len(groups),
            "op": t["op"].iloc[members].tolist() + [None] * len(groups),
            "name": [f"arrive {n}" for n in member_names] + [f"barrier {n}" for n in first_names],
        })
        columns: dict[str, pd.Categorical | np.ndarray] = {}
        for col in t.columns:
            if col in _TEXT_COLUMNS:
                columns[col] = _appended_text(t[col], new[col].tolist())
            else:
                ours, theirs = dur if col == "dur_ns" else t[col].to_numpy(), new[col].to_numpy()
                columns[col] = np.concatenate([ours, theirs]).astype(np.result_type(ours, theirs), copy=False)
        tasks = pd.DataFrame(columns, copy=False)
        del t, columns, new
        state.replace_tasks(tasks)

        redirect = np.arange(len(tasks), dtype=np.int64)
        redirect[members] = arrive_ids
        state.edges = {rule: EdgeSet(found.kind, found.src, redirect[found.dst], found.lat_ns)
                       for rule, found in state.edges.items()}
        state.arrivals = Arrivals(member=members, arrive=arrive_ids, barrier=barrier_ids[group_of])


_TEXT_COLUMNS = ("phase", "layer", "op", "name")


def _appended_text(column: pd.Series, extra: list[object]) -> pd.Categorical:
    """``column`` (text, categorical or not) with ``extra`` appended, as a categorical whose
    categories are the values present, sorted, as ``object``: what ``pd.Categorical`` makes of the
    whole column as objects, without turning every task's value into an object first.

    >>> _appended_text(pd.Series(pd.Categorical(["b", None, "a"])), ["c", None, "a"]).tolist()
    ['b', nan, 'a', 'c', nan, 'a']
    """
    old = column.array if isinstance(column.dtype, pd.CategoricalDtype) else pd.Categorical(column.to_numpy())
    old_categories = old.categories.tolist()
    present = [x for x in extra if isinstance(x, str)]
    categories = sorted(set(old_categories) | set(present))
    at = {c: i for i, c in enumerate(categories)}
    old_codes = np.asarray(old.codes, dtype=np.int32)
    lut = np.asarray([at[c] for c in old_categories], dtype=np.int32)
    codes = np.concatenate([np.where(old_codes >= 0, lut[np.maximum(old_codes, 0)] if len(lut) else -1, -1),
                            np.asarray([at[x] if isinstance(x, str) else -1 for x in extra], dtype=np.int32)])
    del old_codes
    used = np.zeros(len(categories), dtype=bool)
    used[codes[codes >= 0]] = True
    if not used.all():
        remap = (np.cumsum(used) - 1).astype(np.int32)
        codes = np.where(codes >= 0, remap[np.maximum(codes, 0)], -1)
        categories = [c for c, u in zip(categories, used) if u]
    return pd.Categorical.from_codes(codes, categories=pd.Index(categories, dtype=object))


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
