"""A serving iteration's time from its operators' costs at the batch it runs (issue 18, item 3).

The least-squares model (:mod:`.iteration_model`) fits a line through the recorded iterations and
knows nothing outside them. This model prices an iteration the way the hardware runs it, so it
extrapolates in batch size and context length:

* **Anchors.** Every recorded iteration found by an engine adapter (:mod:`.engines`) is an anchor:
  its GPU kernels with their replayed durations (the scenario's, when a scenario changed them),
  the CPU thread's own time (the replay with every GPU task at zero time), and what the two leave
  between them (``overlap``: launch lead, synchronizations).
* **Each kernel moves with the part of the batch that drives it** (:class:`KernelLaw`), by the
  rule of :func:`~whatif.predictors.costs.anchored_time_ns`: the time above the device's fixed
  latency scales like the kernel's achievable roofline time (Williams et al. 2009), so the kernel
  keeps the efficiency it was measured at.

  - ``GEMM`` (weights × activations): ``A(x) = √((2·P·⌈x⌉₆₄ / F)² + (s·P / BW)²)`` for x tokens
    through a weight of P parameters of s bytes (:func:`~whatif.hardware.roofline.weight_gemm_ns`):
    the rows padded to whole tiles of 64 (a decode of 65 sequences computes 128 rows), F the
    achievable rate of the largest GEMMs, BW the streaming bandwidth, compute and weight reads
    overlapped imperfectly (the root of the sum of squares, √2 × the roofline's max at the ridge).
    Below the knee ``x* = s·F / (2·BW)`` tokens (≈ 250 on an H100 in bf16) a GEMM mostly reads its
    weights, flat within a tile of rows and a step at each new tile; above it the time grows with
    the tokens. Against Vidur's measured A100/A40 layer GEMMs (50 model × TP curves, 1-1,024
    tokens) this form errs by 7.4 % (median) where ``max`` at the size-dependent rate erred by 21 %
    (bench/serving_op_laws.py).
  - ``ATTENTION``: FLOPs ``4·d·H·pairs`` (query-key pairs: causal prompt pairs plus one per decode
    context token) against bytes ``s·d·(2·H_kv·keys + 2·H·queries)``: a decode step reads the KV
    cache (memory-bound, ∝ Σ context), a prefill computes (∝ pairs); ``H/H_kv`` from the memory
    model's shape (GQA-aware), MHA when the trace does not say.
  - ``PER_TOKEN`` (elementwise, norms, rotary, copies, sampling, collectives of activations):
    the measured time plus ``(x − x0) · 4·h·s / BW`` (each token more reads and writes about four
    activation vectors of the hidden size h at the streaming bandwidth), never below the fixed
    latency. Small kernels are mostly fixed cost (a decode's norm moves kilobytes in microseconds),
    so scaling their whole time with the tokens would grow them far faster than the bytes they
    move. Without a hidden size (no transformer block found) the time above the fixed latency
    scales with the tokens.

* **Iteration time** of a batch b from anchor i: ``max(cpu_i(b), gpu_i(b)) + overlap_i`` where
  ``gpu_i(b) = busy_i · Σ_k t_k(b) / Σ_k t_k`` (the anchor's GPU busy time, the union over its
  streams, scaled by its kernels' new total) and ``cpu_i(b) = cpu_i + c_seq · (seqs(b) − seqs_i)``
  with ``c_seq`` the CPU time per
  sequence fitted over the anchors (≥ 0; zero with fewer than three distinct batch sizes). The
  prediction is the mean over the ``k`` anchors nearest in (tokens, context) of the same phase
  (any phase when none), times the phase's **residual**: the median, over anchors, of measured /
  predicted from the other anchors (leave-one-out), 1 with one anchor.
* **Out of range.** :meth:`CostIterationModel.extrapolation` names the drivers of a batch beyond
  what the anchors saw (more than 25 % beyond the largest or below the smallest), so the output
  can warn.

What it leaves out (docs/serving.md): the LM head's GEMM runs on one token per sequence in a
prefill (priced here by all tokens); CUDA-graph padding to the captured batch size; a collective's
latency beyond the device's fixed latency; per-sequence context lengths when an engine reports
only their sum (attention depends on the sum).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import IntEnum

import numpy as np
import pandas as pd

from whatif.core.dtypes import DType, dtype_in_kernel_name, element_bytes
from whatif.core.kernels import KernelClass, classify_kernel
from whatif.depgraph.graph import GPU_WORK_KINDS, TaskGraph
from whatif.hardware.devices import Device
from whatif.hardware.roofline import LARGE_GEMM_FLOPS, fixed_latency_ns, weight_gemm_ns
from whatif.predictors.bounds import union_ns
from whatif.predictors.replay import Replay, replay
from whatif.transforms.base import TransformContext
from whatif.transforms.generic import Scale
from whatif.transforms.optimizations.gpu import current_device
from whatif.transforms.parallel.memory import DEFAULT_HEAD_DIM, ModelShape
from whatif.transforms.select import Selector, kernel_classes

from .engines import CompositionSource, FoundIterations, IterationPhase, iteration_of_tasks, iteration_spans
from .logs import LLMBatch, ServingLogError

NEAREST = 4            # anchors averaged per prediction
RANGE_SLACK = 1.25     # a driver this far beyond the anchors' range is extrapolated
ACTIVATIONS_PER_TOKEN = 4  # hidden-size vectors a per-token kernel reads and writes per token (2 in, 1-2 out)
MIN_CPU_FIT = 3        # distinct batch sizes needed to fit the CPU time per sequence
GPU_BOUND_SHARE = 0.5  # GPU busy share of a replay above which its weight GEMMs add to each iteration


class KernelLaw(IntEnum):
    """How a kernel's work moves with the batch an iteration runs."""

    GEMM = 0        # weights × tokens: flat below the knee, ∝ tokens above it
    ATTENTION = 1   # ∝ query-key pairs (compute) or keys read (memory)
    PER_TOKEN = 2   # ∝ tokens (activations)


