"""The collectives of a multi-rank job as a whole: per collective call across the loaded ranks,
its size, algorithm and bus bandwidth (nccl-tests' conventions), the arrival skew from the first
rank to the last, the straggler and what it cost everyone, intra- vs inter-node; per rank, how
long it spent transferring and waiting and how often it was the straggler.

A *call* is one collective matched across ranks by the graph builder
(:mod:`whatif.depgraph.rules.collectives`: the k-th occurrence of a collective name and process
group, or of a kernel name, on every loaded rank; a ``send``/``recv`` with the k-th one between the same
two ranks; on clocks aligned across ranks). For each call:

* ``arrival`` of a rank is the start of its collective kernel; ``skew`` = last arrival - first;
* the **straggler** is the rank that arrived last; every other rank waited for it, and
  ``waited_ns`` is the sum of those waits (the time the straggler cost the others);
* ``transfer_ns`` = the last rank's end - the last arrival (the time the collective itself took);
* ``algbw`` = message bytes / transfer time and ``busbw`` = algbw x the collective's bus factor
  (nccl-tests' ``PERFORMANCE.md``: all-reduce 2(n-1)/n, all-gather, reduce-scatter and all-to-all
  (n-1)/n, the rest 1; n the process group's size; the message is the full buffer:
  :func:`whatif.hardware.collectives.bus_bytes`).

A collective kernel on a rank whose peers are not loaded is a call of one rank: its ``transfer``
is the kernel's duration, waiting for the missing peers included (so its bandwidths are lower
bounds), and it has no skew.

>>> from whatif.tracer.trace import load_trace            # doctest: +SKIP
>>> doc = collectives(load_trace("run/"), ranks_per_node=8)  # doctest: +SKIP
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from whatif.core.bounds import check_fields
from whatif.core.kernels import CollectiveKind, collective_kind
from whatif.depgraph.build import build_graph
from whatif.depgraph.graph import EdgeKind, TaskGraph, TaskKind
from whatif.depgraph.rules.collectives import call_keys
from whatif.documents import CollectiveCall, CollectivesDocument, RankCollectives
from whatif.hardware.collectives import bus_bytes
from whatif.tracer.args import Arg, arg_columns, rank_list
from whatif.tracer.measured_collectives import collective_points
from whatif.tracer.trace import Trace

__all__ = ["CollectivesOptions", "Span", "bus_factor", "collectives", "span_of"]


@dataclass(frozen=True)
class CollectivesOptions:
    ranks_per_node: int | None = field(default=None, metadata={
        "minimum": 1, "maximum": 1 << 20,
        "help": "GPUs per node, to tell intra- from inter-node collectives (rank // N is the node; default: "
                "the number of GPUs the trace's deviceProperties list, when it lists more than one)"})

    def __post_init__(self) -> None:
        check_fields(self)


class Span:
    """Where a call's process group lies."""

    INTRA = "intra-node"
    INTER = "inter-node"
    UNKNOWN = "unknown"


