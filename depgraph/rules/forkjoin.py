"""Cross-thread waits the trace shows by timing (Lumos's CPU inter-thread dependencies).

When thread A sits idle between tasks ``u`` and ``v`` while thread B runs a burst of tasks
``f..l`` entirely inside that gap (e.g. the main thread blocked in ``backward()`` while autograd's
thread runs the backward ops), A was waiting for B: ``u`` forks ``f`` and ``l`` joins ``v``
(:class:`ForkJoins`). A's gap keeps only the part before the burst and B's idle gap before ``f``
becomes 0 (:class:`BurstGaps`), so the waits are recomputed in every replay.

A polling thread (every task a :data:`~.sync_lookup.QUERY_CALL`, e.g. PyTorch's NCCL watchdog)
neither forks nor joins: it sleeps on a timer, so its gaps hold other threads' bursts by chance,
and nothing it does can release another thread.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from whatif.tracer.trace import per_name

from ..graph import EdgeKind
from ..state import BuildState, EdgeSet
from .base import Adjustment, EdgeRule
from .sync_lookup import QUERY_CALL
from .thread import ThreadOrder


@dataclass(frozen=True)
class Bursts:
    """Bursts found for one pair of threads (A, B): A's THREAD edge (index) whose gap holds each
    burst, and the burst's first and last task on B."""

    thread_edge: np.ndarray
    first: np.ndarray
    last: np.ndarray


def polling_threads(state: BuildState, tasks_of: dict[int, np.ndarray]) -> set[int]:
    """The threads (of ``tasks_of``: thread -> its tasks) whose every task is a query call."""
    query = per_name(state.tasks["name"], lambda n: QUERY_CALL.match(n) is not None)
    return {th for th, tasks in tasks_of.items() if query[tasks].all()}


def thread_bursts(state: BuildState) -> list[Bursts]:
    """Every burst of one thread inside another thread's gap, per pair of threads of a rank
    neither of which polls (found once per state of the task table)."""
    return state.memo("thread_bursts", lambda: _thread_bursts(state))


def _thread_bursts(state: BuildState) -> list[Bursts]:
    thread = state.edges[ThreadOrder]
    src, dst = thread.src, thread.dst
    start_m, end_m = state.start_ns, state.end_ns
    resource, ranks = state.column("resource"), state.column("rank")
    threads = np.unique(resource[src]) if len(src) else np.empty(0, dtype=np.int64)
    by_thread = {}
    for th in threads.tolist():
        sel = np.flatnonzero(resource[src] == th)
        order = sel[np.argsort(start_m[dst[sel]], kind="stable")]
        by_thread[th] = (order, np.concatenate([src[order][:1], dst[order]]))
    thread_rank = {th: int(ranks[tasks[0]]) for th, (_, tasks) in by_thread.items()}
    polling = polling_threads(state, {th: tasks for th, (_, tasks) in by_thread.items()})
    state.report["polling_threads"] = len(polling)
    found = []
    for a, (a_edges, _) in by_thread.items():
        gap_lo, gap_hi = end_m[src[a_edges]], start_m[dst[a_edges]]
        for b, (_, b_tasks) in by_thread.items():
            if a == b or thread_rank[a] != thread_rank[b] or a in polling or b in polling:
                continue
            b_start, b_end = start_m[b_tasks], np.maximum.accumulate(end_m[b_tasks])
            first = np.searchsorted(b_start, gap_lo, side="left")
            last = np.searchsorted(b_end, gap_hi, side="right") - 1
            hit = np.flatnonzero((last >= first) & (first < len(b_tasks)))
            if len(hit):
                found.append(Bursts(a_edges[hit], b_tasks[first[hit]], b_tasks[last[hit]]))
    return found


class ForkJoins(EdgeRule):
    """FLOW edges ``u -> f`` (fork) and ``l -> v`` (join) per burst; latency = measured offset."""

    kind = EdgeKind.FLOW
    needs = (ThreadOrder,)

    def edges(self, state: BuildState) -> EdgeSet:
        bursts = thread_bursts(state)
        if not bursts:
            return EdgeSet.empty(self.kind)
        thread = state.edges[ThreadOrder]
        forks_src = np.concatenate([thread.src[b.thread_edge] for b in bursts])
        forks_dst = np.concatenate([b.first for b in bursts])
        joins_src = np.concatenate([b.last for b in bursts])
        joins_dst = np.concatenate([thread.dst[b.thread_edge] for b in bursts])
        state.report["thread_forks_joins"] = len(forks_src)
        src, dst = np.concatenate([forks_src, joins_src]), np.concatenate([forks_dst, joins_dst])
        return EdgeSet.of(self.kind, src, dst, np.maximum(state.start_ns[dst] - state.end_ns[src], 0))


class BurstGaps(Adjustment):
    """The waiting thread's gap keeps only its part before the burst; the burst's thread was idle
    (woken), so the THREAD edge into its first task carries 0."""

    needs = (ThreadOrder,)

    def apply(self, state: BuildState) -> None:
        thread = state.edges[ThreadOrder]
        start_m, end_m = state.start_ns, state.end_ns
        lat_ns = thread.lat_ns.copy()
        edge_into = np.full(len(start_m), -1, dtype=np.int64)
        edge_into[thread.dst] = np.arange(len(thread.dst))
        for b in thread_bursts(state):
            e = b.thread_edge
            lat_ns[e] = np.maximum(np.minimum(lat_ns[e], start_m[b.first] - end_m[thread.src[e]]), 0)
            woken = edge_into[b.first]
            lat_ns[woken[woken >= 0]] = 0
        state.set_latency(ThreadOrder, lat_ns)