def kernel_law(kernel_class: KernelClass) -> KernelLaw:
    """The law of a kernel class.

    >>> kernel_law(KernelClass.GEMM).name, kernel_law(KernelClass.NORMALIZATION).name
    ('GEMM', 'PER_TOKEN')
    """
    if kernel_class in (KernelClass.GEMM, KernelClass.CONV):
        return KernelLaw.GEMM
    if kernel_class is KernelClass.ATTENTION:
        return KernelLaw.ATTENTION
    return KernelLaw.PER_TOKEN


GEMM_LAW_CLASSES = [c.value for c in KernelClass if kernel_law(c) is KernelLaw.GEMM]


@dataclass(frozen=True)
class Drivers:
    """The parts of a batch that drive its kernels: ``tokens`` through the weights (prompt tokens +
    one per decoding sequence), ``seqs``, query-key ``pairs`` (causal prompt pairs + each decode
    context), ``keys`` read from the KV cache, ``context`` (Σ decode context)."""

    tokens: float
    seqs: float
    pairs: float
    keys: float
    context: float

    @classmethod
    def of(cls, batch: LLMBatch) -> Drivers:
        """
        >>> Drivers.of(LLMBatch(prefill_tokens=(4,), decode_context=(10, 20)))
        Drivers(tokens=6.0, seqs=3.0, pairs=40.0, keys=34.0, context=30.0)
        """
        new = np.asarray(batch.prefill_tokens, dtype=float)
        cached = np.asarray(batch.prefill_cached or (0,) * len(new), dtype=float)
        ctx = np.asarray(batch.decode_context, dtype=float)
        pairs = float((new * cached + new * (new + 1) / 2).sum() + ctx.sum())
        return cls(tokens=float(new.sum() + len(ctx)), seqs=float(len(new) + len(ctx)), pairs=pairs,
                   keys=float((cached + new).sum() + ctx.sum()), context=float(ctx.sum()))


_RATE_GRID_FLOPS = np.logspace(3, np.log10(LARGE_GEMM_FLOPS), 131)   # where the GEMM-rate curve is sampled


