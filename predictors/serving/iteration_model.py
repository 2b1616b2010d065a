"""Iteration-time models fitted on a trace's replayed serving iterations.

One step (``ProfilerStep#N``) is one serving iteration. Per step the replay gives its *cycle*:
from the first task of its phase (``phase:prefill`` / ``decode`` / ``denoise``) to the task that
completes the step, plus the loop's work before the phase (the median gap between a step's begin
and its first phase task; the median leaves out the idle sleeps before some prefills). A scenario
changes the replay, hence the cycles, hence the model.

Every iteration is matched to the serving log, but the fits and the loop's work use only the
steps that count (:mod:`whatif.core.steps`: the warm-up ``ProfilerStep#0`` and a partial last
step are left out by default, judged on the measured graph; :class:`StepOptions` brings them
back). A phase none of whose iterations counts is fitted on all of them.

LLM (:func:`fit_llm_model`): per phase, a least-squares linear model of iteration time (ns) in features of the
batch composition, Vidur-style; candidate feature sets are compared by leave-one-out relative
error and the best one with non-negative slopes is kept. When the model's weights and the device
are known (:class:`WeightGemms`), the weight GEMMs' time at the batch's tokens is priced by their
law (:meth:`~.iteration_costs.DeviceLaw.gemm_ns`: tile rows, overlapped roofline) and the fit is
of what remains, so a batch beyond the fitted ones pays the GEMM tiles it adds (a decode of 65
sequences runs its GEMMs on 128 rows, 20 % slower on an A100 than at 64) instead of a line's
extrapolation. The features:

* prefill: ``tokens`` (new tokens), ``tokens2`` (tokens², dense attention over the packed batch),
  ``attn`` (Σ new·(cached+new) per sequence, block-diagonal attention), ``seqs``;
* decode: ``seqs``, ``context`` (Σ context tokens), ``padded`` (seqs · max context: attention over a
  padded batch, as the example's decode does).

DiT (:func:`fit_dit_model`): per denoising step, attention time and the rest are each fitted
linearly in the model batch; another token count ``T'`` scales the attention slope by (T'/T)² and
the rest's slope by T'/T (intercepts are per-call overheads and stay).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from whatif.core.kernels import is_attention
from whatif.core.steps import COUNT_DEFAULT, Exclusion, StepOptions
from whatif.depgraph.graph import GPU_WORK_KINDS, TaskGraph
from whatif.predictors.replay import Replay
from whatif.predictors.steps import step_end_tasks, step_exclusions

from .iteration_costs import RANGE_DRIVERS, Drivers, Range, WeightGemms, driver_value
from .logs import LLMBatch, ServingLogError

PREFILL_CANDIDATES: list[tuple[str, ...]] = [("tokens",), ("tokens", "tokens2"), ("tokens", "attn"), ("seqs", "tokens"),
                                             ("seqs", "tokens", "tokens2"), ("seqs", "tokens", "attn")]
DECODE_CANDIDATES: list[tuple[str, ...]] = [("seqs",), ("seqs", "context"), ("seqs", "padded"),
                                            ("seqs", "context", "padded")]


def replayed_iterations(replay: Replay, reference: TaskGraph | None = None,
                        options: StepOptions = COUNT_DEFAULT) -> pd.DataFrame:
    """Per step that ran a phase, in step order: ``rank``, ``step``, ``phase``, ``cycle_ns`` (first phase
    task to step completion), ``pre_gap_ns`` (step begin to first phase task), ``attn_ns`` (replayed time
    of attention ops/kernels in the step), ``excluded_reason`` (an :class:`Exclusion` or None, judged on
    ``reference``, the measured graph, default the replayed one) and ``included`` (whether the step
    counts under ``options`` on every rank). Multi-rank: the slowest rank per step."""
    g = replay.graph
    t = g.tasks
    floor, finisher = step_end_tasks(replay, replay.start_ns, replay.end_ns)
    steps = g.steps
    has_phase = t["phase"].notna().to_numpy()
    if not has_phase.any():
        raise ServingLogError("the trace has no phase annotations (phase:prefill/decode/denoise): "
                              "mark serving iterations with whatif.phase(...)")
    start, end = replay.start_ns, replay.end_ns
    ph = t.loc[has_phase, ["rank", "step", "phase"]].copy()
    ph["start"] = start[has_phase]
    names = t.loc[has_phase, "name"].astype(str)
    attention = {n: is_attention(n) for n in names.unique()}
    ph["attn"] = np.where(names.map(attention).to_numpy(dtype=bool), (end - start)[has_phase], 0)
    ph["phase"] = ph["phase"].astype(str)
    agg = ph.groupby(["rank", "step"], sort=False).agg(first=("start", "min"), phase=("phase", "first"),
                                                         attn_ns=("attn", "sum")).reset_index()
    reasons = step_exclusions(g if reference is None else reference)
    rows = pd.DataFrame({"rank": steps["rank"].to_numpy(), "step": steps["step"].to_numpy(), "floor": floor,
                         "done": end[finisher], "reason": pd.Series(reasons, dtype=object),
                         "included": options.mask(reasons)})
    m = agg.merge(rows, on=["rank", "step"], how="inner")
    m["cycle_ns"] = m["done"] - m["first"]
    m["pre_gap_ns"] = m["first"] - m["floor"]
    m = m.sort_values(["step", "rank"])
    per_step = m.groupby("step", sort=True).agg(rank=("rank", "first"), phase=("phase", "first"),
                                                cycle_ns=("cycle_ns", "max"), pre_gap_ns=("pre_gap_ns", "max"),
                                                attn_ns=("attn_ns", "max"), included=("included", "all"),
                                                excluded_reason=("reason", _first_reason)).reset_index()
    return per_step[["rank", "step", "phase", "cycle_ns", "pre_gap_ns", "attn_ns", "excluded_reason", "included"]]


def _first_reason(reasons: pd.Series) -> Exclusion | None:
    return next((r for r in reasons if r is not None), None)


def _counted(iters: pd.DataFrame) -> np.ndarray:
    """The rows that count, every row when none does."""
    inc = iters["included"].to_numpy(dtype=bool)
    return inc if inc.any() else np.ones(len(iters), dtype=bool)


def _excluded(iters: pd.DataFrame, used: set[int]) -> list[tuple[int, str, Exclusion]]:
    """``(step, phase, reason)`` of each iteration not in the ``used`` rows."""
    return [(int(s), str(p), r) for i, (s, p, r) in enumerate(zip(iters["step"], iters["phase"],
                                                                   iters["excluded_reason"]))
            if i not in used and r is not None]


def _excluded_dicts(excluded: list[tuple[int, str, Exclusion]]) -> list[dict[str, Any]]:
    return [{"step": s, "phase": p, "excluded": r.value} for s, p, r in excluded]


def loop_overhead_ns(iters: pd.DataFrame) -> float:
    """The serving loop's work before an iteration's phase: median pre-phase gap over the counted
    iterations (the warm-up step, which holds start-up, is not one by default; the median leaves out
    idle sleeps, rare next to the many back-to-back iterations)."""
    gaps = iters["pre_gap_ns"].to_numpy()[_counted(iters)]
    return float(np.median(gaps)) if len(gaps) else 0.0


def _phase_rows(phases: list[str], counted: np.ndarray, phase: str) -> list[int]:
    """Rows of ``phase`` that count (all of the phase's rows when none does)."""
    idx = [i for i, p in enumerate(phases) if p == phase]
    return [i for i in idx if counted[i]] or idx


def llm_features(batch: LLMBatch) -> dict[str, float]:
    """Feature values of a batch (tokens, or token products for attention terms)."""
    new = np.asarray(batch.prefill_tokens, dtype=float)
    cached = np.asarray(batch.prefill_cached or (0,) * len(new), dtype=float)
    ctx = np.asarray(batch.decode_context, dtype=float)
    if len(new):
        tok = float(new.sum())
        return {"seqs": float(len(new)), "tokens": tok, "tokens2": tok * tok,
                "attn": float((new * (cached + new)).sum())}
    return {"seqs": float(len(ctx)), "context": float(ctx.sum()),
            "padded": float(len(ctx) * ctx.max()) if len(ctx) else 0.0}


@dataclass
class PhaseFit:
    """A fitted linear model ``time_ns = intercept_ns + Σ coef[f] · feature f`` and its quality."""

    phase: str
    features: tuple[str, ...]
    intercept_ns: float
    coef: dict[str, float]
    n: int
    r2: float
    mape: float        # in-sample mean |relative error|
    loo_mape: float    # leave-one-out mean |relative error|
    candidates: dict[str, float] = field(default_factory=dict)  # feature set -> LOO MAPE

    def predict_ns(self, feats: dict[str, float]) -> float:
        return self.intercept_ns + sum(c * feats[f] for f, c in self.coef.items())

    def to_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "features": list(self.features), "intercept_ns": self.intercept_ns,
                "coef": self.coef, "n": self.n, "r2": self.r2, "mape": self.mape, "loo_mape": self.loo_mape,
                "candidates": self.candidates}


