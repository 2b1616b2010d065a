"""The versioned documents as typed, immutable objects (``msgspec.Struct``), and their JSON.

Producers (:mod:`whatif.summary`, :mod:`whatif.serving`, :mod:`whatif.report`) return these
objects; the CLI, the reports, the figures and the dashboard read their attributes. JSON is made
only at the edge, by :func:`to_json` (output files, the report's ``report.json``) and read back by
:func:`from_json` (``--baseline``/``--prediction``/``--serving`` files). Field names and order
are the JSON's keys and order (``docs/analysis-schema.md``, ``docs/prediction-schema.md``,
``docs/report-schema.md``, ``docs/serving.md``); a field left :data:`UNSET` is not written.

>>> doc = PredictionDocument(source="t.json", device=None,
...                          baseline=BaselinePrediction(mean_step_ns=2_000_000, steps=[], critical_path=[]),
...                          scenarios=[])
>>> text = to_json(doc)
>>> text.splitlines()[1]
'  "schema": "whatif.prediction",'
>>> from_json(text, PredictionDocument) == doc, to_json(from_json(text, PredictionDocument)) == text
(True, True)
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, TypeVar, Union, get_args

import msgspec
import orjson
from msgspec import UNSET, UnsetType

from whatif.core.errors import WhatifError
from whatif.core.output import write_output

__all__ = [
    "UNSET",
    "AnalysisDocument",
    "BaselinePrediction",
    "BaselineReportRef",
    "BaselineStep",
    "BreakdownDocument",
    "Cap",
    "CapacityEntry",
    "ChangeEntry",
    "Check",
    "ClassTime",
    "CollectiveCall",
    "CollectivesDocument",
    "Contributor",
    "CriticalPathEntry",
    "DitIterationModel",
    "DitRequest",
    "DitScenarioServing",
    "DitServingDocument",
    "DitSettings",
    "DitSweepCurve",
    "DitSweepDocument",
    "DitSweepPoint",
    "Document",
    "DocumentError",
    "Fidelity",
    "IdleGaps",
    "JobDocument",
    "JobGroup",
    "LatencyStats",
    "LaunchDelays",
    "LlmIterationModel",
    "LlmRequest",
    "LlmScenarioServing",
    "LlmScheduler",
    "LlmServingDocument",
    "LlmSweepCurve",
    "LlmSweepDocument",
    "LlmSweepPoint",
    "MemoryDevice",
    "MemoryDocument",
    "MemoryOp",
    "MemorySeries",
    "MemoryStep",
    "NotJsonError",
    "OpRow",
    "OpsDocument",
    "PathShift",
    "PhaseFitEntry",
    "PlanRow",
    "PlanSweepDocument",
    "PredictionDocument",
    "ProfilerOffset",
    "QueueLength",
    "RankCollectives",
    "RankEntry",
    "ReportDocument",
    "ReportRow",
    "RowServing",
    "ScenarioHeadline",
    "ScenarioPrediction",
    "ScenarioStep",
    "ServingDocument",
    "SloAttainment",
    "Stat",
    "StepBreakdown",
    "StepFidelity",
    "SweepDocument",
    "TemporalBreakdown",
    "TopEntry",
    "UtilizationEntry",
    "WaterfallEntry",
    "WorkloadEntry",
    "counted",
    "from_json",
    "mean_breakdown_ns",
    "to_json",
    "write_json"
]

ANALYSIS_SCHEMA = "whatif.analysis"
PREDICTION_SCHEMA = "whatif.prediction"
REPORT_SCHEMA = "whatif.report"
SERVE_SCHEMA = "whatif.serving/1"
SWEEP_SCHEMA = "whatif.serving-sweep/1"
VERSION = 1


class DocumentError(WhatifError):
    """JSON that is not the document asked for (one line naming the first wrong key)."""


class NotJsonError(DocumentError):
    """The text is not JSON at all (as opposed to JSON that is not the expected document)."""


class Entry(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every document and document entry: immutable, keyword-built, compared by value."""


# --- shared entries -------------------------------------------------------------------------


class _HasExcluded(Protocol):
    @property
    def excluded(self) -> str | UnsetType: ...


_Stepped = TypeVar("_Stepped", bound=_HasExcluded)


class StepBreakdown(Entry, frozen=True, kw_only=True):
    """Where one step's critical path spent its time: ns per category (cpu, launch, gpu, comm, sync, idle);
    ``excluded``: why the step is left out of means (``warm-up``, ``partial``), unset when it counts."""

    rank: int
    step: int
    breakdown_ns: dict[str, int]
    excluded: str | UnsetType = UNSET


def counted(entries: list[_Stepped]) -> list[_Stepped]:
    """The entries of steps that count in means (``excluded`` unset); all of them when none does.

    >>> [s.step for s in counted([StepBreakdown(rank=0, step=0, breakdown_ns={}, excluded="warm-up"),
    ...                           StepBreakdown(rank=0, step=1, breakdown_ns={})])]
    [1]
    """
    kept = [e for e in entries if e.excluded is UNSET]
    return kept if kept else entries


class TopEntry(Entry, frozen=True, kw_only=True):
    """Measured time of one kernel, op or layer (``name``): GPU and CPU ns, task count."""

    name: str
    count: int
    gpu_ns: int
    cpu_ns: int


class Fidelity(Entry, frozen=True, kw_only=True):
    """Median and worst ``|replayed / measured - 1|`` over the steps (None without steps)."""

    median_abs_error: float | None
    max_abs_error: float | None


