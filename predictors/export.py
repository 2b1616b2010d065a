"""Write a replay as Kineto traces that Perfetto, chrome://tracing, HolisticTraceAnalysis and
TraceLens open: one document per rank, every event of the input at its replayed time.

What is kept (docs/interop.md): every complete event of the input (``cpu_op``, ``user_annotation``,
``python_function``, runtime and driver calls, GPU work, GPU annotations, ``cuda_sync`` records)
with its name, pid/tid and ``args`` (``Input Dims``, ``Input type``, ``Concrete Inputs``,
``External id``, ``correlation``, collective metadata...), each kind under current Kineto's
category; thread and process names; the top-level metadata (``deviceProperties``,
``distributedInfo``...); launch flows (``ac2g``, keyed by correlation id) and the input's other
flows (``fwdbwd``), with flow ids unique in each file. GPU work a transform removed is left out;
work a transform added is written from its task. Instant and counter events are not kept.

**The time rule.** Each track (a rank's CPU thread, or GPU stream) gets a monotone map from its
measured clock to the replayed one: every task on the track pins its measured start and end to
its replayed start and end; a time between two pinned points is interpolated linearly; before the
first and after the last, the track is shifted like its nearest pinned point. An event starts at
the map of its start and ends at the map of its end (where two tasks meet, a start takes the later
task's time and an end the earlier's). So a task's own event lands exactly on its replayed
interval, an event nested in another stays nested (the map is monotone), and an operator around
several tasks spans from its first task's replayed start to its last's end. A track with no task
moves with its rank's median shift.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from whatif.core.output import OutputError, gzip_bytes, write_output
from whatif.depgraph.graph import LOCAL_GPU_WORK_KINDS, EdgeKind, ResourceKind, TaskKind
from whatif.tracer.kinds import GPU_ACTIVITY_KINDS, GPU_KINDS, KINETO_CATEGORY, EventKind, codes
from whatif.tracer.kineto import kineto_json
from whatif.tracer.readers import is_trace_name
from whatif.tracer.record.trace_file import trace_file_name

from .replay import Replay

_CATEGORY = {TaskKind.CPU_CALL: "cuda_runtime", TaskKind.WAIT: "cuda_runtime", TaskKind.CPU_WORK: "cpu_op",
             TaskKind.KERNEL: "kernel", TaskKind.COMM: "kernel", TaskKind.MEMCPY: "gpu_memcpy",
             TaskKind.MEMSET: "gpu_memset"}
"""Category of a task with no input event (work a transform added)."""
_PINNING_KINDS = LOCAL_GPU_WORK_KINDS | {TaskKind.CPU_CALL}
"""Tasks whose measured start is their event's start (shifted by the rank's clock alignment)."""
EXPORT_NAME = "whatif predicted timeline"


@dataclass(frozen=True)
class TrackMap:
    """A monotone piecewise-linear map of one track's measured times (ns) to replayed times:
    ``x`` the distinct pinned measured times (ascending); ``y_end``/``y_start`` the replayed time
    of each from the left (what an event ending there gets) and from the right (an event starting
    there).

    >>> m = TrackMap.of(np.array([0, 10, 10, 20]), np.array([100, 110, 115, 125]))
    >>> m.starts(np.array([-5, 5, 10, 15, 30])).tolist()
    [95, 105, 115, 120, 135]
    >>> m.ends(np.array([10])).tolist()
    [110]
    """

    x: np.ndarray
    y_end: np.ndarray
    y_start: np.ndarray

    @classmethod
    def of(cls, x: np.ndarray, y: np.ndarray) -> TrackMap:
        """From pinned (measured, replayed) pairs in any order; replayed times are made
        non-decreasing in measured order."""
        order = np.lexsort((y, x))
        x, y = x[order], np.maximum.accumulate(y[order])
        first = np.r_[True, x[1:] != x[:-1]]
        last = np.r_[x[1:] != x[:-1], True]
        return cls(x[first], y[first], y[last])

    def _at(self, q: np.ndarray, at_knot: np.ndarray) -> np.ndarray:
        x, y_end, y_start = self.x, self.y_end, self.y_start
        i = np.searchsorted(x, q, side="right") - 1
        out = np.empty(len(q), dtype=np.int64)
        before, after = i < 0, i >= len(x) - 1
        out[before] = y_end[0] + (q[before] - x[0])
        inside = ~before & ~after
        j = i[inside]
        span = (x[j + 1] - x[j]).astype(np.float64)
        frac = (q[inside] - x[j]) / span
        out[inside] = y_start[j] + np.rint(frac * (y_end[j + 1] - y_start[j])).astype(np.int64)
        out[after] = y_start[-1] + (q[after] - x[-1])
        on = (i >= 0) & (x[np.maximum(i, 0)] == q)
        out[on] = at_knot[i[on]]
        return out

    def starts(self, q: np.ndarray) -> np.ndarray:
        return self._at(q, self.y_start)

    def ends(self, q: np.ndarray) -> np.ndarray:
        return self._at(q, self.y_end)


Track = tuple[int, bool, int, int]
"""(rank, on GPU, pid or device, tid or stream)."""


def _event_tracks(events: pd.DataFrame) -> tuple[np.ndarray, list[Track]]:
    """Track id of every event row, and each id's track: (rank, pid, tid) on a CPU thread,
    (rank, device, stream) on a GPU."""
    on_gpu = np.isin(events["kind"].to_numpy(), codes(GPU_KINDS))
    keys = pd.DataFrame({"rank": events["rank"].to_numpy(), "gpu": on_gpu,
                         "a": np.where(on_gpu, events["device"].to_numpy(), events["pid"].to_numpy()),
                         "b": np.where(on_gpu, events["stream"].to_numpy(), events["tid"].to_numpy())})
    ids = keys.groupby(["rank", "gpu", "a", "b"], sort=True).ngroup().to_numpy()
    first = np.unique(ids, return_index=True)[1]
    return ids, [(int(r), bool(gp), int(a), int(b)) for r, gp, a, b in keys.iloc[first].itertuples(index=False)]


@dataclass(frozen=True)
class EventTimes:
    """Replayed start and end (ns) of every event row, which rows are written, and the maps that
    moved them (per track, and each rank's shift for a track with no task)."""

    start_ns: np.ndarray
    end_ns: np.ndarray
    kept: np.ndarray
    maps: dict[Track, TrackMap]
    rank_shift_ns: np.ndarray

    def moved(self, track: Track, ts_ns: int) -> int:
        """Where a time on ``track`` (e.g. a flow end) lands."""
        m = self.maps.get(track)
        if m is None:
            return ts_ns + int(self.rank_shift_ns[track[0]])
        return int(m.starts(np.asarray([ts_ns], dtype=np.int64))[0])


def event_times(replay: Replay) -> EventTimes:
    """Every input event at its replayed time (the module's time rule)."""
    g = replay.graph
    assert g.trace is not None
    ev = g.trace.events
    t = g.tasks
    ts = ev["ts_ns"].to_numpy()
    end = ts + ev["dur_ns"].to_numpy()
    ranks = ev["rank"].to_numpy()
    rows = t["event"].to_numpy()
    m_start, m_end = t["measured_start_ns"].to_numpy(), t["measured_end_ns"].to_numpy()
    pinned = (rows >= 0) & (m_start >= 0) & (m_end >= m_start)
    kinds = t["kind"].to_numpy()

    exact = pinned & np.isin(kinds, codes(_PINNING_KINDS))
    diff = pd.Series(m_start[exact] - ts[rows[exact]]).groupby(ranks[rows[exact]]).median()
    clock = np.zeros(int(ranks.max()) + 1 if len(ranks) else 1, dtype=np.int64)
    clock[diff.index.to_numpy()] = np.rint(diff.to_numpy()).astype(np.int64)

    p_rows = rows[pinned]
    p_clock = clock[ranks[p_rows]]
    x = np.r_[m_start[pinned] - p_clock, m_end[pinned] - p_clock]
    y = np.r_[replay.start_ns[pinned], replay.end_ns[pinned]].astype(np.int64)
    tracks, track_keys = _event_tracks(ev)
    k_track = np.r_[tracks[p_rows], tracks[p_rows]]
    k_rank = np.r_[ranks[p_rows], ranks[p_rows]]
    shift = pd.Series(y - x).groupby(k_rank).median()
    rank_shift = np.zeros_like(clock)
    rank_shift[shift.index.to_numpy()] = np.rint(shift.to_numpy()).astype(np.int64)

    start_ns = ts + rank_shift[ranks]
    end_ns = end + rank_shift[ranks]
    by_track = pd.Series(np.arange(len(x))).groupby(k_track).indices
    ev_by_track = pd.Series(np.arange(len(ts))).groupby(tracks).indices
    maps: dict[Track, TrackMap] = {}
    for track, at in by_track.items():
        m = maps[track_keys[track]] = TrackMap.of(x[at], y[at])
        mine = ev_by_track[track]
        start_ns[mine] = m.starts(ts[mine])
        end_ns[mine] = np.maximum(m.ends(end[mine]), start_ns[mine])

    has_task = np.zeros(len(ts), dtype=bool)
    has_task[rows[rows >= 0]] = True
    gone = np.isin(ev["kind"].to_numpy(), codes(GPU_ACTIVITY_KINDS)) & ~has_task
    return EventTimes(start_ns, end_ns, ~gone, maps, rank_shift)


class _FlowIds:
    """Flow ids unique in one file: a flow keeps its input id unless another flow took it (or it
    is not a 64-bit id the writer can encode).

    >>> ids = _FlowIds()
    >>> ids.of("ac2g", 7), ids.of("ac2g", 7), ids.of("fwdbwd", 7), ids.of("fwdbwd", 2 ** 70)
    (7, 7, 1, 2)
    """

    def __init__(self) -> None:
        self.given: dict[tuple[str, int], int] = {}
        self.used: set[int] = set()
        self.next = 1

    def of(self, category: str, flow_id: int) -> int:
        key = (category, flow_id)
        if key not in self.given:
            new = flow_id
            while new in self.used or not 0 <= new < 2 ** 63:
                new, self.next = self.next, self.next + 1
            self.used.add(new)
            self.given[key] = new
        return self.given[key]


def _writable(value: Any) -> bool:
    """Whether a copied value can be written back (a hostile trace may hold integers beyond 64
    bits, which the reader never uses and the writer cannot encode)."""
    try:
        orjson.dumps(value)
    except TypeError:
        return False
    return True


def _synthetic_track(replay: Replay, resource: int) -> tuple[int, int]:
    """pid and tid for a task with no input event, from its resource."""
    res = replay.graph.resources
    kind = ResourceKind(int(res["kind"].to_numpy()[resource]))
    key = int(res["key"].to_numpy()[resource])
    if kind == ResourceKind.STREAM:
        return int(res["device"].to_numpy()[resource]), key
    if kind == ResourceKind.THREAD:
        return key >> 32, key & 0xFFFFFFFF
    return -1, resource


class _Writer:
    """Accumulates each rank's events, times in microseconds from one base."""

    def __init__(self, replay: Replay, times: EventTimes, base_ns: int) -> None:
        self.replay, self.times, self.base_ns = replay, times, base_ns
        trace = replay.graph.trace
        assert trace is not None
        self.trace = trace
        self.events: dict[int, list[dict[str, Any]]] = {info.rank: [] for info in trace.ranks}
        self.flow_ids = {info.rank: _FlowIds() for info in trace.ranks}

    def us(self, ns: int) -> float:
        return round((ns - self.base_ns) / 1000.0, 3)

    def slice(self, rank: int, cat: str, name: str, pid: int, tid: int, start_ns: int, end_ns: int,
              args: dict[str, Any] | None) -> None:
        e: dict[str, Any] = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": self.us(start_ns),
                             "dur": round((end_ns - start_ns) / 1000.0, 3)}
        if args is not None:
            e["args"] = args if _writable(args) else {}
        self.events[rank].append(e)

    def flow(self, rank: int, cat: str, flow_id: int, phase: str, pid: int, tid: int, ts_ns: int) -> None:
        e = {"ph": phase, "id": self.flow_ids[rank].of(cat, flow_id), "pid": pid, "tid": tid, "ts": self.us(ts_ns),
             "cat": cat, "name": cat}
        if phase == "f":
            e["bp"] = "e"
        self.events[rank].append(e)