def _fit_one(x: np.ndarray, y: np.ndarray, total: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ordinary least squares with intercept (the conditional *mean*, so a run's total busy time is
    kept even when other jobs slow some iterations); returns (coefficients, LOO errors relative to
    ``total``, the whole iteration's time)."""
    a = np.column_stack([np.ones(len(y)), x])
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    resid = y - a @ coef
    pinv = np.linalg.pinv(a.T @ a)
    h = np.einsum("ij,jk,ik->i", a, pinv, a)
    loo = resid / np.clip(1 - h, 1e-9, None) / total
    return coef, loo


def fit_phase(phase: str, feats: list[dict[str, float]], y_ns: np.ndarray,
              candidates: list[tuple[str, ...]], priced_ns: np.ndarray | None = None) -> PhaseFit:
    """Best candidate feature set by leave-one-out relative error among fits with non-negative slopes.
    ``priced_ns``: the part of each iteration priced outside the fit (its weight GEMMs), for errors
    relative to the whole iteration."""
    y = np.asarray(y_ns, dtype=float)
    total = y + (np.asarray(priced_ns, dtype=float) if priced_ns is not None else 0.0)
    tried: dict[str, float] = {}
    best: tuple[float, tuple[str, ...], np.ndarray] | None = None
    for cand in candidates:
        x = np.array([[f[c] for c in cand] for f in feats], dtype=float)
        if len(y) <= len(cand) + 1 or np.linalg.matrix_rank(np.column_stack([np.ones(len(y)), x])) < len(cand) + 1:
            continue
        coef, loo = _fit_one(x, y, total)
        score = float(np.mean(np.abs(loo)))
        tried["+".join(cand)] = score
        if (coef[1:] < 0).any():
            continue
        if best is None or score < best[0] * 0.98:  # a bigger set must earn its keep
            best = (score, cand, coef)
    if best is None:  # too few or identical iterations: a constant
        mean = float(np.mean(y))
        return PhaseFit(phase, (), mean, {}, len(y), 0.0, float(np.mean(np.abs((y - mean) / total))), float("nan"),
                        tried)
    score, cand, coef = best
    x = np.array([[f[c] for c in cand] for f in feats], dtype=float)
    pred = coef[0] + x @ coef[1:]
    ss_tot = float(((total - total.mean()) ** 2).sum())   # of the whole iteration, priced part included
    r2 = 1 - float(((y - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
    return PhaseFit(phase, cand, float(coef[0]), {c: float(v) for c, v in zip(cand, coef[1:])}, len(y), r2,
                    float(np.mean(np.abs((pred - y) / total))), score, tried)


@dataclass
class IterationModel:
    """Time (ns) of an LLM serving iteration of any composition. ``correction[phase] = (a_ns, b)``
    maps the recorded (profiled) speed to the program's own: ``a_ns + b · t`` (identity: (0, 1))."""

    fits: dict[str, PhaseFit]
    loop_overhead_ns: float
    correction: dict[str, tuple[float, float]] = field(default_factory=dict)
    excluded: list[tuple[int, str, Exclusion]] = field(default_factory=list)  # (step, phase, reason) not fitted
    ranges: dict[str, dict[str, Range]] = field(default_factory=dict)  # phase -> driver -> range fitted on
    adapter: str = ""   # the engine adapter whose iterations it was fitted on ("": a serving log)
    notes: tuple[str, ...] = ()
    gemms: WeightGemms | None = None  # priced by their law; the fits are of the rest

    def extrapolation(self, batch: LLMBatch) -> tuple[str, ...]:
        """The drivers of ``batch`` (tokens, seqs, context) beyond the range its phase was fitted on."""
        phase = "prefill" if batch.prefill_tokens else "decode"
        d = Drivers.of(batch)
        return tuple(name for name, r in self.ranges.get(phase, {}).items() if r.outside(driver_value(d, name)))

    def _corrected(self, phase: str, t_ns: float, marginal: bool = False) -> float:
        a, b = self.correction.get(phase, (0.0, 1.0))
        return b * t_ns if marginal else a + b * t_ns

    def time_ns(self, batch: LLMBatch) -> float:
        """Iteration time (ns). A mixed batch (chunked prefill) costs its prefill plus the decode
        part's marginal time (the decode fit without its intercept): one forward pass, one overhead."""
        return max(self._time_ns(batch, corrected=True), 1.0)

    def raw_time_ns(self, batch: LLMBatch) -> float:
        """The recorded-speed time, before the profiler correction."""
        return self._time_ns(batch, corrected=False)

    def _time_ns(self, batch: LLMBatch, corrected: bool) -> float:
        if not batch.prefill_tokens and not batch.decode_context:
            return 0.0
        fix = self._corrected if corrected else (lambda phase, t, marginal=False: t)
        gemm = self.gemms.ns(Drivers.of(batch).tokens) if self.gemms is not None else 0.0
        if batch.prefill_tokens:
            p = LLMBatch(batch.prefill_tokens, batch.prefill_cached)
            t = fix("prefill", gemm + self._phase("prefill").predict_ns(llm_features(p)))
            if batch.decode_context:
                d = self._phase("decode")
                marg = d.predict_ns(llm_features(LLMBatch(decode_context=batch.decode_context))) - d.intercept_ns
                t += fix("decode", marg, marginal=True)
            return t
        return fix("decode", gemm + self._phase("decode").predict_ns(llm_features(batch)))

    def _phase(self, phase: str) -> PhaseFit:
        if phase not in self.fits:
            raise ServingLogError(f"the trace has no {phase} iterations: cannot price a {phase} batch")
        return self.fits[phase]

    def to_dict(self) -> dict[str, Any]:
        return {"loop_overhead_ns": self.loop_overhead_ns,
                "profiler_correction": {p: {"offset_ns": a, "scale": b} for p, (a, b) in self.correction.items()},
                "phases": {p: f.to_dict() for p, f in self.fits.items()}, "excluded": _excluded_dicts(self.excluded),
                "weight_gemms": self.gemms.to_dict() if self.gemms is not None else None}


def fit_llm_model(iters: pd.DataFrame, compositions: list[tuple[str, LLMBatch]],
                  gemms: WeightGemms | None = None) -> IterationModel:
    """Fit per phase on replayed iterations (:func:`replayed_iterations`) matched in order to the
    log's compositions; the phase sequences must agree. With ``gemms`` each phase is fitted on the
    iteration time less the weight GEMMs' priced time at its tokens (module doc)."""
    trace_phases = iters["phase"].tolist()
    log_phases = [p for p, _ in compositions]
    if trace_phases != log_phases:
        n = next((i for i, (a, b) in enumerate(zip(trace_phases, log_phases)) if a != b),
                 min(len(trace_phases), len(log_phases)))
        raise ServingLogError(f"trace and serving log disagree: {len(trace_phases)} phase steps vs "
                              f"{len(log_phases)} logged iterations, first difference at iteration {n} "
                              "(is the log from this recording?)")
    over = loop_overhead_ns(iters)
    priced = np.array([gemms.ns(Drivers.of(b).tokens) for _, b in compositions]) if gemms is not None \
        else np.zeros(len(compositions))
    y = iters["cycle_ns"].to_numpy(float) + over - priced
    counted = iters["included"].to_numpy(dtype=bool)
    fits = {}
    for phase, cands in (("prefill", PREFILL_CANDIDATES), ("decode", DECODE_CANDIDATES)):
        idx = _phase_rows(log_phases, counted, phase)
        if idx:
            fits[phase] = fit_phase(phase, [llm_features(compositions[i][1]) for i in idx], y[idx], cands,
                                    priced[idx])
    fitted = {i for phase in fits for i in _phase_rows(log_phases, counted, phase)}
    ranges = {}
    for phase in fits:
        drivers = [Drivers.of(compositions[i][1]) for i in _phase_rows(log_phases, counted, phase)]
        ranges[phase] = {name: Range(min(driver_value(d, name) for d in drivers),
                                     max(driver_value(d, name) for d in drivers)) for name in RANGE_DRIVERS}
    return IterationModel(fits=fits, loop_overhead_ns=over, excluded=_excluded(iters, fitted), ranges=ranges,
                          gemms=gemms)


def profiler_correction(model: IterationModel,
                        plain: list[tuple[str, LLMBatch, float]]) -> dict[str, tuple[float, float]]:
    """Per phase: ``(a_ns, b)`` such that the un-profiled program's iteration takes ``a_ns + b · t``
    where ``t`` is the model's recorded (profiled) time of the same composition, fitted by least
    squares on an un-profiled run of the *recorded* configuration ((phase, batch, logged ms) per
    iteration). The profiler's cost is mostly a fixed amount per recorded op (so an offset, large
    next to a small model's CPU iterations) plus a proportional part; a single ratio would leave
    the fixed part in. Falls back to a ratio (``a = 0``) with fewer than 8 iterations or a
    non-positive slope."""
    out: dict[str, tuple[float, float]] = {}
    for phase in model.fits:
        rows = [(model.raw_time_ns(b), d * 1e6) for p, b, d in plain if p == phase]
        if not rows:
            continue
        x, y = (np.asarray(v, dtype=float) for v in zip(*rows))
        if len(rows) >= 8 and np.ptp(x) > 0:
            b, a = np.polyfit(x, y, 1)
            if b > 0:
                out[phase] = (float(a), float(b))
                continue
        out[phase] = (0.0, float(np.median(y / x)))
    return out


@dataclass
class DitStepModel:
    """Time (ns) of one denoising step at a model batch and token count, fitted at ``tokens_ref``.

    Two resources, as the replay sees them: the CPU thread's own work per step (``cpu``, what the
    step takes when every GPU task takes zero time) and the GPU's work (``attn``, attention kernels,
    growing with the model batch and the square of the tokens; ``rest``, every other GPU task,
    growing with the model batch and the tokens). The step takes the larger of the two plus
    ``overlap_ns``, the part of the recorded step that neither explains (dependencies between them):

        step(b, T) = max(cpu(b), attn(b) r^2 + rest(b) r) + overlap_ns,   r = T / tokens_ref

    so a launch-bound step (cpu > GPU work) does not grow with the tokens until its GPU work
    overtakes the CPU, and a GPU-bound one grows with its GPU work. Each of ``cpu``, ``attn`` and
    ``rest`` is a line (intercept_ns, slope_ns per model-batch element) over the model batches the
    recording saw; with one model batch the GPU lines go through zero (work per element) and the
    CPU line is flat (one launch sequence per step whatever the batch). Beyond the tokens and model
    batches it was fitted on (:attr:`ranges`) it extrapolates; :meth:`extrapolation` names the
    drivers of a step out there, so the simulator can count them and the output warn.
    """

    tokens_ref: int
    attn: tuple[float, float]   # GPU attention work: intercept_ns, ns per model-batch element at tokens_ref
    rest: tuple[float, float]   # every other GPU task, likewise
    cpu: tuple[float, float]    # the step with zero-time GPU work (the CPU thread's own work)
    overlap_ns: float
    batch_overhead_ns: float    # per served batch, outside the steps (noise, result copy)
    n: int
    mape: float
    loo_mape: float
    batches_seen: list[int] = field(default_factory=list)
    factor: float = 1.0
    excluded: list[tuple[int, str, Exclusion]] = field(default_factory=list)  # (step, phase, reason) not fitted

    def gpu_ns(self, model_batch: int, tokens: int) -> float:
        r = tokens / self.tokens_ref
        return self.attn[0] + self.attn[1] * model_batch * r * r + self.rest[0] + self.rest[1] * model_batch * r

    def step_ns(self, model_batch: int, tokens: int) -> float:
        cpu = self.cpu[0] + self.cpu[1] * model_batch
        return max(max(cpu, self.gpu_ns(model_batch, tokens)) + self.overlap_ns, 1.0) * self.factor

    @property
    def ranges(self) -> dict[str, Range]:
        """The drivers the model was fitted on: its one latent-token count (``tokens``) and the
        model batches the recording saw (``model_batch``, when it says)."""
        out = {"tokens": Range(float(self.tokens_ref), float(self.tokens_ref))}
        if self.batches_seen:
            out["model_batch"] = Range(float(min(self.batches_seen)), float(max(self.batches_seen)))
        return out

    def extrapolation(self, model_batch: int, tokens: int) -> dict[str, float]:
        """The drivers of a step (``tokens``, ``model_batch``) beyond the range the model was fitted
        on, by the LLM models' rule (:meth:`Range.outside`), with their values; empty: within range.

        >>> m = DitStepModel(tokens_ref=256, attn=(0.0, 1.0), rest=(0.0, 1.0), cpu=(0.0, 0.0), overlap_ns=0.0,
        ...                  batch_overhead_ns=0.0, n=1, mape=0.0, loo_mape=0.0, batches_seen=[1])
        >>> m.extrapolation(1, 300), m.extrapolation(1, 4096), m.extrapolation(2, 64)
        ({}, {'tokens': 4096.0}, {'tokens': 64.0, 'model_batch': 2.0})
        """
        value = {"tokens": float(tokens), "model_batch": float(model_batch)}
        return {name: value[name] for name, r in self.ranges.items() if r.outside(value[name])}

    def to_dict(self) -> dict[str, Any]:
        return {"tokens_ref": self.tokens_ref, "attention_ns": list(self.attn), "rest_ns": list(self.rest),
                "cpu_ns": list(self.cpu), "overlap_ns": self.overlap_ns,
                "batch_overhead_ns": self.batch_overhead_ns, "n": self.n, "mape": self.mape,
                "loo_mape": self.loo_mape, "model_batches_seen": self.batches_seen, "profiler_correction": self.factor,
                "excluded": _excluded_dicts(self.excluded)}


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares line (intercept, slope); a constant's slope is 0, a single x goes through 0."""
    if len(np.unique(x)) < 2:
        return 0.0, float(np.mean(y) / np.mean(x))
    slope, icpt = np.polyfit(x, y, 1)
    if slope < 0:
        return float(np.mean(y)), 0.0
    return float(icpt), float(slope)


def _flat_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares line, flat (the median) when ``x`` takes one value or the slope is negative."""
    if len(np.unique(x)) < 2:
        return float(np.median(y)), 0.0
    slope, icpt = np.polyfit(x, y, 1)
    return (float(np.median(y)), 0.0) if slope < 0 else (float(icpt), float(slope))


@dataclass(frozen=True)
class DitStepWork:
    """Per replayed denoising step (aligned with the iterations): the step with zero-time GPU work
    (``cpu_ns``) and the GPU's attention and other work (``attn_ns``, ``rest_ns``), ns."""

    cpu_ns: np.ndarray
    attn_ns: np.ndarray
    rest_ns: np.ndarray


def gpu_work_per_step(graph: TaskGraph, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(attention, other) GPU busy time of each of ``steps``, ns: the summed durations of the GPU
    tasks (kernels, copies, memsets, collectives) of the step, the slowest rank's."""
    t = graph.tasks
    gpu = np.isin(t["kind"].to_numpy(), [int(k) for k in GPU_WORK_KINDS])
    names = t["name"].astype(str).to_numpy()[gpu]
    attention = {n: is_attention(n) for n in np.unique(names).tolist()}
    frame = pd.DataFrame({"rank": t["rank"].to_numpy()[gpu], "step": t["step"].to_numpy()[gpu],
                          "dur": t["dur_ns"].to_numpy()[gpu].astype(float)})
    frame["attn"] = np.where([attention[n] for n in names.tolist()], frame["dur"], 0.0)
    per = frame.groupby(["step", "rank"]).agg(attn=("attn", "sum"), dur=("dur", "sum")).groupby("step").max()
    per = per.reindex(steps, fill_value=0.0)
    return per["attn"].to_numpy(float), (per["dur"] - per["attn"]).to_numpy(float)


def fit_dit_model(iters: pd.DataFrame, compositions: list[tuple[int, int]], work: DitStepWork,
                  batch_overhead_ns: float = 0.0) -> DitStepModel:
    """Fit on replayed denoising steps matched in order to the log's (model batch, tokens); the
    steps that count only (all of them when none does). ``work`` holds each step's CPU-only time
    and GPU work, aligned with ``iters``."""
    if len(iters) != len(compositions):
        raise ServingLogError(f"trace and serving log disagree: {len(iters)} denoise steps vs "
                              f"{len(compositions)} logged steps (is the log from this recording?)")
    tokens = {t for _, t in compositions}
    if len(tokens) != 1:
        raise ServingLogError("the DiT log mixes token counts; record one resolution")
    over = loop_overhead_ns(iters)
    used = np.flatnonzero(_counted(iters))
    mb = np.array([b for b, _ in compositions], dtype=float)[used]
    y = (iters["cycle_ns"].to_numpy(float) + over)[used]
    cpu_y = work.cpu_ns[used] + over
    attn_y, rest_y = work.attn_ns[used], work.rest_ns[used]

    def fit(rows: np.ndarray) -> tuple[tuple[float, float], tuple[float, float], tuple[float, float], float]:
        a, r, c = _line(mb[rows], attn_y[rows]), _line(mb[rows], rest_y[rows]), _flat_line(mb[rows], cpu_y[rows])
        bound = np.maximum(c[0] + c[1] * mb[rows], a[0] + a[1] * mb[rows] + r[0] + r[1] * mb[rows])
        return a, r, c, max(float(np.median(y[rows] - bound)), 0.0)

    def predict(model: tuple[tuple[float, float], tuple[float, float], tuple[float, float], float],
                rows: np.ndarray) -> np.ndarray:
        a, r, c, o = model
        return np.maximum(c[0] + c[1] * mb[rows], a[0] + a[1] * mb[rows] + r[0] + r[1] * mb[rows]) + o

    everything = np.arange(len(y))
    fitted = fit(everything)
    loo = [abs(predict(fit(everything[everything != i]), np.array([i]))[0] - y[i]) / y[i]
           for i in range(len(y)) if len(y) > 1]
    a, r, c, o = fitted
    return DitStepModel(tokens_ref=tokens.pop(), attn=a, rest=r, cpu=c, overlap_ns=o,
                        batch_overhead_ns=batch_overhead_ns, n=len(y),
                        mape=float(np.mean(np.abs(predict(fitted, everything) / y - 1))),
                        loo_mape=float(np.mean(loo)) if loo else float("nan"),
                        batches_seen=sorted({int(b) for b in mb}), excluded=_excluded(iters, set(used.tolist())))
