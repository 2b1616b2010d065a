"""Synchronization rules: which GPU work a CPU call or a GPU stream waits on.

* ``cudaDeviceSynchronize`` / ``hipDeviceSynchronize`` / context sync: the last work launched
  (before the call) on every stream of the rank's device.
* ``cudaStreamSynchronize``: the last work launched on that stream. The stream comes from the
  ``cuda_sync`` record with the call's correlation; without one, the stream of the thread's
  most recent launch.
* ``cudaEventSynchronize``: the work captured by the ``cudaEventRecord`` the ``cuda_sync``
  record names (``wait_on_cuda_event_record_corr_id`` on ``wait_on_stream``).
* ``cudaStreamWaitEvent`` (GPU -> GPU): the first work launched on the waiting stream after the
  call waits for the recorded work (``EVENT_WAIT`` edge).

A waiting call's replay duration is its wake-up overhead ``w = end - max(dep ends)`` (measured),
and its SYNC edges carry ``w`` too, so ``end = max(start, deps done) + w``: the wait itself is
recomputed by the replay, never copied.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from whatif.tracer.args import Arg
from whatif.tracer.kinds import EventKind

from .graph import EdgeKind

if TYPE_CHECKING:
    from .state import SyncContext

DEVICE_SYNC = re.compile(r"(cuda|hip)DeviceSynchronize|cuCtxSynchronize|hipCtxSynchronize")
STREAM_SYNC = re.compile(r"(cuda|hip|cu)StreamSynchronize")
EVENT_SYNC = re.compile(r"(cuda|hip|cu)EventSynchronize")
STREAM_WAIT = re.compile(r"(cuda|hip|cu)StreamWaitEvent")


class StreamIndex:
    """Per stream: its tasks in order and the running max of their launch times."""

    def __init__(self, ctx: SyncContext) -> None:
        t = ctx.tasks
        resource = t["resource"].to_numpy()
        gpu = ctx.gpu_ids
        launch_t = np.where(ctx.launch_of[gpu] >= 0, ctx.start_m[np.maximum(ctx.launch_of[gpu], 0)], ctx.start_m[gpu])
        order = np.lexsort((ctx.end_m[gpu], ctx.start_m[gpu], resource[gpu]))
        gpu, launch_t = gpu[order], launch_t[order]
        res = resource[gpu]
        self.tasks: dict[int, np.ndarray] = {}
        self.launched: dict[int, np.ndarray] = {}
        for r in np.unique(res):
            sel = res == r
            self.tasks[int(r)] = gpu[sel]
            self.launched[int(r)] = np.maximum.accumulate(launch_t[sel])
        ev = ctx.trace.events
        rows = t["event"].to_numpy()[gpu]
        self.by_key: dict[tuple[int, int, int], int] = {}
        for r, d, s, rk in zip(res.tolist(), ev["device"].to_numpy()[rows].tolist(),
                               ev["stream"].to_numpy()[rows].tolist(), t["rank"].to_numpy()[gpu].tolist()):
            self.by_key.setdefault((rk, d, s), r)
        self.by_rank_stream: dict[tuple[int, int], int] = {(rk, s): r for (rk, _, s), r in self.by_key.items()}

    def last_before(self, resource: int, time_ns: int) -> int:
        """The last task on ``resource`` launched before ``time_ns``, or -1."""
        launched = self.launched.get(resource)
        if launched is None:
            return -1
        i = int(np.searchsorted(launched, time_ns, side="left")) - 1
        return int(self.tasks[resource][i]) if i >= 0 else -1

    def first_after(self, resource: int, time_ns: int) -> int:
        """The first task on ``resource`` launched at or after ``time_ns``, or -1."""
        launched = self.launched.get(resource)
        if launched is None:
            return -1
        i = int(np.searchsorted(launched, time_ns, side="left"))
        return int(self.tasks[resource][i]) if i < len(launched) else -1

    def streams_of(self, rank: int, device: int | None) -> list[int]:
        return sorted({r for (rk, d, _), r in self.by_key.items() if rk == rank and (device is None or d == device)})

    def find(self, rank: int, device: int, stream: int) -> int | None:
        found = self.by_key.get((rank, device, stream))
        return found if found is not None else self.by_rank_stream.get((rank, stream))


@dataclass(frozen=True)
class SyncRecord:
    """What a ``cuda_sync`` record says: the device and stream it synchronized, and for a stream
    wait the stream and the ``cudaEventRecord`` (its correlation id) it waited on; -1 when absent."""

    device: int
    stream: int
    wait_on_stream: int
    wait_on_event_correlation: int


def _sync_records(ctx: SyncContext) -> dict[tuple[int, int], SyncRecord]:
    """``cuda_sync`` records by (rank, correlation)."""
    tr = ctx.trace
    ev = tr.events
    rows = np.flatnonzero(ev["kind"].to_numpy() == int(EventKind.GPU_SYNC))
    cols = [tr.arg(a)[rows] for a in (Arg.SYNC_DEVICE, Arg.SYNC_STREAM, Arg.WAIT_ON_STREAM,
                                      Arg.WAIT_ON_EVENT_CORRELATION)]
    out: dict[tuple[int, int], SyncRecord] = {}
    for i, (r, c) in enumerate(zip(ev["rank"].to_numpy()[rows].tolist(), ev["correlation"].to_numpy()[rows].tolist())):
        if c >= 0 and ev["args"].iat[int(rows[i])].__class__ is dict:
            out[(r, c)] = SyncRecord(*(-1 if col[i] is None else int(col[i]) for col in cols))
    return out


def _last_launch_stream(ctx: SyncContext) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per CPU thread resource: launch times and the stream resource each launch went to."""
    t = ctx.tasks
    resource = t["resource"].to_numpy()
    gpu = ctx.gpu_ids[ctx.launch_of[ctx.gpu_ids] >= 0]
    calls = ctx.launch_of[gpu]
    thread = resource[calls]
    out = {}
    for th in np.unique(thread):
        sel = thread == th
        order = np.argsort(ctx.start_m[calls[sel]], kind="stable")
        out[int(th)] = (ctx.start_m[calls[sel]][order], resource[gpu[sel]][order])
    return out


