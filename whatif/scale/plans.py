"""Plan sweeps: every plan of a grid TP x PP x DP x SP x micro-batches x batch x device, each
predicted the way ``whatif predict`` predicts a scenario file (docs/scale.md, "Plan sweeps").

A **plan** is a scenario of the parallel transforms (docs/multi-gpu.md) in a fixed order:
``gpu`` (when the device is not the recorded one), ``batch`` (the batch per GPU as a multiple of
the traced one, when not 1), ``tensor_parallel``, ``sequence_parallel``, ``pipeline_parallel``,
``data_parallel``; a degree of 1 leaves its transform out. Its TOML text
(:func:`plan_toml`) is what a user would write, and the sweep loads the same tables through the
scenario-file loader (:func:`plan_scenario`), applies them with :meth:`Scenario.apply` and replays the final graph, so a
plan's step time is ``whatif predict -s plan.toml``'s mean step. Each rank of the trace becomes
``tp·pp·sp`` GPUs and the job ``dp`` replicas of the traced one: GPUs = ranks x tp x pp x sp x dp.

Per plan: the predicted mean step (the latency), the throughput ``dp x batch x samples per step /
step`` (samples when the samples one step of the traced job processes are given, else traced
batches), the bytes per GPU (on a trace with GPU allocator records and shapes, plans with
sp = 1: the peak of the recorded timeline at the plan's batch, one tensor-parallel rank's share of
each block and, pipelined, the fullest stage's (``batch_memory.py``, ``tp_memory.py``,
``pp_memory.py``); Ulysses, Ring and USP plans with tp = pp = 1: one sequence-parallel rank's
(``sp_memory.py``); other plans: the memory model of
``transforms/parallel/memory.py``, weights ``W/(tp·pp)`` and the workspace; a plan over the
device's memory is not replayed), and the
Pareto front of the plans that ran: a plan is on it when no other plan is at least as good on GPUs
(fewer), step time (shorter) and throughput (higher) and better on one.

>>> grid = PlanGrid(tp=(1, 2), pp=(1, 2), micro_batches=(2, 4))
>>> [p.label for p in expand(grid, recorded_device=None, mode=Mode.TRAINING)]
['tp1·pp1·sp1·dp1', 'tp1·pp2·mb2·sp1·dp1', 'tp1·pp2·mb4·sp1·dp1', 'tp2·pp1·sp1·dp1', 'tp2·pp2·mb2·sp1·dp1', \
'tp2·pp2·mb4·sp1·dp1']
>>> [p.label for p in expand(PlanGrid(batch_factor=(1, 2)), recorded_device=None, mode=Mode.SERVING)]
['tp1·pp1·sp1·dp1', 'tp1·pp1·sp1·dp1·b2']
>>> print(plan_toml(expand(grid, recorded_device=None, mode=Mode.TRAINING)[4]))
name = "tp2·pp2·mb2·sp1·dp1"
<BLANKLINE>
[[transform]]
name = "tensor_parallel"
degree = 2
topology = "dgx_h100"
<BLANKLINE>
[[transform]]
name = "pipeline_parallel"
degree = 2
micro_batches = 2
schedule = "1f1b"
topology = "dgx_h100"
<BLANKLINE>
"""
from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import TypeVar

import msgspec
import numpy as np
import pandas as pd

from whatif.analysis import Analysis, ScenarioResult, analyze, make_context
from whatif.core import limits
from whatif.core.errors import WhatifError
from whatif.depgraph.graph import TaskGraph
from whatif.documents import PlanRow, PlanSweepDocument
from whatif.hardware.devices import find_device, get_device
from whatif.hardware.topology import TopologyName
from whatif.predictors.cost_models import CostModelName
from whatif.predictors.replay import replay
from whatif.predictors.steps import COUNT_DEFAULT, StepOptions
from whatif.summary import mean_counted_step_ns
from whatif.tracer.memory import BlockScaling, on_gpu
from whatif.transforms.base import TransformContext, TransformError
from whatif.transforms.optimizations.batch_memory import BatchPeaks, batch_peaks, block_roles
from whatif.transforms.parallel.forward_ops import forward_ops
from whatif.transforms.parallel.layers import backward_mask
from whatif.transforms.parallel.memory import WORKSPACE_FRACTION, ModelShape, model_shape, plan_memory
from whatif.transforms.parallel.pp_memory import Schedule, default_micro_batches, pipeline_shares
from whatif.transforms.parallel.sequence import SequenceParallel
from whatif.transforms.parallel.sp_memory import MODELLED_MODES, sp_batch_peaks
from whatif.transforms.parallel.tp_memory import tensor_parallel_shares
from whatif.transforms.scenario import Scenario, ScenarioError, ScenarioStepError, scenario_from_dict

