"""Where a GPU's time went, per rank and step: HolisticTraceAnalysis's everyday breakdowns,
computed from the raw events with no hidden window.

* **temporal**: idle / compute / non-compute time over the span from a GPU's first activity to
  its last (HTA's ``get_temporal_breakdown``), with the non-compute time split into
  communication and memory, and the communication hidden under compute (HTA's
  ``get_comm_comp_overlap``: overlap time / communication time);
* **idle**: every gap between consecutive activities on a stream, by cause (HTA's
  ``get_idle_time_breakdown``): *host wait* when the launch call started after the previous
  activity ended (the CPU was late), *kernel wait* when the gap is shorter than
  ``kernel_wait_ns`` (back-to-back launch overhead), *other* for the rest (e.g. waiting on an
  event of another stream);
* **launches**: launch delay (activity start − end of its launch call, clipped at 0) per rank,
  with HTA's outliers: delays over ``long_delay_ns`` and kernels shorter than their launch call;
* **queues**: operations launched on a stream but not yet started (+1 at the launch call, −1 at
  the start, HTA's ``get_queue_length_time_series``): maximum, time-weighted mean and the share
  of the span with nothing queued;
* **classes**: GPU time per kernel class (:class:`~whatif.core.kernels.KernelClass`) per step.

Every GPU activity (kernel, copy, memset) of every rank counts in the rank's row: nothing is
cut by a step window. Per-step rows attribute an activity to the step its launch call ran in;
activities launched outside any step are in a ``step`` −1 row, and the steps whatif leaves out of
means (warm-up, partial) carry their ``excluded`` reason. HTA differs (``docs/breakdown.md``):
it keeps only the events of whole profiler steps, rounds times to microseconds, and counts
``cuda_sync`` records (waits drawn on the GPU track) as non-compute work.

>>> from whatif.tracer.trace import load_trace
>>> doc = breakdown(load_trace("sample_traces/train_cpu"))   # doctest: +SKIP
>>> doc.temporal[0].idle_ns <= doc.temporal[0].span_ns       # doctest: +SKIP
True
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np
import pandas as pd

from whatif.core.bounds import check_fields
from whatif.core.kernels import KernelClass, classify_kernel, is_collective
from whatif.depgraph.graph import GPU_WORK_KINDS, TaskGraph
from whatif.documents import BreakdownDocument, ClassTime, IdleGaps, LaunchDelays, QueueLength, TemporalBreakdown
from whatif.predictors.bounds import union_ns
from whatif.predictors.steps import exclusion_reasons
from whatif.tracer.kinds import GPU_ACTIVITY_KINDS, GPU_MEMORY_KINDS, EventKind, codes
from whatif.tracer.trace import Trace, per_name

__all__ = ["OUTSIDE_STEPS", "WHOLE_RANK", "BreakdownOptions", "WorkClass", "breakdown", "gpu_work",
           "queue_series", "step_label", "summarize", "union_ns"]

WHOLE_RANK = -2
"""``step`` of a row that covers every activity of the rank."""
OUTSIDE_STEPS = -1
"""``step`` of a row of the activities launched outside any step."""


def step_label(step: int, excluded: str | None = None, prefix: str = "") -> str:
    """How a row's ``step`` reads in a table: "all", "outside steps" or ``prefix`` + the number,
    with the reason a left-out step does not count.

    >>> step_label(WHOLE_RANK), step_label(3, "warm-up", prefix="step ")
    ('all', 'step 3 (warm-up)')
    """
    label = {WHOLE_RANK: "all", OUTSIDE_STEPS: "outside steps"}.get(step, f"{prefix}{step}")
    return f"{label} ({excluded})" if excluded else label


class WorkClass(str, Enum):
    """HTA's three kinds of GPU work."""

    COMPUTE = "compute"
    COMMUNICATION = "communication"
    MEMORY = "memory"


