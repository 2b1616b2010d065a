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
* ``gpu_busy_ns``: the time any GPU work of the rank runs in the step's measured window (union
  of the intervals, whatever step the work is attributed to).
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
from dataclasses import dataclass
from enum import Enum

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


def _union(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals as sorted, disjoint (start, end) arrays."""
    if not len(start):
        return start, end
    order = np.argsort(start, kind="stable")
    s, reach = start[order], np.maximum.accumulate(end[order])
    first = np.flatnonzero(np.concatenate([[True], s[1:] > reach[:-1]]))
    last = np.concatenate([first[1:] - 1, [len(s) - 1]])
    return s[first], reach[last]


def union_ns(start: np.ndarray, end: np.ndarray) -> int:
    """Length of the union of the intervals ``[start, end)`` (e.g. a GPU's busy time over its streams).

    >>> union_ns(np.array([0, 5, 20]), np.array([10, 12, 25]))
    17
    """
    u_start, u_end = _union(np.asarray(start), np.asarray(end))
    return int((u_end - u_start).sum())


def _covered_ns(u_start: np.ndarray, u_end: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per window [lo, hi): how much of it the disjoint sorted intervals cover."""
    if not len(u_start):
        return np.zeros(len(lo), dtype=np.int64)
    covered_before = np.concatenate([[0], np.cumsum(u_end - u_start)])

    def covered_until(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(u_start, t, side="right")  # intervals starting at or before t
        partial = np.where(k > 0, np.clip(t - u_start[np.maximum(k - 1, 0)], 0,
                                          (u_end - u_start)[np.maximum(k - 1, 0)]), 0)
        return covered_before[np.maximum(k - 1, 0)] * (k > 0) + partial

    return np.maximum(covered_until(hi) - covered_until(lo), 0).astype(np.int64)


def _gpu_stream_own(graph: TaskGraph) -> pd.Series:
    gpu = _measured(graph, kind_codes(GPU_WORK_KINDS))
    gpu = gpu.assign(dur=gpu["end"] - gpu["start"])
    return gpu.groupby(["rank", "step", "resource"])["dur"].sum().groupby(level=["rank", "step"]).max()


def _gpu_busy_ns(graph: TaskGraph, measured_ns: np.ndarray) -> np.ndarray:
    """Per row of ``graph.steps``: how long any GPU work of its rank ran in the step's window
    (whatever step that work is attributed to: work launched before the window counts too)."""
    t, steps = graph.tasks, graph.steps
    gpu = np.isin(t["kind"].to_numpy(), kind_codes(GPU_WORK_KINDS)) & (t["measured_start_ns"].to_numpy() >= 0)
    ranks, start, end = t["rank"].to_numpy()[gpu], t["measured_start_ns"].to_numpy()[gpu], \
        t["measured_end_ns"].to_numpy()[gpu]
    hi = steps["measured_end_ns"].to_numpy()
    lo = hi - measured_ns
    out = np.zeros(len(steps), dtype=np.int64)
    for rank in np.unique(steps["rank"].to_numpy()):
        rows = np.flatnonzero(steps["rank"].to_numpy() == rank)
        mine = ranks == rank
        u_start, u_end = _union(start[mine], end[mine])
        out[rows] = _covered_ns(u_start, u_end, lo[rows], hi[rows])
    return out


def step_bounds(graph: TaskGraph) -> pd.DataFrame:
    """Per step of ``graph``: ``rank``, ``step``, ``measured_ns`` (the step's measured length, as
    :func:`~whatif.predictors.steps.step_times` counts it), ``cpu_own_ns``, ``gpu_stream_own_ns``
    and ``gpu_busy_ns`` (see the module docstring). Steps without CPU or GPU work get 0."""
    steps = graph.steps
    out = pd.DataFrame({"rank": steps["rank"].to_numpy(), "step": steps["step"].to_numpy(),
                        "measured_ns": measured_step_ns(graph)})
    key = pd.MultiIndex.from_arrays([out["rank"], out["step"]])
    for col, series in (("cpu_own_ns", _cpu_own(graph)), ("gpu_stream_own_ns", _gpu_stream_own(graph))):
        out[col] = series.reindex(key).fillna(0).to_numpy(dtype=np.int64) if len(series) else 0
    out["gpu_busy_ns"] = _gpu_busy_ns(graph, out["measured_ns"].to_numpy())
    return out


class FixedPart(Enum):
    """Work a scenario left unchanged, which bounds its speedup."""

    CPU_OWN = "CPU own work"
    GPU_STREAM = "work on the busiest GPU stream"


_FLOOR_COLUMN = {FixedPart.CPU_OWN: "cpu_own_ns", FixedPart.GPU_STREAM: "gpu_stream_own_ns"}
_PART_KINDS = {FixedPart.CPU_OWN: (int(TaskKind.CPU_CALL), int(TaskKind.CPU_WORK)),
               FixedPart.GPU_STREAM: tuple(kind_codes(GPU_WORK_KINDS))}
BINDING_SHARE = 0.9
"""A cap binds when the predicted speedup reaches this share of it."""
UNEXPLAINED_WAIT_KEYS = ("sync_wait_unattributed_ns", "stream_waits_unattributed_ns",
                         "copy_calls_wait_unattributed_ns")
"""``graph.report`` entries of waits the build could not tie to the work waited for: the replay
keeps them as measured, whatever a scenario changes."""


def unexplained_wait_ns(graph: TaskGraph) -> int:
    """Waits the graph holds as measured because the trace does not say what they waited for."""
    return sum(int(graph.report.get(key, 0)) for key in UNEXPLAINED_WAIT_KEYS)


@dataclass(frozen=True)
class SpeedupCap:
    """The most a scenario can speed the steps up, given the work it left unchanged (Amdahl):
    ``speedup_cap`` = sum of the steps' baseline times / sum of the fixed part's floor
    (:func:`step_bounds`), ``floor_ns`` the floor's mean per step."""

    speedup_cap: float
    part: FixedPart
    floor_ns: int
    held_ns: int = 0
    """Per step: waits held as measured (:func:`unexplained_wait_ns`), named because no scenario moves them."""

    def binding(self, speedup: float) -> bool:
        return speedup >= BINDING_SHARE * self.speedup_cap

    def line(self, speedup: float) -> str:
        """One line: ``capped at 1.06x: 1.751 ms of CPU own work per step (unchanged)``, and the
        waits held as measured when there are any."""
        head = "capped at" if self.binding(speedup) else "bound"
        held = (f"; {self.held_ns / 1e6:,.3f} ms per step of waits the trace does not explain are held as measured"
                if self.held_ns > 0 else "")
        return (f"{head} {self.speedup_cap:.2f}x: {self.floor_ns / 1e6:,.3f} ms of {self.part.value} "
                f"per step (unchanged){held}")


def _work(graph: TaskGraph, codes: Sequence[int]) -> tuple[int, int]:
    t = graph.tasks
    sel = np.isin(t["kind"].to_numpy(), codes)
    return int(sel.sum()), int(t["dur_ns"].to_numpy()[sel].sum())


def unchanged_parts(base: TaskGraph, scenario: TaskGraph) -> list[FixedPart]:
    """The parts whose tasks (count and total duration) ``scenario`` left as in ``base``."""
    return [part for part, codes in _PART_KINDS.items() if _work(base, codes) == _work(scenario, codes)]


def speedup_cap(bounds: pd.DataFrame, base_ns: pd.Series, parts: Sequence[FixedPart],
                held_ns: int = 0) -> SpeedupCap | None:
    """The cap the unchanged ``parts`` set on the steps of ``bounds`` (rows of :func:`step_bounds`)
    whose baseline time is ``base_ns`` (same index): the binding part's, None when no part is
    fixed or a fixed part has no work."""
    if not len(bounds) or not parts:
        return None
    floors = {p: int(bounds[_FLOOR_COLUMN[p]].sum()) for p in parts}
    part = max(floors, key=lambda p: floors[p])
    if floors[part] <= 0:
        return None
    return SpeedupCap(speedup_cap=round(float(base_ns.sum()) / floors[part], 4), part=part,
                      floor_ns=int(floors[part] / len(bounds)), held_ns=held_ns)
