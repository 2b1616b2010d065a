"""Launches: a call -> the GPU work with its correlation id (a CUDA/HIP graph launch reaches all
its kernels).

A kernel starts at ``max(launch arrives, stream free)``; the trace shows only the start. If the
launch returned (plus the device's launch latency, below) before the previous kernel on the
stream ended, the kernel was *queued*: its LAUNCH edge carries that latency and its STREAM edge
the measured idle. Otherwise it was *launch-bound*: the LAUNCH edge carries the measured latency
(:mod:`.stream` gives its STREAM edge the median idle).

**The launch latency** (call returns -> GPU work starts, nothing else in the way) is read off the
launches that found their stream idle: the stream's previous work had ended before the call
returned, or there was none. Only a call's first GPU task counts (a graph launch's later nodes
wait for the earlier ones). Per (rank, device), the median of those gaps, over
:data:`MIN_IDLE_LAUNCHES` or more of them; else the rank's, pooled over its devices; else
:data:`DEFAULT_LAUNCH_LATENCY_NS`. The median, not a low quantile: the gaps are µs on a µs clock
(2021-2023 traces round to whole µs, and CPU and GPU clocks differ by about as much), and a
stream that also waits on another stream's event (``cudaStreamWaitEvent``, invisible without
``cuda_sync`` records) looks idle but starts late; both tails are a minority. Per device, not
per stream: the latency is the driver's path to the device; a stream's own idle launches are few
and can all be such event waits (NCCL's stream on ``hta/negative_queue``: 10 idle launches,
0.5-5.5 ms late). Measured on the shared traces (docs/accuracy.md): 0-3 µs on NVIDIA GPUs,
4.6-24 µs on AMD MI300X through HIP. The 5 % quantile of *all* launch gaps, used before, is the
CPU's lead over the GPU wherever the CPU runs far ahead (7.3 ms on ``hta/negative_queue``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from whatif.tracer.trace import per_name

from ..graph import EdgeKind
from ..state import BuildState, EdgeSet
from .base import EdgeRule
from .blocking import BlockingCallIssue
from .order import stream_pairs

MIN_IDLE_LAUNCHES = 8             # idle-stream launches needed for a device's (or rank's) own median
DEFAULT_LAUNCH_LATENCY_NS = 2_000  # median over the shared traces' ranks of their own median (docs/accuracy.md)


@dataclass(frozen=True)
class LaunchTiming:
    """Per launched GPU task: its call, the measured launch latency, and whether it was queued."""

    gpu: np.ndarray
    call: np.ndarray
    gap_ns: np.ndarray    # measured: GPU start - call end
    floor_ns: np.ndarray  # its device's launch latency (see the module docstring)
    queued: np.ndarray    # bool: the stream, not the launch, held it back


def launch_timing(state: BuildState) -> LaunchTiming:
    """Launch latencies and queued/launch-bound, per launched GPU task (see the module docstring);
    computed once per state of the task table, however many rules ask."""
    return state.memo("launch_timing", lambda: _launch_timing(state))


def _launch_timing(state: BuildState) -> LaunchTiming:
    start, end = state.start_ns, state.end_ns
    prev, cur = stream_pairs(state)
    prev_of = np.full(len(start), -1, dtype=np.int64)
    prev_of[cur] = prev
    launcher = state.launch_of[state.gpu_ids]
    gpu, call = state.gpu_ids[launcher >= 0], launcher[launcher >= 0]
    gap_ns = start[gpu] - end[call]
    p = prev_of[gpu]
    has_prev = p >= 0
    idle = ~has_prev
    idle[has_prev] = end[p[has_prev]] <= end[call[has_prev]]
    floor_ns = launch_latency_ns(state, gpu, call, gap_ns, idle)
    queued = np.zeros(len(gpu), dtype=bool)
    queued[has_prev] = end[call[has_prev]] + floor_ns[has_prev] <= end[p[has_prev]]
    return LaunchTiming(gpu=gpu, call=call, gap_ns=gap_ns, floor_ns=floor_ns, queued=queued)


def launch_latency_ns(state: BuildState, gpu: np.ndarray, call: np.ndarray, gap_ns: np.ndarray,
                      idle: np.ndarray) -> np.ndarray:
    """Per launched GPU task: its device's launch latency, the median gap of the launches that
    found their stream idle (first GPU task of each call), with the fallbacks of the module
    docstring. ``state.report`` gets the range over devices and how many fell back."""
    rank = state.column("rank").astype(np.int64)[gpu]
    device = state.resources.frame()["device"].to_numpy().astype(np.int64)[state.column("resource")[gpu]]
    order = np.lexsort((state.start_ns[gpu], call))
    by_call = call[order]
    first = np.zeros(len(gpu), dtype=bool)
    first[order] = np.r_[True, by_call[1:] != by_call[:-1]][:len(gpu)]
    sample = idle & first
    out = np.full(len(gpu), DEFAULT_LAUNCH_LATENCY_NS, dtype=np.int64)
    values: list[int] = []
    from_rank = by_default = 0
    for r in np.unique(rank).tolist():
        in_rank = rank == r
        pooled = gap_ns[in_rank & sample]
        rank_ns = int(np.median(pooled)) if len(pooled) >= MIN_IDLE_LAUNCHES else None
        for d in np.unique(device[in_rank]).tolist():
            on = in_rank & (device == d)
            own = gap_ns[on & sample]
            if len(own) >= MIN_IDLE_LAUNCHES:
                value = int(np.median(own))
            elif rank_ns is not None:
                value, from_rank = rank_ns, from_rank + 1
            else:
                value, by_default = DEFAULT_LAUNCH_LATENCY_NS, by_default + 1
            out[on] = value
            values.append(value)
    report = state.report
    report["launch_latency_ns_min"] = min(values, default=0)
    report["launch_latency_ns_max"] = max(values, default=0)
    report["launch_latency_devices_from_rank"] = from_rank
    report["launch_latency_devices_default"] = by_default
    return out


class LaunchEdges(EdgeRule):
    """LAUNCH edges: call -> GPU work; latency = measured, or the device's launch latency for queued work."""

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
        name = state.tasks["name"]
        is_launch_name = per_name(name, lambda n: "Launch" in n or "Memcpy" in n or "Memset" in n)[state.call_ids]
        launched_calls = np.unique(launcher[launcher >= 0])
        report["launch_calls_without_gpu_task"] = int(
            is_launch_name.sum() - np.isin(state.call_ids[is_launch_name], launched_calls).sum())
        report["graph_launches"] = int(per_name(name, lambda n: "GraphLaunch" in n)[state.call_ids].sum())