@dataclass(frozen=True)
class DeviceLaw:
    """What the laws read from the device, in the iteration's dtype: element bytes ``s``, the
    streaming bandwidth, the achievable GEMM rate as a function of a GEMM's FLOPs (sampled from
    :meth:`~whatif.hardware.devices.Device.achievable_matrix_flops` at ten points a decade and
    interpolated in log-log, within 0.3 % of it), the
    attention shape (head size, query heads per KV head) and the bytes a per-token kernel moves
    per token. ``proportional``: no cataloged device, so GEMMs scale with the tokens, attention
    with the keys read."""

    elem_bytes: float
    bw_bytes_per_ns: float
    log_rate: np.ndarray          # log(FLOP/ns) at _RATE_GRID_FLOPS
    head_dim: int
    gqa: float
    token_bytes: float            # ACTIVATIONS_PER_TOKEN · h · s (0: hidden size unknown)
    fixed_ns: float
    proportional: bool = False

    @classmethod
    def of(cls, device: Device | None, dtype: DType, gqa: float, head_dim: int, hidden: int = 0) -> DeviceLaw:
        s = element_bytes(dtype.value) or 2.0
        fixed = fixed_latency_ns(device)
        if device is None:
            return cls(elem_bytes=s, bw_bytes_per_ns=1.0, log_rate=np.zeros(len(_RATE_GRID_FLOPS)),
                       head_dim=head_dim, gqa=gqa, token_bytes=0.0, fixed_ns=fixed, proportional=True)
        rates = np.array([device.achievable_matrix_flops(dtype, f) for f in _RATE_GRID_FLOPS]) / 1e9
        return cls(elem_bytes=s, bw_bytes_per_ns=device.stream_bw_bytes_per_s / 1e9, log_rate=np.log(rates),
                   head_dim=head_dim, gqa=gqa, token_bytes=ACTIVATIONS_PER_TOKEN * hidden * s, fixed_ns=fixed)

    @property
    def knee_tokens(self) -> float:
        """Tokens above which a large GEMM's FLOPs outlast its weight reads: ``s·F / (2·BW)``."""
        return self.elem_bytes * self.large_rate / (2.0 * self.bw_bytes_per_ns)

    def rate(self, flops: np.ndarray) -> np.ndarray:
        """Achievable FLOP/ns of GEMMs of ``flops`` FLOPs."""
        return np.exp(np.interp(np.log(np.maximum(flops, 1.0)), np.log(_RATE_GRID_FLOPS), self.log_rate))

    @property
    def large_rate(self) -> float:
        """Achievable FLOP/ns of the largest GEMMs (the tensor cores' rate once a tile computes)."""
        return float(np.exp(self.log_rate[-1]))

    def gemm_ns(self, params: np.ndarray, tokens: float) -> np.ndarray:
        """Achievable time of GEMMs of ``params`` weights each over ``tokens`` tokens:
        :func:`~whatif.hardware.roofline.weight_gemm_ns` at the rate of the largest GEMMs."""
        if self.proportional:
            return 2.0 * params * tokens
        return weight_gemm_ns(params, tokens, self.elem_bytes, self.large_rate, self.bw_bytes_per_ns)

    def implied_params(self, var_ns: np.ndarray, tokens: float) -> np.ndarray:
        """The weights ``P`` whose achievable time at ``tokens`` is ``var_ns`` (the kernel kept at the
        efficiency it was measured at); the law is linear in the weights."""
        return var_ns / np.maximum(self.gemm_ns(np.ones(1), tokens), 1e-12)

    def attention_ns(self, heads: np.ndarray, d: Drivers) -> np.ndarray:
        """Achievable time of attention over ``heads`` KV heads (each with ``gqa`` query heads):
        FLOPs ``4·d·g·pairs`` against bytes ``2·s·d·keys + 2·s·d·g·queries`` per KV head."""
        unit_bytes = 2.0 * self.elem_bytes * self.head_dim * (d.keys + self.gqa * d.tokens)
        if self.proportional:
            return heads * unit_bytes
        flops = heads * 4.0 * self.head_dim * self.gqa * d.pairs
        return np.maximum(flops / self.rate(flops), heads * unit_bytes / self.bw_bytes_per_ns)

    def implied_heads(self, var_ns: np.ndarray, d: Drivers) -> np.ndarray:
        """The KV heads (× layers, in one kernel) whose achievable attention time at ``d`` is ``var_ns``."""
        heads = var_ns / np.maximum(self.attention_ns(np.ones(1), d), 1e-12)
        for _ in range(4):
            heads = heads * var_ns / np.maximum(self.attention_ns(heads, d), 1e-12)
        return heads


@dataclass(frozen=True)
class WeightGemms:
    """The weight GEMMs of one iteration: ``params`` weights (every layer's, one forward pass) on the
    device ``law``; their time at x tokens is ``scale`` × :meth:`DeviceLaw.gemm_ns` (linear in the
    weights, so one GEMM of all of them prices the same as each layer's). ``scale``: how much a
    scenario changed the GEMMs' time (1 on the recorded trace; a ``gpu`` scenario keeps the recorded
    GPU's knee and tile step, scaled).

    >>> from whatif.hardware.devices import get_device
    >>> g = WeightGemms.of(6.5e9 * 2, get_device("A100_SXM_80GB"))   # Llama-2-7B's layers in bf16
    >>> [round(g.ns(x) / 1e6, 2) for x in (1, 64, 65, 128)]          # ms: one tile of rows, then two
    [8.0, 8.0, 9.61, 9.61]
    """

    params: float
    law: DeviceLaw
    device: str = ""
    scale: float = 1.0

    @classmethod
    def of(cls, weight_bytes: float, device: Device, dtype: DType = DType.BF16) -> WeightGemms:
        law = DeviceLaw.of(device, dtype, 1.0, 128)
        return cls(params=weight_bytes / law.elem_bytes, law=law, device=device.name)

    def ns(self, tokens: float) -> float:
        return self.scale * float(self.law.gemm_ns(np.array([self.params]), max(tokens, 1.0))[0])

    def to_dict(self) -> dict[str, float | str]:
        return {"params": self.params, "device": self.device, "scale": self.scale, "ns_at_1_token": self.ns(1.0),
                "knee_tokens": self.law.knee_tokens}