def mean_breakdown_ns(paths: list[StepBreakdown] | list[CriticalPathEntry]) -> dict[str, float]:
    """Mean critical-path time per category over the counted ``paths``, in the categories' order.

    >>> mean_breakdown_ns([StepBreakdown(rank=0, step=0, breakdown_ns={"cpu": 3, "gpu": 1}),
    ...                    StepBreakdown(rank=0, step=1, breakdown_ns={"cpu": 1, "gpu": 2})])
    {'cpu': 2.0, 'gpu': 1.5}
    """
    cats = list(paths[0].breakdown_ns) if paths else []
    paths = [p for p in paths if p.excluded is UNSET] or paths  # type: ignore[assignment]
    n = max(len(paths), 1)
    return {c: sum(p.breakdown_ns.get(c, 0) for p in paths) / n for c in cats}


# --- whatif.analysis ------------------------------------------------------------------------


class RankEntry(Entry, frozen=True, kw_only=True):
    rank: int
    path: str
    gpu: str | None
    world_size: int | None


class StepFidelity(Entry, frozen=True, kw_only=True):
    """One step, measured and replayed; ``error`` = replayed / measured - 1."""

    rank: int
    step: int
    measured_ns: int
    predicted_ns: int
    error: float
    excluded: str | UnsetType = UNSET


class CriticalPathEntry(Entry, frozen=True, kw_only=True):
    rank: int
    step: int
    length_ns: int
    tasks: int
    breakdown_ns: dict[str, int]
    excluded: str | UnsetType = UNSET


class UtilizationEntry(Entry, frozen=True, kw_only=True):
    rank: int
    resource: str
    busy_ns: int
    utilization: float


class AnalysisDocument(Entry, frozen=True, kw_only=True):
    """The ``whatif.analysis`` v1 document (``whatif analyze --json``)."""

    schema: Literal["whatif.analysis"] = "whatif.analysis"
    version: Literal[1] = 1
    source: str
    ranks: list[RankEntry]
    tasks: int
    edges: int
    resources: int
    graph_report: dict[str, int]
    steps: list[StepFidelity]
    fidelity: Fidelity
    critical_path: list[CriticalPathEntry]
    top_kernels: list[TopEntry]
    top_ops: list[TopEntry]
    top_layers: list[TopEntry]
    utilization: list[UtilizationEntry]

    @property
    def mean_measured_step_ns(self) -> float:
        steps = counted(self.steps)
        return sum(s.measured_ns for s in steps) / max(len(steps), 1)

    @property
    def mean_predicted_step_ns(self) -> float:
        steps = counted(self.steps)
        return sum(s.predicted_ns for s in steps) / max(len(steps), 1)


# --- whatif.prediction ----------------------------------------------------------------------


Stat = Literal["mean", "p50", "p90", "p99"]


class LatencyStats(Entry, frozen=True, kw_only=True):
    """mean, p50, p90, p99 (ms) of a serving metric; a statistic not given is not written."""

    mean: float | UnsetType | None = UNSET
    p50: float | UnsetType | None = UNSET
    p90: float | UnsetType | None = UNSET
    p99: float | UnsetType | None = UNSET

    def get(self, stat: Stat) -> float | None:
        """The statistic, None when it is missing or unset.

        >>> LatencyStats(mean=2.5).get("mean"), LatencyStats(mean=2.5).get("p99")
        (2.5, None)
        """
        value = {"mean": self.mean, "p50": self.p50, "p90": self.p90, "p99": self.p99}[stat]
        return None if value is UNSET else value  # type: ignore[return-value]


class RowServing(Entry, frozen=True, kw_only=True):
    """TTFT/TPOT statistics joined to a prediction row (``whatif report --serving``)."""

    ttft_ms: LatencyStats | UnsetType | None = UNSET
    tpot_ms: LatencyStats | UnsetType | None = UNSET

    def stats(self, metric: Literal["ttft_ms", "tpot_ms"]) -> LatencyStats | None:
        value = self.ttft_ms if metric == "ttft_ms" else self.tpot_ms
        return value if isinstance(value, LatencyStats) else None


class BaselineStep(Entry, frozen=True, kw_only=True):
    rank: int
    step: int
    measured_ns: int
    predicted_ns: int
    excluded: str | UnsetType = UNSET


class BaselinePrediction(Entry, frozen=True, kw_only=True):
    """The unmodified graph's replay: mean step, per-step times, per-step critical path."""

    mean_step_ns: int
    steps: list[BaselineStep]
    critical_path: list[StepBreakdown]
    serving: RowServing | UnsetType = UNSET

    name: ClassVar[str] = "baseline"
    speedup: ClassVar[float] = 1.0


class ScenarioStep(Entry, frozen=True, kw_only=True):
    rank: int
    step: int
    baseline_ns: int
    predicted_ns: int
    speedup: float
    excluded: str | UnsetType = UNSET


class Cap(Entry, frozen=True, kw_only=True):
    """Why a scenario's speedup is capped: work it left unchanged (``part``: ``CPU own work``,
    ``work on the busiest GPU stream``) takes ``floor_ns`` per step, so the mean step cannot
    speed up beyond ``speedup_cap``; ``binding``: the predicted speedup is within 10 % of it;
    ``reason``: the one line the CLI, the report and the dashboard print."""

    speedup_cap: float
    part: str
    floor_ns: int
    binding: bool
    reason: str


class WaterfallEntry(Entry, frozen=True, kw_only=True):
    """The prediction after one more transform of a scenario (cumulative)."""

    transform: str
    mean_step_ns: int
    speedup: float


