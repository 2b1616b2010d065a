"""GPU stream order: each stream's work in measured order."""
from __future__ import annotations

import numpy as np

from ..graph import EdgeKind
from ..state import BuildState, EdgeSet
from .base import EdgeRule
from .blocking import BlockingCallIssue
from .launch import launch_timing
from .order import stream_pairs


class StreamOrder(EdgeRule):
    """STREAM edges: consecutive work of a stream; latency = the measured idle between them, but
    for launch-bound work (:mod:`.launch`) the median idle of queued work: its launch set its start."""

    kind = EdgeKind.STREAM
    needs = (BlockingCallIssue,)

    def edges(self, state: BuildState) -> EdgeSet:
        prev, cur = stream_pairs(state)
        idle_ns = state.start_ns[cur] - state.end_ns[prev]
        state.report["gpu_overlaps_clipped"] = int((idle_ns < 0).sum())
        launch_bound = np.zeros(len(state.tasks), dtype=bool)
        timing = launch_timing(state)
        launch_bound[timing.gpu[~timing.queued]] = True
        typical_ns = queued_idle_ns(state)
        idle_ns = np.maximum(idle_ns, 0)
        return EdgeSet.of(self.kind, prev, cur, np.where(launch_bound[cur], np.minimum(idle_ns, typical_ns), idle_ns))


def queued_idle_ns(state: BuildState) -> int:
    """The median idle between queued work and its stream predecessor (0 without queued work)."""
    prev, cur = stream_pairs(state)
    idle_ns = np.maximum(state.start_ns[cur] - state.end_ns[prev], 0)
    timing = launch_timing(state)
    launch_bound = np.zeros(len(state.tasks), dtype=bool)
    launch_bound[timing.gpu[~timing.queued]] = True
    queued_idle = idle_ns[~launch_bound[cur]]
    return int(np.median(queued_idle)) if len(queued_idle) else 0