@dataclass(frozen=True)
class Kernels:
    """Measured kernels of one iteration, each with its law, its fixed part (at most the device's
    fixed latency), the part above it and its inferred size (GEMM: the weights P; attention: the
    KV heads × layers it covers; per-token: ns per token more or fewer), recorded at ``drivers``."""

    law: np.ndarray
    fixed_ns: np.ndarray
    var_ns: np.ndarray
    size: np.ndarray
    drivers: Drivers

    @classmethod
    def measured(cls, laws: np.ndarray, dur_ns: np.ndarray, drivers: Drivers, dev: DeviceLaw) -> Kernels:
        """Kernels of measured durations ``dur_ns`` and laws ``laws`` at ``drivers``.

        >>> from whatif.hardware.devices import get_device
        >>> dev = DeviceLaw.of(get_device("H100_SXM"), DType.BF16, 4.0, 128, 4096)
        >>> k = Kernels.measured(np.array([KernelLaw.GEMM]), np.array([100_000.0]), Drivers.of(
        ...     LLMBatch(decode_context=(512,) * 8)), dev)
        >>> [round(t / 1e3) for t in (k.at(Drivers.of(LLMBatch(decode_context=(512,) * n)), dev)[0]
        ...                             for n in (1, 64, 65, 2048))]   # us: one tile of rows, then two, then FLOPs
        [100, 100, 108, 763]
        """
        law = laws.astype(np.int8)
        fixed = np.minimum(dur_ns, dev.fixed_ns)
        var = dur_ns - fixed
        tokens = max(drivers.tokens, 1.0)
        per_token = dev.token_bytes / dev.bw_bytes_per_ns if dev.token_bytes > 0 else var / tokens
        size = np.where(law == KernelLaw.PER_TOKEN, per_token, 0.0)
        gemm, attn = law == KernelLaw.GEMM, law == KernelLaw.ATTENTION
        size[gemm] = dev.implied_params(var[gemm], tokens)
        size[attn] = dev.implied_heads(var[attn], drivers)
        return cls(law=law, fixed_ns=fixed, var_ns=var, size=size, drivers=drivers)

    @property
    def sum_ns(self) -> float:
        return float(self.fixed_ns.sum() + self.var_ns.sum())

    def at(self, d: Drivers, dev: DeviceLaw) -> np.ndarray:
        """Each kernel's time at drivers ``d``: its fixed part plus its law's achievable time."""
        var = np.empty(len(self.law))
        gemm, attn = self.law == KernelLaw.GEMM, self.law == KernelLaw.ATTENTION
        tok = self.law == KernelLaw.PER_TOKEN
        var[gemm] = dev.gemm_ns(self.size[gemm], d.tokens)
        var[attn] = dev.attention_ns(self.size[attn], d)
        var[tok] = np.maximum(self.var_ns[tok] + (d.tokens - self.drivers.tokens) * self.size[tok], 0.0)
        return self.fixed_ns + var


@dataclass
class Anchor:
    """One recorded iteration: its composition, replayed cycle, CPU-only time, GPU busy time, the
    overlap left between them, and its GPU kernels."""

    phase: str
    batch: LLMBatch
    drivers: Drivers
    cycle_ns: float
    cpu_ns: float
    gpu_busy_ns: float
    overlap_ns: float
    kernels: Kernels

    def gpu_ns(self, d: Drivers, dev: DeviceLaw) -> float:
        """The anchor's GPU busy time at drivers ``d``: its kernels' new total, scaled by the
        anchor's busy / sum (the overlap of its streams)."""
        total = self.kernels.sum_ns
        if not len(self.kernels.law) or total <= 0:
            return self.gpu_busy_ns
        return self.gpu_busy_ns * float(self.kernels.at(d, dev).sum()) / total

    def time_ns(self, d: Drivers, dev: DeviceLaw, cpu_per_seq_ns: float) -> float:
        cpu = max(self.cpu_ns + cpu_per_seq_ns * (d.seqs - self.drivers.seqs), 0.0)
        return max(cpu, self.gpu_ns(d, dev)) + self.overlap_ns


