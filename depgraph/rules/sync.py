"""Synchronization: which GPU work a CPU call waits on.

* ``cudaDeviceSynchronize`` / ``hipDeviceSynchronize`` / context sync: the last work launched
  (before the call) on every stream of the rank's device.
* ``cudaStreamSynchronize``: the last work launched on that stream. The stream comes from the
  ``cuda_sync`` record with the call's correlation; without one, the stream of the thread's
  most recent launch.
* ``cudaEventSynchronize``: the work captured by the ``cudaEventRecord`` the ``cuda_sync``
  record names (``wait_on_cuda_event_record_corr_id`` on ``wait_on_stream``).
* A held copy call's WAIT task (:mod:`.blocking`): its copy, when the call returned after the
  copy ended; else the work before the copy on its stream (the call was held until the stream
  reached its copy).

Work queued before the trace window counts as launched before every call (see
:class:`.sync_lookup.StreamIndex`). The waiting call's duration becomes its wake-up time
(:class:`SyncWakeUps`, see :mod:`.sync_lookup`), so the wait is recomputed by every replay; the
report counts waits that no GPU work explains (``sync_wait_unattributed``).
"""
from __future__ import annotations

import numpy as np

from ..graph import EdgeKind
from ..state import BuildState, EdgeSet
from .base import Adjustment, EdgeRule
from .blocking import BlockingCallIssue
from .sync_lookup import (
    DEVICE_SYNC,
    EVENT_SYNC,
    STREAM_SYNC,
    STREAM_WAIT,
    WAITING_CALL,
    StreamIndex,
    SyncLookup,
    wake_ns,
)


class SyncEdges(EdgeRule):
    """SYNC edges: waited-on GPU work -> the call (or WAIT task) that waited; latency = wake-up."""

    kind = EdgeKind.SYNC
    needs = (BlockingCallIssue,)

    def edges(self, state: BuildState) -> EdgeSet:
        look = SyncLookup.of(state)
        index, rep = look.index, state.report
        start, end = state.start_ns, state.end_ns
        waiters: list[int] = []
        deps_of: list[list[int]] = []
        streams_of: list[list[int]] = []
        for c in look.calls_named(WAITING_CALL):
            name = look.names[c]
            if STREAM_WAIT.search(name):
                continue
            rank = int(look.ranks[c])
            rec = look.record_of(c)
            t, done_by = int(start[c]), int(end[c])
            streams: list[int] = []
            deps: list[int] = []
            if DEVICE_SYNC.search(name):
                event = look.events[c]
                device = int(look.device_of_event[event]) if look.device_of_event[event] >= 0 else None
                if rec is not None and rec.device >= 0:
                    device = rec.device
                streams = index.streams_of(rank, device)
                deps = [index.last_before(s, t, done_by) for s in streams]
            elif STREAM_SYNC.search(name):
                stream_res = None
                if rec is not None and rec.stream >= 0:
                    stream_res = index.find(rank, rec.device, rec.stream)
                if stream_res is None:
                    stream_res = look.thread_stream(c)
                    rep["stream_syncs_stream_inferred"] += 1
                if stream_res is not None:
                    streams = [stream_res]
                    deps = [index.last_before(stream_res, t, done_by)]
            elif EVENT_SYNC.search(name):
                if rec is not None:
                    deps = [look.record_target(rank, rec, done_by)]
                    streams = [int(look.resource[d]) for d in deps if d >= 0]
                else:
                    stream_res = look.thread_stream(c)
                    rep["event_syncs_stream_inferred"] += 1
                    if stream_res is not None:
                        streams = [stream_res]
                        deps = [index.last_before(stream_res, t, done_by)]
            else:
                continue
            deps = [d for d in deps if d >= 0]
            if not deps:
                rep["syncs_with_nothing_to_wait_for"] += 1
            else:
                rep["syncs_linked"] += 1
            waiters.append(c)
            deps_of.append(deps)
            streams_of.append(streams)
        explained: list[frozenset[int]] = [frozenset()] * len(waiters)
        for dep, wait, copy in zip(state.blocking.waits_on.tolist(), state.blocking.wait.tolist(),
                                   state.blocking.copy.tolist()):
            waiters.append(wait)
            deps_of.append([dep])
            streams_of.append([int(look.resource[dep])])
            explained.append(frozenset((copy,)))
        rep["gpu_tasks_before_window"] = index.before_window
        _report_unattributed(state, index, waiters, deps_of, streams_of, explained)
        linked = [i for i, deps in enumerate(deps_of) if deps]
        return _edges(state, np.asarray([waiters[i] for i in linked], dtype=np.int64), [deps_of[i] for i in linked])


def _report_unattributed(state: BuildState, index: StreamIndex, waiters: list[int], deps_of: list[list[int]],
                         streams_of: list[list[int]], explained: list[frozenset[int]]) -> None:
    """Count the waits no GPU work explains: the part of a waiting call after its deps ended (from
    its start if none) during which the streams it waits on ran other work than a held copy's own
    copy (which the call overlaps once its stream reached it)."""
    start, end = state.start_ns, state.end_ns
    count, total_ns = 0, 0
    for w, deps, streams, own in zip(waiters, deps_of, streams_of, explained):
        from_ns = max([int(start[w])] + [int(end[d]) for d in deps])
        busy = index.busy_ns(streams, from_ns, int(end[w]), own)
        count += busy > 0
        total_ns += busy
    state.report["sync_wait_unattributed"] = count
    state.report["sync_wait_unattributed_ns"] = total_ns


def _edges(state: BuildState, waiters: np.ndarray, deps_of: list[list[int]]) -> EdgeSet:
    end = state.end_ns
    dep_end = np.asarray([int(end[d].max()) for d in deps_of], dtype=np.int64)
    lat = wake_ns(state.start_ns[waiters], end[waiters], dep_end)
    counts = [len(d) for d in deps_of]
    src = [d for deps in deps_of for d in deps]
    return EdgeSet.of(EdgeKind.SYNC, src, np.repeat(waiters, counts), np.repeat(lat, counts))


class SyncWakeUps(Adjustment):
    """A call that waited (its deps ended after it started) lasts its wake-up time, not its wait."""

    needs = (SyncEdges,)

    def apply(self, state: BuildState) -> None:
        sync = state.edges[SyncEdges]
        start, end = state.start_ns, state.end_ns
        waiter, group = np.unique(sync.dst, return_inverse=True)
        dep_end = np.full(len(waiter), np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(dep_end, group, end[sync.src])
        waited = dep_end > start[waiter]
        state.set_column("dur_ns", waiter[waited], wake_ns(start[waiter], end[waiter], dep_end)[waited])