from .executor import Execution, map_chunks

__all__ = ["Mode", "Plan", "PlanGrid", "PlanStatus", "expand", "pareto_front", "plan_scenario", "plan_toml",
           "sweep_plans"]

SP_MODES = ("ulysses", "ring", "torus", "usp")


class Mode(Enum):
    """What the traced program is: a training step (``pipeline_parallel`` 1F1B, DDP buckets) or a
    serving step (request pipelining, ``data_parallel`` replicas)."""

    TRAINING = "training"
    SERVING = "serving"


class PlanStatus(Enum):
    OK = "ok"                      # replayed
    REFUSED = "refused"            # a transform refused the graph (its reason in the row)
    NO_FIT = "does not fit"        # over the device's memory (the memory model's line in the row)


_N = TypeVar("_N", int, float)


def _listed(text: str, convert: Callable[[str], _N], what: str) -> tuple[_N, ...]:
    """The distinct values of a comma-separated list, in order."""
    try:
        return tuple(dict.fromkeys(convert(x) for x in text.split(",") if x.strip()))
    except ValueError:
        raise ValueError(f"expected comma-separated {what}, got {text!r}") from None


def _degrees(text: str) -> tuple[int, ...]:
    values = _listed(text, int, "integers")
    if not values or not all(1 <= v <= limits.MAX_GPUS for v in values):
        raise ValueError(f"degrees must be integers in 1..{limits.MAX_GPUS}, got {text!r}")
    return values


def _ulysses_degrees(text: str) -> tuple[int, ...]:
    values = _listed(text, int, "integers")
    if not values or not all(0 <= v <= limits.MAX_GPUS for v in values):
        raise ValueError(f"Ulysses degrees must be integers in 0..{limits.MAX_GPUS}, got {text!r}")
    return values


def _micro_batches(text: str) -> tuple[int, ...]:
    values = _degrees(text)
    if max(values) > limits.MAX_PARTS:
        raise ValueError(f"micro-batches must be at most {limits.MAX_PARTS}, got {text!r}")
    return values


def _batches(text: str) -> tuple[float, ...]:
    """Batch factors: multiples of the traced batch per GPU (> 0, at most ``MAX_PARTS``).

    >>> _batches("1,2,0.5,2")
    (1.0, 2.0, 0.5)
    """
    values = _listed(text, float, "numbers")
    if not values or not all(0 < v <= limits.MAX_PARTS for v in values):
        raise ValueError(f"batch factors must be in (0, {limits.MAX_PARTS}], got {text!r}")
    return values


def _names(text: str) -> tuple[str, ...]:
    """Catalog names of the GPUs in ``text`` (case and trace spellings accepted), in order."""
    names = []
    for name in (x.strip() for x in text.split(",") if x.strip()):
        try:
            names.append(get_device(name).name)
        except KeyError:
            raise ValueError(f"{name!r} is not a GPU of the catalog ('whatif devices' lists them)") from None
    return tuple(dict.fromkeys(names))


def _degree_field(help_text: str) -> tuple[int, ...]:
    return field(default=(1,), metadata={"help": help_text, "parse": _degrees, "metavar": "N1,N2,..."})