def _names(replay: Replay) -> dict[int, list[dict[str, Any]]]:
    """Each rank's process and thread name events."""
    assert replay.graph.trace is not None
    out: dict[int, list[dict[str, Any]]] = {}
    for info in replay.graph.trace.ranks:
        out[info.rank] = [{"ph": "M", "name": "process_name", "pid": p, "tid": 0, "args": {"name": name}}
                          for p, name in sorted(info.process_names.items())]
        out[info.rank] += [{"ph": "M", "name": "thread_name", "pid": p, "tid": th, "args": {"name": name}}
                           for (p, th), name in sorted(info.thread_names.items())]
    return out


def _input_events(w: _Writer, ev: pd.DataFrame) -> None:
    """Every kept input event, in (rank, replayed start, longer first, input order) order."""
    times = w.times
    names = ev["name"].astype(str).to_numpy()
    kinds, ranks = ev["kind"].to_numpy(), ev["rank"].to_numpy()
    pid, tid = ev["pid"].to_numpy(), ev["tid"].to_numpy()
    kept = np.flatnonzero(times.kept)
    args = w.trace.raw_args()
    order = kept[np.lexsort((kept, times.start_ns[kept] - times.end_ns[kept], times.start_ns[kept], ranks[kept]))]
    for row in order.tolist():
        w.slice(int(ranks[row]), KINETO_CATEGORY[EventKind(int(kinds[row]))], names[row], int(pid[row]), int(tid[row]),
                int(times.start_ns[row]), int(times.end_ns[row]), args[row])