@dataclass(frozen=True)
class Range:
    """The smallest and largest value of a driver the anchors saw."""

    low: float
    high: float

    def outside(self, value: float) -> bool:
        return value > self.high * RANGE_SLACK or value < self.low / RANGE_SLACK


@dataclass
class RangeTally:
    """The simulated iterations whose batch left the range their model was fitted on: how many,
    how many per driver, and the smallest and largest value each driver took out there (what the
    serving output's warning reports, for the LLM and the DiT models alike)."""

    iterations: int = 0
    drivers: dict[str, int] = field(default_factory=dict)
    values: dict[str, tuple[float, float]] = field(default_factory=dict)

    def add(self, beyond: dict[str, float], iterations: int = 1) -> None:
        """Count ``iterations`` iterations whose drivers ``beyond`` (name -> value) left the range
        (nothing when ``beyond`` is empty).

        >>> t = RangeTally()
        >>> t.add({"tokens": 4096.0}, 28); t.add({}); t.add({"tokens": 1024.0})
        >>> t.iterations, t.drivers, t.values
        (29, {'tokens': 29}, {'tokens': (1024.0, 4096.0)})
        """
        if not beyond:
            return
        self.iterations += iterations
        for name, value in beyond.items():
            self.drivers[name] = self.drivers.get(name, 0) + iterations
            low, high = self.values.get(name, (value, value))
            self.values[name] = (min(low, value), max(high, value))


@dataclass
class PhaseCosts:
    """The anchors of one phase, their CPU time per sequence, residual and ranges."""

    phase: str
    anchors: list[Anchor]
    cpu_per_seq_ns: float
    residual: float
    loo_mape: float
    ranges: dict[str, Range]

    def gpu_ns_by_law(self) -> dict[KernelLaw, float]:
        """Mean GPU time per anchor by kernel law (ns, measured durations)."""
        out = {}
        for law in KernelLaw:
            out[law] = float(np.mean([(a.kernels.fixed_ns + a.kernels.var_ns)[a.kernels.law == law].sum()
                                      for a in self.anchors]))
        return out


@dataclass
class CostIterationModel:
    """Time (ns) of an LLM serving iteration of any composition, from its anchors' operator costs.
    ``correction[phase] = (a_ns, b)`` maps the profiled speed to the program's own (as
    :class:`~.iteration_model.IterationModel`'s)."""

    phases: dict[str, PhaseCosts]
    device_law: DeviceLaw
    loop_overhead_ns: float
    adapter: str
    source: CompositionSource
    notes: tuple[str, ...] = ()
    correction: dict[str, tuple[float, float]] = field(default_factory=dict)
    _memo: dict[LLMBatch, float] = field(default_factory=dict, repr=False)

    def time_ns(self, batch: LLMBatch) -> float:
        """Iteration time (ns) of ``batch``, at the program's own speed (profiler-corrected)."""
        raw = self._memo.get(batch)
        if raw is None:
            raw = self._memo[batch] = self.raw_time_ns(batch)
        a, b = self.correction.get(self._phase_of(batch).phase, (0.0, 1.0))
        return max(a + b * raw, 1.0) if raw > 0 else 0.0

    def raw_time_ns(self, batch: LLMBatch) -> float:
        """The recorded-speed time (before the profiler correction)."""
        if not batch.prefill_tokens and not batch.decode_context:
            return 0.0
        pc = self._phase_of(batch)
        d = Drivers.of(batch)
        return pc.residual * _mean_nearest(pc.anchors, d, self.device_law, pc.cpu_per_seq_ns) + self.loop_overhead_ns

    def _phase_of(self, batch: LLMBatch) -> PhaseCosts:
        want = batch.phase
        for p in (want, "prefill" if batch.prefill_tokens else "decode", *self.phases):
            if p in self.phases:
                return self.phases[p]
        raise ServingLogError("no recorded iteration to price a batch from")

    def extrapolation(self, batch: LLMBatch) -> tuple[str, ...]:
        """The drivers of ``batch`` beyond what the anchors of its phase saw (empty: within range)."""
        pc = self._phase_of(batch)
        d = Drivers.of(batch)
        return tuple(name for name, r in pc.ranges.items() if r.outside(driver_value(d, name)))


def driver_value(d: Drivers, name: str) -> float:
    """The value of driver ``name`` (one of :data:`RANGE_DRIVERS`)."""
    return {"tokens": d.tokens, "seqs": d.seqs, "context": d.context}[name]


