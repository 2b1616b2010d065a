"""What the synchronization rules (:mod:`.sync`, :mod:`.event_wait`) look up: which work a stream
had launched by a given time, the ``cuda_sync`` records, and each thread's last launch stream.

A waiting call's replay duration is its wake-up overhead ``w = end - max(dep ends)`` (measured),
and its SYNC edges carry ``w`` too, so ``end = max(start, deps done) + w``: the wait itself is
recomputed by the replay, never copied.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from whatif.tracer.args import Arg, arg_column
from whatif.tracer.kinds import EventKind
from whatif.tracer.trace import name_texts

from ..state import BuildState

DEVICE_SYNC = re.compile(r"(cuda|hip)DeviceSynchronize|cuCtxSynchronize|hipCtxSynchronize")
STREAM_SYNC = re.compile(r"(cuda|hip|cu)StreamSynchronize")
EVENT_SYNC = re.compile(r"(cuda|hip|cu)EventSynchronize")
STREAM_WAIT = re.compile(r"(cuda|hip|cu)StreamWaitEvent")
WAITING_CALL = re.compile(r"Synchronize|WaitEvent")
BEFORE_WINDOW_NS = np.iinfo(np.int64).min  # the launch time of work queued before the trace window
QUERY_CALL = re.compile(r"^(cuda|hip|cu)(EventQuery|StreamQuery|PointerGetAttributes?)$")
"""Runtime calls that only read state and return at once: ``cudaEventQuery``, ``cudaStreamQuery``,
``cudaPointerGetAttributes``, their HIP and driver twins. A thread that makes no other call polls
(PyTorch's NCCL watchdog): it sleeps on a timer between polls, so it wakes no other thread."""
COPY_CALL = re.compile(r"(cuda|hip|cu)Memcpy")
"""Copy calls: ``cudaMemcpy``, ``cudaMemcpyAsync``, ``cuMemcpyDtoH``..., ``hipMemcpy``,
``hipMemcpyAsync``, ``hipMemcpyWithStream`` (what ``.item()`` / ``.cpu()`` / ``.to()`` call)."""
SYNCHRONOUS_COPY = re.compile(r"^(cuda|hip|cu)Memcpy(?!\w*Async)")
"""Copy calls that return only once their copy is done (CUDA's and HIP's synchronous API):
``cudaMemcpy``, ``hipMemcpy``, ``hipMemcpyWithStream``, ``cuMemcpyDtoH``..."""
PAGEABLE_COPY = re.compile(r"Pageable")
"""A copy (activity name, e.g. ``Memcpy DtoH (Device -> Pageable)``) to or from pageable host
memory: an async call for it waits for its stream (CUDA "API synchronization behavior")."""


class StreamIndex:
    """Per stream: its tasks in order and the running max of their launch times.

    A task without a launch is taken as launched at its own start, except the ones before its
    stream's first launched task: the work the GPU had queued when the trace window opened, taken
    as launched before the window (:data:`BEFORE_WINDOW_NS`). A synchronization waits on those it
    could have: the ones that started before it returned (``done_by_ns``)."""

    def __init__(self, state: BuildState) -> None:
        resource = state.column("resource")
        start, end = state.start_ns, state.end_ns
        gpu = state.gpu_ids
        launch_of = state.launch_of
        launch_t = np.where(launch_of[gpu] >= 0, start[np.maximum(launch_of[gpu], 0)], start[gpu])
        order = np.lexsort((end[gpu], start[gpu], resource[gpu]))
        gpu, launch_t = gpu[order], launch_t[order]
        res = resource[gpu]
        self.tasks: dict[int, np.ndarray] = {}
        self.launched: dict[int, np.ndarray] = {}
        self.pre_window_starts: dict[int, np.ndarray] = {}
        self.spans: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # starts, ends, running max end
        for r in np.unique(res):
            sel = res == r
            tasks = gpu[sel]
            launched = np.flatnonzero(launch_of[tasks] >= 0)
            n_pre = int(launched[0]) if len(launched) else len(tasks)
            launch_r = launch_t[sel]
            launch_r[:n_pre] = BEFORE_WINDOW_NS
            self.tasks[int(r)] = tasks
            self.launched[int(r)] = np.maximum.accumulate(launch_r)
            self.pre_window_starts[int(r)] = start[tasks[:n_pre]]
            self.spans[int(r)] = (start[tasks], end[tasks], np.maximum.accumulate(end[tasks]))
        ev = state.trace.events
        rows = state.column("event")[gpu]
        self.by_key: dict[tuple[int, int, int], int] = {}
        for r, d, s, rk in zip(res.tolist(), ev["device"].to_numpy()[rows].tolist(),
                               ev["stream"].to_numpy()[rows].tolist(), state.column("rank")[gpu].tolist()):
            self.by_key.setdefault((rk, d, s), r)
        self.by_rank_stream: dict[tuple[int, int], int] = {(rk, s): r for (rk, _, s), r in self.by_key.items()}

    @property
    def before_window(self) -> int:
        """How many tasks, over all streams, ran work queued before the window."""
        return sum(len(s) for s in self.pre_window_starts.values())

    def last_before(self, resource: int, time_ns: int, done_by_ns: int) -> int:
        """The last task on ``resource`` launched before ``time_ns``, or -1; of the work queued
        before the window, the last one that started before ``done_by_ns``."""
        launched = self.launched.get(resource)
        if launched is None:
            return -1
        i = int(np.searchsorted(launched, time_ns, side="left")) - 1
        pre = self.pre_window_starts[resource]
        if i < len(pre):
            i = min(i, int(np.searchsorted(pre, done_by_ns, side="left")) - 1)
        return int(self.tasks[resource][i]) if i >= 0 else -1

    def busy_ns(self, resources: list[int], from_ns: int, to_ns: int, explained: frozenset[int] = frozenset()) -> int:
        """How long, within ``[from_ns, to_ns)``, any of ``resources`` ran work other than ``explained``."""
        if to_ns <= from_ns:
            return 0
        spans = [(max(int(start[i]), from_ns), min(int(end[i]), to_ns))
                 for r in resources
                 for tasks, start, end in [self._overlapping(r, from_ns, to_ns)]
                 for i in range(len(tasks)) if int(tasks[i]) not in explained]
        total, reach = 0, from_ns
        for a, b in sorted(spans):
            a = max(a, reach)
            if b > a:
                total += b - a
                reach = b
        return total

    def _overlapping(self, resource: int, from_ns: int, to_ns: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The tasks of ``resource`` that may overlap ``[from_ns, to_ns)``, their starts and ends."""
        starts, ends, reach = self.spans[resource]
        lo = int(np.searchsorted(reach, from_ns, side="right"))
        hi = int(np.searchsorted(starts, to_ns, side="left"))
        return self.tasks[resource][lo:hi], starts[lo:hi], ends[lo:hi]

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


def _sync_records(state: BuildState) -> dict[tuple[int, int], SyncRecord]:
    """``cuda_sync`` records by (rank, correlation)."""
    tr = state.trace
    ev = tr.events
    rows = np.flatnonzero(ev["kind"].to_numpy() == int(EventKind.GPU_SYNC))
    # read on the sync records only: `device` and `stream` are also on every kernel's arguments
    raw = tr.args
    cols = [arg_column(raw, a, rows) for a in (Arg.SYNC_DEVICE, Arg.SYNC_STREAM, Arg.WAIT_ON_STREAM,
                                              Arg.WAIT_ON_EVENT_CORRELATION)]
    out: dict[tuple[int, int], SyncRecord] = {}
    has_args = [a.__class__ is dict for a in raw.values(rows)]
    for i, (r, c) in enumerate(zip(ev["rank"].to_numpy()[rows].tolist(), ev["correlation"].to_numpy()[rows].tolist())):
        if c >= 0 and has_args[i]:
            out[(r, c)] = SyncRecord(*(-1 if col[i] is None else int(col[i]) for col in cols))
    return out


def _last_launch_stream(state: BuildState) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per CPU thread resource: launch times and the stream resource each launch went to."""
    resource = state.column("resource")
    start = state.start_ns
    gpu = state.gpu_ids[state.launch_of[state.gpu_ids] >= 0]
    calls = state.launch_of[gpu]
    thread = resource[calls]
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for th in np.unique(thread):
        sel = thread == th
        order = np.argsort(start[calls[sel]], kind="stable")
        out[int(th)] = (start[calls[sel]][order], resource[gpu[sel]][order])
    return out


class SyncLookup:
    """The lookups of one build's synchronization rules (:meth:`of`: built once per task table)."""

    @classmethod
    def of(cls, state: BuildState) -> SyncLookup:
        return state.memo("sync_lookup", lambda: cls(state))

    def __init__(self, state: BuildState) -> None:
        self.call_ids = state.call_ids  # no reference to the state: the memo holding this would make a cycle
        self.start_ns = state.start_ns
        self.index = StreamIndex(state)
        self.records = _sync_records(state)
        self.launches = _last_launch_stream(state)
        t = state.tasks
        self.names = name_texts(t["name"])
        self.ranks = t["rank"].to_numpy()
        self.resource = t["resource"].to_numpy()
        events = t["event"].to_numpy()
        ev = state.trace.events
        self.device_of_event = ev["device"].to_numpy()
        self.corr = ev["correlation"].to_numpy()[events]  # per task
        self.events = events
        categories = t["name"].cat.categories
        codes = t["name"].cat.codes.to_numpy()[state.call_ids]
        self._call_codes = codes
        self._categories = categories
        records = state.call_ids[np.asarray(categories.str.contains("EventRecord"), dtype=bool)[codes]]
        self.record_call_by_corr = dict(zip(zip(self.ranks[records].tolist(), self.corr[records].tolist()),
                                            records.tolist()))

    def calls_named(self, pattern: re.Pattern[str]) -> list[int]:
        """Call tasks whose name contains a match of ``pattern``, in task order."""
        match = np.fromiter((pattern.search(str(c)) is not None for c in self._categories), dtype=bool,
                            count=len(self._categories))
        return self.call_ids[match[self._call_codes]].tolist()

    def record_of(self, call: int) -> SyncRecord | None:
        return self.records.get((int(self.ranks[call]), int(self.corr[call])))

    def thread_stream(self, call: int) -> int | None:
        """The stream of the thread's most recent launch before ``call``."""
        entry = self.launches.get(int(self.resource[call]))
        if entry is None:
            return None
        i = int(np.searchsorted(entry[0], self.start_ns[call], side="left")) - 1
        return int(entry[1][i]) if i >= 0 else None

    def next_launch_stream(self, call: int) -> int | None:
        """The stream of the thread's first launch at or after ``call``'s start."""
        entry = self.launches.get(int(self.resource[call]))
        if entry is None:
            return None
        i = int(np.searchsorted(entry[0], self.start_ns[call], side="left"))
        return int(entry[1][i]) if i < len(entry[0]) else None

    def record_target(self, rank: int, rec: SyncRecord, done_by_ns: int) -> int:
        """The task captured by the cudaEventRecord a cuda_sync record points to, or -1; work
        queued before the window counts if it started before ``done_by_ns``."""
        rc, ws = rec.wait_on_event_correlation, rec.wait_on_stream
        record_call = self.record_call_by_corr.get((rank, rc)) if rc >= 0 else None
        if record_call is None or ws < 0:
            return -1
        stream_res = self.index.find(rank, rec.device, ws)
        return self.index.last_before(stream_res, int(self.start_ns[record_call]), done_by_ns) \
            if stream_res is not None else -1


def wake_ns(start_ns: np.ndarray, end_ns: np.ndarray, dep_end_ns: np.ndarray) -> np.ndarray:
    """How long a call that waited took after what it waited on was done (0 if it did not wait).

    >>> wake_ns(np.array([0, 0]), np.array([100, 100]), np.array([90, 0])).tolist()
    [10, 0]
    """
    waited = dep_end_ns > start_ns
    return np.where(waited, np.minimum(np.maximum(end_ns - dep_end_ns, 0), end_ns - start_ns), 0)
