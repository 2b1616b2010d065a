"""Launches: a call -> the GPU work with its correlation id (a CUDA/HIP graph launch reaches all
its kernels).

A kernel starts at ``max(launch arrives, stream free)``; the trace shows only the start. If the
launch returned (plus the rank's fastest launch latency, its :data:`LAUNCH_QUANTILE`) before the
previous kernel on the stream ended, the kernel was *queued*: its LAUNCH edge carries that
fastest latency and its STREAM edge the measured idle. Otherwise it was *launch-bound*: the
LAUNCH edge carries the measured latency (:mod:`.stream` gives its STREAM edge the median idle).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..graph import EdgeKind
from ..state import BuildState, EdgeSet
from .base import EdgeRule
from .blocking import BlockingCallIssue
from .order import stream_pairs

LAUNCH_QUANTILE = 0.05  # a launch latency this low is "the stream was idle, the launch was the bottleneck"


@dataclass(frozen=True)
class LaunchTiming:
    """Per launched GPU task: its call, the measured launch latency, and whether it was queued."""

    gpu: np.ndarray
    call: np.ndarray
    gap_ns: np.ndarray    # measured: GPU start - call end
    floor_ns: np.ndarray  # its rank's fastest launch latency
    queued: np.ndarray    # bool: the stream, not the launch, held it back


def launch_timing(state: BuildState) -> LaunchTiming:
    """Launch latencies and queued/launch-bound, per launched GPU task (see the module docstring)."""
    start, end = state.start_ns, state.end_ns
    rank = state.column("rank").astype(np.int64)
    prev, cur = stream_pairs(state)
    prev_of = np.full(len(start), -1, dtype=np.int64)
    prev_of[cur] = prev
    launcher = state.launch_of[state.gpu_ids]
    gpu, call = state.gpu_ids[launcher >= 0], launcher[launcher >= 0]
    gap_ns = start[gpu] - end[call]
    ranks = sorted(state.origin_of_rank)
    floors = np.asarray([int(np.quantile(gap_ns[rank[gpu] == r], LAUNCH_QUANTILE)) if (rank[gpu] == r).any() else 0
                         for r in ranks], dtype=np.int64)
    floor_ns = (floors[np.searchsorted(np.asarray(ranks, dtype=np.int64), rank[gpu])] if len(gpu)
                else np.empty(0, dtype=np.int64))
    p = prev_of[gpu]
    has_prev = p >= 0
    queued = np.zeros(len(gpu), dtype=bool)
    queued[has_prev] = end[call[has_prev]] + floor_ns[has_prev] <= end[p[has_prev]]
    return LaunchTiming(gpu=gpu, call=call, gap_ns=gap_ns, floor_ns=floor_ns, queued=queued)


class LaunchEdges(EdgeRule):
    """LAUNCH edges: call -> GPU work; latency = measured, or the fastest one for queued work."""

    kind = EdgeKind.LAUNCH
    needs = (BlockingCallIssue,)

    def edges(self, state: BuildState) -> EdgeSet:
        self._count_unmatched(state)
        timing = launch_timing(state)
        lat_ns = np.where(timing.queued, np.minimum(timing.gap_ns, timing.floor_ns), timing.gap_ns)
        state.report["gpu_tasks_launch_bound"] = int((~timing.queued).sum())
        state.report["gpu_tasks_queued"] = int(timing.queued.sum())
        return EdgeSet.of(self.kind, timing.call, timing.gpu, lat_ns)

    @staticmethod
    def _count_unmatched(state: BuildState) -> None:
        report = state.report
        launcher = state.launch_of[state.gpu_ids]
        report["gpu_tasks_without_launch"] = int((launcher < 0).sum())
        names = state.tasks["name"].iloc[state.call_ids].tolist()
        is_launch_name = np.fromiter((("Launch" in n) or ("Memcpy" in n) or ("Memset" in n) for n in names),
                                     dtype=bool, count=len(names))
        launched_calls = np.unique(launcher[launcher >= 0])
        report["launch_calls_without_gpu_task"] = int(
            is_launch_name.sum() - np.isin(state.call_ids[is_launch_name], launched_calls).sum())
        report["graph_launches"] = int(sum("GraphLaunch" in n for n in names))
