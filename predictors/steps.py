"""Step times and critical paths of a replay.

A step *completes* when the last task attributed to it ends (its end marker, the GPU work it
launched, other threads' work in its window). A step's time is the spacing of completions: from
the previous step's completion (on the same rank) to its own, and for a rank's first step from
its ``ProfilerStep#N`` begin. Steps of a pipelined program overlap (the CPU runs ahead of the
GPU), so a window per step would count the overlap twice; completion spacing sums to the wall
time and is the iteration time a user sees. Measured and predicted times use this same rule
(on measured and on replayed task times). A trace without step annotations has one step per
rank spanning its window.

Not every step is one a user means. :func:`step_exclusions` applies the rule of
:mod:`whatif.core.steps` (warm-up ``ProfilerStep#0``, a partial last step; the recorder's summary
applies the same one) to every rank of the measured graph, counting each step's tasks.

The critical path of a step is walked backwards from the task that ends it, following the edge
that set each task's start (or end, for a wait). Every nanosecond of the step is attributed to
one category (HTA's breakdown, refined):

=========  ===============================================================
cpu        CPU work: operator time between calls, non-launch API calls
launch     kernel-launch API calls and launch latency (CPU/launch-bound)
gpu        kernels, copies and memsets
comm       collective kernels and waiting for other ranks at a collective
sync       CPU waiting for the GPU, cross-stream event waits
idle       GPU idle between queued kernels, offsets of tasks with no predecessor
=========  ===============================================================
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from whatif.core.steps import COUNT_DEFAULT, PARTIAL_SHARE, Exclusion, StepOptions, completion_floor, rank_exclusions
from whatif.depgraph.graph import EdgeKind, TaskGraph, TaskKind

from .replay import RESOURCE_BOUND, Replay, replay

__all__ = ["CATEGORIES", "COUNT_DEFAULT", "PARTIAL_SHARE", "CriticalPath", "Exclusion", "StepOptions",
           "counted_steps", "critical_path", "included_mean_ns", "measured_step_ns", "step_end_tasks",
           "step_exclusions", "step_times", "step_times_ns", "utilization"]

CATEGORIES = ("cpu", "launch", "gpu", "comm", "sync", "idle")
_EDGE_CATEGORY = {EdgeKind.ANCHOR: "idle", EdgeKind.THREAD: "cpu", EdgeKind.STREAM: "idle", EdgeKind.LAUNCH: "launch",
                  EdgeKind.SYNC: "sync", EdgeKind.EVENT_WAIT: "sync", EdgeKind.COLLECTIVE: "comm", EdgeKind.FLOW: "cpu",
                  EdgeKind.LAUNCH_QUEUE: "sync", EdgeKind.CONTENTION: "gpu"}
_TASK_CATEGORY = {TaskKind.CPU_WORK: "cpu", TaskKind.CPU_CALL: "cpu", TaskKind.WAIT: "sync", TaskKind.KERNEL: "gpu",
                  TaskKind.MEMCPY: "gpu", TaskKind.MEMSET: "gpu", TaskKind.COMM: "comm"}


def step_exclusions(graph: TaskGraph) -> list[Exclusion | None]:
    """Per row of ``graph.steps``: why the step is excluded by default, None when it counts
    (:func:`whatif.core.steps.rank_exclusions` per rank, steps in begin order, events = tasks)."""
    steps = graph.steps
    out: list[Exclusion | None] = [None] * len(steps)
    if not len(steps):
        return out
    t = graph.tasks
    work = t[t["kind"].to_numpy() != int(TaskKind.MARKER)]
    counts = work.groupby(["rank", "step"]).size()
    ranks = steps["rank"].to_numpy()
    numbers = steps["step"].to_numpy()
    begins = steps["measured_begin_ns"].to_numpy()
    for r in np.unique(ranks):
        rows = np.flatnonzero(ranks == r)
        rows = rows[np.argsort(begins[rows], kind="stable")]
        tasks = [int(counts.get((int(r), int(numbers[i])), 0)) for i in rows]
        for i, reason in zip(rows.tolist(), rank_exclusions(numbers[rows].tolist(), tasks)):
            out[i] = reason
    return out


def exclusion_reasons(graph: TaskGraph) -> dict[tuple[int, int], str]:
    """(rank, step) -> why the step is left out of means by default, for the steps that are
    (:func:`step_exclusions` keyed by step instead of by row)."""
    steps = graph.steps
    return {(int(r), int(s)): why.value for r, s, why in
            zip(steps["rank"].tolist(), steps["step"].tolist(), step_exclusions(graph)) if why is not None}


def counted_steps(graph: TaskGraph, options: StepOptions = COUNT_DEFAULT) -> np.ndarray:
    """Per row of ``graph.steps`` (the measured graph): whether the step counts under ``options``."""
    return options.mask(step_exclusions(graph))


def measured_step_ns(graph: TaskGraph) -> np.ndarray:
    """Per row of ``graph.steps``: the measured step time, from the previous step's completion on
    the same rank (or the step's own begin for a rank's first step) to this step's completion."""
    steps = graph.steps
    m_begin = steps["measured_begin_ns"].to_numpy()
    m_done = steps["measured_end_ns"].to_numpy()
    return m_done - completion_floor(steps["rank"].to_numpy(), m_begin, m_done)