RANGE_DRIVERS = ("tokens", "seqs", "context")


def _distance(a: Drivers, b: Drivers) -> float:
    def lg(x: float, y: float) -> float:
        return abs(math.log((x + 1.0) / (y + 1.0)))
    return lg(a.tokens, b.tokens) + lg(a.seqs, b.seqs) + lg(a.keys, b.keys)


def _mean_nearest(anchors: list[Anchor], d: Drivers, dev: DeviceLaw, cpu_per_seq_ns: float) -> float:
    order = sorted(range(len(anchors)), key=lambda i: (_distance(anchors[i].drivers, d), i))[:NEAREST]
    return float(np.mean([anchors[i].time_ns(d, dev, cpu_per_seq_ns) for i in order]))


def _cpu_per_seq(anchors: list[Anchor]) -> float:
    seqs = np.array([a.drivers.seqs for a in anchors])
    if len(np.unique(seqs)) < MIN_CPU_FIT:
        return 0.0
    cpu = np.array([a.cpu_ns for a in anchors])
    slope = float(np.polyfit(seqs, cpu, 1)[0])
    return max(slope, 0.0)


GPU_SHARE_NOTED = 0.1
"""A phase whose recorded iterations keep the GPU busy less than this share of their time gets a
note (:func:`gpu_share_note`)."""


def gpu_share_note(phase: str, anchors: list[Anchor]) -> str:
    """A line when the GPU works only a small share of the ``phase`` iterations' recorded time
    (below :data:`GPU_SHARE_NOTED`): the rest is CPU time or waiting, which every predicted
    iteration keeps; empty otherwise, and for iterations without GPU work.

    >>> a = Anchor("decode", None, None, 473.8e6, 473.6e6, 9.8e6, 0.0, None)   # the SGLang MI300X trace
    >>> gpu_share_note("decode", [a])[:78]
    "the GPU works 9.8 ms of the decode iteration's 473.8 ms (2%): the rest is CPU "
    """
    cycle = float(sum(a.cycle_ns for a in anchors))
    busy = float(sum(a.gpu_busy_ns for a in anchors))
    if cycle <= 0 or busy <= 0 or busy / cycle >= GPU_SHARE_NOTED:
        return ""
    n = len(anchors)
    whose = f"the {phase} iteration's" if n == 1 else f"the {n} {phase} iterations' mean"
    return (f"the GPU works {busy / n / 1e6:,.1f} ms of {whose} {cycle / n / 1e6:,.1f} ms ({busy / cycle:.0%}): the "
            f"rest is CPU time or waiting (a blocking call's wait counts as CPU time), which every predicted "
            f"iteration keeps, so TTFT and TPOT inherit it")


def _phase_costs(phase: str, anchors: list[Anchor], dev: DeviceLaw) -> PhaseCosts:
    c_seq = _cpu_per_seq(anchors)
    ratios = []
    for i, a in enumerate(anchors):
        others = anchors[:i] + anchors[i + 1:]
        if others:
            pred = _mean_nearest(others, a.drivers, dev, c_seq)
            if pred > 0 and a.cycle_ns > 0:
                ratios.append(a.cycle_ns / pred)
    residual = float(np.median(ratios)) if ratios else 1.0
    loo = float(np.mean(np.abs(1.0 - np.asarray(ratios) / residual))) if ratios else float("nan")
    ranges = {name: Range(min(driver_value(a.drivers, name) for a in anchors),
                          max(driver_value(a.drivers, name) for a in anchors)) for name in RANGE_DRIVERS}
    return PhaseCosts(phase=phase, anchors=anchors, cpu_per_seq_ns=c_seq, residual=residual, loo_mape=loo,
                      ranges=ranges)


def cpu_only_replay(rp: Replay) -> Replay:
    """``rp``'s graph replayed with every GPU task at zero time: what the CPU threads' own work
    (Python, dispatch, launches, synchronizations) takes, the floor a faster GPU cannot go below."""
    return replay(Scale(select=Selector(kind="gpu"), factor=0.0).apply(rp.graph, TransformContext()))


def iteration_dtype(graph: TaskGraph) -> DType:
    """The dtype the GEMM kernels' names spell most often (by time), bf16 when none does."""
    t = graph.tasks
    gpu = np.isin(t["kind"].to_numpy(), [int(k) for k in GPU_WORK_KINDS])
    per_name = t.loc[gpu].groupby(t.loc[gpu, "name"].astype(str))["dur_ns"].sum()
    seen: dict[DType, float] = {}
    for name, dur_ns in per_name.items():
        dt = dtype_in_kernel_name(str(name))
        if dt is not None:
            seen[dt] = seen.get(dt, 0.0) + float(dur_ns)
    return max(seen, key=lambda k: (seen[k], k.value)) if seen else DType.BF16