@dataclass(frozen=True)
class BreakdownOptions:
    kernel_wait_ns: int = field(default=30_000, metadata={
        "minimum": 0, "help": "a gap between two activities on a stream shorter than this, launched in time, is "
                "kernel wait (default 30000 ns: HTA's consecutive_kernel_delay of 30 in its microsecond "
                "timestamps)"})
    long_delay_ns: int = field(default=100_000, metadata={
        "minimum": 0, "help": "a launch delay over this is an outlier (default 100000 ns, HTA's launch_delay_cutoff "
                              "of 100 us)"})

    def __post_init__(self) -> None:
        check_fields(self)


def gpu_work(trace: Trace, graph: TaskGraph | None = None) -> pd.DataFrame:
    """One row per GPU activity (kernel, copy, memset) of every rank: ``event`` (its row in the
    event table), ``rank``, ``stream`` (the
    device and stream, as ``"device:stream"``), ``ts_ns``, ``end_ns``, ``name``, ``work``
    (:class:`WorkClass` value), ``kernel_class`` (:class:`KernelClass` value), ``launch_ns`` and
    ``launch_end_ns`` (start and end of the runtime or driver call that launched it, −1 when the
    trace has none), ``step`` (the graph's step of the activity, :data:`OUTSIDE_STEPS` without
    one or without a graph)."""
    ev = trace.events
    kinds = ev["kind"].to_numpy()
    rows = np.flatnonzero(np.isin(kinds, codes(GPU_ACTIVITY_KINDS)))
    names = ev["name"]
    cat_codes = names.cat.codes.to_numpy()[rows]
    categories = names.cat.categories
    collective = per_name(names, is_collective)[rows]
    memory = np.isin(kinds[rows], codes(GPU_MEMORY_KINDS))
    work = np.where(memory, WorkClass.MEMORY.value,
                    np.where(collective, WorkClass.COMMUNICATION.value, WorkClass.COMPUTE.value))
    rank = ev["rank"].to_numpy()
    ts = ev["ts_ns"].to_numpy()
    end = ts + ev["dur_ns"].to_numpy()
    corr = ev["correlation"].to_numpy()

    calls = np.flatnonzero(np.isin(kinds, codes({EventKind.RUNTIME, EventKind.DRIVER})) & (corr >= 0))
    call_index = pd.MultiIndex.from_arrays([rank[calls], corr[calls]])
    first = ~call_index.duplicated(keep="first")   # the outer call: rows sorted by start, longer first
    # positions, not a reindexed frame: a NaN fill would pass epoch nanoseconds through float64,
    # which keeps only 53 bits (a launch time off by up to 128 ns)
    where = call_index[first].get_indexer(pd.MultiIndex.from_arrays([rank[rows], corr[rows]]))
    has = (corr[rows] >= 0) & (where >= 0)
    pick = np.maximum(where, 0)
    starts, ends = ts[calls][first], end[calls][first]
    if not len(starts):   # no launch call recorded at all: every activity is unlaunched
        starts = ends = np.full(1, -1, dtype=np.int64)
    launch_ns = np.where(has, starts[pick], -1).astype(np.int64)
    launch_end_ns = np.where(has, ends[pick], -1).astype(np.int64)

    step = np.full(len(rows), OUTSIDE_STEPS, dtype=np.int64)
    op: list[str | None] = [None] * len(rows)
    if graph is not None:
        t = graph.tasks
        gpu = t[np.isin(t["kind"].to_numpy(), codes(GPU_WORK_KINDS))]
        where = pd.Series(np.arange(len(rows)), index=rows)
        pos = where.reindex(gpu["event"].to_numpy()).to_numpy()
        ok = ~np.isnan(pos)
        pos = pos[ok].astype(np.int64)
        step[pos] = gpu["step"].to_numpy()[ok]
        ops = gpu["op"].to_numpy()[ok]
        for p, o in zip(pos.tolist(), ops.tolist()):
            op[p] = o if isinstance(o, str) else None
    row_names = np.asarray(categories)[cat_codes]
    classes: dict[tuple[str, str | None], str] = {}  # one classification per distinct (kernel, op)
    kernel_class = [classes.get(key) or classes.setdefault(key, classify_kernel(*key).value)
                    for key in zip(map(str, row_names.tolist()), op)]
    device = ev["device"].to_numpy()[rows]
    stream = ev["stream"].to_numpy()[rows]
    return pd.DataFrame({
        "event": rows, "rank": rank[rows], "stream": [f"{d}:{s}" for d, s in zip(device.tolist(), stream.tolist())],
        "ts_ns": ts[rows], "end_ns": end[rows], "name": row_names, "work": work,
        "kernel_class": kernel_class, "launch_ns": launch_ns, "launch_end_ns": launch_end_ns, "step": step,
    })


