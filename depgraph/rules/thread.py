"""CPU program order: each thread's tasks in measured order (step markers around the work they
bound), the edge carrying the CPU time between them (Daydream's gap)."""
from __future__ import annotations

import numpy as np

from ..graph import EdgeKind
from ..state import BuildState, EdgeSet
from .base import EdgeRule
from .blocking import BlockingCallIssue
from .order import consecutive_pairs


class ThreadOrder(EdgeRule):
    """THREAD edges: consecutive tasks of a thread; latency = the gap, overlaps clipped to 0."""

    kind = EdgeKind.THREAD
    needs = (BlockingCallIssue,)

    def edges(self, state: BuildState) -> EdgeSet:
        cpu = state.cpu_ids
        start, end = state.start_ns, state.end_ns
        resource = state.column("resource")
        order = cpu[np.lexsort((end[cpu], state.thread_tie[cpu], start[cpu], resource[cpu]))]
        prev, cur = consecutive_pairs(resource, order)
        gap_ns = start[cur] - end[prev]
        state.report["cpu_overlaps_clipped"] = int((gap_ns < 0).sum())
        return EdgeSet.of(self.kind, prev, cur, np.maximum(gap_ns, 0))