class ChangeEntry(Entry, frozen=True, kw_only=True):
    """One change-log entry (:class:`whatif.depgraph.graph.Change`); ``target``: tasks, edges, resources, note."""

    transform: str
    action: str
    target: str
    count: int
    tasks: int
    before_ns: int
    after_ns: int
    reason: str

    @property
    def touched(self) -> str:
        """What the change touched, as text: ``12 tasks``, ``4,557 edges``; ``note`` for a note.

        >>> ChangeEntry(transform="cuda_graph", action="add LAUNCH", target="edges", count=4557, tasks=0,
        ...             before_ns=0, after_ns=0, reason="").touched
        '4,557 edges'
        """
        return "note" if self.target == "note" else f"{self.count:,} {self.target}"


class ScenarioHeadline(Entry, frozen=True, kw_only=True):
    """A scenario's headline numbers, without per-step data (what the dashboard shows first)."""

    name: str
    transforms: list[str]
    mean_step_ns: int
    baseline_mean_step_ns: int
    speedup: float
    waterfall: list[WaterfallEntry]
    changes: list[ChangeEntry]
    cap: Cap | None = None


class ScenarioPrediction(Entry, frozen=True, kw_only=True):
    """One scenario of a prediction."""

    name: str
    source: str | None
    transforms: list[str]
    mean_step_ns: int
    speedup: float
    steps: list[ScenarioStep]
    waterfall: list[WaterfallEntry]
    changes: list[ChangeEntry]
    critical_path: list[StepBreakdown]
    serving: RowServing | UnsetType = UNSET
    cap: Cap | None = None


class Suggestion(Entry, frozen=True, kw_only=True):
    """One optimization ``whatif suggest`` tried and predicted: the best setting of a transform
    (``others``: the other settings tried, with their speedups)."""

    rank: int
    transform: str
    setting: str
    params: dict[str, Any]       # the setting as a scenario file's [[transform]] table (name = transform)
    headline: ScenarioHeadline
    saved_ns_per_step: int
    where: list[str]
    others: dict[str, float]


class SkippedSuggestion(Entry, frozen=True, kw_only=True):
    """A registered transform ``whatif suggest`` did not predict, and why."""

    transform: str
    reason: str


class SuggestDocument(Entry, frozen=True, kw_only=True):
    """The ``whatif.suggest`` v1 document (``whatif suggest --json``): the optimizations whose
    needs the trace meets, each predicted alone, ranked by predicted mean-step speedup."""

    schema: Literal["whatif.suggest"] = "whatif.suggest"
    version: Literal[1] = 1
    source: str
    device: str | None
    baseline_mean_step_ns: int
    suggestions: list[Suggestion]
    skipped: list[SkippedSuggestion]


# --- whatif.breakdown ------------------------------------------------------------------------


class TemporalBreakdown(Entry, frozen=True, kw_only=True):
    """A GPU's time from its first activity to its last, for a rank (``step`` -2) or the
    activities one step launched (-1: launched outside any step). ``idle + compute + non_compute
    = span``; ``non_compute`` is communication and memory time not under compute;
    ``comm_overlapped`` is the communication time during which compute also ran."""

    rank: int
    step: int
    excluded: str | None
    activities: int
    span_ns: int
    idle_ns: int
    compute_ns: int
    non_compute_ns: int
    communication_ns: int
    memory_ns: int
    comm_overlapped_ns: int


class IdleGaps(Entry, frozen=True, kw_only=True):
    """The gaps between consecutive activities of one stream (``device:stream``), by cause."""

    rank: int
    stream: str
    gaps: int
    host_wait_ns: int
    kernel_wait_ns: int
    other_ns: int


class LaunchDelays(Entry, frozen=True, kw_only=True):
    """Activity start - end of its launch call (clipped at 0) over a rank's launched activities."""

    rank: int
    launches: int
    p50_ns: int
    p90_ns: int
    p99_ns: int
    max_ns: int
    long_delays: int
    shorter_than_launch: int


class QueueLength(Entry, frozen=True, kw_only=True):
    """Operations launched on a stream and not yet started: the maximum, the time-weighted mean
    and the share of the time nothing was queued, from the first launch to the last start."""

    rank: int
    stream: str
    max: int
    mean: float
    empty_share: float


class ClassTime(Entry, frozen=True, kw_only=True):
    """GPU time of one kernel class in a rank (``step`` -2) or a step."""

    rank: int
    step: int
    kernel_class: str
    count: int
    total_ns: int
    share: float


class BreakdownDocument(Entry, frozen=True, kw_only=True):
    """The ``whatif.breakdown`` v1 document (``whatif breakdown --json``)."""

    schema: Literal["whatif.breakdown"] = "whatif.breakdown"
    version: Literal[1] = 1
    source: str
    kernel_wait_ns: int
    long_delay_ns: int
    temporal: list[TemporalBreakdown]
    idle: list[IdleGaps]
    launches: list[LaunchDelays]
    queues: list[QueueLength]
    classes: list[ClassTime]


# --- whatif.collectives ---------------------------------------------------------------------


class CollectiveCall(Entry, frozen=True, kw_only=True):
    """One collective across the loaded ranks (``ranks``): the ``occurrence``-th call of ``key``
    on those ranks (collective name and process group, else kernel name; a point-to-point transfer:
    ``send/recv a->b@group``). Times on the lowest rank's clock;
    ``waited_ns`` sums every rank's wait for the last arrival (``straggler``); ``algbw_gbps`` =
    ``message_bytes`` / ``transfer_ns`` and ``busbw_gbps`` = algbw x the bus factor of ``kind`` at
    ``group_size`` (GB/s = bytes/ns), None where the trace records no size."""

    key: str
    occurrence: int
    kind: str
    step: int
    message_bytes: float | None
    group_size: int | None
    ranks: list[int]
    span: str
    first_arrival_ns: int
    skew_ns: int
    transfer_ns: int
    straggler: int | None
    waited_ns: int
    algbw_gbps: float | None
    busbw_gbps: float | None