def _temporal(rank: int, step: int, excluded: str | None, w: pd.DataFrame) -> TemporalBreakdown:
    s, e = w["ts_ns"].to_numpy(), w["end_ns"].to_numpy()
    work = w["work"].to_numpy()
    comp, comm, mem = (work == c.value for c in WorkClass)
    busy = union_ns(s, e)
    compute = union_ns(s[comp], e[comp])
    communication = union_ns(s[comm], e[comm])
    overlap = compute + communication - union_ns(s[comp | comm], e[comp | comm])
    span = int(e.max() - s.min()) if len(s) else 0
    return TemporalBreakdown(rank=rank, step=step, excluded=excluded, activities=len(w), span_ns=span,
                             idle_ns=span - busy, compute_ns=compute, non_compute_ns=busy - compute,
                             communication_ns=communication, memory_ns=union_ns(s[mem], e[mem]),
                             comm_overlapped_ns=overlap)


def _idle(rank: int, stream: str, w: pd.DataFrame, options: BreakdownOptions) -> IdleGaps:
    w = w.sort_values("ts_ns", kind="stable")
    ts, end, launch = w["ts_ns"].to_numpy(), w["end_ns"].to_numpy(), w["launch_ns"].to_numpy()
    prev_end = np.maximum.accumulate(end)[:-1]
    gap = ts[1:] - prev_end
    keep = gap > 0
    gap, prev_end, launch = gap[keep], prev_end[keep], launch[1:][keep]
    host = launch > prev_end
    kernel = ~host & (gap < options.kernel_wait_ns)
    other = ~host & ~kernel
    return IdleGaps(rank=rank, stream=stream, gaps=int(len(gap)), host_wait_ns=int(gap[host].sum()),
                    kernel_wait_ns=int(gap[kernel].sum()), other_ns=int(gap[other].sum()))


def _launches(rank: int, w: pd.DataFrame, options: BreakdownOptions) -> LaunchDelays | None:
    w = w[w["launch_ns"].to_numpy() >= 0]
    if not len(w):
        return None
    delay = np.maximum(w["ts_ns"].to_numpy() - w["launch_end_ns"].to_numpy(), 0)
    call = w["launch_end_ns"].to_numpy() - w["launch_ns"].to_numpy()
    gpu = w["end_ns"].to_numpy() - w["ts_ns"].to_numpy()
    p50, p90, p99 = np.percentile(delay, [50, 90, 99], method="lower").tolist()
    return LaunchDelays(rank=rank, launches=len(w), p50_ns=int(p50), p90_ns=int(p90), p99_ns=int(p99),
                        max_ns=int(delay.max()), long_delays=int((delay > options.long_delay_ns).sum()),
                        shorter_than_launch=int((gpu < call).sum()))


