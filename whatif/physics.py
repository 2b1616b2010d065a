"""Physics relations a what-if prediction must obey on any trace: how predictions *move*.

An unchanged replay reproduces a trace by construction; these relations test what happens when
the hardware changes (issue 13). Each compares predictions of the same trace under simple
scenarios with the bounds of :mod:`whatif.predictors.bounds` (measured, computed without the
replay), step by step on *cumulative* times: per rank, the time from its first step's start to
each step's completion. A step's own interval (previous completion to its completion) is not
monotonic when steps overlap (the CPU runs ahead into the next step): a faster step ``n - 1``
completes earlier and hands time to step ``n`` even when nothing completes later. No step's
completion may move the wrong way, and that is what these relations test.

* ``identity``: an empty scenario and ``scale factor=1`` reproduce the baseline exactly.
* ``monotonic``: making a kind of task faster never makes a step slower (beyond 0.1 %), making
  it slower never makes one faster.
* ``gpu_zero``: with all GPU work at zero time, a step takes at least the CPU's own work
  (0.5 % slack) and at most 10 % more.
* ``cpu_zero``: with all CPU work at zero time, no step is shorter than its busiest GPU stream's
  own work (0.5 % slack).
* ``bounded``: all GPU work twice as fast speeds a step up by between 1 and Amdahl's
  ``1 / (1 - g / 2)``, ``g`` the step's GPU-busy fraction.
* ``composition``: two scalings of disjoint kinds give the same steps in either order.
* ``device_commutes``: another GPU then twice the batch gives the same steps as twice the batch
  then the GPU (0.1 %), and likewise int8 (W8A8) quantization, and tensor parallelism over 2
  GPUs with its collectives overlapped in 2 nano-batches (where the trace's blocks can be
  sharded): each kernel is priced on the recorded kernel's work, rate and waves, at its dtypes
  now, and a nano-batch's share beside a collective part is re-taken after the move, in both
  orders. Applies where the trace's GPU is in the catalog; the destination is an H100 (an A100
  for an H100 trace).

>>> from whatif.api import analyze
>>> results = check(analyze("sample_traces/llm_serve"))
>>> [(r.relation.value, r.holds) for r in results if r.applies]   # a CPU-only trace
[('identity', True), ('monotonic', True)]
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np
import pandas as pd

from whatif.analysis import Analysis, make_context, predict
from whatif.hardware.devices import find_device
from whatif.predictors.bounds import step_bounds
from whatif.transforms.base import Transform, TransformContext, TransformError
from whatif.transforms.generic import Scale
from whatif.transforms.optimizations.batch import Batch
from whatif.transforms.optimizations.gpu import Gpu
from whatif.transforms.optimizations.precision import Precision
from whatif.transforms.parallel.overlap import Overlap
from whatif.transforms.parallel.tensor import TensorParallel
from whatif.transforms.scenario import Scenario
from whatif.transforms.select import Selector

MONOTONIC_TOLERANCE = 0.001
FLOOR_SLACK = 0.005
GPU_ZERO_CEILING = 0.10
MONOTONIC_KINDS = ("kernel", "memcpy", "comm", "cpu")


class Relation(str, Enum):
    IDENTITY = "identity"
    MONOTONIC = "monotonic"
    GPU_ZERO = "gpu_zero"
    CPU_ZERO = "cpu_zero"
    BOUNDED = "bounded"
    COMPOSITION = "composition"
    DEVICE_COMMUTES = "device_commutes"


@dataclass(frozen=True)
class RelationResult:
    """Whether ``relation`` holds on every step it applies to; ``detail`` gives the worst step's
    numbers (or why the relation does not apply). ``value`` and ``bound`` summarize all steps
    (each rank's last completion, summed over ranks): for ``gpu_zero`` the predicted and floor
    time (ms), for ``cpu_zero`` the same against the busiest stream, for ``bounded`` the
    speedup and its Amdahl ceiling; NaN for the others."""

    relation: Relation
    holds: bool
    applies: bool
    detail: str
    value: float = float("nan")
    bound: float = float("nan")


def _scale(kind: str | None, factor: float) -> Scale:
    return Scale(select=Selector(kind=kind), factor=factor)


class _Trial:
    """Predictions of one trace under a scenario, as cumulative step completions (ns) per row of
    ``graph.steps``: per rank, running sums over its steps in begin order."""

    def __init__(self, analysis: Analysis, ctx: TransformContext) -> None:
        self.analysis, self.ctx = analysis, ctx
        steps = analysis.graph.steps
        self._order = np.lexsort((steps["measured_begin_ns"].to_numpy(), steps["rank"].to_numpy()))
        self._ranks = steps["rank"].to_numpy()[self._order]

    def cumulative(self, per_step: np.ndarray) -> np.ndarray:
        summed = pd.Series(np.asarray(per_step)[self._order]).groupby(self._ranks).cumsum().to_numpy()
        out = np.empty_like(summed)
        out[self._order] = summed
        return out

    def steps(self, transforms: Sequence[Transform]) -> np.ndarray:
        pred = predict(self.analysis, [Scenario(name="physics", transforms=list(transforms))], self.ctx)
        return self.cumulative(pred.scenarios[0].steps["predicted_ns"].to_numpy(dtype=np.int64))

    def total(self, cumulative: np.ndarray) -> float:
        """All steps: each rank's last cumulative value, summed over ranks."""
        return float(pd.Series(np.asarray(cumulative)[self._order]).groupby(self._ranks).last().sum())

    def has(self, kind: str) -> bool:
        return len(Selector(kind=kind)(self.analysis.graph)) > 0


def _worst(mask: np.ndarray, score: np.ndarray, describe: Callable[[int], str]) -> str:
    i = int(np.flatnonzero(mask)[np.argmax(score[mask])])
    return describe(i)


def check(analysis: Analysis, ctx: TransformContext | None = None) -> list[RelationResult]:
    """Every relation of this module on ``analysis``'s trace, in the order they are listed above."""
    trial = _Trial(analysis, ctx or make_context(analysis.trace))
    base = trial.cumulative(analysis.steps["predicted_ns"].to_numpy(dtype=np.int64))
    bounds = step_bounds(analysis.graph)
    for col in ("measured_ns", "cpu_own_ns", "gpu_stream_own_ns", "gpu_busy_ns"):
        bounds[col] = trial.cumulative(bounds[col].to_numpy())
    label = [f"rank {r} through step {s}" for r, s in zip(bounds["rank"], bounds["step"])]
    return [_identity(trial, base), _monotonic(trial, base, label), _gpu_zero(trial, bounds, label),
            _cpu_zero(trial, bounds, label), _bounded(trial, base, bounds, label), _composition(trial, label),
            _device_commutes(trial, label)]


def _identity(trial: _Trial, base: np.ndarray) -> RelationResult:
    same = [np.array_equal(trial.steps(ts), base) for ts in ([], [_scale(None, 1.0)])]
    return RelationResult(Relation.IDENTITY, all(same), True,
                          "empty scenario and scale x1 reproduce the baseline" if all(same)
                          else f"differs: empty scenario {'ok' if same[0] else 'changed'}, "
                               f"scale x1 {'ok' if same[1] else 'changed'}")


def _monotonic(trial: _Trial, base: np.ndarray, label: list[str]) -> RelationResult:
    worst: tuple[float, str] = (0.0, "")
    for kind in MONOTONIC_KINDS:
        if not trial.has(kind):
            continue
        for factor in (0.5, 2.0):
            pred = trial.steps([_scale(kind, factor)])
            wrong = (pred - base) / np.maximum(base, 1) * (1 if factor < 1 else -1)
            i = int(np.argmax(wrong)) if len(wrong) else 0
            if len(wrong) and wrong[i] > worst[0]:
                worst = (float(wrong[i]), f"{kind} x{factor}: {label[i]} {base[i] / 1e6:.3f} -> {pred[i] / 1e6:.3f} ms")
    holds = worst[0] <= MONOTONIC_TOLERANCE
    return RelationResult(Relation.MONOTONIC, holds, True,
                          "every step moves the right way" if not worst[1] else
                          f"worst {worst[0] * 100:.2f} % the wrong way ({worst[1]})")


def _gpu_zero(trial: _Trial, bounds: pd.DataFrame, label: list[str]) -> RelationResult:
    floor = bounds["cpu_own_ns"].to_numpy(dtype=np.int64)
    has = (floor > 0) & (bounds["gpu_busy_ns"].to_numpy() > 0)
    if not has.any():
        return RelationResult(Relation.GPU_ZERO, True, False, "no step has both CPU and GPU work")
    pred = trial.steps([_scale("gpu", 0.0)])
    ratio = pred / np.maximum(floor, 1)
    bad = has & ((ratio < 1 - FLOOR_SLACK) | (ratio > 1 + GPU_ZERO_CEILING))
    score = np.abs(ratio - 1)
    detail = _worst(bad if bad.any() else has, score,
                    lambda i: f"{label[i]}: GPU x0 {pred[i] / 1e6:.3f} ms vs CPU own work {floor[i] / 1e6:.3f} ms "
                              f"({ratio[i]:.2f}x)")
    return RelationResult(Relation.GPU_ZERO, not bad.any(), True,
                          f"{int(bad.sum())} of {int(has.sum())} steps outside [floor, floor x1.1]; worst {detail}",
                          trial.total(pred) / 1e6, trial.total(floor) / 1e6)


def _cpu_zero(trial: _Trial, bounds: pd.DataFrame, label: list[str]) -> RelationResult:
    floor = bounds["gpu_stream_own_ns"].to_numpy(dtype=np.int64)
    has = floor > 0
    if not has.any():
        return RelationResult(Relation.CPU_ZERO, True, False, "no step has GPU work")
    pred = trial.steps([_scale("cpu", 0.0)])
    ratio = pred / np.maximum(floor, 1)
    bad = has & (ratio < 1 - FLOOR_SLACK)
    detail = _worst(bad if bad.any() else has, -ratio,
                    lambda i: f"{label[i]}: CPU x0 {pred[i] / 1e6:.3f} ms vs busiest stream {floor[i] / 1e6:.3f} ms")
    return RelationResult(Relation.CPU_ZERO, not bad.any(), True,
                          f"{int(bad.sum())} of {int(has.sum())} steps below the busiest stream; closest {detail}",
                          trial.total(pred) / 1e6, trial.total(floor) / 1e6)


def _bounded(trial: _Trial, base: np.ndarray, bounds: pd.DataFrame,
             label: list[str]) -> RelationResult:
    busy = bounds["gpu_busy_ns"].to_numpy(dtype=np.float64)
    measured = bounds["measured_ns"].to_numpy(dtype=np.float64)
    has = (busy > 0) & (measured > 0)
    if not has.any():
        return RelationResult(Relation.BOUNDED, True, False, "no step has GPU work")
    g = np.clip(busy / np.maximum(measured, 1), 0, 1)
    ceiling = 1 / (1 - g / 2)
    pred = trial.steps([_scale("gpu", 0.5)])
    speedup = base / np.maximum(pred, 1)
    bad = has & ((speedup < 1 - MONOTONIC_TOLERANCE) | (speedup > ceiling * (1 + MONOTONIC_TOLERANCE)))
    mean_speedup = trial.total(base) / max(trial.total(pred), 1)
    mean_ceiling = trial.total(measured) / max(trial.total(measured - busy / 2), 1)
    detail = f"GPU x0.5: speedup {mean_speedup:.3f}x over all steps, Amdahl ceiling {mean_ceiling:.3f}x"
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        detail += f"; {int(bad.sum())} steps outside, e.g. {label[i]} {speedup[i]:.3f}x vs ceiling {ceiling[i]:.3f}x"
    return RelationResult(Relation.BOUNDED, not bad.any(), True, detail, mean_speedup, mean_ceiling)


def _composition(trial: _Trial, label: list[str]) -> RelationResult:
    if not (trial.has("kernel") and trial.has("cpu")):
        return RelationResult(Relation.COMPOSITION, True, False, "needs both kernels and CPU tasks")
    a = trial.steps([_scale("kernel", 0.5), _scale("cpu", 0.5)])
    b = trial.steps([_scale("cpu", 0.5), _scale("kernel", 0.5)])
    same = np.array_equal(a, b)
    if same:
        return RelationResult(Relation.COMPOSITION, True, True, "kernel x0.5 and cpu x0.5 commute")
    i = int(np.argmax(np.abs(a - b)))
    return RelationResult(Relation.COMPOSITION, False, True,
                          f"order matters: {label[i]} {a[i] / 1e6:.3f} vs {b[i] / 1e6:.3f} ms")


def _device_commutes(trial: _Trial, label: list[str]) -> RelationResult:
    recorded = find_device(trial.ctx.device)
    if recorded is None or not trial.has("kernel"):
        return RelationResult(Relation.DEVICE_COMMUTES, True, False,
                              "needs kernels and a GPU of the catalog ('whatif devices')")
    dest = "A100_SXM_80GB" if recorded.name.startswith("H100") else "H100_SXM"
    worst: tuple[float, str, int, np.ndarray, np.ndarray] | None = None
    changes: tuple[tuple[str, list[Transform]], ...] = (
        ("batch x2", [Batch(factor=2.0)]), ("precision(int8)", [Precision(dtype="int8")]),
        ("tensor_parallel(2) + overlap(2)", [TensorParallel(degree=2), Overlap(nano_batches=2)]))
    for name, change in changes:
        try:
            a = trial.steps([Gpu(device=dest), *change])
            b = trial.steps([*change, Gpu(device=dest)])
        except TransformError:   # a GPU without an int8 rate (GP100), no block to shard
            continue
        off = np.abs(a - b) / np.maximum(np.minimum(a, b), 1)
        if len(off) and (worst is None or off.max() > worst[0]):
            worst = (float(off.max()), name, int(np.argmax(off)), a, b)
    if worst is None:
        return RelationResult(Relation.DEVICE_COMMUTES, True, False, "no step to compare")
    off, name, i, a, b = worst
    holds = off <= MONOTONIC_TOLERANCE
    return RelationResult(Relation.DEVICE_COMMUTES, holds, True,
                          f"gpu({dest}) commutes with batch x2, precision(int8) and tensor_parallel(2) + "
                          f"overlap(2) where they apply (worst {off * 100:.3f} %, "
                          f"{name})" if holds else
                          f"order matters: gpu({dest}) and {name}, {label[i]} {a[i] / 1e6:.3f} (gpu first) vs "
                          f"{b[i] / 1e6:.3f} ms ({off * 100:.2f} %)")