class RankCollectives(Entry, frozen=True, kw_only=True):
    """One rank's collectives: time transferring, time waiting for later peers, how often it was
    the last to arrive, and the waiting that cost the others."""

    rank: int
    calls: int
    transfer_ns: int
    waited_ns: int
    straggler_calls: int
    caused_wait_ns: int


class CollectivesDocument(Entry, frozen=True, kw_only=True):
    """The ``whatif.collectives`` v1 document (``whatif collectives --json``)."""

    schema: Literal["whatif.collectives"] = "whatif.collectives"
    version: Literal[1] = 1
    source: str
    ranks_per_node: int | None
    calls: list[CollectiveCall]
    ranks: list[RankCollectives]


# --- whatif.job ------------------------------------------------------------------------------


class JobGroup(Entry, frozen=True, kw_only=True):
    """One rank group of a rank-parallel analysis: its ranks and sizes."""

    ranks: list[int]
    events: int
    tasks: int
    edges: int


class JobDocument(Entry, frozen=True, kw_only=True):
    """The ``whatif.job`` v1 document (``whatif job --json``): a job replayed rank-parallel. The
    steps are those of ``whatif analyze`` (the same replay, :mod:`whatif.scale.job`); timings and
    memory are not in it (they differ run to run)."""

    schema: Literal["whatif.job"] = "whatif.job"
    version: Literal[1] = 1
    source: str
    ranks: list[int]
    groups: list[JobGroup]
    events: int
    tasks: int
    edges: int
    collectives: int
    rounds: int
    steps: list[StepFidelity]
    fidelity: Fidelity


# --- whatif.memory ---------------------------------------------------------------------------


class MemoryDevice(Entry, frozen=True, kw_only=True):
    """One device's allocator records on one rank: how many, how much, and the peak.

    ``baseline`` says what the byte figures are measured from: ``"recorded"`` when every record
    carries the allocator's ``Total Allocated`` (PyTorch >= 1.13), ``"relative"`` when only the
    sizes are known (2021 traces): the running sum from 0 at the first record, so the memory
    allocated before the recording began is not in it. ``held_at_peak_unrecorded_bytes``: the part
    of the peak that no record in the trace allocated (made before the recording began; None when
    the baseline is relative or the records carry no addresses)."""

    rank: int
    device: str
    records: int
    allocations: int
    frees: int
    allocated_bytes: int
    freed_bytes: int
    baseline: Literal["recorded", "relative"]
    first_ns: int
    last_ns: int
    start_allocated_bytes: int
    end_allocated_bytes: int
    peak_allocated_bytes: int
    peak_ns: int
    peak_step: int
    peak_op: str
    peak_reserved_bytes: int | None
    held_at_peak_unrecorded_bytes: int | None


class MemoryStep(Entry, frozen=True, kw_only=True):
    """Allocated memory over one step of one device (records in the step's time window on the rank):
    before its first record, its peak, after its last record."""

    rank: int
    device: str
    step: int
    excluded: str | None
    records: int
    allocated_bytes: int
    start_allocated_bytes: int
    peak_allocated_bytes: int
    end_allocated_bytes: int


class MemoryOp(Entry, frozen=True, kw_only=True):
    """The records of one device made inside one operator (the innermost aten op on the recording
    thread, else its innermost annotation or module). ``net_bytes`` = allocated - freed inside it;
    ``held_at_peak_bytes``: bytes it allocated that were still allocated at the device's peak
    (None when records carry no addresses)."""

    rank: int
    device: str
    op: str
    allocations: int
    allocated_bytes: int
    freed_bytes: int
    net_bytes: int
    held_at_peak_bytes: int | None


class MemorySeries(Entry, frozen=True, kw_only=True):
    """One device's allocated (and reserved) bytes after each record, in time order; thinned to
    the document's ``max_points`` by keeping each bucket's lowest and highest point (the peak is
    always kept). ``reserved_bytes`` is None when the records carry no ``Total Reserved``."""

    rank: int
    device: str
    points: int
    ts_ns: list[int]
    allocated_bytes: list[int]
    reserved_bytes: list[int] | None


class MemoryDocument(Entry, frozen=True, kw_only=True):
    """The ``whatif.memory`` v1 document (``whatif memory --json``). ``predicted``: None for the
    recorded timeline; for a what-if's (``whatif memory -s``), a line per transform saying what it
    changed in the records, or that it does not model memory."""

    schema: Literal["whatif.memory"] = "whatif.memory"
    version: Literal[1] = 1
    source: str
    max_points: int
    devices: list[MemoryDevice]
    steps: list[MemoryStep]
    ops: list[MemoryOp]
    timeline: list[MemorySeries]
    predicted: list[str] | None = None


# --- whatif.ops ------------------------------------------------------------------------------


class OpRow(Entry, frozen=True, kw_only=True):
    """One group of GPU activities: the launching op (else the kernel name), its input shapes and
    dtype, and with ``by: kernel`` the kernel name. ``count``: op calls (kernels with ``by:
    kernel``); ``mean_ns`` per count. FLOPs and bytes are the op's shared among its kernels by
    duration; None (and the figures from them) when the op's shapes give none. ``roofline_tflops``:
    the device's achievable roof at the row's intensity; ``roofline_pct``: roofline time / measured
    time."""

    op: str
    kernel: str
    shapes: str
    dtype: str
    kernel_class: str
    count: int
    kernels: int
    total_ns: int
    mean_ns: float
    flops: float | None
    bytes: float | None
    intensity: float | None
    achieved_tflops: float | None
    achieved_tbps: float | None
    roofline_tflops: float | None
    roofline_pct: float | None
    bound: str