def span_of(ranks: tuple[int, ...], ranks_per_node: int | None) -> str:
    """:class:`Span` of a process group given its ranks.

    >>> span_of((0, 1, 2, 3), 8), span_of((4, 12), 8), span_of((0, 1), None)
    ('intra-node', 'inter-node', 'unknown')
    """
    if not ranks or ranks_per_node is None:
        return Span.UNKNOWN
    return Span.INTRA if len({r // ranks_per_node for r in ranks}) == 1 else Span.INTER


def _default_ranks_per_node(trace: Trace) -> int | None:
    """The GPUs every rank's deviceProperties list, when they agree and list more than one (a
    process that sees one GPU says nothing about its node)."""
    counts = {len(r.device_names) for r in trace.ranks if r.device_names}
    return counts.pop() if len(counts) == 1 and min(counts) > 1 else None


@dataclass
class _Calls:
    """The COMM tasks of the graph with their call (its barrier task, or ``-(1 + task id)`` for a
    kernel whose peers are not loaded: a call of one rank)."""

    comm: np.ndarray       # task ids of COMM tasks
    call: np.ndarray       # per COMM task: its barrier task id, or -(1 + task id) for a lone kernel


def _calls(graph: TaskGraph) -> _Calls:
    t = graph.tasks
    kinds = t["kind"].to_numpy()
    comm = np.flatnonzero(kinds == int(TaskKind.COMM))
    events = t["event"].to_numpy()
    e = graph.edges
    coll = e[e["kind"].to_numpy() == int(EdgeKind.COLLECTIVE)]
    src, dst = coll["src"].to_numpy(), coll["dst"].to_numpy()
    from_arrive = kinds[src] == int(TaskKind.ARRIVE)
    barrier_of_event = dict(zip(events[src[from_arrive]].tolist(), dst[from_arrive].tolist()))
    call = np.asarray([barrier_of_event.get(int(events[c]), -1 - int(c)) for c in comm.tolist()], dtype=np.int64)
    return _Calls(comm, call)


def collectives(trace: Trace, graph: TaskGraph | None = None,
                options: CollectivesOptions = CollectivesOptions()) -> CollectivesDocument:
    """Every collective call of ``trace`` across its loaded ranks, and per-rank totals.

    Parameters
    ----------
    trace : the event table of one rank, or several (a folder of per-rank traces).
    graph : its dependency graph (built when None): it matches the calls across ranks and aligns
        the ranks' clocks.
    options : :class:`CollectivesOptions` (GPUs per node).
    """
    graph = graph if graph is not None else build_graph(trace)
    per_node = options.ranks_per_node if options.ranks_per_node is not None else _default_ranks_per_node(trace)
    t = graph.tasks
    found = _calls(graph)
    if not len(found.comm):
        return CollectivesDocument(source=trace.source, ranks_per_node=per_node, calls=[], ranks=[])
    points = {p.event: p for p in collective_points(trace)}
    names = dict(zip(found.comm.tolist(), t["name"].iloc[found.comm].astype(str).tolist()))  # per COMM task
    events, ranks_col = t["event"].to_numpy(), t["rank"].to_numpy()
    start, end, steps = t["measured_start_ns"].to_numpy(), t["measured_end_ns"].to_numpy(), t["step"].to_numpy()
    rows = np.unique(events[found.comm])  # arguments are read for these rows only (a job has millions)
    coll_name, pg_ranks = ({int(r): v for r, v in zip(rows.tolist(), column)} for column in arg_columns(
        trace.args, (Arg.COLLECTIVE_NAME, Arg.PROCESS_GROUP_RANKS), rows).values())
    key_of = dict(zip(found.comm.tolist(), call_keys(trace.args, events[found.comm], [names[c] for c in found.comm],
                                                     ranks_col[found.comm])))
    frame = pd.DataFrame({"task": found.comm, "call": found.call, "rank": ranks_col[found.comm],
                          "arrival": start[found.comm], "end": end[found.comm]})
    frame = _with_waits(frame.sort_values(["arrival", "rank"], kind="stable"))
    calls: list[CollectiveCall] = []
    occurrence: dict[tuple[str, tuple[int, ...]], int] = {}   # per key and ranks: same-named subgroups count apart
    for _, members in frame.groupby("call", sort=False):
        first = int(members["task"].iloc[0])
        ev = int(events[first])
        point = points.get(ev)
        kind = point.kind if point is not None else (k.value if (k := collective_kind(coll_name[ev] or None,
                                                                                       names[first])) else "unknown")
        key = key_of[first]
        loaded = tuple(sorted(int(r) for r in members["rank"]))
        n = occurrence[(key, loaded)] = occurrence.get((key, loaded), -1) + 1
        arrival = members["arrival"].to_numpy()
        transfer = int(members["transfer"].max())
        group = point.ranks if point is not None else None
        nbytes = point.message_bytes if point is not None else None
        algbw = nbytes / transfer if nbytes is not None and transfer > 0 else None
        busbw = algbw * bus_factor(kind, group) if algbw is not None and group else None
        known: tuple[int, ...] = ()
        if kind == CollectiveKind.SEND_RECV.value:  # a transfer spans its two ends, not its process group
            known = loaded if len(loaded) == 2 else ()
        else:
            known = rank_list(pg_ranks[ev]) or (loaded if group is not None and len(loaded) == group else ())
        straggler = int(members["rank"].to_numpy()[int(np.argmax(arrival))]) if len(members) > 1 else None
        calls.append(CollectiveCall(
            key=key, occurrence=n, kind=kind, step=int(steps[first]), message_bytes=nbytes, group_size=group,
            ranks=list(loaded), span=span_of(known, per_node),
            first_arrival_ns=int(arrival.min()), skew_ns=int(arrival.max() - arrival.min()),
            transfer_ns=max(transfer, 0), straggler=straggler, waited_ns=int(members["waited"].sum()),
            algbw_gbps=None if algbw is None else round(algbw, 6),
            busbw_gbps=None if busbw is None else round(busbw, 6)))
    calls.sort(key=lambda c: (c.first_arrival_ns, c.key, c.occurrence))
    return CollectivesDocument(source=trace.source, ranks_per_node=per_node, calls=calls,
                               ranks=_rank_totals(frame, calls))


def _with_waits(frame: pd.DataFrame) -> pd.DataFrame:
    """Each member's ``waited`` (last arrival of its call - its arrival) and ``transfer`` (its end -
    the last arrival; for a call of one rank, the whole kernel)."""
    last = frame.groupby("call")["arrival"].transform("max").to_numpy()
    lone = frame.groupby("call")["rank"].transform("size").to_numpy() == 1
    arrival, end = frame["arrival"].to_numpy(), frame["end"].to_numpy()
    return frame.assign(waited=last - arrival, transfer=np.where(lone, end - arrival, end - last))


def _rank_totals(frame: pd.DataFrame, calls: list[CollectiveCall]) -> list[RankCollectives]:
    caused: dict[int, int] = {}
    straggled: dict[int, int] = {}
    for c in calls:
        if c.straggler is not None:
            caused[c.straggler] = caused.get(c.straggler, 0) + c.waited_ns
            straggled[c.straggler] = straggled.get(c.straggler, 0) + 1
    out = []
    for r in sorted(set(frame["rank"].tolist())):
        rows = frame[frame["rank"].to_numpy() == r]
        out.append(RankCollectives(rank=r, calls=len(rows), transfer_ns=int(np.maximum(rows["transfer"], 0).sum()),
                                   waited_ns=int(rows["waited"].sum()), straggler_calls=straggled.get(r, 0),
                                   caused_wait_ns=caused.get(r, 0)))
    return out


def bus_factor(kind: str, group_size: int) -> float:
    """nccl-tests' busbw / algbw of a collective of ``group_size`` ranks (1 for an unknown kind).

    >>> bus_factor("all_reduce", 8), bus_factor("all_gather", 4), bus_factor("unknown", 4)
    (1.75, 0.75, 1.0)
    """
    try:
        return bus_bytes(kind, 1.0, group_size)
    except ValueError:
        return 1.0