@dataclass(frozen=True)
class PlanGrid:
    """The axes of a plan sweep (each a list; every combination is a plan) and what every plan
    shares. ``micro_batches`` applies to pipelined plans only (0: the transform's default);
    ``device``: GPUs of the catalog (empty: the recorded one); ``mode``: None reads it off the
    trace (training when it has backward kernels); ``samples_per_step``: samples (or tokens) one
    step of the traced job processes, 0 when unknown (throughput in traced batches per second)."""

    tp: tuple[int, ...] = _degree_field("tensor-parallel degrees")
    pp: tuple[int, ...] = _degree_field("pipeline-parallel degrees (stages)")
    dp: tuple[int, ...] = _degree_field("data-parallel degrees (replicas of the traced job)")
    sp: tuple[int, ...] = _degree_field("sequence-parallel degrees")
    micro_batches: tuple[int, ...] = field(default=(0,), metadata={
        "help": "micro-batches per step of pipelined plans (default: the transform's, 4 for training, p for "
                "serving)", "parse": _micro_batches, "metavar": "M1,M2,..."})
    batch_factor: tuple[float, ...] = field(default=(1.0,), metadata={
        "help": "batch per GPU as multiples of the traced one (the batch transform; throughput counts it)",
        "parse": _batches, "metavar": "K1,K2,..."})
    device: tuple[str, ...] = field(default=(), metadata={
        "help": "GPUs of the catalog to run each plan on (default: the recorded one)", "parse": _names,
        "metavar": "GPU1,GPU2,..."})
    topology: str = field(default="dgx_h100", metadata={"help": "topology preset of every plan's collectives",
                                                        "choices": [t.value for t in TopologyName]})
    sp_mode: str = field(default="ulysses", metadata={"help": "sequence parallelism", "choices": SP_MODES})
    ulysses_degree: tuple[int, ...] = field(default=(0,), metadata={
        "help": "usp: Ulysses degrees u of each sequence-parallel plan (a ring over sp/u; 0: the GPUs of one "
                "machine); a u that does not divide sp is left out of that sp's plans", "parse": _ulysses_degrees,
        "metavar": "U1,U2,..."})
    mode: Mode | None = field(default=None, metadata={
        "help": "training or serving (default: training when the trace has backward kernels)",
        "choices": [m.value for m in Mode]})
    samples_per_step: int = field(default=0, metadata={
        "minimum": 0, "help": "samples (or tokens) one step of the traced job processes; 0: throughput in traced "
                              "batches per second"})

    def __post_init__(self) -> None:
        if isinstance(self.mode, str):
            object.__setattr__(self, "mode", Mode(self.mode))
        laid = {sp for sp, _ in self.sp_layouts()}
        bare = [sp for sp in self.sp if sp not in laid]
        if bare:
            raise ValueError(f"no Ulysses degree of {', '.join(map(str, self.ulysses_degree))} divides the "
                             f"sequence-parallel degree {', '.join(map(str, bare))} (0: the transform's default)")

    def size(self) -> int:
        """Plans in the grid (micro-batches count for pipelined plans only, Ulysses degrees for
        usp plans only)."""
        pipelined = sum(p > 1 for p in self.pp)
        return (len(self.device) or 1) * len(self.tp) * (len(self.pp) - pipelined + pipelined
                                                         * len(self.micro_batches)) * len(self.sp_layouts()) \
            * len(self.dp) * len(self.batch_factor)

    def sp_layouts(self) -> list[tuple[int, int]]:
        """Each sequence-parallel degree with each Ulysses degree it is swept with: ``(sp, u)``, u
        0 (the transform's default) but for usp plans, where u must divide sp.

        >>> PlanGrid(sp=(1, 4, 8), sp_mode="usp", ulysses_degree=(2, 8)).sp_layouts()
        [(1, 0), (4, 2), (8, 2), (8, 8)]
        >>> PlanGrid(sp=(4,), sp_mode="usp", ulysses_degree=(0, 4, 2)).sp_layouts()   # 0 is 4 on a DGX H100
        [(4, 4), (4, 2)]
        """
        out = []
        for sp in self.sp:
            us = [u for u in dict.fromkeys(self.ulysses_degree if self.sp_mode == "usp" and sp > 1 else (0,))
                  if u == 0 or sp % u == 0]
            if 0 in us and len(us) > 1 and self._default_ulysses(sp) in us:   # the same layout twice
                us.remove(0)
            out += [(sp, u) for u in us]
        return out

    def _default_ulysses(self, sp: int) -> int:
        """The Ulysses degree the transform takes for usp of ``sp`` when none is given (0 when it
        cannot lay sp out on the topology)."""
        try:
            return SequenceParallel(mode="usp", degree=sp, topology=self.topology).ulysses_ranks()
        except TransformError:
            return 0