class OpsDocument(Entry, frozen=True, kw_only=True):
    """The ``whatif.ops`` v1 document (``whatif ops --json``): the rows sorted by total time;
    ``gpu_total_ns`` is the time of every GPU activity, which the rows sum to."""

    schema: Literal["whatif.ops"] = "whatif.ops"
    version: Literal[1] = 1
    source: str
    by: str
    devices: list[str]
    short_ns: int
    gpu_total_ns: int
    rows: list[OpRow]


class NanoFlowPartition(Entry, frozen=True, kw_only=True):
    """A split of the GPU among GEMMs, memory-bound kernels and collectives: shares of its SMs
    (NanoFlow's measure), summing to 1."""

    gemm_share: float
    memory_share: float
    comm_share: float


class NanoFlowDocument(Entry, frozen=True, kw_only=True):
    """The ``whatif.nanoflow`` v1 document (``whatif nanoflow --json``): one iteration (a step, the
    mean over the trace's steps) run one kernel at a time (``sequential_ns`` = ``gemm_ns`` +
    ``memory_ns`` + ``comm_ns``), and NanoFlow's schedule: ``nano_batches`` on ``partition``
    (None when no partition beats one kernel at a time; ``nano_batches`` is then 1), taking
    ``iteration_ns`` with the pipeline's fill over ``layers`` blocks per step. ``scenario``: the
    scenario applied first ("" for none); ``topology`` priced the collectives' parts."""

    schema: Literal["whatif.nanoflow"] = "whatif.nanoflow"
    version: Literal[1] = 1
    source: str
    scenario: str
    topology: str
    memory_curve: str
    comm_curve: str
    layers: int
    gemm_ns: int
    memory_ns: int
    comm_ns: int
    sequential_ns: int
    nano_batches: int
    partition: NanoFlowPartition | None
    iteration_ns: int
    speedup: float
    assumptions: list[str]


class PredictionDocument(Entry, frozen=True, kw_only=True):
    """The ``whatif.prediction`` v1 document (``whatif predict --json``)."""

    schema: Literal["whatif.prediction"] = "whatif.prediction"
    version: Literal[1] = 1
    source: str
    device: str | None
    baseline: BaselinePrediction
    scenarios: list[ScenarioPrediction]

    def rows(self) -> list[BaselinePrediction | ScenarioPrediction]:
        """The baseline, then each scenario."""
        return [self.baseline, *self.scenarios]

    def row(self, name: str) -> BaselinePrediction | ScenarioPrediction | None:
        """The row called ``name`` (``"baseline"`` or a scenario name), None when there is none."""
        return next((r for r in self.rows() if r.name == name), None)


# --- whatif.report --------------------------------------------------------------------------


class Contributor(Entry, frozen=True, kw_only=True):
    transform: str
    delta_ns: int


class PathShift(Entry, frozen=True, kw_only=True):
    category: str
    delta_ns: int


class ReportRow(Entry, frozen=True, kw_only=True):
    """One summary row of a report: the baseline or a scenario."""

    name: str
    kind: Literal["baseline", "scenario"]
    mean_step_ns: int
    measured_step_ns: int | None
    speedup: float
    ttft_ms: LatencyStats | None
    tpot_ms: LatencyStats | None
    contributors: list[Contributor]
    critical_path_shift: list[PathShift]
    baseline_report_step_ns: int | None


class Check(Entry, frozen=True, kw_only=True):
    """A threshold or regression check and its outcome."""

    kind: Literal["threshold", "regression"]
    name: str
    status: Literal["passed", "failed", "skipped"]
    values: dict[str, float]
    message: str


class BaselineReportRef(Entry, frozen=True, kw_only=True):
    path: str | None
    source: str | None
    max_regression: float | None


class ReportDocument(Entry, frozen=True, kw_only=True):
    """The ``whatif.report`` v1 document (``report.json``)."""

    schema: Literal["whatif.report"] = "whatif.report"
    version: Literal[1] = 1
    whatif_version: str
    source: str
    device: str | None
    status: Literal["passed", "failed"]
    rows: list[ReportRow]
    checks: list[Check]
    baseline_report: BaselineReportRef | None
    fidelity: Fidelity | None
    top_kernels: list[TopEntry]
    top_ops: list[TopEntry]
    top_layers: list[TopEntry]
    prediction: PredictionDocument
    suggestions: SuggestDocument | UnsetType = UNSET  # ``whatif report --suggest``
    ops: OpsDocument | UnsetType = UNSET  # ``whatif report --ops``


# --- whatif.serving and whatif.serving-sweep ------------------------------------------------


class WorkloadEntry(Entry, frozen=True, kw_only=True):
    """The workload simulated: a file (``file``, ``columns``, ``time_unit``) or drawn requests."""

    file: str | UnsetType = UNSET
    columns: dict[str, str] | UnsetType = UNSET
    time_unit: str | UnsetType = UNSET
    arrivals: Literal["poisson", "gamma", "burstgpt", "fixed"] | UnsetType = UNSET
    rate_req_per_s: float | UnsetType | None = UNSET
    cv: float | UnsetType | None = UNSET
    num_requests: int | UnsetType = UNSET
    prompt_tokens: tuple[int, int] | UnsetType = UNSET
    output_tokens: tuple[int, int] | UnsetType = UNSET
    seed: int | UnsetType = UNSET
    prefix_share: float | UnsetType = UNSET