def gpu_busy_share(rp: Replay, gpu: np.ndarray) -> float:
    """The largest share, over ranks, of a rank's serving iterations (its steps that run a phase,
    every step when none does; first task start to last task end, so idle time between iterations
    does not count) that its GPU work covers (the union over its streams)."""
    t = rp.graph.tasks
    frame = pd.DataFrame({"rank": t["rank"].to_numpy(), "step": t["step"].to_numpy(),
                          "start": rp.start_ns, "end": rp.end_ns})
    phased = t["phase"].notna().to_numpy()
    keep = (phased if phased.any() else np.ones(len(t), dtype=bool)) & (frame["step"].to_numpy() >= 0)
    if not keep.any():
        return 0.0
    keys = pd.MultiIndex.from_frame(frame.loc[keep, ["rank", "step"]]).unique()
    steps = frame.groupby(["rank", "step"])
    span = (steps["end"].max() - steps["start"].min()).reindex(keys)
    busy = pd.Series({key: union_ns(g["start"].to_numpy(), g["end"].to_numpy())
                      for key, g in frame[gpu].groupby(["rank", "step"])}, dtype=float)
    per_rank = pd.DataFrame({"span": span, "busy": busy.reindex(keys, fill_value=0.0)}).groupby(level=0).sum()
    per_rank = per_rank[per_rank["span"] > 0]
    return float((per_rank["busy"] / per_rank["span"]).max()) if len(per_rank) else 0.0


def weight_gemms_of_replay(rp: Replay, device: Device | None, shape: ModelShape | None) -> WeightGemms | None:
    """The weight GEMMs of ``rp``'s iterations for the least-squares model: ``shape``'s weights on the
    recorded ``device`` in the GEMM kernels' dtype, scaled by how much the replay changed the GEMM
    kernels' time (a scenario). None without a cataloged GPU, a model shape or GEMM kernels, and when
    no rank's GPU is busy for ``GPU_BOUND_SHARE`` of its iterations (:func:`gpu_busy_share`): a
    launch-bound loop's GEMMs run under its CPU work, so their time does not add to an iteration's.
    The weights are every GEMM of a step (the memory model's), the LM head's included, which a
    prefill runs on one row per sequence, not per token: a prefill's GEMMs are priced high by
    the head's share of the weights (2 % for Llama-2-7B)."""
    if device is None or shape is None or shape.weight_bytes <= 0:
        return None
    t = rp.graph.tasks
    gpu = np.isin(t["kind"].to_numpy(), [int(k) for k in GPU_WORK_KINDS])
    if gpu_busy_share(rp, gpu) < GPU_BOUND_SHARE:
        return None
    gemm = gpu & np.isin(kernel_classes(rp.graph), GEMM_LAW_CLASSES)
    start, end = t["measured_start_ns"].to_numpy(), t["measured_end_ns"].to_numpy()
    recorded = gemm & (start >= 0)
    measured = float((end - start)[recorded].sum())
    if measured <= 0:
        return None
    replayed = float(t["dur_ns"].to_numpy(float)[recorded].sum())
    return replace(WeightGemms.of(shape.weight_bytes, device, iteration_dtype(rp.graph)), scale=replayed / measured)


