"""Per-step bounds that any prediction must respect, computed from the *measured* times of a
graph's tasks, independently of the replay.

* ``cpu_own_ns``: the CPU's own work in the step: per CPU thread, the span of its tasks in the
  step (step markers included: time the profiler saw no operator in is still the thread's)
  less the time its blocking calls spent waiting; the busiest thread's. Waiting are:
  synchronize calls and the waiting part of blocking copies (whole), and what a call that
  launched GPU work took beyond the median of its name's launching calls on the rank while its
  stream was still busy with earlier work (a copy to pageable memory held until its stream was
  free, a launch held by a full launch queue); a long call on an idle stream (a first launch
  loading its module) is the CPU's own.
  A GPU that takes zero time leaves this.
* ``gpu_stream_own_ns``: the busiest GPU stream's own work (sum of its tasks' durations). A CPU
  that takes zero time leaves at least this.
* ``gpu_busy_ns``: the time any GPU work of the rank runs in the step (union of the intervals).
  With ``g = gpu_busy_ns / measured_ns``, making all GPU work ``f`` times as long can speed the
  step up by at most ``1 / (1 - (1 - f) * g)`` (Amdahl), and never slow it down.

>>> from whatif.api import analyze
>>> b = step_bounds(analyze("sample_traces/llm_serve").graph)
>>> sorted(b.columns)
['cpu_own_ns', 'gpu_busy_ns', 'gpu_stream_own_ns', 'measured_ns', 'rank', 'step']
>>> bool((b["cpu_own_ns"] <= b["measured_ns"]).all())
True
"""
from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from whatif.depgraph.graph import CPU_KINDS, GPU_WORK_KINDS, EdgeKind, ResourceKind, TaskGraph, TaskKind, kind_codes
from whatif.depgraph.rules.sync_lookup import DEVICE_SYNC, EVENT_SYNC, STREAM_SYNC

from .steps import measured_step_ns

BLOCKING_CALL = re.compile("|".join(p.pattern for p in (DEVICE_SYNC, STREAM_SYNC, EVENT_SYNC)))
"""CPU calls that block until GPU work is done (their measured duration is mostly waiting)."""


def _measured(graph: TaskGraph, codes: Sequence[int]) -> pd.DataFrame:
    t = graph.tasks
    sel = (np.isin(t["kind"].to_numpy(), codes) & (t["step"].to_numpy() >= 0)
           & (t["measured_start_ns"].to_numpy() >= 0))
    idx = np.flatnonzero(sel)
    return pd.DataFrame({"task": idx, "rank": t["rank"].to_numpy()[idx], "step": t["step"].to_numpy()[idx],
                         "resource": t["resource"].to_numpy()[idx],
                         "start": t["measured_start_ns"].to_numpy()[idx],
                         "end": t["measured_end_ns"].to_numpy()[idx],
                         "kind": t["kind"].to_numpy()[idx],
                         "name": t["name"].astype(str).to_numpy()[idx]})


def _stream_busy_until(graph: TaskGraph) -> np.ndarray:
    """Per task: for a call that launched GPU work, the measured end of the work that stood before
    it on its stream (the stream was busy until then); -1 for other tasks and idle streams."""
    e = graph.edges
    kind, src, dst = e["kind"].to_numpy(), e["src"].to_numpy(), e["dst"].to_numpy()
    end = graph.tasks["measured_end_ns"].to_numpy()
    prev_end = np.full(len(graph.tasks), -1, dtype=np.int64)
    stream = kind == int(EdgeKind.STREAM)
    prev_end[dst[stream]] = end[src[stream]]
    out = np.full(len(graph.tasks), -1, dtype=np.int64)
    launch = kind == int(EdgeKind.LAUNCH)
    np.maximum.at(out, src[launch], prev_end[dst[launch]])
    return out


def _cpu_own(graph: TaskGraph) -> pd.Series:
    cpu = _measured(graph, kind_codes(CPU_KINDS | {TaskKind.MARKER}))
    threads = np.flatnonzero(graph.resources["kind"].to_numpy() == int(ResourceKind.THREAD))
    cpu = cpu[np.isin(cpu["resource"].to_numpy(), threads)]
    names = cpu["name"].to_numpy()
    blocking = (cpu["kind"].to_numpy() == int(TaskKind.WAIT)) | np.fromiter(
        (bool(BLOCKING_CALL.search(n)) for n in names), dtype=bool, count=len(names))
    start, end = cpu["start"].to_numpy(), cpu["end"].to_numpy()
    busy_until = _stream_busy_until(graph)[cpu["task"].to_numpy()]
    launcher = busy_until >= 0
    typical = pd.Series((end - start)[launcher]).groupby(
        [cpu["rank"].to_numpy()[launcher], names[launcher]]).transform("median").to_numpy()
    held = np.zeros(len(cpu), dtype=np.int64)
    held[launcher] = np.maximum(np.minimum(end[launcher], busy_until[launcher]) - start[launcher] - typical, 0)
    dur = end - start
    cpu = cpu.assign(wait=np.where(blocking, dur, held))
    per_thread = cpu.groupby(["rank", "step", "resource"]).agg(start=("start", "min"), end=("end", "max"),
                                                                 wait=("wait", "sum"))
    own = (per_thread["end"] - per_thread["start"] - per_thread["wait"]).clip(lower=0)
    return own.groupby(level=["rank", "step"]).max()


def _union_ns(start: np.ndarray, end: np.ndarray) -> int:
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    prev = np.concatenate([[s[0] if len(s) else 0], reach[:-1]])
    return int(np.maximum(e - np.maximum(s, prev), 0).sum()) if len(s) else 0


def _gpu(graph: TaskGraph) -> tuple[pd.Series, pd.Series]:
    gpu = _measured(graph, kind_codes(GPU_WORK_KINDS))
    gpu = gpu.assign(dur=gpu["end"] - gpu["start"])
    stream_own = gpu.groupby(["rank", "step", "resource"])["dur"].sum().groupby(level=["rank", "step"]).max()
    busy = {key: _union_ns(g["start"].to_numpy(), g["end"].to_numpy())
            for key, g in gpu.groupby(["rank", "step"])}
    busy_s = pd.Series(busy, dtype=np.int64)
    busy_s.index = busy_s.index.set_names(["rank", "step"]) if len(busy_s) else busy_s.index
    return stream_own, busy_s


def step_bounds(graph: TaskGraph) -> pd.DataFrame:
    """Per step of ``graph``: ``rank``, ``step``, ``measured_ns`` (the step's measured length, as
    :func:`~whatif.predictors.steps.step_times` counts it), ``cpu_own_ns``, ``gpu_stream_own_ns``
    and ``gpu_busy_ns`` (see the module docstring). Steps without CPU or GPU work get 0."""
    steps = graph.steps
    out = pd.DataFrame({"rank": steps["rank"].to_numpy(), "step": steps["step"].to_numpy(),
                        "measured_ns": measured_step_ns(graph)})
    key = pd.MultiIndex.from_arrays([out["rank"], out["step"]])
    stream_own, busy = _gpu(graph)
    for col, series in (("cpu_own_ns", _cpu_own(graph)), ("gpu_stream_own_ns", stream_own), ("gpu_busy_ns", busy)):
        out[col] = series.reindex(key).fillna(0).to_numpy(dtype=np.int64) if len(series) else 0
    return out
