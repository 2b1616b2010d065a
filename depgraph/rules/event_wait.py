"""Stream waits: ``cudaStreamWaitEvent`` makes the first work launched on the waiting stream
after the call wait for the work the event captured on another stream.

**Recorded.** With a ``cuda_sync`` record, the record names the waiting stream and the
``cudaEventRecord`` (correlation id, stream): the captured work is the last work launched on
that stream before the record call.

**Inferred.** Without one (CUPTI before ~2023 records no ``cuda_sync``, and traces rarely hold
the ``cudaEventRecord`` call), the evidence is the timing of the first work after the wait. The
waiting stream is the stream of the thread's next launch. That work waited for the event if it
was launch-bound (its stream was free) and started later than its launch could have arrived
(call end + the device's launch latency, :mod:`.launch`): then the work it waited for is the
other stream's work, on its device, that ended last before it started, provided that work ended
in the later half of the late window (it explains most of the delay). Otherwise the delay cannot
be attributed: it stays on the LAUNCH edge and ``graph.report`` counts it
(``stream_waits_unattributed``, ``..._ns``), unless another stream's kernel held the work back
(:mod:`.contention`: its CONTENTION edge recomputes the delay).

**Held work.** Work whose stream wait held it (the waited-for work ended after its launch could
have arrived, :class:`EventWaitLaunches`) starts when the waited-for work ends: its EVENT_WAIT
edge carries the measured offset from that end to its start (the GPU's reaction, µs when
recorded), and its LAUNCH edge the device's launch latency, not the measured gap, so the wait is
recomputed by every replay. Other EVENT_WAIT edges carry 0.
"""
from __future__ import annotations

import numpy as np

from ..graph import EdgeKind
from ..state import BuildState, EdgeSet
from .base import Adjustment, EdgeRule
from .blocking import BlockingCallIssue
from .contention import DeviceContention
from .launch import LaunchEdges, LaunchTiming, launch_timing
from .sync_lookup import STREAM_WAIT, SyncLookup