def _added_tasks(w: _Writer, synthetic: np.ndarray) -> None:
    """Work a transform added (tasks with no input event), from its task."""
    t = w.replay.graph.tasks
    res, kinds, ranks, names = (t[c].to_numpy() for c in ("resource", "kind", "rank", "name"))
    for i in synthetic.tolist():
        pid, tid = _synthetic_track(w.replay, int(res[i]))
        w.slice(int(ranks[i]), _CATEGORY[TaskKind(int(kinds[i]))], str(names[i]), pid, tid,
                int(w.replay.start_ns[i]), int(w.replay.end_ns[i]), {"whatif task": i})


def _flows(w: _Writer, ev: pd.DataFrame) -> None:
    """A launch flow per launch edge (id: the correlation id), then the input's other flows."""
    g, times = w.replay.graph, w.times
    assert g.trace is not None
    ranks, pid, tid, corr = (ev[c].to_numpy() for c in ("rank", "pid", "tid", "correlation"))
    e_rows = g.tasks["event"].to_numpy()
    launch = g.edges[g.edges["kind"] == int(EdgeKind.LAUNCH)]
    for s, d in zip(e_rows[launch["src"].to_numpy()].tolist(), e_rows[launch["dst"].to_numpy()].tolist()):
        if s < 0 or d < 0 or corr[d] < 0 or not times.kept[d]:
            continue
        rank = int(ranks[d])
        w.flow(rank, "ac2g", int(corr[d]), "s", int(pid[s]), int(tid[s]), int(times.start_ns[s]))
        w.flow(rank, "ac2g", int(corr[d]), "f", int(pid[d]), int(tid[d]), int(times.start_ns[d]))
    for rank, f in g.trace.flows:
        w.flow(rank, f.category, f.flow_id, f.phase, f.pid, f.tid, times.moved((rank, False, f.pid, f.tid), f.ts_ns))


