"""Kernels held back by another stream's kernel: a kernel that fills the device's SMs leaves
none to a kernel of another stream until its blocks retire, so that kernel starts as the
other one finishes (in its last wave, or just after it).

The evidence is timing. A launched kernel is *held* when it started later than it was ready
(its launch arrived: call end + the device's launch latency, :mod:`.launch`; and its stream
predecessor ended), by more than that launch latency, and another stream's kernel on its device
(not a collective, whose kernels take few SMs) covered at least half of that delay and ended
within half of it of the held kernel's start: then the held kernel waited for that kernel (the
one ending nearest its start). A CONTENTION edge links them, latency = the measured offset from
that kernel's end to the held kernel's start (negative when it started in the last wave), and
:class:`ContentionLaunches` gives the held kernel's LAUNCH edge the launch latency and its STREAM
edge the median idle of queued work, so every replay recomputes the wait from the other kernel's
end. ``graph.report``: ``kernels_held_by_other_streams``, ``..._ns`` (the delays explained).
On ``hta/trace_diff_control_rank3`` (A100, fbgemm embedding backward on one stream, index
permutations on another) the permutations start 0-7 µs after, or 60-95 µs before, the end of
``split_embedding_backward_codegen_*`` (docs/accuracy.md).
"""
from __future__ import annotations

import numpy as np

from ..graph import EdgeKind, TaskKind
from ..state import BuildState, EdgeSet
from .base import Adjustment, EdgeRule
from .blocking import BlockingCallIssue
from .launch import LaunchEdges, launch_timing
from .order import stream_pairs
from .stream import StreamOrder, queued_idle_ns


class DeviceContention(EdgeRule):
    """CONTENTION edges: the other stream's kernel that held a kernel back -> that kernel (module
    docstring); latency = the measured offset from its end."""

    kind = EdgeKind.CONTENTION
    needs = (BlockingCallIssue,)

    def edges(self, state: BuildState) -> EdgeSet:
        start, end = state.start_ns, state.end_ns
        n = len(start)
        timing = launch_timing(state)
        ready = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
        floor = np.zeros(n, dtype=np.int64)
        ready[timing.gpu] = end[timing.call] + timing.floor_ns
        floor[timing.gpu] = timing.floor_ns
        prev, cur = stream_pairs(state)
        ready[cur] = np.where(ready[cur] < np.iinfo(np.int64).max, np.maximum(ready[cur], end[prev]), ready[cur])
        resource = state.column("resource")
        res_frame = state.resources.frame()
        device = res_frame["rank"].to_numpy()[resource] * (1 << 20) + res_frame["device"].to_numpy()[resource]
        kernels = state.gpu_ids[state.column("kind")[state.gpu_ids] == int(TaskKind.KERNEL)]
        src: list[int] = []
        dst: list[int] = []
        for d in np.unique(device[kernels]).tolist():
            on = kernels[device[kernels] == d]
            on = on[np.argsort(end[on], kind="stable")]
            ends = end[on]
            delay = start[on] - ready[on]
            for v in on[(ready[on] < np.iinfo(np.int64).max) & (delay > floor[on])].tolist():
                late = int(start[v] - ready[v])
                lo = int(np.searchsorted(ends, start[v] - late // 2, side="left"))
                hi = int(np.searchsorted(ends, start[v] + late // 2, side="right"))
                cand = on[lo:hi]
                covered = np.minimum(end[cand], start[v]) - np.maximum(start[cand], ready[v])
                cand = cand[(resource[cand] != resource[v]) & (2 * covered >= late)]
                if len(cand):
                    src.append(int(cand[np.argmin(np.abs(end[cand] - start[v]))]))
                    dst.append(v)
        s, t = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        state.report["kernels_held_by_other_streams"] = len(t)
        state.report["kernels_held_by_other_streams_ns"] = int((start[t] - ready[t]).sum())
        return EdgeSet.of(self.kind, s, t, start[t] - end[s])


class ContentionLaunches(Adjustment):
    """A kernel another stream's kernel held back: its LAUNCH edge carries the device's launch
    latency and its STREAM edge the median idle of queued work; the wait is the CONTENTION edge's."""

    needs = (LaunchEdges, StreamOrder, DeviceContention)

    def apply(self, state: BuildState) -> None:
        held = np.unique(state.edges[DeviceContention].dst)
        timing = launch_timing(state)
        floor = np.zeros(len(state.start_ns), dtype=np.int64)
        floor[timing.gpu] = timing.floor_ns
        launch = state.edges[LaunchEdges]
        lat_ns = launch.lat_ns.copy()
        lower = np.isin(launch.dst, held)
        lat_ns[lower] = np.minimum(lat_ns[lower], floor[launch.dst[lower]])
        stream = state.edges[StreamOrder]
        idle_ns = stream.lat_ns.copy()
        lower_idle = np.isin(stream.dst, held)
        idle_ns[lower_idle] = np.minimum(idle_ns[lower_idle], queued_idle_ns(state))
        state.report["kernels_held_gap_recomputed_ns"] = int((launch.lat_ns - lat_ns).sum()
                                                             + (stream.lat_ns - idle_ns).sum())
        state.set_latency(LaunchEdges, lat_ns)
        state.set_latency(StreamOrder, idle_ns)