class CapacityEntry(Entry, frozen=True, kw_only=True):
    """What one replica holds (:class:`~whatif.predictors.serving.capacity.Capacity`): the engine's
    memory fraction of the GPU, weights and KV bytes per token per GPU (None without a memory
    model), KV tokens and blocks (None: unlimited), the caps, which figures were ``given``."""

    engine: str
    describe: str
    gpu: str
    gpu_memory_bytes: float | None
    memory_fraction: float
    weights_bytes: float | None
    kv_bytes_per_token: int | None
    kv_tokens: int | None
    kv_blocks: int | None
    block_tokens: int
    max_seqs: int
    max_batched_tokens: int
    kv_transfer_ns_per_token: float
    given: list[str]


class LlmScheduler(Entry, frozen=True, kw_only=True):
    """The LLM serving system simulated (:class:`~whatif.predictors.serving.simulator.SchedulerConfig`)."""

    policy: str
    max_seqs: int
    max_batched_tokens: int
    chunk_tokens: int | None
    kv_capacity_tokens: int | None
    kv_block_tokens: int
    replicas: int
    prefill_replicas: int
    kv_transfer_ns_per_token: float
    router: str
    kv_capacity_source: str = ""
    engine_profile: str = "examples"
    prefix_caching: bool = False
    kv_watermark: float = 0.0      # fraction of KV blocks new admissions leave free (vLLM V0 / Vidur: 0.01)
    capacity: CapacityEntry | UnsetType = UNSET


class DitSettings(Entry, frozen=True, kw_only=True):
    """DiT request shape and batching, resolved against the recording."""

    steps: int
    resolution: int
    frames: int
    patch: int
    tokens: int
    batch: int
    cfg: bool
    replicas: int


class SloAttainment(Entry, frozen=True, kw_only=True):
    ttft_ms: float | None
    tpot_ms: float | None
    attainment: float
    goodput_req_per_s: float | None


class PhaseFitEntry(Entry, frozen=True, kw_only=True):
    """A fitted per-phase iteration model and its quality (``candidates``: LOO MAPE per feature set)."""

    phase: str
    features: list[str]
    intercept_ns: float
    coef: dict[str, float]
    n: int
    r2: float
    mape: float
    loo_mape: float | None
    candidates: dict[str, float]


class ProfilerOffset(Entry, frozen=True, kw_only=True):
    offset_ns: float
    scale: float


class ExcludedIteration(Entry, frozen=True, kw_only=True):
    """A recorded iteration an iteration model was not fitted on, and why (``warm-up``, ``partial``)."""

    step: int
    phase: str
    excluded: str


class DriverRange(Entry, frozen=True, kw_only=True):
    """The smallest and largest value of a batch driver (tokens, seqs, context) an iteration model saw."""

    low: float
    high: float


class CostPhaseEntry(Entry, frozen=True, kw_only=True):
    """One phase of the operator-cost iteration model: its anchors (recorded iterations), the CPU
    time per sequence fitted over them, the residual (measured / predicted from the other anchors,
    median) and its leave-one-out error, and the GPU time of the anchors by kernel law (mean ns)."""

    phase: str
    anchors: int
    cpu_per_seq_ns: float
    residual: float
    loo_mape: float | None
    gpu_ns_by_law: dict[str, float]


class WeightGemmsEntry(Entry, frozen=True, kw_only=True):
    """The weight GEMMs a least-squares iteration model prices by their law rather than fitting:
    ``params`` weights on ``device`` (``scale``: the scenario's change of the GEMMs' time), their time
    at 1 token and the knee (tokens) above which their FLOPs outlast their weight reads."""

    params: float
    device: str
    scale: float
    ns_at_1_token: float
    knee_tokens: float


class LlmIterationModel(Entry, frozen=True, kw_only=True):
    """The iteration model of one scenario: ``kind`` ``least-squares`` (``phases``: a fit per phase
    over a serving log's compositions) or ``operator costs`` (``cost_phases``: recorded iterations
    re-priced by their kernels' laws, found in the trace by ``adapter``); ``ranges``: per phase,
    the batch drivers it saw (beyond them it extrapolates); ``weight_gemms``: the least-squares
    model's GEMMs priced by their law (the fits are of the rest), None when not known."""

    loop_overhead_ns: float
    profiler_correction: dict[str, ProfilerOffset]
    phases: dict[str, PhaseFitEntry]
    excluded_iterations: list[ExcludedIteration] = []
    kind: str = "least-squares"
    adapter: str = ""
    composition_source: str = ""
    iterations_found: int = 0
    cost_phases: dict[str, CostPhaseEntry] = {}
    ranges: dict[str, dict[str, DriverRange]] = {}
    notes: list[str] = []
    weight_gemms: WeightGemmsEntry | None = None


class DitIterationModel(Entry, frozen=True, kw_only=True):
    """The denoising-step model of one scenario, fitted at ``tokens_ref`` latent tokens; ``ranges``:
    ``{"denoise": {"tokens": …, "model_batch": …}}``, the drivers it saw (beyond them it extrapolates)."""

    tokens_ref: int
    attention_ns: list[float]
    rest_ns: list[float]
    batch_overhead_ns: float
    cpu_ns: list[float] = []
    overlap_ns: float = 0.0
    n: int
    mape: float
    loo_mape: float | None
    model_batches_seen: list[int]
    profiler_correction: float
    excluded_iterations: list[ExcludedIteration] = []
    ranges: dict[str, dict[str, DriverRange]] = {}


class LlmRequest(Entry, frozen=True, kw_only=True):
    id: int
    replica: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    queue_ms: float
    ttft_ms: float
    tpot_ms: float | None
    e2e_ms: float
    preemptions: int