def queue_series(w: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """For the activities ``w`` of one stream: the times the queue length changes and its value
    from each (a step function). Only activities with a launch call count (HTA's rule)."""
    w = w[w["launch_ns"].to_numpy() >= 0]
    t = np.concatenate([w["launch_ns"].to_numpy(), w["ts_ns"].to_numpy()])
    d = np.concatenate([np.ones(len(w), dtype=np.int64), -np.ones(len(w), dtype=np.int64)])
    order = np.lexsort((-d, t))         # at equal times the launch first: nothing starts before its launch
    return t[order], np.cumsum(d[order])


def _queue(rank: int, stream: str, w: pd.DataFrame) -> QueueLength | None:
    t, q = queue_series(w)
    if not len(t):
        return None
    held = np.diff(t)
    span = int(t[-1] - t[0])
    mean = float((q[:-1] * held).sum() / span) if span else 0.0
    empty = float(held[q[:-1] <= 0].sum() / span) if span else 1.0
    return QueueLength(rank=rank, stream=stream, max=int(q.max()), mean=round(mean, 3),
                       empty_share=round(empty, 4))


def _classes(rank: int, step: int, w: pd.DataFrame) -> list[ClassTime]:
    dur = w["end_ns"].to_numpy() - w["ts_ns"].to_numpy()
    total = int(dur.sum())
    by = pd.Series(dur).groupby(w["kernel_class"].to_numpy()).agg(["sum", "size"])
    order = [c.value for c in KernelClass if c.value in by.index]
    return [ClassTime(rank=rank, step=step, kernel_class=c, count=int(by.loc[c, "size"]),
                      total_ns=int(by.loc[c, "sum"]),
                      share=round(float(by.loc[c, "sum"]) / total, 4) if total else 0.0) for c in order]


def _by(work: pd.DataFrame, column: str) -> Iterable[tuple[Any, pd.DataFrame]]:
    values = work[column].to_numpy()
    for value in sorted(set(values.tolist())):
        yield value, work[values == value]


def _groups(work: pd.DataFrame) -> Iterable[tuple[int, int, pd.DataFrame]]:
    for rank, w in _by(work, "rank"):
        yield rank, WHOLE_RANK, w
        for step, ws in _by(w, "step"):
            yield rank, step, ws


def breakdown(trace: Trace, graph: TaskGraph | None = None,
              options: BreakdownOptions = BreakdownOptions()) -> BreakdownDocument:
    """The breakdowns of ``trace``: per rank (``step`` :data:`WHOLE_RANK`), and per step when
    ``graph`` (the trace's dependency graph) says which step launched each activity.

    Parameters
    ----------
    trace : the event table (:func:`whatif.tracer.trace.load_trace`).
    graph : its dependency graph (:func:`whatif.depgraph.build.build_graph`), for per-step rows,
        the steps left out of means, and the op of each kernel (a kernel with a generic name is
        classed by its op); None: rank rows only.
    options : thresholds (:class:`BreakdownOptions`).
    """
    excluded = exclusion_reasons(graph) if graph is not None else {}
    return summarize(gpu_work(trace, graph), trace.source, options, excluded, per_step=graph is not None)


def summarize(work: pd.DataFrame, source: str, options: BreakdownOptions = BreakdownOptions(),
              excluded: dict[tuple[int, int], str] | None = None, per_step: bool = True) -> BreakdownDocument:
    """The breakdowns of the activities ``work`` (rows of :func:`gpu_work`, any subset, e.g. HTA's
    window of whole profiler steps); ``excluded``: (rank, step) -> why the step is left out of
    means; ``per_step``: add a row per step besides the rank's."""
    excluded = excluded or {}
    temporal, classes = [], []
    for rank, step, w in _groups(work):
        if step == WHOLE_RANK or per_step:
            temporal.append(_temporal(rank, step, excluded.get((rank, step)), w))
            classes.extend(_classes(rank, step, w))
    idle, queues, launches = [], [], []
    for rank, w in _by(work, "rank"):
        for stream, ws in _by(w, "stream"):
            idle.append(_idle(rank, stream, ws, options))
            q = _queue(rank, stream, ws)
            if q is not None:
                queues.append(q)
        d = _launches(rank, w, options)
        if d is not None:
            launches.append(d)
    return BreakdownDocument(source=source, kernel_wait_ns=options.kernel_wait_ns,
                             long_delay_ns=options.long_delay_ns, temporal=temporal, idle=idle,
                             launches=launches, queues=queues, classes=classes)