def step_end_tasks(replay: Replay, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``graph.steps`` under the given task times: (where the step's time starts, the
    task that completes it). See the module docstring."""
    g = replay.graph
    t = g.tasks
    steps = g.steps
    key = t["rank"].to_numpy().astype(np.int64) * (1 << 32) + (t["step"].to_numpy().astype(np.int64) & 0xFFFFFFFF)
    frame = pd.DataFrame({"key": key, "end": -end, "id": np.arange(len(t))})
    first = frame.sort_values(["key", "end", "id"], kind="stable").groupby("key").head(1).set_index("key")["id"]
    step_keys = steps["rank"].to_numpy().astype(np.int64) * (1 << 32) + (steps["step"].to_numpy().astype(np.int64)
                                                                       & 0xFFFFFFFF)
    finisher = first.reindex(step_keys).fillna(-1).to_numpy().astype(np.int64)
    begin_task = steps["begin_task"].to_numpy()
    finisher = np.where(finisher >= 0, finisher, begin_task)
    floor = completion_floor(steps["rank"].to_numpy(), start[begin_task], end[finisher])
    return floor, finisher


def step_times(replay: Replay, options: StepOptions = COUNT_DEFAULT, reference: TaskGraph | None = None
               ) -> pd.DataFrame:
    """Measured and predicted time of every step: columns ``rank``, ``step``, ``measured_ns``,
    ``predicted_ns``, ``error`` (predicted / measured - 1), ``excluded_reason`` (an
    :class:`Exclusion`, None when the step counts by default; judged on ``reference``, the
    measured graph, default the replayed one) and ``included`` (whether it counts under
    ``options``)."""
    g = replay.graph
    steps = g.steps
    floor, finisher = step_end_tasks(replay, replay.start_ns, replay.end_ns)
    predicted = replay.end_ns[finisher] - floor
    measured = measured_step_ns(g)
    out = pd.DataFrame({"rank": steps["rank"].to_numpy(), "step": steps["step"].to_numpy(),
                        "measured_ns": measured, "predicted_ns": predicted})
    out["error"] = np.where(measured > 0, predicted / np.maximum(measured, 1) - 1.0, 0.0)
    reasons = step_exclusions(g if reference is None else reference)
    out["excluded_reason"] = pd.Series(reasons, dtype=object)
    out["included"] = options.mask(reasons)
    return out


def included_mean_ns(steps: pd.DataFrame, column: str = "predicted_ns") -> float:
    """Mean of ``column`` over the included rows of a :func:`step_times` frame (over every row when
    none is included)."""
    sel = steps[steps["included"]] if steps["included"].any() else steps
    return float(sel[column].mean()) if len(sel) else 0.0


def step_times_ns(graph: TaskGraph) -> pd.Series:
    """Replay ``graph``: each step's predicted time (ns; max over ranks), indexed by step (the
    :data:`~whatif.transforms.base.StepTimes` that transforms searching over plans get)."""
    return step_times(replay(graph)).groupby("step")["predicted_ns"].max().astype(float)


@dataclass
class CriticalPath:
    """The chain of tasks that set a step's length, and where its time went (ns per category)."""

    rank: int
    step: int
    tasks: list[int]
    breakdown_ns: dict[str, int]

    @property
    def length_ns(self) -> int:
        return sum(self.breakdown_ns.values())