@dataclass(frozen=True)
class Plan:
    """One point of the grid, with what every plan of its sweep shares; ``device`` None: the
    recorded GPU (no ``gpu`` transform); ``micro_batches`` 0 for unpipelined plans."""

    tp: int
    pp: int
    dp: int
    sp: int
    micro_batches: int
    device: str | None
    mode: Mode
    topology: str = "dgx_h100"
    sp_mode: str = "ulysses"
    batch: float = 1.0
    ulysses: int = 0

    @property
    def label(self) -> str:
        mb = f"·mb{self.micro_batches}" if self.pp > 1 and self.micro_batches else ""
        u = f"u{self.ulysses}" if self.sp > 1 and self.ulysses else ""
        b = f"·b{self.batch:g}" if self.batch != 1 else ""
        on = f" on {self.device}" if self.device else ""
        return f"tp{self.tp}·pp{self.pp}{mb}·sp{self.sp}{u}·dp{self.dp}{b}{on}"

    def transforms(self) -> list[dict[str, object]]:
        """The ``[[transform]]`` tables of the plan's scenario, in order."""
        out: list[dict[str, object]] = []
        if self.device:
            out.append({"name": "gpu", "device": self.device})
        if self.batch != 1:
            out.append({"name": "batch", "factor": self.batch})
        if self.tp > 1:
            out.append({"name": "tensor_parallel", "degree": self.tp, "topology": self.topology})
        if self.sp > 1:
            out.append({"name": "sequence_parallel", "mode": self.sp_mode, "degree": self.sp,
                        **({"ulysses_degree": self.ulysses} if self.ulysses else {}), "topology": self.topology})
        if self.pp > 1:
            out.append({"name": "pipeline_parallel", "degree": self.pp,
                        **({"micro_batches": self.micro_batches} if self.micro_batches else {}),
                        "schedule": _schedule(self.mode).value, "topology": self.topology})
        if self.dp > 1:
            out.append({"name": "data_parallel", "degree": self.dp, "mode": self.mode.value,
                        "topology": self.topology})
        return out


def expand(grid: PlanGrid, recorded_device: str | None, mode: Mode) -> list[Plan]:
    """Every plan of ``grid``, in a fixed order (device, tp, pp, micro-batches, sp, dp); a device
    that is the recorded GPU gets no ``gpu`` transform."""
    recorded = find_device(recorded_device) if recorded_device else None
    devices: list[str | None] = [None if recorded is not None and get_device(d).name == recorded.name else d
                                 for d in grid.device] or [None]
    plans = []
    for device, tp, pp in itertools.product(devices, grid.tp, grid.pp):
        mbs = grid.micro_batches if pp > 1 else (0,)
        for mb, (sp, u), dp, b in itertools.product(mbs, grid.sp_layouts(), grid.dp, grid.batch_factor):
            plans.append(Plan(tp=tp, pp=pp, dp=dp, sp=sp, micro_batches=mb, device=device, mode=mode,
                              topology=grid.topology, sp_mode=grid.sp_mode, batch=b, ulysses=u))
    return list(dict.fromkeys(plans))


def _toml_value(value: object) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)


def plan_toml(plan: Plan) -> str:
    """The scenario file of ``plan`` (what ``whatif predict -s`` reads); a plan of degree 1
    everywhere on the recorded GPU has no transform and no file (ScenarioError)."""
    tables = plan.transforms()
    if not tables:
        raise ScenarioError(f"{plan.label}: the traced job itself has no scenario file")
    lines = [f"name = {_toml_value(plan.label)}", ""]
    for table in tables:
        lines += ["[[transform]]", *(f"{k} = {_toml_value(v)}" for k, v in table.items()), ""]
    return "\n".join(lines)


def plan_scenario(plan: Plan) -> Scenario | None:
    """The :class:`Scenario` of :func:`plan_toml`'s tables, through the loader of scenario files
    (None for the traced job itself)."""
    tables = plan.transforms()
    if not tables:
        return None
    return scenario_from_dict({"name": plan.label, "transform": tables}, source=f"<plan {plan.label}>")


class MemorySource(str, Enum):
    """Where a plan's bytes per GPU come from."""

    RECORDS = "allocator records"      # the recorded timeline at the plan's batch (and TP rank)
    MODEL = "weights + workspace"      # transforms/parallel/memory.py
    NONE = ""                          # neither can be read


@dataclass
class PlanBase:
    """What every worker gets once: the analysed trace, the cost model's name, the model shape
    for the memory model (None, with ``memory_note`` saying why, when it cannot be read), and the
    recorded GPU memory at any batch per tensor-parallel degree of the grid (one rank's; empty
    when the trace has no GPU allocator records to read, a degree left out when its memory cannot
    be sharded)."""

    analysis: Analysis
    cost_model: str
    shape: ModelShape | None
    memory_note: str
    recorded: dict[RecordedKey, BatchPeaks] = field(default_factory=dict)