class DitRequest(Entry, frozen=True, kw_only=True):
    id: int
    arrival_s: float
    queue_ms: float
    service_ms: float
    latency_ms: float


class LlmScenarioServing(Entry, frozen=True, kw_only=True):
    """Predicted LLM serving metrics of one scenario (times in ms, throughput per second)."""

    name: str
    num_requests: int
    duration_s: float
    output_tokens: int
    ttft_ms: LatencyStats
    tpot_ms: LatencyStats
    e2e_ms: LatencyStats
    queue_ms: LatencyStats
    throughput_req_per_s: float | None
    throughput_tokens_per_s: float | None
    total_tokens_per_s: float | None
    slo: SloAttainment
    preemptions: int
    busy_fraction: float | None
    iterations: dict[str, int]
    iteration_model: LlmIterationModel
    kv_capacity_tokens: int | None = None   # this scenario's replica (its tensor/pipeline degrees, PIM stacks)
    kv_capacity_source: str = ""
    extrapolated_iterations: int = 0        # simulated iterations whose batch left the model's range
    extrapolated_drivers: dict[str, int] = {}   # driver (tokens, seqs, context) -> iterations beyond its range
    extrapolated_values: dict[str, DriverRange] = {}   # driver -> smallest and largest value it took beyond its range
    requests: list[LlmRequest] | UnsetType = UNSET
    capacity: CapacityEntry | UnsetType = UNSET


class DitScenarioServing(Entry, frozen=True, kw_only=True):
    """Predicted DiT serving metrics of one scenario (``e2e_ms`` is ``latency_ms``)."""

    name: str
    num_requests: int
    num_batches: int
    duration_s: float
    throughput_req_per_s: float | None
    latency_ms: LatencyStats
    queue_ms: LatencyStats
    service_ms: LatencyStats
    step_ms_at_full_batch: float
    busy_fraction: float | None
    iteration_model: DitIterationModel
    e2e_ms: LatencyStats
    iterations: dict[str, int] = {}         # simulated denoising steps ({"denoise": n})
    extrapolated_iterations: int = 0        # simulated steps whose tokens or model batch left the model's range
    extrapolated_drivers: dict[str, int] = {}   # driver (tokens, model_batch) -> steps beyond its range
    extrapolated_values: dict[str, DriverRange] = {}   # driver -> smallest and largest value it took beyond its range
    requests: list[DitRequest] | UnsetType = UNSET


class LlmServingDocument(Entry, frozen=True, kw_only=True):
    """The ``whatif.serving/1`` document of an LLM serving loop (``whatif serve --json``)."""

    schema: Literal["whatif.serving/1"] = "whatif.serving/1"
    source: str
    log: str
    kind: Literal["llm"] = "llm"
    workload: WorkloadEntry
    scheduler: LlmScheduler
    profiler_correction: dict[str, tuple[float, float]] | None
    scenarios: list[LlmScenarioServing]


class DitServingDocument(Entry, frozen=True, kw_only=True):
    """The ``whatif.serving/1`` document of a DiT serving loop."""

    schema: Literal["whatif.serving/1"] = "whatif.serving/1"
    source: str
    log: str
    kind: Literal["dit"] = "dit"
    workload: WorkloadEntry
    scheduler: DitSettings
    profiler_correction: float | None
    scenarios: list[DitScenarioServing]
    notes: list[str] = []   # what the models could not know (denoising steps found in an engine trace)
    recorded: DitSettings | UnsetType = UNSET   # the recording's request shape, next to ``scheduler``'s


class LlmSweepPoint(Entry, frozen=True, kw_only=True):
    rate_req_per_s: float
    ttft_ms: LatencyStats
    tpot_ms: LatencyStats
    e2e_ms: LatencyStats
    queue_ms: LatencyStats
    throughput_tokens_per_s: float | None
    throughput_req_per_s: float | None
    busy_fraction: float | None
    slo: SloAttainment
    extrapolated_iterations: int = 0


class DitSweepPoint(Entry, frozen=True, kw_only=True):
    rate_req_per_s: float
    latency_ms: LatencyStats
    queue_ms: LatencyStats
    throughput_req_per_s: float | None
    busy_fraction: float | None
    e2e_ms: LatencyStats
    extrapolated_iterations: int = 0


class LlmSweepCurve(Entry, frozen=True, kw_only=True):
    name: str
    iteration_model: LlmIterationModel
    points: list[LlmSweepPoint]
    kv_capacity_tokens: int | None = None
    kv_capacity_source: str = ""
    capacity: CapacityEntry | UnsetType = UNSET


class DitSweepCurve(Entry, frozen=True, kw_only=True):
    name: str
    iteration_model: DitIterationModel
    points: list[DitSweepPoint]


class LlmSweepDocument(Entry, frozen=True, kw_only=True):
    """The ``whatif.serving-sweep/1`` document of an LLM serving loop (``whatif sweep --json``)."""

    schema: Literal["whatif.serving-sweep/1"] = "whatif.serving-sweep/1"
    source: str
    kind: Literal["llm"] = "llm"
    workload: WorkloadEntry
    scheduler: LlmScheduler
    profiler_correction: dict[str, tuple[float, float]] | None
    curves: list[LlmSweepCurve]


class DitSweepDocument(Entry, frozen=True, kw_only=True):
    """The ``whatif.serving-sweep/1`` document of a DiT serving loop."""

    schema: Literal["whatif.serving-sweep/1"] = "whatif.serving-sweep/1"
    source: str
    kind: Literal["dit"] = "dit"
    workload: WorkloadEntry
    scheduler: DitSettings
    profiler_correction: float | None
    curves: list[DitSweepCurve]