def _path_inputs(replay: Replay) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-replay arrays every critical-path walk needs, computed once and cached on the replay."""
    cached = replay.cache.get("critical_path_inputs")
    if cached is None:
        g = replay.graph
        kinds = g.tasks["kind"].to_numpy()
        src = g.edges["src"].to_numpy()
        ekind = g.edges["kind"].to_numpy()
        launches = np.zeros(len(kinds), dtype=bool)
        launches[src[ekind == int(EdgeKind.LAUNCH)]] = True
        begin, finisher = step_end_tasks(replay, replay.start_ns, replay.end_ns)
        cached = (kinds, src, ekind, launches, begin, finisher)
        replay.cache["critical_path_inputs"] = cached
    return cached  # type: ignore[return-value]


def critical_path(replay: Replay, step_row: int) -> CriticalPath:
    """Walk the critical path of row ``step_row`` of ``graph.steps`` backwards."""
    g = replay.graph
    kinds, src, ekind, launches, begin, finisher = _path_inputs(replay)
    floor = int(begin[step_row])
    start, end = replay.start_ns, replay.end_ns
    acc = dict.fromkeys(CATEGORIES, 0)

    def add(category: str, lo: int, hi: int) -> bool:
        """Attribute [lo, hi] clipped at the step begin; False once the walk passed the begin."""
        if hi > floor:
            acc[category] += hi - max(lo, floor)
        return lo > floor

    path: list[int] = []
    v = int(finisher[step_row])
    while v >= 0:
        path.append(v)
        k = TaskKind(int(kinds[v]))
        sync_edge = int(replay.end_by[v])
        if sync_edge >= 0:
            u = int(src[sync_edge])
            if not add("sync", int(end[u]), int(end[v])):
                break
            v = u
            continue
        category = "launch" if k == TaskKind.CPU_CALL and launches[v] else _TASK_CATEGORY.get(k, "idle")
        if not add(category, int(start[v]), int(end[v])):
            break
        by = int(replay.start_by[v])
        if by == RESOURCE_BOUND:
            v = int(replay.resource_prev[v])
        elif by >= 0:
            u = int(src[by])
            if not add(_EDGE_CATEGORY[EdgeKind(int(ekind[by]))], int(end[u]), int(start[v])):
                break
            v = u
        else:
            break
    steps = g.steps
    return CriticalPath(rank=int(steps["rank"].iloc[step_row]), step=int(steps["step"].iloc[step_row]),
                        tasks=path[::-1], breakdown_ns=acc)


def utilization(replay: Replay) -> pd.DataFrame:
    """Busy time of every resource over the replayed window: ``resource``, ``name``, ``busy_ns``,
    ``window_ns``, ``utilization``."""
    g = replay.graph
    t = g.tasks
    busy = pd.Series(replay.end_ns - replay.start_ns).groupby(t["resource"].to_numpy()).sum()
    ranks = t["rank"].to_numpy()
    window = {int(r): int(replay.end_ns[ranks == r].max() - replay.start_ns[ranks == r].min())
              for r in np.unique(ranks)}
    res = g.resources
    out = pd.DataFrame({"resource": busy.index.to_numpy(), "busy_ns": busy.to_numpy()})
    out["name"] = res["name"].to_numpy()[out["resource"]]
    out["rank"] = res["rank"].to_numpy()[out["resource"]]
    out["window_ns"] = [window[int(r)] for r in out["rank"]]
    out["utilization"] = out["busy_ns"] / out["window_ns"].clip(lower=1)
    return out