Prefix = tuple[tuple[tuple[str, object], ...], ...]


@dataclass
class PlanWorker:
    """A worker's state: the base, its own cost-model context, and the graphs after the last
    plan's transforms but its last and after all of them (or the refusal they met): plans come in
    grid order, so the next plan usually starts from one of them (a scenario applied in two parts
    is the same fold of its transforms)."""

    base: PlanBase
    ctx: TransformContext
    kept: dict[Prefix, TaskGraph | ScenarioStepError] = field(default_factory=dict)

    def _apply(self, scenario: Scenario, graph: TaskGraph, n: int, start: int) -> TaskGraph | ScenarioStepError:
        """The graph after ``scenario``'s transforms ``start..n-1`` applied to ``graph``."""
        try:
            return replace(scenario, transforms=scenario.transforms[start:n]).apply(graph, self.ctx)[-1]
        except ScenarioStepError as exc:
            return exc

    def after(self, scenario: Scenario, tables: list[dict[str, object]]) -> TaskGraph:
        """The graph after all of ``scenario``'s transforms, whose tables are ``tables``
        (ScenarioStepError when one refuses)."""
        keys = [tuple(tuple(t.items()) for t in tables[:n]) for n in (len(tables) - 1, len(tables))]
        base = self.base.analysis.graph
        head = self.kept[keys[0]] if keys[0] in self.kept else \
            self._apply(scenario, base, len(tables) - 1, 0) if keys[0] else base
        full = head if isinstance(head, ScenarioStepError) else self._apply(scenario, head, len(tables),
                                                                             len(tables) - 1)
        self.kept = {keys[0]: head, keys[1]: full}
        if isinstance(full, ScenarioStepError):
            raise full
        return full


@dataclass(frozen=True)
class PlanOutcome:
    """What one plan gave (before the Pareto front and the throughput, which need the grid)."""

    status: PlanStatus
    step_ns: int | None
    memory_per_gpu_bytes: int | None
    fits: bool | None
    reason: str
    memory_source: MemorySource = MemorySource.NONE


def setup_worker(base: PlanBase) -> PlanWorker:
    return PlanWorker(base=base, ctx=make_context(base.analysis.trace, base.cost_model))


def evaluate_chunk(worker: PlanWorker, plans: list[Plan]) -> list[PlanOutcome]:
    return [evaluate(worker, plan) for plan in plans]


def _capacity_bytes(plan: Plan, recorded: str | None) -> float | None:
    dev = get_device(plan.device) if plan.device else find_device(recorded) if recorded else None
    return float(dev.mem_bytes) if dev is not None and dev.mem_bytes else None


def evaluate(worker: PlanWorker, plan: Plan) -> PlanOutcome:
    """One plan: the memory model's verdict, then (when it fits or cannot be judged) its scenario
    applied and replayed, as ``whatif predict`` does."""
    base = worker.base
    memory: int | None = None
    fits: bool | None = None
    source = MemorySource.NONE
    capacity = _capacity_bytes(plan, worker.ctx.device)
    key = _recorded_key(plan)
    recorded = base.recorded.get(key) if key is not None else None
    if recorded is not None:
        memory, source = recorded.peak_bytes(plan.batch), MemorySource.RECORDS
        if capacity is not None:
            fits = memory <= capacity
            if not fits:
                parts = ([f"one rank of tensor parallelism {plan.tp}"] if plan.tp > 1 else []) + \
                    ([f"the fullest of {plan.pp} pipeline stages"] if plan.pp > 1 else []) + \
                    ([f"one rank of {plan.sp_mode} sequence parallelism {plan.sp}"
                      + (f" (Ulysses over {plan.ulysses})" if plan.ulysses else "")] if plan.sp > 1 else [])
                rank = "".join(f" on {part}" for part in parts)
                return PlanOutcome(PlanStatus.NO_FIT, None, memory, False,
                                   f"the recorded allocator timeline at {plan.batch:g}x the batch{rank} peaks at "
                                   f"{memory / 2**30:,.2f} GiB, over the GPU's {capacity / 2**30:,.0f} GiB", source)
    elif base.shape is not None and capacity is not None:
        mem = plan_memory(base.shape, tensor=plan.tp, pipeline=plan.pp, kv_tokens=0, capacity_bytes=capacity)
        memory, fits, source = int(mem.total_bytes), mem.fits, MemorySource.MODEL
        if not mem.fits:
            return PlanOutcome(PlanStatus.NO_FIT, None, memory, False, mem.why_not(), source)
    scenario = plan_scenario(plan)
    a = base.analysis
    if scenario is None:
        return PlanOutcome(PlanStatus.OK, mean_counted_step_ns(a.steps), memory, fits, "", source)
    try:
        graph = worker.after(scenario, plan.transforms())
    except ScenarioStepError as exc:
        return PlanOutcome(PlanStatus.REFUSED, None, memory, fits, exc.reason.splitlines()[0], source)
    except WhatifError as exc:
        return PlanOutcome(PlanStatus.REFUSED, None, memory, fits, str(exc).splitlines()[0], source)
    replayed = replay(graph)
    result = ScenarioResult(scenario=scenario, graphs=[replayed.graph], replays=[replayed], reference=a.graph,
                            options=a.options)
    return PlanOutcome(PlanStatus.OK, mean_counted_step_ns(result.steps), memory, fits, "", source)


