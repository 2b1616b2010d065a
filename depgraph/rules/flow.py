"""Cross-thread dependencies the trace records as flow events (``fwdbwd``: a forward op -> its
backward op on the autograd thread).

A flow target starts after both its flow source and its thread predecessor; the trace shows which
ended last. If the thread predecessor did (the autograd thread running one backward op after
another, long after their forward ops ended), the thread's order held it: its THREAD edge keeps
the CPU gap and the FLOW edge carries 0, a data dependency long satisfied. Otherwise the thread
sat idle when the source ended, and the source woke it: the FLOW edge carries the measured offset
and the THREAD edge 0. Either way the unmodified replay reproduces the start, and the
forward-to-backward offset (ms: the rest of the forward pass, the loss, the backward ops before)
is never frozen where the replay recomputes it through the thread.
"""
from __future__ import annotations

import numpy as np

from ..graph import EdgeKind
from ..state import BuildState, EdgeSet
from .base import Adjustment, EdgeRule
from .thread import ThreadOrder


class Flows(EdgeRule):
    """FLOW edges from matched flow start/finish events; latency = the measured offset from the
    source task's end to the target's start (:class:`FlowWakesThread` keeps it only where the flow
    woke its thread). Several flows into one task keep the one that ends last."""

    kind = EdgeKind.FLOW

    def edges(self, state: BuildState) -> EdgeSet:
        trace = state.trace
        if not trace.flows:
            return EdgeSet.empty(self.kind)
        start_m, end_m = state.start_ns, state.end_ns
        cpu_ids = state.cpu_ids
        ranks = state.column("rank")
        ev = trace.events
        rows = state.column("event")[cpu_ids]
        valid = rows >= 0
        pid_tid: dict[tuple[int, int, int], list[int]] = {}
        for task, r, p, th in zip(cpu_ids[valid], ranks[cpu_ids][valid], ev["pid"].to_numpy()[rows[valid]],
                                  ev["tid"].to_numpy()[rows[valid]]):
            pid_tid.setdefault((int(r), int(p), int(th)), []).append(int(task))
        by_thread = {k: np.asarray(sorted(v, key=lambda i: (start_m[i], end_m[i])), dtype=np.int64)
                     for k, v in pid_tid.items()}
        starts = {k: start_m[v] for k, v in by_thread.items()}
        pairs: dict[tuple[int, str, int], dict[str, tuple[int, int, int, int]]] = {}
        for r, fl in trace.flows:
            pairs.setdefault((r, fl.category, fl.flow_id), {})[fl.phase] = (fl.pid, fl.tid, fl.ts_ns, r)
        src, dst = [], []
        for ends in pairs.values():
            if "s" not in ends or "f" not in ends:
                state.report["flows_unmatched"] += 1
                continue
            (sp, st, sts, r), (fp, ft, fts, _) = ends["s"], ends["f"]
            a, b = by_thread.get((r, sp, st)), by_thread.get((r, fp, ft))
            if a is None or b is None or (sp, st) == (fp, ft):
                continue
            i = np.searchsorted(starts[(r, sp, st)], sts, side="right") - 1
            j = np.searchsorted(starts[(r, fp, ft)], fts, side="left")
            if i < 0 or j >= len(b) or end_m[a[i]] > start_m[b[j]]:
                state.report["flows_unmatched"] += 1
                continue
            src.append(a[i])
            dst.append(b[j])
        s, d = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        keep = np.lexsort((end_m[s], d))
        last = np.ones(len(keep), dtype=bool)
        last[:-1] = d[keep][1:] != d[keep][:-1]
        s, d = s[keep][last], d[keep][last]
        state.report["flows_cross_thread"] = len(s)
        return EdgeSet.of(self.kind, s, d, start_m[d] - end_m[s])


class FlowWakesThread(Adjustment):
    """Per flow target, the dependency that ended last holds it (module docstring): a thread woken
    by its flow (the source ended after the thread's previous task) was idle, its THREAD edge
    carries 0; a target its thread held keeps the THREAD gap, and its FLOW edge carries 0."""

    needs = (ThreadOrder, Flows)

    def apply(self, state: BuildState) -> None:
        thread, flows = state.edges[ThreadOrder], state.edges[Flows]
        end = state.end_ns
        prev = np.full(len(end), -1, dtype=np.int64)
        prev[thread.dst] = thread.src
        p = prev[flows.dst]
        held_by_thread = (p >= 0) & (end[np.maximum(p, 0)] >= end[flows.src])
        woken = flows.dst[~held_by_thread]
        state.report["flows_held_by_thread"] = int(held_by_thread.sum())
        state.report["flows_waking_thread"] = len(woken)
        state.set_latency(Flows, np.where(held_by_thread, 0, flows.lat_ns))
        lat_ns = thread.lat_ns.copy()
        lat_ns[np.isin(thread.dst, woken)] = 0
        state.set_latency(ThreadOrder, lat_ns)