class _Launches:
    """Per task (-1 / 0 where not launched): its call, launch latency and whether its launch bound it."""

    def __init__(self, state: BuildState, timing: LaunchTiming) -> None:
        n = len(state.start_ns)
        self.call = np.full(n, -1, dtype=np.int64)
        self.floor_ns = np.zeros(n, dtype=np.int64)
        self.launch_bound = np.zeros(n, dtype=bool)
        self.call[timing.gpu] = timing.call
        self.floor_ns[timing.gpu] = timing.floor_ns
        self.launch_bound[timing.gpu] = ~timing.queued
        self.arrive_ns = np.where(self.call >= 0, state.end_ns[np.maximum(self.call, 0)] + self.floor_ns, 0)

    def held(self, state: BuildState, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Whether ``src`` ended after ``dst``'s launch could have arrived, ``dst`` launch-bound."""
        return self.launch_bound[dst] & (self.call[dst] >= 0) & (state.end_ns[src] > self.arrive_ns[dst])


class _EndsByDevice:
    """Per (rank, device): its GPU work sorted by end, to find what ended last before a time."""

    def __init__(self, state: BuildState) -> None:
        resources = state.resources.frame()
        gpu = state.gpu_ids
        res = state.column("resource")[gpu]
        key = resources["rank"].to_numpy()[res] * (1 << 20) + resources["device"].to_numpy()[res]
        self.device_key = np.zeros(len(state.start_ns), dtype=np.int64)
        self.device_key[gpu] = key
        self.tasks: dict[int, np.ndarray] = {}
        self.ends: dict[int, np.ndarray] = {}
        end = state.end_ns
        for k in np.unique(key).tolist():
            sel = gpu[key == k]
            sel = sel[np.argsort(end[sel], kind="stable")]
            self.tasks[k], self.ends[k] = sel, end[sel]
        self.resource = state.column("resource")

    def last_other_stream_before(self, task: int, time_ns: int) -> int:
        """The work of another stream on ``task``'s device that ended last at or before ``time_ns``."""
        k = int(self.device_key[task])
        tasks, ends = self.tasks[k], self.ends[k]
        i = int(np.searchsorted(ends, time_ns, side="right")) - 1
        while i >= 0 and self.resource[tasks[i]] == self.resource[task]:
            i -= 1
        return int(tasks[i]) if i >= 0 else -1


class EventWaits(EdgeRule):
    """EVENT_WAIT edges: waited-for work -> the first work after the wait on the waiting stream,
    from the ``cuda_sync`` record or inferred (module docstring); latency: the measured offset
    for held work, else 0."""

    kind = EdgeKind.EVENT_WAIT
    needs = (BlockingCallIssue, DeviceContention)

    def edges(self, state: BuildState) -> EdgeSet:
        look = SyncLookup.of(state)
        launches = _Launches(state, launch_timing(state))
        ends = _EndsByDevice(state)
        start = state.start_ns
        rep = state.report
        src: list[int] = []
        dst: list[int] = []
        inferred: set[int] = set()
        contended = set(state.edges[DeviceContention].dst.tolist())
        for c in look.calls_named(STREAM_WAIT):
            rec = look.record_of(c)
            rank = int(look.ranks[c])
            if rec is not None:
                waiting = look.index.find(rank, rec.device, rec.stream)
            else:
                rep["stream_waits_without_sync_record"] += 1
                waiting = look.next_launch_stream(c)
            first = look.index.first_after(waiting, int(start[c])) if waiting is not None else -1
            recorded = -1
            if rec is not None and first >= 0:
                recorded = look.record_target(rank, rec, int(start[first]))
            if first < 0 or (rec is not None and recorded < 0):
                rep["stream_waits_with_nothing_to_wait_for"] += 1
                continue
            if rec is None:
                if first in inferred:
                    continue
                recorded = self._infer(state, launches, ends, first, first in contended)
                if recorded < 0:
                    continue
                inferred.add(first)
            src.append(recorded)
            dst.append(first)
        s, d = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        held = launches.held(state, s, d)
        rep["stream_waits_linked"] = len(s)
        rep["stream_waits_inferred"] = len(inferred)
        rep["stream_waits_holding_work"] = int(held.sum())
        return EdgeSet.of(self.kind, s, d, np.where(held, np.maximum(start[d] - state.end_ns[s], 0), 0))

    @staticmethod
    def _infer(state: BuildState, launches: _Launches, ends: _EndsByDevice, first: int, held: bool) -> int:
        """What ``first`` waited for (module docstring), or -1; counts a late start that neither
        this nor another stream's kernel (``held``, :mod:`.contention`) explains."""
        start = int(state.start_ns[first])
        arrive = int(launches.arrive_ns[first])
        if launches.call[first] < 0 or not launches.launch_bound[first] or start <= arrive:
            return -1
        cand = ends.last_other_stream_before(first, start)
        if cand >= 0 and 2 * (start - int(state.end_ns[cand])) <= start - arrive:
            return cand
        if held:
            return -1
        state.report["stream_waits_unattributed"] += 1
        state.report["stream_waits_unattributed_ns"] += start - arrive
        return -1


class EventWaitLaunches(Adjustment):
    """Work its stream wait held (module docstring): its LAUNCH edge carries the device's launch
    latency; the wait is the EVENT_WAIT edge's."""

    needs = (LaunchEdges, EventWaits)

    def apply(self, state: BuildState) -> None:
        timing = launch_timing(state)
        launches = _Launches(state, timing)
        wait = state.edges[EventWaits]
        held = np.unique(wait.dst[launches.held(state, wait.src, wait.dst)])
        launch = state.edges[LaunchEdges]
        lower = np.isin(launch.dst, held)
        lat_ns = launch.lat_ns.copy()
        lat_ns[lower] = np.minimum(lat_ns[lower], launches.floor_ns[launch.dst[lower]])
        state.report["stream_waits_launch_gap_recomputed_ns"] = int((launch.lat_ns - lat_ns).sum())
        state.set_latency(LaunchEdges, lat_ns)