def anchors_from_replay(replay: Replay, cpu_replay: Replay, found: FoundIterations, law: DeviceLaw
                        ) -> tuple[list[Anchor], float]:
    """The anchors of ``found`` in ``replay`` (``cpu_replay``: the same graph replayed with every GPU
    task at zero time) and the loop's overhead between iterations (median gap, 0 with one)."""
    g = replay.graph
    n = len(found.iterations)
    member = iteration_of_tasks(g, found)
    t = g.tasks
    kind = t["kind"].to_numpy()
    gpu = np.isin(kind, [int(k) for k in GPU_WORK_KINDS])
    spans = iteration_spans(member, replay.start_ns, replay.end_ns, n)
    # tasks a transform inserted (no measured time) belong to the iteration whose span holds them
    inserted = (member < 0) & (t["measured_start_ns"].to_numpy() < 0)
    if inserted.any():
        held = np.flatnonzero(spans[:, 0] >= 0)
        starts = replay.start_ns[inserted]
        at = np.searchsorted(spans[held, 0], starts, side="right") - 1
        ok = (at >= 0) & (starts < spans[held[np.clip(at, 0, None)], 1])
        member = member.copy()
        member[np.flatnonzero(inserted)[ok]] = held[at[ok]]
        spans = iteration_spans(member, replay.start_ns, replay.end_ns, n)
    cpu_spans = iteration_spans(iteration_of_tasks(cpu_replay.graph, found), cpu_replay.start_ns,
                                cpu_replay.end_ns, n)
    names = t["name"].astype(str).to_numpy()
    ops = t["op"].astype(object).to_numpy()
    dur = (replay.end_ns - replay.start_ns).astype(float)
    classes = {}
    anchors: list[Anchor] = []
    for i, it in enumerate(found.iterations):
        if spans[i, 0] < 0:
            continue
        if it.llm is None:
            raise ServingLogError(f"{found.adapter}: iteration {i} has no LLM composition")
        rows = np.flatnonzero((member == i) & gpu)
        laws = np.empty(len(rows), dtype=np.int8)
        for j, r in enumerate(rows):
            key = (names[r], ops[r] if isinstance(ops[r], str) else None)
            if key not in classes:
                classes[key] = kernel_law(classify_kernel(*key))
            laws[j] = classes[key]
        drivers = Drivers.of(it.llm)
        kernels = Kernels.measured(laws, dur[rows], drivers, law)
        span = float(union_ns(replay.start_ns[rows], replay.end_ns[rows]))
        cycle = float(spans[i, 1] - spans[i, 0])
        cpu = float(cpu_spans[i, 1] - cpu_spans[i, 0]) if cpu_spans[i, 0] >= 0 else 0.0
        anchors.append(Anchor(phase=it.phase.value if it.phase is not IterationPhase.MIXED else "mixed",
                              batch=it.llm, drivers=drivers, cycle_ns=cycle, cpu_ns=cpu,
                              gpu_busy_ns=span, overlap_ns=max(cycle - max(cpu, span), 0.0), kernels=kernels))
    held = spans[spans[:, 0] >= 0]
    held = held[np.argsort(held[:, 0], kind="stable")]
    gaps = held[1:, 0] - held[:-1, 1]
    loop = float(np.median(np.clip(gaps, 0, None))) if len(gaps) else 0.0
    return anchors, loop


def fit_cost_model(replay: Replay, cpu_replay: Replay, found: FoundIterations, device: Device | None,
                   shape: ModelShape | None = None, notes: tuple[str, ...] = ()) -> CostIterationModel:
    """The cost-grounded iteration model of ``found`` priced on ``replay`` (``cpu_replay``: the same
    graph with every GPU task at zero time), on the achievable roofline of ``device`` (or of the GPU
    a ``gpu`` transform moved the kernels to: :func:`current_device`), with ``shape``
    (the memory model's :class:`~whatif.transforms.parallel.memory.ModelShape`: GQA ratio, head
    size, hidden size) when the trace has transformer blocks.

    Raises
    ------
    ServingLogError
        ``found`` holds DiT steps, or none of its iterations has tasks in the replay.
    """
    if found.kind != "llm":
        raise ServingLogError(f"{found.adapter}: denoising steps, not LLM iterations")
    device = current_device(replay.graph, device)
    if shape is None:
        law = DeviceLaw.of(device, iteration_dtype(replay.graph), 1.0, DEFAULT_HEAD_DIM)
        notes = (*notes, "no transformer block found: attention priced as MHA, per-token kernels by their own time")
    else:
        law = DeviceLaw.of(device, iteration_dtype(replay.graph), shape.heads / max(shape.kv_heads, 1),
                           shape.head_dim, shape.hidden)
    anchors, loop = anchors_from_replay(replay, cpu_replay, found, law)
    if not anchors:
        raise ServingLogError(f"{found.adapter}: none of the {len(found.iterations)} iterations has tasks in the trace")
    phases: dict[str, list[Anchor]] = {}
    for a in anchors:
        phases.setdefault(a.phase, []).append(a)
    extra = [] if len(anchors) > 1 else ["one recorded iteration: no residual fit, no CPU time per sequence"]
    recorded = ", ".join(sorted(phases))
    extra += [f"no {p} iteration recorded: {p} batches are priced from the {recorded} iterations' kernels"
              for p in ("prefill", "decode") if p not in phases]
    extra += [line for p, a in sorted(phases.items()) if (line := gpu_share_note(p, a))]
    return CostIterationModel(phases={p: _phase_costs(p, a, law) for p, a in sorted(phases.items())},
                              device_law=law, loop_overhead_ns=loop, adapter=found.adapter, source=found.source,
                              notes=tuple(notes) + found.notes + tuple(extra))