def pareto_front(gpus: Sequence[int], step_ns: Sequence[float], throughput: Sequence[float]) -> np.ndarray:
    """Which points are on the Pareto front of (fewer GPUs, shorter step, higher throughput): no
    other point is at least as good on all three and better on one. Equal points are all on it.

    >>> pareto_front([1, 2, 2, 4], [10, 6, 8, 6], [1.0, 2.0, 1.5, 2.0]).tolist()
    [True, True, False, False]
    """
    g = np.asarray(gpus, dtype=float)
    s = np.asarray(step_ns, dtype=float)
    t = np.asarray(throughput, dtype=float)
    # point j dominates i: g_j <= g_i, s_j <= s_i, t_j >= t_i, and one strictly
    no_worse = (g[:, None] <= g[None, :]) & (s[:, None] <= s[None, :]) & (t[:, None] >= t[None, :])
    better = (g[:, None] < g[None, :]) | (s[:, None] < s[None, :]) | (t[:, None] > t[None, :])
    return np.asarray(~(no_worse & better).any(axis=0), dtype=bool)


def _trace_mode(analysis: Analysis) -> Mode:
    return Mode.TRAINING if backward_mask(analysis.graph).any() else Mode.SERVING


def _shape(analysis: Analysis, ctx: TransformContext) -> tuple[ModelShape | None, str]:
    try:
        shape = model_shape(analysis.graph, ctx, "plan sweep")
    except TransformError as exc:
        return None, f"not checked: {exc}"
    return shape, (f"weights {shape.held_bytes / 1e9:.2f} GB / (tp·pp) + a workspace of {WORKSPACE_FRACTION:.0%} of "
                   f"each GPU's memory (vLLM's gpu_memory_utilization 0.9 leaves it); KV cache, gradients and "
                   f"optimizer state not counted")


RecordedKey = tuple[int, int, int, int, int]
"""A plan's (tensor-parallel degree, pipeline stages, micro-batches: 0 without pipelining,
sequence-parallel degree, its Ulysses ranks): the plans that read one recorded timeline."""


def _schedule(mode: Mode) -> Schedule:
    """The pipeline schedule a plan of ``mode`` runs."""
    return Schedule.ONE_F_ONE_B if mode is Mode.TRAINING else Schedule.SERVING


def ulysses_ranks(plan: Plan) -> int:
    """The ranks each of ``plan``'s Ulysses all-to-alls spans (``sp`` in Ulysses mode, 1 for a
    ring or without sequence parallelism, the machine's share in USP and torus mode; 0 when its
    topology cannot say: the plan is refused)."""
    if plan.sp == 1:
        return 1
    try:
        return SequenceParallel(mode=plan.sp_mode, degree=plan.sp, topology=plan.topology,
                                ulysses_degree=plan.ulysses).ulysses_ranks()
    except TransformError:
        return 0


def _recorded_key(plan: Plan) -> RecordedKey | None:
    """The timeline ``plan`` reads; None for sequence parallelism with tensor or pipeline
    parallelism, or in torus mode, which keep the memory model."""
    if plan.sp > 1:
        ulysses = ulysses_ranks(plan)
        if plan.tp > 1 or plan.pp > 1 or plan.sp_mode not in MODELLED_MODES or not ulysses:
            return None
        return 1, 1, 0, plan.sp, ulysses
    if plan.pp == 1:
        return plan.tp, 1, 0, 1, 1
    return plan.tp, plan.pp, plan.micro_batches or default_micro_batches(_schedule(plan.mode), plan.pp), 1, 1