def chrome_traces(replay: Replay) -> dict[int, dict[str, Any]]:
    """The replayed timeline as one Kineto document per rank (dicts ready for JSON); every file
    shares one ``baseTimeNanoseconds`` so that their times compare."""
    g = replay.graph
    assert g.trace is not None, "export needs the graph's trace"
    times = event_times(replay)
    t = g.tasks
    synthetic = np.flatnonzero((t["event"].to_numpy() < 0) & np.isin(t["kind"].to_numpy(), codes(_CATEGORY)))
    starts = np.r_[times.start_ns[times.kept], replay.start_ns[synthetic]]
    w = _Writer(replay, times, int(starts.min()) if len(starts) else 0)
    _input_events(w, g.trace.events)
    _added_tasks(w, synthetic)
    _flows(w, g.trace.events)
    docs: dict[int, dict[str, Any]] = {}
    for info, (rank, names) in zip(g.trace.ranks, _names(replay).items()):
        meta = {k: v for k, v in info.metadata.items() if k != "traceEvents" and _writable(v)}
        docs[rank] = {**meta, "schemaVersion": meta.get("schemaVersion", 1), "baseTimeNanoseconds": w.base_ns,
                      "traceName": EXPORT_NAME, "traceEvents": names + w.events[rank]}
    return docs


def export_paths(replay: Replay, path: str | Path) -> dict[int, Path]:
    """Where :func:`write_chrome_trace` writes each rank: ``path`` itself for a single rank, else
    ``path/rank<k>.pt.trace.json.gz`` (a folder that whatif, HTA and TensorBoard read as one run)."""
    path = Path(path)
    assert replay.graph.trace is not None
    ranks = [info.rank for info in replay.graph.trace.ranks]
    if len(ranks) == 1:
        return {ranks[0]: path}
    if is_trace_name(path.name) or path.is_file():
        raise OutputError(f"{path}: {len(ranks)} ranks are written one file per rank; name a folder")
    return {r: path / trace_file_name(r) for r in ranks}


def write_chrome_trace(replay: Replay, path: str | Path) -> Path:
    """Write :func:`chrome_traces` (:func:`export_paths`; gzip for names ending in ``.gz``);
    returns ``path``."""
    paths = export_paths(replay, path)
    for rank, doc in chrome_traces(replay).items():
        data = kineto_json(doc)
        write_output(paths[rank], gzip_bytes(data) if paths[rank].suffix == ".gz" else data)
    return Path(path)