# --- whatif.plan-sweep ----------------------------------------------------------------------


class PlanRow(Entry, frozen=True, kw_only=True):
    """One plan of a plan sweep (docs/scale.md): its degrees (``ulysses``: the ranks each Ulysses
    all-to-all spans, :func:`whatif.scale.plans.ulysses_ranks`) and batch factor (multiples of the
    traced batch per GPU), the GPUs it takes, what happened
    (``status``: ``ok``, ``refused`` by a transform, ``does not fit`` the device's memory, with
    the one-line ``reason``), the predicted mean step, the throughput (the document's
    ``throughput_unit``), the bytes per GPU (None when they cannot be read) and where they come
    from (``memory_source``: ``allocator records``, the recorded timeline at the plan's batch;
    ``weights + workspace``, the plan memory model; empty: neither) and whether it is on the
    Pareto front of the plans that ran."""

    plan: str
    tp: int
    pp: int
    micro_batches: int
    sp: int
    ulysses: int = 1
    dp: int
    batch: float
    device: str
    gpus: int
    status: str
    step_ns: int | None
    throughput_per_s: float | None
    memory_per_gpu_bytes: int | None
    fits: bool | None
    pareto: bool
    reason: str
    memory_source: str = ""


class PlanSweepDocument(Entry, frozen=True, kw_only=True):
    """The ``whatif.plan-sweep/1`` document (``whatif sweep --plans --json``): one row per plan in
    the grid's order; ``memory_model`` says what the bytes per GPU count, or why they are unknown."""

    schema: Literal["whatif.plan-sweep/1"] = "whatif.plan-sweep/1"
    source: str
    device: str | None
    ranks: int
    mode: str
    topology: str
    throughput_unit: str
    samples_per_step: int
    baseline_step_ns: int
    memory_model: str
    plans: list[PlanRow]


def top_tables(doc: AnalysisDocument | ReportDocument) -> tuple[tuple[list[TopEntry], str, bool], ...]:
    """The top tables of an analysis or a report: the rows, what they rank, and whether they have a
    CPU time column (a kernel is GPU work: its launch's CPU time is its op's, so a kernel's is 0)."""
    return (doc.top_kernels, "kernels", False), (doc.top_ops, "ops", True), (doc.top_layers, "layers", True)


ServingDocument = Union[LlmServingDocument, DitServingDocument]  # noqa: UP007 - a runtime value for from_json
SweepDocument = Union[LlmSweepDocument, DitSweepDocument]  # noqa: UP007
Document = Union[AnalysisDocument, PredictionDocument, ReportDocument, LlmServingDocument,  # noqa: UP007
                 DitServingDocument, LlmSweepDocument, DitSweepDocument, SuggestDocument,
                 BreakdownDocument, MemoryDocument, CollectivesDocument, PlanSweepDocument]
D = TypeVar("D", bound=Entry)

_JSON_OPTIONS = orjson.OPT_INDENT_2


def to_json(doc: Entry) -> str:
    """``doc`` as indented JSON text, keys in field order: the same object gives the same text.

    >>> print(to_json(Fidelity(median_abs_error=0.01, max_abs_error=None)))
    {
      "median_abs_error": 0.01,
      "max_abs_error": null
    }
    """
    return orjson.dumps(msgspec.to_builtins(doc), option=_JSON_OPTIONS).decode()


def write_json(path: Path, doc: Entry) -> Path:
    """Write :func:`to_json` of ``doc`` to ``path`` (UTF-8, folders made as needed, atomically;
    :class:`~whatif.core.output.OutputError` naming the path when it cannot be written)."""
    return write_output(path, to_json(doc).encode())


def _members(doc_type: object) -> tuple[type[Entry], ...]:
    members = get_args(doc_type)
    return members if members else (doc_type,)  # type: ignore[return-value]


def from_json(text: str | bytes, doc_type: type[D] | object) -> D:
    """The document of type ``doc_type`` in JSON ``text``. ``doc_type`` may be a union of documents
    that differ in their ``kind`` or ``schema`` (:data:`ServingDocument`, :data:`SweepDocument`,
    ``PredictionDocument | ReportDocument``): the member whose literal matches is decoded.
    Raises :class:`DocumentError` naming the first wrong key (``$.scenarios[0].name``).

    >>> from_json('{"median_abs_error": null, "max_abs_error": 0.5}', Fidelity).max_abs_error
    0.5
    >>> from_json('{"median_abs_error": "x", "max_abs_error": 0.5}', Fidelity)
    Traceback (most recent call last):
    ...
    whatif.documents.DocumentError: Expected `float | null`, got `str` - at `$.median_abs_error`
    """
    try:
        raw = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise NotJsonError(f"not JSON ({exc})") from None
    members = _members(doc_type)
    target = members[0]
    if len(members) > 1 and isinstance(raw, dict):
        for key in ("kind", "schema"):
            match = [m for m in members if _literal(m, key) == raw.get(key)]
            if len(match) == 1:
                target = match[0]
                break
    try:
        return msgspec.convert(raw, target)  # type: ignore[return-value]
    except msgspec.ValidationError as exc:
        raise DocumentError(str(exc)) from None


def _literal(doc_type: type[Entry], key: str) -> object:
    """The default of field ``key`` of ``doc_type`` (its ``kind`` or ``schema`` literal), else None."""
    fields = {f.name: f for f in msgspec.structs.fields(doc_type)}
    field = fields.get(key)
    return None if field is None or field.default is msgspec.NODEFAULT else field.default