def _composed(*scalings: BlockScaling | None) -> BlockScaling | None:
    """The scalings given, one after another (:meth:`BlockScaling.then`); None when none is."""
    given = [s for s in scalings if s is not None]
    return functools.reduce(BlockScaling.then, given) if given else None


def _recorded(analysis: Analysis, plans: Sequence[Plan]) -> tuple[dict[RecordedKey, BatchPeaks], str]:
    """The recorded GPU memory at any batch per (tp, pp, micro-batches) of ``plans`` with sp = 1
    (one tensor-parallel rank's; of a pipeline, its fullest stage's), and a line saying what it
    counts (or why it is not used)."""
    trace = analysis.trace
    if not on_gpu(trace.memory).any():
        return {}, ""
    try:
        roles = block_roles(trace)
    except TransformError as exc:
        return {}, f"the allocator records are not used: {exc}"
    ops = forward_ops(trace)
    schedule = _schedule(plans[0].mode) if plans else Schedule.SERVING
    tensor: dict[int, BlockScaling | None] = {}
    refused_tp = refused_pp = refused_sp = ""
    out: dict[RecordedKey, BatchPeaks] = {}
    for key in sorted({k for k in map(_recorded_key, plans) if k is not None}):
        tp, pp, m, sp, ulysses = key
        if sp > 1:
            try:
                found = sp_batch_peaks(trace, sp, ulysses, roles, ops)
            except TransformError as exc:
                refused_sp = refused_sp or str(exc)
                continue
            if found is not None:
                out[key] = found
            continue
        if tp > 1 and tp not in tensor and not refused_tp:
            try:
                tensor[tp] = tensor_parallel_shares(trace, tp, roles=roles, ops=ops).scaling()
            except TransformError as exc:
                refused_tp = str(exc)
        if tp > 1 and tp not in tensor:
            continue
        rank = tensor.get(tp)
        stages: list[BlockScaling | None] = [None]
        if pp > 1:
            if refused_pp:
                continue
            try:
                stages = [pipeline_shares(trace, pp, s, m, schedule, roles, ops).scaling() for s in range(pp)]
            except TransformError as exc:
                refused_pp = str(exc)
                continue
        peaks = [batch_peaks(trace, roles, _composed(rank, stage)) for stage in stages]
        if all(p is not None for p in peaks):
            out[key] = BatchPeaks.of_all([p for p in peaks if p is not None])
    why = "".join(f"; {which} plans keep the model: {reason}"
                  for which, reason in (("pp > 1", refused_pp), ("tp > 1", refused_tp), ("sp > 1", refused_sp))
                  if reason)
    if not out:
        return out, f"the allocator records are not used{why}"
    plain = [k for k in out if k[3] == 1]
    sps = ", ".join(dict.fromkeys(f"{k[3]}" + (f" (u {k[4]})" if plans[0].sp_mode == "usp" else "")
                                  for k in sorted(out) if k[3] > 1))
    layouts = [(k[4] > 1, k[4] < k[3]) for k in out if k[3] > 1]   # (an all-to-all, a ring)
    buffers = " and ".join(x for x, on in (("all-to-all buffers", any(a for a, _ in layouts)),
                                           ("ring blocks", any(r for _, r in layouts))) if on)
    sequence = (f"; {plans[0].sp_mode} plans with sp {sps} (tp = pp = 1): one rank's per-token activations of the "
                f"blocks and its {buffers} at the plan's batch (sequence_parallel's memory model)") if sps else ""
    if not plain:
        return out, f"{sequence.removeprefix('; ')} (docs/memory.md){why}"
    tps = ", ".join(str(tp) for tp in sorted({k[0] for k in plain}))
    pps = ", ".join(str(pp) for pp in sorted({k[1] for k in plain}))
    return out, (f"plans with sp = 1, tp {tps} and pp {pps}: the peak of the recorded allocator timeline with the "
                 f"activations at the plan's batch and, for tp > 1, one rank's share of each block, for pp > 1 the "
                 f"fullest stage's (its layers, the micro-batches its schedule keeps in flight) (batch's, "
                 f"tensor_parallel's and pipeline_parallel's memory models{sequence}, docs/memory.md; DDP's gradient "
                 f"buckets not counted){why}")


