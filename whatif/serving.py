"""Serving predictions from the Python API: the functions behind `whatif serve` and `whatif sweep`.

Fit an iteration-time model on the replayed serving iterations (baseline and each scenario),
then simulate requests under a scheduler and report TTFT, TPOT, end-to-end latency and
throughput per scenario. Both functions return the typed documents (:mod:`whatif.documents`)
whose JSON the commands write.

>>> from whatif.serving import Workload, serve, sweep                       # doctest: +SKIP
>>> doc = serve("sample_traces/llm_serve", ["scenarios/faster_linear.toml"],
...             Workload(rate=10, num_requests=20))                         # doctest: +SKIP
>>> [(s.name, s.ttft_ms.mean) for s in doc.scenarios]                        # doctest: +SKIP
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from whatif.analysis import Analysis, ScenarioResult, analyze, make_context, predict, scenario_cost_model
from whatif.core.bounds import check_fields
from whatif.core.errors import TraceError
from whatif.core.limits import MAX_INT_PARAMETER, MAX_PARTS, MAX_REQUESTS, MAX_STEP, MAX_TOKENS
from whatif.core.steps import COUNT_DEFAULT, Exclusion, StepOptions
from whatif.depgraph.graph import TaskGraph
from whatif.documents import (
    UNSET,
    CapacityEntry,
    CostPhaseEntry,
    DitIterationModel,
    DitRequest,
    DitScenarioServing,
    DitServingDocument,
    DitSettings,
    DitSweepCurve,
    DitSweepDocument,
    DitSweepPoint,
    DriverRange,
    ExcludedIteration,
    LatencyStats,
    LlmIterationModel,
    LlmRequest,
    LlmScenarioServing,
    LlmScheduler,
    LlmServingDocument,
    LlmSweepCurve,
    LlmSweepDocument,
    LlmSweepPoint,
    PhaseFitEntry,
    ProfilerOffset,
    ServingDocument,
    SloAttainment,
    SweepDocument,
    WeightGemmsEntry,
    WorkloadEntry,
)
from whatif.hardware.devices import Device, find_device
from whatif.predictors.cost_models import CostModelName
from whatif.predictors.replay import Replay
from whatif.predictors.serving import logs
from whatif.predictors.serving.arrivals import (
    Arrivals,
    DitRequestSpec,
    RequestSpec,
    WorkloadError,
    draw_arrivals,
    read_dit_workload,
    read_workload,
    synthetic_workload,
    with_prefix_share,
)
from whatif.predictors.serving.capacity import Capacity, GpuMemory, engine_capacity
from whatif.predictors.serving.dit_steps import dit_fit_inputs
from whatif.predictors.serving.engine_defaults import engine_key
from whatif.predictors.serving.engines import FoundIterations, find_iterations
from whatif.predictors.serving.engines.xdit import steps_per_request
from whatif.predictors.serving.iteration_costs import (
    CostIterationModel,
    Drivers,
    Range,
    RangeTally,
    cpu_only_replay,
    driver_value,
    fit_cost_model,
    weight_gemms_of_replay,
)
from whatif.predictors.serving.iteration_model import (
    DitStepModel,
    DitStepWork,
    IterationModel,
    fit_dit_model,
    fit_llm_model,
    gpu_work_per_step,
    profiler_correction,
    replayed_iterations,
)
from whatif.predictors.serving.logs import ServingLogError
from whatif.predictors.serving.simulator import (
    SchedulerConfig,
    SimResult,
    simulate_dit,
    simulate_llm,
)
from whatif.transforms.base import Transform, TransformError
from whatif.transforms.parallel.memory import ModelShape, device_capacity_bytes, model_shape
from whatif.transforms.placement import Placement
from whatif.transforms.scenario import Scenario, check_distinct_names, load_scenario, scenario_placement
from whatif.transforms.select import Selector

__all__ = ["DitOptions", "ServingModels", "Workload", "column_mapping", "fit_serving", "recorded_capacity", "serve",
           "sweep", "token_range"]

TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
DEFAULT_REQUESTS = 20

ScenarioLike = Scenario | str | Path | Transform | ScenarioResult
Model = IterationModel | CostIterationModel | DitStepModel
LlmModel = IterationModel | CostIterationModel


@dataclass
class RangeWatch:
    """Counts the simulated iterations whose batch leaves the range ``model`` was fitted on
    (:class:`RangeTally`: how many, per driver, and the values the drivers took there)."""

    model: LlmModel
    tally: RangeTally = field(default_factory=RangeTally)

    def time_ns(self, batch: logs.LLMBatch) -> float:
        beyond = self.model.extrapolation(batch)
        if beyond:
            d = Drivers.of(batch)
            self.tally.add({name: driver_value(d, name) for name in beyond})
        return self.model.time_ns(batch)


def token_range(text: str) -> tuple[int, int]:
    """``"16:64"`` -> ``(16, 64)``; ``"32"`` -> ``(32, 32)`` (the ``--prompt-tokens`` form).

    >>> token_range("16:64"), token_range("32")
    ((16, 64), (32, 32))
    """
    try:
        lo, _, hi = text.partition(":")
        return int(lo), int(hi or lo)
    except ValueError:
        raise ValueError(f"expected N or MIN:MAX tokens, got {text!r}") from None


def column_mapping(text: str) -> tuple[str, str]:
    """``"arrival_s=ts"`` -> ``("arrival_s", "ts")`` (the ``--column`` form)."""
    field_name, sep, name = text.partition("=")
    if not sep or not field_name or not name:
        raise ValueError(f"expected FIELD=COLUMN, got {text!r}")
    return field_name, name


@dataclass(frozen=True)
class Workload:
    """Requests to simulate: drawn at ``rate`` req/s (Poisson, or gamma with ``cv``; ``inf``: all at
    t=0) with uniform prompt/output lengths, or read from ``file`` (CSV/JSONL: arrival_s,
    prompt_tokens, output_tokens; ``columns`` maps fields to the file's names). ``num_requests``:
    how many to draw (default 20), or the first N of the file. Each field's metadata is its
    ``whatif serve`` option (see ``whatif/commands/_dataclass_args.py``)."""

    rate: float | None = field(default=None, metadata={
        "exclusive_minimum": 0, "allow_inf": True, "help": "arrival rate (req/s); inf: all at t=0"})
    num_requests: int | None = field(default=None, metadata={"minimum": 1, "maximum": MAX_REQUESTS,
        "help": f"requests to draw (default {DEFAULT_REQUESTS}); with --workload, keep the first N"})
    prompt_tokens: tuple[int, int] = field(default=(16, 64), metadata={
        "help": "prompt lengths, uniform in [MIN, MAX]", "parse": token_range, "metavar": "MIN[:MAX]"})
    output_tokens: tuple[int, int] = field(default=(32, 128), metadata={
        "help": "output lengths, uniform in [MIN, MAX]", "parse": token_range, "metavar": "MIN[:MAX]"})
    cv: float | None = field(default=None, metadata={"exclusive_minimum": 0, "maximum": 1000,
        "help": "gamma arrivals with this coefficient of variation (bursty > 1); default Poisson"})
    arrivals: Arrivals | None = field(default=None, metadata={"choices": tuple(a.value for a in Arrivals),
        "help": "arrival gaps: poisson, gamma (--cv), burstgpt (BurstGPT's gamma, shape 0.5), fixed "
                "(1/rate apart); default poisson, gamma with --cv"})
    prefix_share: float = field(default=0.0, metadata={"minimum": 0, "maximum": 1,
        "help": "share of each prompt (after the first request's) that earlier requests sent too: cached "
                "when the engine caches prefixes"})
    seed: int = field(default=0, metadata={
        "minimum": 0, "maximum": MAX_INT_PARAMETER, "help": "seeds arrivals and lengths (same draws as the examples)"})
    file: str | Path | None = field(default=None, metadata={
        "help": "CSV/JSONL: arrival_s, prompt_tokens, output_tokens", "flag": "--workload", "metavar": "FILE"})
    columns: Mapping[str, str] = field(default_factory=dict, metadata={
        "help": "map a workload field to the file's column name (repeatable)", "flag": "--column",
        "parse": column_mapping, "repeatable": True, "metavar": "FIELD=NAME"})
    time_unit: str = field(default="s", metadata={"help": "unit of the file's arrival column",
                                                   "choices": tuple(TIME_UNITS)})

    def __post_init__(self) -> None:
        check_fields(self, WorkloadError)
        if self.arrivals is not None:
            try:
                object.__setattr__(self, "arrivals", Arrivals(self.arrivals))
            except ValueError:
                raise WorkloadError(f"unknown arrivals {self.arrivals!r} "
                                    f"({', '.join(a.value for a in Arrivals)})") from None
        for name, tokens in (("prompt_tokens", self.prompt_tokens), ("output_tokens", self.output_tokens)):
            if not (isinstance(tokens, tuple) and len(tokens) == 2 and all(
                    isinstance(t, int) and not isinstance(t, bool) for t in tokens)
                    and 1 <= tokens[0] <= tokens[1] <= MAX_TOKENS):
                raise WorkloadError(f"{name} must be (MIN, MAX) integers with 1 <= MIN <= MAX <= {MAX_TOKENS}, "
                                    f"got {tokens!r}")

    @property
    def n(self) -> int:
        return DEFAULT_REQUESTS if self.num_requests is None else self.num_requests

    def _from_file(self) -> list[RequestSpec]:
        if self.time_unit not in TIME_UNITS:
            raise WorkloadError(f"unknown time unit {self.time_unit!r} ({', '.join(TIME_UNITS)})")
        reqs = read_workload(Path(self.file), dict(self.columns), TIME_UNITS[self.time_unit])  # type: ignore[arg-type]
        return reqs[: self.num_requests] if self.num_requests else reqs

    def _rate(self, rate: float | None) -> float:
        rate = self.rate if rate is None else rate
        if rate is None:
            raise WorkloadError("give a workload file or an arrival rate (--workload FILE or --rate R)")
        return rate

    @property
    def kind(self) -> Arrivals:
        """How the arrivals are drawn: :attr:`arrivals`, else gamma when :attr:`cv` is given, else Poisson."""
        if isinstance(self.arrivals, Arrivals):
            return self.arrivals
        return Arrivals.POISSON if self.cv is None else Arrivals.GAMMA

    def llm_requests(self, rate: float | None = None) -> list[RequestSpec]:
        """The LLM requests (``rate`` overrides :attr:`rate`)."""
        if self.file:
            reqs = self._from_file()
        else:
            reqs = synthetic_workload(self.n, self._rate(rate), self.prompt_tokens, self.output_tokens, self.seed,
                                      self.cv, self.kind)
        return with_prefix_share(reqs, self.prefix_share) if self.prefix_share else reqs

    def dit_requests(self, rate: float | None = None) -> list[DitRequestSpec]:
        """The DiT requests (``rate`` overrides :attr:`rate`); a file may give each one's resolution and steps."""
        if self.file:
            if self.time_unit not in TIME_UNITS:
                raise WorkloadError(f"unknown time unit {self.time_unit!r} ({', '.join(TIME_UNITS)})")
            reqs = read_dit_workload(Path(self.file), dict(self.columns), TIME_UNITS[self.time_unit])  # type: ignore[arg-type]
            return reqs[: self.num_requests] if self.num_requests else reqs
        times = draw_arrivals(self.n, self._rate(rate), random.Random(self.seed), self.kind, self.cv)
        return [DitRequestSpec(i, t) for i, t in enumerate(times)]

    def describe(self, rate: float | None = None) -> WorkloadEntry:
        """The ``workload`` entry of the documents."""
        share = self.prefix_share if self.prefix_share else UNSET
        if self.file:
            return WorkloadEntry(file=str(self.file), columns=dict(self.columns), time_unit=self.time_unit,
                                 prefix_share=share)
        return WorkloadEntry(arrivals=self.kind.value, rate_req_per_s=rate, cv=self.cv,  # type: ignore[arg-type]
                             num_requests=self.n, prompt_tokens=self.prompt_tokens, output_tokens=self.output_tokens,
                             seed=self.seed, prefix_share=share)


@dataclass(frozen=True)
class DitOptions:
    """DiT request shape; ``None`` keeps what the recording used."""

    steps: int | None = field(default=None, metadata={
        "minimum": 1, "maximum": MAX_STEP, "help": "denoising steps per request (default: as recorded)"})
    resolution: int | None = field(default=None, metadata={
        "minimum": 1, "maximum": 1 << 20,
        "help": "side of the latent grid, not pixels: latent tokens = frames x (side / patch)^2; serve prints the "
                "recorded side next to it (default: as recorded)"})
    frames: int | None = field(default=None, metadata={
        "minimum": 1, "maximum": 1 << 20, "help": "video frames (default: as recorded)"})
    batch: int | None = field(default=None, metadata={"minimum": 1, "maximum": MAX_PARTS,
        "help": "max requests denoised together (default: as recorded)"})
    cfg: bool | None = field(default=None, metadata={"help": "classifier-free guidance on/off (default: as recorded)"})

    def __post_init__(self) -> None:
        check_fields(self, WorkloadError)

    def settings(self, c: logs.DitConfig, replicas: int = 1) -> DitSettings:
        """Resolved settings against the recorded config ``c`` (the ``scheduler`` entry of DiT documents)."""
        res, frames = self.resolution or c.resolution, self.frames or c.frames
        if res % c.patch:
            raise WorkloadError(f"resolution {res} is not a multiple of the recorded patch {c.patch}")
        cfg = (c.cfg_scale > 1.0) if self.cfg is None else self.cfg
        return DitSettings(steps=self.steps or c.steps, resolution=res, frames=frames, patch=c.patch,
                           tokens=frames * (res // c.patch) ** 2, batch=self.batch or c.batch, cfg=cfg,
                           replicas=replicas)


class ServingModels:
    """The iteration models of the baseline and each scenario, with the serving log they were
    fitted on (build with :func:`fit_serving`; reuse for several :func:`serve`/:func:`sweep` calls).
    The fits use the steps ``step_options`` counts, judged on ``reference`` (the measured graph)."""

    def __init__(self, source: str, log_path: Path | None, replays: Sequence[tuple[str, Replay]],
                 unprofiled_log: str | Path | None = None, *, reference: TaskGraph | None = None,
                 step_options: StepOptions = COUNT_DEFAULT,
                 placements: Sequence[Callable[[], Placement]] = (), found: FoundIterations | None = None,
                 device: Device | None = None, shape: ModelShape | None = None) -> None:
        self.source = source
        self.log_path = log_path
        self.reference = reference
        self.found = found
        self.device = device
        self.shape = shape
        if (log_path is None) == (found is None):
            raise ValueError("give the serving log or the iterations an adapter found, not both")
        if found is not None and unprofiled_log:
            raise WorkloadError("--unprofiled-log needs the serving log of the recording (--iterations-log)")
        if placements and len(placements) != len(replays):
            raise ValueError(f"{len(placements)} placements for {len(replays)} models")
        self._placements = list(placements) or [Placement] * len(replays)
        self._placed: dict[int, Placement] = {}
        self.step_options = step_options
        self.log = logs.read_log(log_path) if log_path is not None else None
        self.kind = found.kind if found is not None else "llm" if isinstance(self.log, logs.LlmLog) else "dit"
        self.dit_steps_per_request = steps_per_request(reference.trace) if (
            found is not None and found.kind == "dit" and reference is not None and reference.trace is not None) else []
        self.models: list[tuple[str, Model]] = [(n, self._fit(rp)) for n, rp in replays]
        self.factor: Any = None
        if unprofiled_log:
            self.factor = self._profiler_factor(logs.read_log(Path(unprofiled_log)))
            for _, m in self.models:
                if isinstance(m, IterationModel | CostIterationModel):
                    m.correction = dict(self.factor)
                else:
                    m.factor = self.factor

    def _fit(self, rp: Replay) -> Model:
        if self.found is not None and self.found.kind == "dit":
            x = dit_fit_inputs(rp, self.found)
            return fit_dit_model(x.iters, x.compositions, x.work, 0.0)
        if self.found is not None:
            if not len(Selector(kind="gpu")(rp.graph)):   # the model ran on the CPU: no kernels to re-price
                fit = fit_llm_model(replayed_iterations(rp, self.reference, self.step_options),
                                    [(it.phase.value, it.llm) for it in self.found.iterations if it.llm is not None])
                return replace(fit, adapter=self.found.adapter, notes=(
                    *self.found.notes, "the iterations ran on the CPU: least-squares fit (no GPU kernels to re-price)"))
            return fit_cost_model(rp, cpu_only_replay(rp), self.found, self.device, self.shape,
                                  self.shape.assumptions if self.shape is not None else ())
        assert self.log is not None
        iters = replayed_iterations(rp, self.reference, self.step_options)
        if isinstance(self.log, logs.LlmLog):
            return fit_llm_model(iters, logs.llm_compositions(self.log),
                                 weight_gemms_of_replay(rp, self.device, self.shape))
        over = [b.duration_ms - sum(b.step_ms) for b in self.log.batches]
        return fit_dit_model(iters, logs.dit_compositions(self.log), self._dit_work(rp, iters),
                             float(np.median(over)) * 1e6 if over else 0.0)

    def _dit_work(self, rp: Replay, iters: pd.DataFrame) -> DitStepWork:
        """Each denoising step's CPU-only time (the replay with every GPU task at zero time) and
        GPU work, aligned with ``iters``. A recording without GPU work ran the model on the CPU:
        its steps' replayed time is then the work (attention ops and the rest), nothing a floor."""
        gpu = Selector(kind="gpu")
        if not len(gpu(rp.graph)):
            attn = iters["attn_ns"].to_numpy(float)
            return DitStepWork(cpu_ns=np.zeros(len(iters)), attn_ns=attn,
                               rest_ns=iters["cycle_ns"].to_numpy(float) - attn)
        cpu_iters = replayed_iterations(cpu_only_replay(rp), self.reference, self.step_options).set_index("step")
        steps = iters["step"].to_numpy()
        attn, rest = gpu_work_per_step(rp.graph, steps)
        return DitStepWork(cpu_ns=cpu_iters["cycle_ns"].reindex(steps).to_numpy(float), attn_ns=attn, rest_ns=rest)

    def _profiler_factor(self, plain: logs.ServingLog) -> Any:
        assert self.log is not None
        if type(plain) is not type(self.log):
            raise WorkloadError(f"the unprofiled log is a {type(plain).__struct_config__.tag} log, the "
                                f"recording's is {type(self.log).__struct_config__.tag}")
        model = self.models[0][1]
        if isinstance(model, IterationModel) and isinstance(plain, logs.LlmLog):
            return profiler_correction(model, [(p, b, d) for (p, b), d in zip(logs.llm_compositions(plain),
                                                                             logs.llm_durations_ms(plain))])
        assert isinstance(plain, logs.DitLog) and isinstance(self.log, logs.DitLog)
        assert isinstance(model, DitStepModel)   # fitted on the DiT log
        dit_model = model

        def ratio(log: logs.DitLog) -> float:
            return float(np.median([s.duration_ms * 1e6 / dit_model.step_ns(mb, t)
                                    for s, (mb, t) in zip(log.steps, logs.dit_compositions(log))]))
        return ratio(plain) / ratio(self.log)

    @property
    def dit_config(self) -> logs.DitConfig:
        """What a DiT run's requests were: its serving log's config, or, for denoising steps an
        engine adapter found, the first step's latent tokens and model batch, the steps per
        pipeline call (1 when the trace shows none), patch 1 (``resolution`` is then the side of the
        latent-token grid: tokens = resolution², or frames = tokens when they are not a square)
        and no classifier-free guidance batch (refused for an LLM run)."""
        if self.found is not None and self.found.kind == "dit":
            first = self.found.iterations[0].dit
            assert first is not None
            side = math.isqrt(first.tokens)
            square = side * side == first.tokens
            steps = int(np.median(self.dit_steps_per_request)) if self.dit_steps_per_request else 1
            return logs.DitConfig(tokens=first.tokens, resolution=side if square else 1,
                                  frames=1 if square else first.tokens, patch=1, steps=steps,
                                  batch=first.model_batch, cfg_scale=0.0)
        if not isinstance(self.log, logs.DitLog):
            raise WorkloadError(f"{self.log_path or self.source}: an LLM serving run, not a DiT one")
        return self.log.config

    @property
    def notes(self) -> list[str]:
        """What the models could not know, one line each (DiT steps found in an engine trace)."""
        if self.found is None or self.found.kind != "dit":
            return []
        c = self.dit_config
        return [*self.found.notes,
                f"{len(self.found.iterations)} denoising step(s) found by the {self.found.adapter} adapter: "
                f"{c.tokens} latent tokens, model batch {c.batch}; "
                + (f"{c.steps} steps per request (pipeline calls)" if self.dit_steps_per_request
                   else "steps per request not in the trace: 1 unless --steps")
                + "; text encoding, VAE and per-request overheads not priced"]

    def placement(self, model: int) -> Placement:
        """Where model ``model``'s scenario places a replica (computed once, when first asked)."""
        if model not in self._placed:
            self._placed[model] = self._placements[model]()
        return self._placed[model]

    def with_engine(self, scheduler: SchedulerConfig) -> SchedulerConfig:
        """``scheduler`` with the engine profile of the adapter that found the iterations when it
        names none and that adapter has one (vllm, sglang)."""
        if scheduler.engine_profile is not None or self.found is None:
            return scheduler
        try:
            return replace(scheduler, engine_profile=engine_key(self.found.adapter))
        except WorkloadError:
            return scheduler

    def capacity(self, scheduler: SchedulerConfig, model: int | None = 0) -> Capacity:
        """What a replica of model ``model`` (None: the recorded placement) holds under ``scheduler``'s
        engine: :func:`recorded_capacity` where its scenario placed the replica, with the figures
        ``scheduler`` gives put in their place."""
        placement = Placement() if model is None else self.placement(model)
        return scheduler.capacity(recorded_capacity(self.reference, placement, scheduler))

    def simulate(self, model: Model, workload: Workload, scheduler: SchedulerConfig, dit: DitOptions,
                 rate: float | None = None, slo_ttft_ms: float | None = None,
                 slo_tpot_ms: float | None = None, capacity: Capacity | None = None) -> SimResult:
        """One simulation of ``model`` (``rate`` overrides the workload's) on replicas of ``capacity``."""
        if self.kind == "llm":
            watch = RangeWatch(model)  # type: ignore[arg-type]
            res = simulate_llm(workload.llm_requests(rate), watch.time_ns, scheduler, slo_ttft_ms, slo_tpot_ms,
                               capacity)
            return res.with_tally(watch.tally)
        d = dit.settings(self.dit_config, scheduler.replicas)
        reqs = workload.dit_requests(rate)
        shapes = [(r.steps or d.steps, d.tokens if r.resolution is None else _dit_tokens(d, r)) for r in reqs]
        return simulate_dit([r.arrival_s for r in reqs], model, d.steps, d.tokens, d.batch, d.cfg,  # type: ignore[arg-type]
                            d.replicas, shapes)


def _dit_tokens(d: DitSettings, r: DitRequestSpec) -> int:
    """Latent tokens of request ``r`` at its own resolution (the recorded patch and frames)."""
    assert r.resolution is not None
    if r.resolution % d.patch:
        raise WorkloadError(f"request {r.id}: resolution {r.resolution} is not a multiple of the recorded patch "
                            f"{d.patch}")
    return d.frames * (r.resolution // d.patch) ** 2


def recorded_capacity(graph: TaskGraph | None, placement: Placement | None = None,
                      scheduler: SchedulerConfig | None = None) -> Capacity:
    """What one replica holds under ``scheduler``'s engine (default: the examples'), from the memory
    model of the recorded model and GPU (:mod:`~whatif.predictors.serving.capacity`) with the
    replica placed as ``placement`` (a scenario's tensor/pipeline degrees, PIM stacks, the GPU it
    moves to and its weights' storage; default: as recorded); KV unlimited, with the reason, when
    the recording has no transformer blocks or no cataloged GPU (a CPU recording of the example
    servers)."""
    scheduler = scheduler or SchedulerConfig()
    engine, length = scheduler.engine, scheduler.max_model_len
    if graph is None or graph.trace is None:
        return engine_capacity(engine, None, GpuMemory(), placement, max_model_len=length, why="no recorded graph")
    ctx = make_context(graph.trace)
    moved_to = placement.device if placement is not None else ""
    dev = find_device(moved_to or ctx.device) if moved_to or ctx.device else None
    gpu = GpuMemory(dev.name, float(dev.mem_bytes)) if dev is not None and dev.mem_bytes else GpuMemory()
    try:
        shape = model_shape(graph, ctx, "serve")
        gpu = replace(gpu, capacity_bytes=device_capacity_bytes(ctx, device=moved_to))
    except TransformError as exc:
        return engine_capacity(engine, None, gpu, placement, max_model_len=length, why=str(exc))
    return engine_capacity(engine, shape, gpu, placement, max_model_len=length,
                           peer_bw_bytes_per_s=dev.peer_copy_bw_bytes_per_s if dev is not None else 0.0)


def recorded_kv_capacity(graph: TaskGraph | None, placement: Placement | None = None) -> tuple[int | None, str]:
    """KV-cache tokens one replica holds under the examples' engine profile (:func:`recorded_capacity`)
    and where that came from (``memory model: …`` or ``unlimited: <why>``)."""
    cap = recorded_capacity(graph, placement)
    return cap.kv_tokens, cap.kv_source


def _run_path(base: str | Path | Analysis) -> Path:
    if isinstance(base, Analysis):
        return Path(base.trace.ranks[0].path) if base.trace.ranks else Path(base.trace.source)
    if not Path(base).exists():  # before looking for its serving log, which would blame its parent folder
        raise TraceError(base, "no such file or folder")
    return Path(base)


def fit_serving(path: str | Path | Analysis, scenarios: Sequence[ScenarioLike] = (), *,
                iterations_log: str | Path | None = None, unprofiled_log: str | Path | None = None,
                baseline: bool = True, cost_model: str | Enum = CostModelName.TRACE,
                step_options: StepOptions | None = None, engine: str | None = None) -> ServingModels:
    """Fit the iteration models of the baseline (unless ``baseline=False`` and there are scenarios)
    and of each scenario on a run folder/trace (or its :class:`Analysis`). The serving log is
    ``iterations_log``, else the ``--log`` named in the run folder's meta.jsonc (meta.json before);
    without one, the iterations are found in the trace by the first serving-engine adapter that
    recognises it (``engine``: that one; :mod:`whatif.predictors.serving.engines`) and priced by
    the operator-cost model (:mod:`whatif.predictors.serving.iteration_costs`). Scenarios without
    a ``cost_model`` key are priced by ``cost_model``. The fits use the steps ``step_options``
    counts (default: an Analysis's own options, else warm-up and partial steps left out)."""
    loaded = [load_scenario(s) if isinstance(s, (str, Path)) else s for s in scenarios]  # validate files first
    check_distinct_names([s for s in loaded if isinstance(s, Scenario)])
    for s in loaded:
        if isinstance(s, Scenario):
            scenario_cost_model(s, cost_model)
    run = _run_path(path)
    log_path = Path(iterations_log) if iterations_log else _serving_log(run)
    base = path if isinstance(path, Analysis) else analyze(path, step_options or COUNT_DEFAULT)
    if step_options is not None:
        base = base.with_options(step_options)
    found = None if log_path is not None else find_iterations(base.graph, engine)
    device, shape = _device_and_shape(base, need_device=found is None)
    replays: list[tuple[str, Replay]] = [] if not baseline and loaded else [("baseline", base.replay)]
    placements: list[Callable[[], Placement]] = [Placement] * len(replays)
    todo = [s for s in loaded if not isinstance(s, ScenarioResult)]
    predicted = iter(predict(base, todo, cost_model=cost_model).scenarios if todo else [])
    for s in loaded:
        r = s if isinstance(s, ScenarioResult) else next(predicted)
        replays.append((r.scenario.name, r.replay))
        placements.append(partial(_placement, base, r, cost_model))
    return ServingModels(base.trace.source if isinstance(path, Analysis) else str(path), log_path, replays,
                         unprofiled_log, reference=base.graph, step_options=base.options, placements=placements,
                         found=found, device=device, shape=shape)


def _serving_log(run: Path) -> Path | None:
    """The ``--log`` the run folder's metadata names, when it is a serving log (a recorded
    program's other log is left to the engine adapters)."""
    found = logs.find_log(run)
    if found is None:
        return None
    try:
        logs.read_log(found)
    except ServingLogError:
        return None
    return found


def _device_and_shape(base: Analysis, need_device: bool = False) -> tuple[Device | None, ModelShape | None]:
    """The recorded GPU (catalog) and the model's shape from the memory model, None where the trace
    does not say (no cataloged GPU, no transformer block found); ``need_device``: no shape either
    without a cataloged GPU (a serving log's fit prices its weight GEMMs only on one)."""
    device = find_device(base.trace.gpu_name)
    if need_device and device is None:
        return None, None
    try:
        shape = model_shape(base.graph, make_context(base.trace), "serve")
    except TransformError:
        shape = None
    return device, shape


def _placement(base: Analysis, result: ScenarioResult, cost_model: str | Enum) -> Placement:
    """Where ``result``'s scenario places one replica (its transforms in turn on its graphs)."""
    if not any(type(t).placement is not Transform.placement for t in result.scenario.transforms):
        return Placement()
    ctx = make_context(base.trace, scenario_cost_model(result.scenario, cost_model), result.scenario.collective_points)
    return scenario_placement(result.scenario.transforms, [base.graph, *result.graphs[:-1]], ctx)


def _models(path: str | Path | Analysis | ServingModels, scenarios: Sequence[ScenarioLike],
            fit_kw: dict[str, Any]) -> ServingModels:
    if isinstance(path, ServingModels):
        if scenarios:
            raise ValueError("scenarios are fitted already: pass them to fit_serving")
        if fit_kw.get("engine") is not None:
            raise ValueError("the iterations are found already: pass engine to fit_serving")
        if fit_kw["step_options"] not in (None, path.step_options):
            raise ValueError("the models are fitted on other steps already: pass step_options to fit_serving")
        return path
    return fit_serving(path, scenarios, **fit_kw)


def serve(path: str | Path | Analysis | ServingModels, scenarios: Sequence[ScenarioLike] = (),
          workload: Workload | str | Path | None = None, *, scheduler: SchedulerConfig | None = None,
          dit: DitOptions | None = None, slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None,
          iterations_log: str | Path | None = None, unprofiled_log: str | Path | None = None,
          baseline: bool = True, requests: bool = False, cost_model: str | Enum = CostModelName.TRACE,
          step_options: StepOptions | None = None, engine: str | None = None) -> ServingDocument:
    """Predicted serving metrics per scenario: the ``whatif.serving/1`` document of `whatif serve --json`.

    ``workload``: a :class:`Workload`, or a workload file (default: 20 requests, which then needs a rate).
    ``requests=True`` includes every simulated request. ``step_options``: which recorded steps the
    iteration models are fitted on (see :func:`fit_serving`).
    """
    workload = Workload(file=workload) if isinstance(workload, (str, Path)) else workload or Workload()
    if workload.file is None and workload.rate is None:
        raise WorkloadError("give a workload file or an arrival rate (--workload FILE or --rate R)")
    scheduler, dit = scheduler or SchedulerConfig(), dit or DitOptions()
    scheduler.check()
    fitted = _models(path, scenarios, {"iterations_log": iterations_log, "unprofiled_log": unprofiled_log,
                                       "baseline": baseline, "cost_model": cost_model, "step_options": step_options,
                                       "engine": engine})
    scheduler = fitted.with_engine(scheduler)
    workload_entry = workload.describe(workload.rate)
    if fitted.kind == "llm":
        per_model = [fitted.capacity(scheduler, i) for i in range(len(fitted.models))]
        return LlmServingDocument(
            source=fitted.source, log=str(fitted.log_path or ""), workload=workload_entry,
            scheduler=_llm_scheduler(scheduler, fitted.capacity(scheduler, None)), profiler_correction=fitted.factor,
            scenarios=[_llm_serving(name, model, fitted.simulate(model, workload, scheduler, dit, None,  # type: ignore[arg-type]
                                                                 slo_ttft_ms, slo_tpot_ms, cap), requests, cap)
                       for (name, model), cap in zip(fitted.models, per_model)])
    return DitServingDocument(
        source=fitted.source, log=str(fitted.log_path or ""), workload=workload_entry, notes=fitted.notes,
        scheduler=dit.settings(fitted.dit_config, scheduler.replicas), profiler_correction=fitted.factor,
        recorded=DitOptions().settings(fitted.dit_config),
        scenarios=[_dit_serving(name, model, fitted.simulate(model, workload, scheduler, dit, None, slo_ttft_ms,  # type: ignore[arg-type]
                                                             slo_tpot_ms), requests)
                   for name, model in fitted.models])


def sweep(path: str | Path | Analysis | ServingModels, rates: Sequence[float],
          scenarios: Sequence[ScenarioLike] = (), workload: Workload | None = None, *,
          scheduler: SchedulerConfig | None = None, dit: DitOptions | None = None,
          slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None,
          iterations_log: str | Path | None = None, unprofiled_log: str | Path | None = None,
          baseline: bool = True, cost_model: str | Enum = CostModelName.TRACE,
          step_options: StepOptions | None = None, engine: str | None = None) -> SweepDocument:
    """Latency vs load: :func:`serve` repeated at each arrival rate, one curve per scenario; the
    ``whatif.serving-sweep/1`` document of `whatif sweep --json` (plot it with
    ``whatif.figures.serving_curves_figure``). The workload's own rate is ignored."""
    workload = workload or Workload()
    if workload.file:
        raise WorkloadError("sweep draws arrivals at each rate; a workload file is for `whatif serve`")
    if not rates or any(r <= 0 for r in rates):
        raise WorkloadError("sweep rates must be > 0")
    scheduler, dit = scheduler or SchedulerConfig(), dit or DitOptions()
    scheduler.check()
    fitted = _models(path, scenarios, {"iterations_log": iterations_log, "unprofiled_log": unprofiled_log,
                                       "baseline": baseline, "cost_model": cost_model, "step_options": step_options,
                                       "engine": engine})
    scheduler = fitted.with_engine(scheduler)

    def simulate(model: Model, rate: float, cap: Capacity | None = None) -> SimResult:
        return fitted.simulate(model, workload, scheduler, dit, float(rate), slo_ttft_ms, slo_tpot_ms, cap)

    if fitted.kind == "llm":
        per_model = [fitted.capacity(scheduler, i) for i in range(len(fitted.models))]
        return LlmSweepDocument(
            source=fitted.source, workload=workload.describe(None),
            scheduler=_llm_scheduler(scheduler, fitted.capacity(scheduler, None)),
            profiler_correction=fitted.factor,
            curves=[LlmSweepCurve(name=name, iteration_model=_llm_model(model),  # type: ignore[arg-type]
                                  points=[_llm_point(rate, simulate(model, rate, cap)) for rate in rates],
                                  kv_capacity_tokens=cap.kv_tokens, kv_capacity_source=cap.kv_source,
                                  capacity=_capacity(cap))
                    for (name, model), cap in zip(fitted.models, per_model)])
    return DitSweepDocument(
        source=fitted.source, workload=workload.describe(None),
        scheduler=dit.settings(fitted.dit_config, scheduler.replicas),
        profiler_correction=fitted.factor,
        curves=[DitSweepCurve(name=name, iteration_model=_dit_model(model),  # type: ignore[arg-type]
                              points=[_dit_point(rate, simulate(model, rate)) for rate in rates])
                for name, model in fitted.models])


# The simulator reports plain summaries (``SimResult.summary``); the documents are built from them here.

def _opt(value: float | None) -> float | None:
    return None if value is None else float(value)


def _stats(values: Mapping[str, float | None]) -> LatencyStats:
    return LatencyStats(mean=_opt(values["mean"]), p50=_opt(values["p50"]), p90=_opt(values["p90"]),
                        p99=_opt(values["p99"]))


def _slo(slo: Mapping[str, Any]) -> SloAttainment:
    return SloAttainment(ttft_ms=_opt(slo["ttft_ms"]), tpot_ms=_opt(slo["tpot_ms"]),
                         attainment=float(slo["attainment"]), goodput_req_per_s=_opt(slo["goodput_req_per_s"]))


def _capacity(cap: Capacity) -> CapacityEntry:
    return CapacityEntry(engine=cap.engine.value, describe=cap.describe(), gpu=cap.gpu.name,
                         gpu_memory_bytes=cap.gpu.capacity_bytes, memory_fraction=float(cap.memory_fraction),
                         weights_bytes=cap.weights_bytes, kv_bytes_per_token=cap.kv_bytes_per_token,
                         kv_tokens=cap.kv_tokens, kv_blocks=cap.kv_blocks, block_tokens=cap.block_tokens,
                         max_seqs=cap.max_seqs, max_batched_tokens=cap.max_batched_tokens,
                         kv_transfer_ns_per_token=float(cap.kv_transfer_ns_per_token), given=list(cap.given))


def _llm_scheduler(cfg: SchedulerConfig, cap: Capacity) -> LlmScheduler:
    return LlmScheduler(policy=str(cfg.policy_key.value), max_seqs=cap.max_seqs,
                        max_batched_tokens=cap.max_batched_tokens, chunk_tokens=cfg.chunk_tokens,
                        kv_capacity_tokens=cap.kv_tokens, kv_capacity_source=cap.kv_source,
                        kv_block_tokens=cap.block_tokens, replicas=cfg.replicas, prefill_replicas=cfg.prefill_replicas,
                        kv_transfer_ns_per_token=float(cap.kv_transfer_ns_per_token), router=str(cfg.router.value),
                        engine_profile=cap.engine.value, prefix_caching=cfg.caches_prefixes,
                        kv_watermark=float(cfg.kv_watermark), capacity=_capacity(cap))


def _excluded_iterations(excluded: list[tuple[int, str, Exclusion]]) -> list[ExcludedIteration]:
    return [ExcludedIteration(step=s, phase=p, excluded=r.value) for s, p, r in excluded]


def _ranges(ranges: Mapping[str, Mapping[str, Range]]) -> dict[str, dict[str, DriverRange]]:
    return {p: {k: DriverRange(low=float(r.low), high=float(r.high)) for k, r in rs.items()}
            for p, rs in ranges.items()}


def _values(res: SimResult) -> dict[str, DriverRange]:
    """The smallest and largest value each driver took beyond its range in a simulation."""
    return {k: DriverRange(low=float(lo), high=float(hi)) for k, (lo, hi) in res.extrapolated_values.items()}


def _llm_model(model: LlmModel) -> LlmIterationModel:
    correction = {p: ProfilerOffset(offset_ns=float(a), scale=float(b)) for p, (a, b) in model.correction.items()}
    if isinstance(model, CostIterationModel):
        return LlmIterationModel(
            kind="operator costs", loop_overhead_ns=float(model.loop_overhead_ns), profiler_correction=correction,
            phases={}, adapter=model.adapter, composition_source=model.source.value,
            iterations_found=sum(len(pc.anchors) for pc in model.phases.values()),
            cost_phases={p: CostPhaseEntry(phase=p, anchors=len(pc.anchors), cpu_per_seq_ns=float(pc.cpu_per_seq_ns),
                                           residual=float(pc.residual),
                                           loo_mape=_defined(pc.loo_mape),
                                           gpu_ns_by_law={law.name.lower(): float(v)
                                                          for law, v in pc.gpu_ns_by_law().items()})
                         for p, pc in model.phases.items()},
            ranges=_ranges({p: pc.ranges for p, pc in model.phases.items()}), notes=list(model.notes))
    return LlmIterationModel(
        loop_overhead_ns=float(model.loop_overhead_ns), profiler_correction=correction,
        phases={p: PhaseFitEntry(phase=f.phase, features=list(f.features), intercept_ns=float(f.intercept_ns),
                                 coef={k: float(v) for k, v in f.coef.items()}, n=int(f.n), r2=float(f.r2),
                                 mape=float(f.mape), loo_mape=_defined(f.loo_mape),
                                 candidates={k: float(v) for k, v in f.candidates.items()})
                for p, f in model.fits.items()},
        excluded_iterations=_excluded_iterations(model.excluded), ranges=_ranges(model.ranges),
        adapter=model.adapter, iterations_found=sum(f.n for f in model.fits.values()) if model.adapter else 0,
        notes=list(model.notes),
        weight_gemms=None if model.gemms is None else msgspec.convert(model.gemms.to_dict(), WeightGemmsEntry))


def _defined(value: float) -> float | None:
    """``value``, or None where it is undefined (NaN: JSON has no NaN, and a document reads back)."""
    return None if np.isnan(value) else float(value)


def _dit_model(model: DitStepModel) -> DitIterationModel:
    return DitIterationModel(tokens_ref=int(model.tokens_ref), attention_ns=[float(v) for v in model.attn],
                             rest_ns=[float(v) for v in model.rest], batch_overhead_ns=float(model.batch_overhead_ns),
                             cpu_ns=[float(v) for v in model.cpu], overlap_ns=float(model.overlap_ns),
                             n=int(model.n), mape=float(model.mape), loo_mape=_defined(model.loo_mape),
                             model_batches_seen=[int(b) for b in model.batches_seen],
                             profiler_correction=float(model.factor),
                             excluded_iterations=_excluded_iterations(model.excluded),
                             ranges=_ranges({"denoise": model.ranges}))


def _llm_serving(name: str, model: LlmModel, res: SimResult, requests: bool, cap: Capacity) -> LlmScenarioServing:
    s = res.summary
    return LlmScenarioServing(
        name=name, kv_capacity_tokens=cap.kv_tokens, kv_capacity_source=cap.kv_source, capacity=_capacity(cap),
        num_requests=int(s["num_requests"]), duration_s=float(s["duration_s"]),
        output_tokens=int(s["output_tokens"]), ttft_ms=_stats(s["ttft_ms"]), tpot_ms=_stats(s["tpot_ms"]),
        e2e_ms=_stats(s["e2e_ms"]), queue_ms=_stats(s["queue_ms"]),
        throughput_req_per_s=_opt(s["throughput_req_per_s"]),
        throughput_tokens_per_s=_opt(s["throughput_tokens_per_s"]), total_tokens_per_s=_opt(s["total_tokens_per_s"]),
        slo=_slo(s["slo"]), preemptions=int(s["preemptions"]), busy_fraction=_opt(s["busy_fraction"]),
        iterations={k: int(v) for k, v in s["iterations"].items()}, iteration_model=_llm_model(model),
        extrapolated_iterations=res.extrapolated_iterations, extrapolated_drivers=dict(res.extrapolated_drivers),
        extrapolated_values=_values(res),
        requests=[LlmRequest(id=int(r["id"]), replica=int(r["replica"]), arrival_s=float(r["arrival_s"]),
                             prompt_tokens=int(r["prompt_tokens"]), output_tokens=int(r["output_tokens"]),
                             queue_ms=float(r["queue_ms"]), ttft_ms=float(r["ttft_ms"]), tpot_ms=_opt(r["tpot_ms"]),
                             e2e_ms=float(r["e2e_ms"]), preemptions=int(r["preemptions"]))
                  for r in res.requests] if requests else UNSET)


def _dit_serving(name: str, model: DitStepModel, res: SimResult, requests: bool) -> DitScenarioServing:
    s = res.summary
    return DitScenarioServing(
        name=name, num_requests=int(s["num_requests"]), num_batches=int(s["num_batches"]),
        duration_s=float(s["duration_s"]), throughput_req_per_s=_opt(s["throughput_req_per_s"]),
        latency_ms=_stats(s["latency_ms"]), queue_ms=_stats(s["queue_ms"]), service_ms=_stats(s["service_ms"]),
        step_ms_at_full_batch=float(s["step_ms_at_full_batch"]), busy_fraction=_opt(s["busy_fraction"]),
        iteration_model=_dit_model(model), e2e_ms=_stats(s["latency_ms"]),
        iterations={k: int(v) for k, v in res.iterations.items()},
        extrapolated_iterations=res.extrapolated_iterations, extrapolated_drivers=dict(res.extrapolated_drivers),
        extrapolated_values=_values(res),
        requests=[DitRequest(id=int(r["id"]), arrival_s=float(r["arrival_s"]), queue_ms=float(r["queue_ms"]),
                             service_ms=float(r["service_ms"]), latency_ms=float(r["latency_ms"]))
                  for r in res.requests] if requests else UNSET)


def _llm_point(rate: float, res: SimResult) -> LlmSweepPoint:
    s = res.summary
    return LlmSweepPoint(rate_req_per_s=float(rate), ttft_ms=_stats(s["ttft_ms"]), tpot_ms=_stats(s["tpot_ms"]),
                         e2e_ms=_stats(s["e2e_ms"]), queue_ms=_stats(s["queue_ms"]),
                         throughput_tokens_per_s=_opt(s["throughput_tokens_per_s"]),
                         throughput_req_per_s=_opt(s["throughput_req_per_s"]),
                         busy_fraction=_opt(s["busy_fraction"]), slo=_slo(s["slo"]),
                         extrapolated_iterations=res.extrapolated_iterations)


def _dit_point(rate: float, res: SimResult) -> DitSweepPoint:
    s = res.summary
    return DitSweepPoint(rate_req_per_s=float(rate), latency_ms=_stats(s["latency_ms"]),
                         queue_ms=_stats(s["queue_ms"]), throughput_req_per_s=_opt(s["throughput_req_per_s"]),
                         busy_fraction=_opt(s["busy_fraction"]), e2e_ms=_stats(s["latency_ms"]),
                         extrapolated_iterations=res.extrapolated_iterations)