def add_sync_edges(ctx: SyncContext) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, int]]:
    """SYNC edges into waiting calls and EVENT_WAIT edges between streams; shortens the replay
    duration of calls that waited (see the module docstring)."""
    t = ctx.tasks
    names = t["name"].to_numpy()
    ranks = t["rank"].to_numpy()
    resource = t["resource"].to_numpy()
    events = t["event"].to_numpy()
    ev = ctx.trace.events
    ev_device = ev["device"].to_numpy()
    index = StreamIndex(ctx)
    records = _sync_records(ctx)
    launches = _last_launch_stream(ctx)
    corr = ev["correlation"].to_numpy()
    name_col = t["name"]
    codes = name_col.cat.codes.to_numpy()[ctx.call_ids]
    categories = name_col.cat.categories
    records_calls = ctx.call_ids[np.asarray(categories.str.contains("EventRecord"), dtype=bool)[codes]]
    call_corr = corr[events[records_calls]]
    call_by_corr = dict(zip(zip(ranks[records_calls].tolist(), call_corr.tolist()), records_calls.tolist()))
    rep = ctx.report
    sync_src: list[int] = []
    sync_dst: list[int] = []
    sync_lat: list[int] = []
    wait_src: list[int] = []
    wait_dst: list[int] = []

    def thread_stream(c: int) -> int | None:
        entry = launches.get(int(resource[c]))
        if entry is None:
            return None
        i = int(np.searchsorted(entry[0], ctx.start_m[c], side="left")) - 1
        return int(entry[1][i]) if i >= 0 else None

    def record_target(rank: int, rec: SyncRecord) -> int:
        """The task captured by the cudaEventRecord a cuda_sync record points to, or -1."""
        rc, ws = rec.wait_on_event_correlation, rec.wait_on_stream
        record_call = call_by_corr.get((rank, rc)) if rc >= 0 else None
        if record_call is None or ws < 0:
            return -1
        stream_res = index.find(rank, rec.device, ws)
        return index.last_before(stream_res, int(ctx.start_m[record_call])) if stream_res is not None else -1

    is_wait_call = np.asarray(categories.str.contains("Synchronize|WaitEvent", regex=True), dtype=bool)[codes]
    for c in ctx.call_ids[is_wait_call].tolist():
        name = names[c]
        rank = int(ranks[c])
        rec = records.get((rank, int(corr[events[c]])))
        deps: list[int] = []
        if STREAM_WAIT.search(name):
            if rec is None:
                rep["stream_waits_without_sync_record"] += 1
                continue
            src = record_target(rank, rec)
            waiting = index.find(rank, rec.device, rec.stream)
            dst = index.first_after(waiting, int(ctx.start_m[c])) if waiting is not None else -1
            if src < 0 or dst < 0:
                rep["stream_waits_with_nothing_to_wait_for"] += 1
                continue
            wait_src.append(src)
            wait_dst.append(dst)
            continue
        if DEVICE_SYNC.search(name):
            device = int(ev_device[events[c]]) if ev_device[events[c]] >= 0 else None
            if rec is not None and rec.device >= 0:
                device = rec.device
            deps = [index.last_before(s, int(ctx.start_m[c])) for s in index.streams_of(rank, device)]
        elif STREAM_SYNC.search(name):
            stream_res = None
            if rec is not None and rec.stream >= 0:
                stream_res = index.find(rank, rec.device, rec.stream)
            if stream_res is None:
                stream_res = thread_stream(c)
                rep["stream_syncs_stream_inferred"] += 1
            if stream_res is not None:
                deps = [index.last_before(stream_res, int(ctx.start_m[c]))]
        elif EVENT_SYNC.search(name):
            if rec is not None:
                deps = [record_target(rank, rec)]
            else:
                stream_res = thread_stream(c)
                rep["event_syncs_stream_inferred"] += 1
                deps = [index.last_before(stream_res, int(ctx.start_m[c]))] if stream_res is not None else []
        else:
            continue
        deps = [d for d in deps if d >= 0]
        if not deps:
            rep["syncs_with_nothing_to_wait_for"] += 1
            continue
        rep["syncs_linked"] += 1
        lat = wait_on(ctx, c, deps)
        sync_src.extend(deps)
        sync_dst.extend([c] * len(deps))
        sync_lat.extend([lat] * len(deps))
    for copy, wait in ctx.blocking:
        sync_src.append(copy)
        sync_dst.append(wait)
        sync_lat.append(wait_on(ctx, wait, [copy]))
    rep["stream_waits_linked"] = len(wait_src)
    return [
        (np.asarray(sync_src, dtype=np.int64), np.asarray(sync_dst, dtype=np.int64),
         np.asarray(sync_lat, dtype=np.int64), EdgeKind.SYNC),
        (np.asarray(wait_src, dtype=np.int64), np.asarray(wait_dst, dtype=np.int64),
         np.zeros(len(wait_src), dtype=np.int64), EdgeKind.EVENT_WAIT),
    ]


def wait_on(ctx: SyncContext, call: int, deps: list[int]) -> int:
    """Set the replay duration of a call that waits on ``deps``; return its SYNC edges' latency.

    If the deps finished (measured) after the call started, the call waited: its replay
    duration and edge latency become the wake-up time after the last dep; otherwise it did not
    wait and keeps its measured duration (latency 0).
    """
    dep_end = int(ctx.end_m[deps].max())
    start, stop = int(ctx.start_m[call]), int(ctx.end_m[call])
    if dep_end <= start:
        return 0
    wake = min(max(stop - dep_end, 0), stop - start)
    ctx.dur[call] = wake
    return wake