def ran(status: str, step_ns: int | None) -> bool:
    """Whether a plan ran: predicted (``ok``) with a step time; the Pareto front is of these."""
    return status == PlanStatus.OK.value and bool(step_ns)


def plan_rows(plans: Sequence[Plan], outcomes: Sequence[PlanOutcome], ranks: int,
              samples_per_step: int) -> list[PlanRow]:
    """The document's rows: GPUs, throughput and the Pareto front added to each plan's outcome."""
    gpus = [ranks * p.tp * p.pp * p.sp * p.dp for p in plans]
    per_step = samples_per_step or 1
    throughput = [round(p.dp * p.batch * per_step / (o.step_ns / 1e9), 6) if o.step_ns else None
                  for p, o in zip(plans, outcomes)]
    done = [i for i, o in enumerate(outcomes) if ran(o.status.value, o.step_ns)]
    front = pareto_front([gpus[i] for i in done], [float(outcomes[i].step_ns or 0) for i in done],
                         [throughput[i] or 0.0 for i in done])
    on_front = {i for i, f in zip(done, front.tolist()) if f}
    return [PlanRow(plan=p.label, tp=p.tp, pp=p.pp, micro_batches=p.micro_batches, sp=p.sp, ulysses=ulysses_ranks(p),
                    dp=p.dp, batch=p.batch,
                    device=p.device or "", gpus=gpus[i], status=o.status.value, step_ns=o.step_ns,
                    throughput_per_s=throughput[i],
                    memory_per_gpu_bytes=o.memory_per_gpu_bytes, fits=o.fits,
                    memory_source=o.memory_source.value, pareto=i in on_front,
                    reason=o.reason)
            for i, (p, o) in enumerate(zip(plans, outcomes))]


IN_THIS_PROCESS = Execution(jobs=1)


def sweep_plans(path_or_analysis: str | Path | Analysis, grid: PlanGrid, execution: Execution = IN_THIS_PROCESS,
                *, cost_model: str = CostModelName.TRACE.value, options: StepOptions = COUNT_DEFAULT,
                source: str = "", progress: Callable[[int, int], None] | None = None) -> PlanSweepDocument:
    """Predict every plan of ``grid`` on a trace (a path, or an :class:`Analysis` already made,
    named ``source`` in the document) and return the ``whatif.plan-sweep/1`` document (rows in
    the grid's order whatever the ``execution``: :class:`~whatif.scale.executor.Execution`);
    ``progress(done, total)`` after each chunk of plans."""
    analysis = path_or_analysis if isinstance(path_or_analysis, Analysis) else analyze(path_or_analysis, options)
    ctx = make_context(analysis.trace, cost_model)
    mode = grid.mode or _trace_mode(analysis)
    plans = expand(grid, ctx.device, mode)
    shape, note = _shape(analysis, ctx)
    recorded, recorded_note = _recorded(analysis, plans)
    note = f"{recorded_note}; other plans: {note}" if recorded else \
        "; ".join(n for n in (note, recorded_note) if n)
    base = PlanBase(analysis=analysis, cost_model=str(cost_model), shape=shape, memory_note=note, recorded=recorded)
    total = len(plans)
    report = (lambda done: progress(done, total)) if progress else None
    outcomes = map_chunks(setup_worker, base, evaluate_chunk, plans, execution, report)
    ranks = len(analysis.trace.ranks)
    rows = plan_rows(plans, outcomes, ranks, grid.samples_per_step)
    baseline = mean_counted_step_ns(analysis.steps)
    return PlanSweepDocument(
        source=source or (str(path_or_analysis) if not isinstance(path_or_analysis, Analysis) else "<analysis>"),
        device=ctx.device, ranks=ranks, mode=mode.value, topology=grid.topology,
        throughput_unit="samples/s" if grid.samples_per_step else "traced batches/s",
        samples_per_step=grid.samples_per_step, baseline_step_ns=baseline, memory_model=note, plans=rows)


def plans_table(doc: PlanSweepDocument) -> pd.DataFrame:
    """The document's rows as a table (the ``-o`` output), columns in the rows' field order."""
    frame = pd.DataFrame([msgspec.structs.asdict(r) for r in doc.plans],
                         columns=[f.name for f in msgspec.structs.fields(PlanRow)])
    return frame.astype({"step_ns": "Int64", "memory_per_gpu_bytes": "Int64", "fits": "boolean"})
