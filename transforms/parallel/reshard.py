"""``reshard`` (Seesaw, arXiv 2503.06433): one parallel plan for prefill, another for decode.

For G GPUs every plan ``(t, p)`` with ``t·p = G`` is applied to the trace as
``tensor_parallel(t)`` then ``pipeline_parallel(p, schedule=serving)`` and replayed; each step's
time under a plan is its phase's time per step (steps are prefill or decode by the ``phase`` of
their tasks, ``phase:prefill``/``phase:decode``; a step without a phase is **prefill when its median
GEMM arithmetic intensity exceeds ``PREFILL_INTENSITY`` FLOP/B, else decode** — so a one-phase
trace yields one phase, and the search reduces to the best single plan: no transition arises).

Seesaw's cycle (transition-minimizing scheduling): prefill runs under plan A until the CPU KV
buffer holds ``R = buffer / kv_per_request`` requests, the GPUs re-shard to plan B, decode drains
the buffer, and they re-shard back. Per cycle:

* prefill ``R/b_p`` steps of ``T_pf(A)``, decode ``R·o/b_d`` steps of ``T_dec(B)`` (o output tokens,
  b_p/b_d requests per step as in the trace);
* 2 transitions of ``(W/G) / B_h2d`` each (every GPU reloads its weight shard from host memory);
* KV through the CPU buffer, ``R·kv/G`` bytes per GPU out after prefill and in before decode, at
  ``B_h2d``, overlapped with compute (each phase takes ``max(compute, KV transfer)``).

``B_h2d`` is what one GPU gets while all G load at once: its PCIe link's rate divided by the GPUs
sharing a host link (``min(G, gpus_per_host_link)``, default 2: a DGX A100 has four PCIe Gen4 switches with two
GPUs behind each, NVIDIA DGX A100 System Architecture, WP-10083-001).

Throughput = ``R / cycle``. With A = B the weights stay and the KV stays on the GPUs (no buffer):
throughput = ``1 / (T_pf/b_p + o·T_dec/b_d)``: a static plan with Seesaw's phase batching. The
static plans are also priced as the engine Seesaw compares with runs them
(``interleaved_rps``, :func:`interleaved_static_rps`): the phases interleaved, prefill first, one
scheduler per pipeline stage, so under PP a prompt's prefill stalls the decodes behind it on every
stage; with TP alone the phases only alternate and both pricings agree.
W, layers and KV heads come from the memory model
(:func:`~.memory.model_shape`: GQA-aware, ``2·L·H_kv·d·e`` bytes per token; ``kv_heads`` overrides);
kv per request is that times ``prompt + output`` tokens. A decode step under PP is the stage's
``p·T_stage(b/p)`` at equal in-flight sequences (``pipeline_parallel``, serving). **A plan that
does not hold its weights and its phase's KV on the device** (:func:`~.memory.plan_memory`; prefill:
the prompts being prefilled, decode and static plans: every in-flight sequence) is left out of that
role, and a plan the parallel transforms refuse (heads, layers) of both, each with one line.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from whatif.core import limits
from whatif.core.kernels import KernelClass
from whatif.depgraph.graph import TaskGraph, TaskKind
from whatif.hardware.devices import find_device

from ..base import Transform, TransformContext, TransformError
from ..edit import note
from ..placement import Placement
from ..registry import register
from .comm import OnTopology
from .layers import find_blocks
from .memory import ModelShape, device_capacity_bytes, model_shape, plan_memory
from .pipeline import PipelineParallel
from .tensor import TensorParallel

PREFILL_INTENSITY = 64.0   # FLOP/B: above, a step's GEMMs are prefill-like (decode GEMV at batch b has ~b)
GB = 1e9
INTERLEAVED_ROUNDS = 6     # the interleaved baseline's horizon: this many generations of every sequence


def interleaved_static_rps(stages: int, prefill_stage_ns: float, decode_stage_ns: float, decode_batch: int,
                           output_tokens: int, rounds: int = INTERLEAVED_ROUNDS) -> float:
    """Requests/s of one static plan under a prefill-first engine that interleaves the phases, as
    vLLM's scheduler without chunked prefill does, with one scheduler per pipeline stage ("virtual
    engines"): ``stages`` engines each hold ``decode_batch/stages`` in-flight sequences; an engine
    whose sequences finished runs its next iteration as a prefill of their replacements (``k``
    prompts: ``k·prefill_stage_ns`` on every stage), else a decode iteration (``decode_stage_ns``
    per stage); an iteration passes the stages in order, each stage serving one iteration at a
    time (first come, first served), and an engine issues its next iteration when its last one
    leaves the last stage. A prefill iteration thus holds up every decode behind it on each stage
    (with one stage, the phases only alternate). Sequences start staggered over their
    ``output_tokens``; the rate is measured over the second half of ``rounds`` generations.

    One stage: the phases alternate, ``1 / (50 ms + 256·20 ms / 256)`` = 14.3 requests/s; four
    stages of 12.5 ms per prompt and 5 ms per decode iteration would serve ``1 / (12.5 ms +
    256·4·5 ms / 256)`` = 30.8 with the phases apart, but each prefill stalls the decodes behind it:

    >>> round(interleaved_static_rps(1, 50e6, 20e6, 256, 256), 1)
    14.3
    >>> round(interleaved_static_rps(4, 12.5e6, 5e6, 256, 256), 1)
    18.2

    Raises
    ------
    ValueError
        When an argument is not positive.
    """
    if min(stages, decode_batch, output_tokens, rounds) < 1 or prefill_stage_ns <= 0 or decode_stage_ns <= 0:
        raise ValueError("interleaved_static_rps: every argument must be positive")
    engines = min(stages, decode_batch)
    remaining = [np.array([1 + ((i * engines + k) * output_tokens) // decode_batch % output_tokens
                           for i in range(decode_batch // engines + (k < decode_batch % engines))], dtype=np.int64)
                 for k in range(engines)]
    waiting = [0] * engines
    stage_free = [0.0] * stages
    ready = [(0.0, k) for k in range(engines)]
    iterations = rounds * output_tokens * engines
    finished, mark = 0, (0.0, 0)
    for n in range(iterations):
        t, k = heapq.heappop(ready)
        prompts, waiting[k] = waiting[k], 0
        per_stage = prompts * prefill_stage_ns if prompts else decode_stage_ns
        for s in range(stages):
            t = max(t, stage_free[s]) + per_stage
            stage_free[s] = t
        if prompts:
            remaining[k] = np.concatenate([remaining[k], np.full(prompts, output_tokens, dtype=np.int64)])
        else:
            remaining[k] = remaining[k] - 1
            done = int((remaining[k] == 0).sum())
            remaining[k] = remaining[k][remaining[k] > 0]
            waiting[k] += done
            finished += done
        heapq.heappush(ready, (t, k))
        if n == iterations // 2:
            mark = (t, finished)
    end = max(stage_free)
    return (finished - mark[1]) / ((end - mark[0]) / 1e9) if end > mark[0] else 0.0


def plans(gpus: int) -> list[tuple[int, int]]:
    """Every (t, p) with t·p = gpus."""
    return [(t, gpus // t) for t in range(1, gpus + 1) if gpus % t == 0]


def step_phases(graph: TaskGraph, ctx: TransformContext) -> pd.Series:
    """Phase (``prefill``/``decode``) of each step, by its tasks' phase, else by GEMM intensity."""
    t = graph.tasks
    steps = t["step"].to_numpy()
    ph = t["phase"].astype(object).to_numpy()
    k = np.flatnonzero(t["kind"].to_numpy() == int(TaskKind.KERNEL))
    f = ctx.require_cost("reshard").kernel_facts(graph, k)
    with np.errstate(divide="ignore", invalid="ignore"):
        inten = np.where(f["bytes"] > 0, f["flops"] / f["bytes"], np.nan)
    gemm = f["kernel_class"] == KernelClass.GEMM.value
    out = {}
    for s in sorted(set(steps[steps >= 0].tolist())):
        names = [str(x) for x in ph[steps == s] if isinstance(x, str)]
        hit = [n for n in ("prefill", "decode") if any(n in x.lower() for x in names)]
        if len(hit) == 1:
            out[s] = hit[0]
            continue
        sel = gemm & (steps[k] == s)
        med = float(np.nanmedian(inten[sel])) if sel.any() else 0.0
        out[s] = "prefill" if med > PREFILL_INTENSITY else "decode"
    return pd.Series(out, name="phase")


@dataclass
class ReshardSearch:
    """Result of :func:`search_reshard`: ``table`` (one row per plan pair, best first;
    ``interleaved_rps``: a static plan's throughput when its engine interleaves the phases, NaN for
    pairs), ``best`` (its row), ``why`` (a sentence), ``assumptions`` (what was inferred)."""

    table: pd.DataFrame
    best: dict[str, Any]
    why: str
    assumptions: list[str]


def _phase_times(graph: TaskGraph, ctx: TransformContext, topology: str, candidates: list[tuple[int, int]],
                 left_out: list[str]) -> pd.DataFrame:
    """Per plan: mean predicted step time (ns) of prefill and of decode steps; a plan the parallel
    transforms refuse (heads not divisible, more stages than layers) is left out with its reason."""
    step_times_ns = ctx.require_step_times("reshard")
    phases = step_phases(graph, ctx)
    rows = []
    for t, p in candidates:
        try:
            g = TensorParallel(degree=t, topology=topology).apply(graph, ctx) if t > 1 else graph
            g = PipelineParallel(degree=p, schedule="serving", topology=topology).apply(g, ctx) if p > 1 else g
        except TransformError as exc:
            left_out.append(f"tp{t}·pp{p} left out: {exc}")
            continue
        st = step_times_ns(g)
        ph = phases.reindex(st.index)
        rows.append({"t": t, "p": p, **{f"{x}_ns": float(st[ph == x].mean()) if (ph == x).any() else np.nan
                                       for x in ("prefill", "decode")}})
    return pd.DataFrame(rows)


def search_reshard(graph: TaskGraph, ctx: TransformContext, *, gpus: int = 8, topology: str = "dgx_h100",
                   h2d_gbps: float = 0.0, buffer_gb: float = 64.0, prompt_tokens: int = 512, output_tokens: int = 0,
                   prefill_batch: int = 1, decode_batch: int = 1, kv_bytes_per_request: float = 0.0,
                   kv_heads: int = 0, capacity_gb: float = 0.0, gpus_per_host_link: int = 2,
                   shape: ModelShape | None = None) -> ReshardSearch:
    """Every (prefill plan, decode plan) pair for ``gpus`` GPUs, with its throughput (requests/s)
    under Seesaw's transition-minimizing cycle; see the module docstring."""
    if gpus < 1 or buffer_gb <= 0 or prefill_batch < 1 or decode_batch < 1 or gpus_per_host_link < 1:
        raise TransformError("reshard: gpus, buffer_gb, prefill_batch, decode_batch and gpus_per_host_link must be "
                             "positive")
    blocks = find_blocks(graph)
    if blocks.empty:
        raise TransformError("reshard: found no transformer block in the trace's kernels")
    shape = shape or model_shape(graph, ctx, "reshard")
    if kv_heads:
        kept = [a for a in shape.assumptions if "MHA" not in a]
        shape = replace(shape, kv_heads=kv_heads, assumptions=(*kept, f"{kv_heads} KV heads (given)"))
    assumptions: list[str] = list(shape.assumptions)
    phases = step_phases(graph, ctx)
    counts = phases.value_counts()
    n_pf, n_dec = int(counts.get("prefill", 0)), int(counts.get("decode", 0))
    if n_pf == 0 or n_dec == 0:
        only = str(phases.to_numpy()[0]) if len(phases) else "?"
        assumptions.append(f"the trace has one phase ({only}, {len(phases)} steps): "
                           "the other phase is priced by the same steps, so the best pair is the best single plan")
    out_tok = output_tokens or max(1, round(n_dec * decode_batch / max(n_pf * prefill_batch, 1))) if n_pf and n_dec \
        else (output_tokens or 1)
    weights = shape.held_bytes
    kv = kv_bytes_per_request or shape.kv_bytes_per_token * (prompt_tokens + out_tok)
    if not kv_bytes_per_request:
        assumptions.append(f"KV per request 2·{shape.layers} layers·{shape.kv_heads} KV heads·{shape.head_dim}·"
                           f"{shape.elem_bytes} B·({prompt_tokens}+{out_tok}) tokens = {kv / 2**20:.1f} MiB")
    capacity = device_capacity_bytes(ctx, capacity_gb)
    # a prefill plan holds the prompts being prefilled (the rest waits in the CPU buffer); a decode
    # plan, and a static one, the KV of every in-flight sequence
    fits: dict[tuple[int, int], dict[str, bool]] = {}
    for t, p in plans(gpus):
        role_fits = {}
        for role, tokens in (("prefill", prefill_batch * prompt_tokens),
                             ("decode", decode_batch * (prompt_tokens + out_tok))):
            mem = plan_memory(shape, tensor=t, pipeline=p, kv_tokens=tokens, capacity_bytes=capacity)
            role_fits[role] = mem.fits
            if not mem.fits:
                assumptions.append(f"tp{t}·pp{p} left out for {role}: {mem.why_not()}")
        if any(role_fits.values()):
            fits[t, p] = role_fits
    if not fits:
        raise TransformError(f"reshard: no plan of {gpus} GPUs fits: {assumptions[-1]}")
    times = _phase_times(graph, ctx, topology, list(fits), assumptions)
    if times.empty:
        raise TransformError(f"reshard: no plan of {gpus} GPUs applies to this trace: {assumptions[-1]}")
    for x, y in (("prefill_ns", "decode_ns"), ("decode_ns", "prefill_ns")):
        times[x] = times[x].fillna(times[y])
    h2d = (h2d_gbps * GB) if h2d_gbps else _h2d(ctx) / min(gpus, gpus_per_host_link)
    requests = max(1.0, math.floor(buffer_gb * GB / kv))
    rows = []
    plan_rows: list[dict[Hashable, Any]] = times.to_dict("records")
    for a in plan_rows:
        for b in plan_rows:
            same = (a["t"], a["p"]) == (b["t"], b["p"])
            if not (fits[a["t"], a["p"]]["prefill"] and fits[b["t"], b["p"]]["decode"]):
                continue
            pf = requests / prefill_batch * a["prefill_ns"]
            dec = requests * out_tok / decode_batch * b["decode_ns"]
            switch = 0.0 if same else 2 * weights / gpus / h2d * 1e9
            kv_ns = 0.0 if same else requests * kv / gpus / h2d * 1e9
            cycle = (pf + dec) if same else max(pf, kv_ns) + max(dec, kv_ns) + switch
            rows.append({"prefill_plan": f"tp{a['t']}·pp{a['p']}", "decode_plan": f"tp{b['t']}·pp{b['p']}",
                         "prefill_step_ms": a["prefill_ns"] / 1e6, "decode_step_ms": b["decode_ns"] / 1e6,
                         "transition_ms": switch / 1e6, "kv_swap_ms": kv_ns / 1e6, "cycle_s": cycle / 1e9,
                         "requests_per_cycle": requests, "throughput_rps": requests / (cycle / 1e9),
                         "interleaved_rps": interleaved_static_rps(a["p"], a["prefill_ns"] / prefill_batch,
                                                                   b["decode_ns"] / b["p"], decode_batch, out_tok)
                         if same else np.nan})
    if not rows:
        raise TransformError(f"reshard: no prefill plan and decode plan of {gpus} GPUs both fit: {assumptions[-1]}")
    table = pd.DataFrame(rows).sort_values("throughput_rps", ascending=False, ignore_index=True)
    best: dict[str, Any] = table.iloc[0].to_dict()
    statics = table[table["prefill_plan"] == table["decode_plan"]]
    static: dict[str, Any] = (statics if len(statics) else table).iloc[0].to_dict()
    interleaved = statics.sort_values("interleaved_rps", ascending=False).iloc[0].to_dict() if len(statics) else None
    plan_tp = times[["t", "p"]].to_numpy()
    prefill_best = plan_tp[int(np.nanargmin(times["prefill_ns"].to_numpy()))].tolist()
    decode_best = plan_tp[int(np.nanargmin(times["decode_ns"].to_numpy()))].tolist()
    why = (f"prefill is fastest per step under {prefill_best} (t, p) and "
           f"decode under {decode_best}; "
           f"best pair {best['prefill_plan']} -> {best['decode_plan']}: "
           f"{best['throughput_rps']:.2f} req/s vs best static "
           f"{static['prefill_plan']} {static['throughput_rps']:.2f} req/s "
           f"({best['throughput_rps'] / static['throughput_rps']:.2f}x); "
           f"2 transitions of {best['transition_ms'] / 2:.1f} ms and a {best['kv_swap_ms']:.1f} ms KV swap amortized "
           f"over {requests:.0f} requests")
    if interleaved is not None:
        why += (f"; a static plan whose engine interleaves the phases (prefill first, one scheduler per stage, as "
                f"vLLM without chunked prefill) serves at most {interleaved['interleaved_rps']:.2f} req/s "
                f"({interleaved['prefill_plan']}: {best['throughput_rps'] / interleaved['interleaved_rps']:.2f}x)")
    return ReshardSearch(table=table, best=best, why=why, assumptions=assumptions)


def _h2d(ctx: TransformContext) -> float:
    """Host-to-device bytes/s of the recorded GPU (its PCIe link), 64 GB/s when unknown."""
    dev = find_device(ctx.device) if ctx.device else None
    return float(dev.pcie_bw_bytes_per_s if dev is not None and dev.pcie_bw_bytes_per_s else 64 * GB)


@register
@dataclass
class Reshard(OnTopology, Transform):
    name = "reshard"
    description = "Seesaw: a parallel plan for prefill and one for decode; searches the pair, applies the best"

    gpus: int = field(default=8, metadata={
        "minimum": 1, "help": "GPUs G (plans t x p = G)", "maximum": limits.MAX_GPUS})
    topology: str = field(default="dgx_h100", metadata={"help": "topology preset"})
    buffer_gb: float = field(default=64.0, metadata={
        "exclusive_minimum": 0, "help": "CPU KV buffer (GB) that sets the requests per phase"})
    prompt_tokens: int = field(default=512, metadata={"minimum": 1, "help": "prompt tokens per request (KV size)"})
    output_tokens: int = field(default=0, metadata={"minimum": 0,
        "help": "output tokens per request; 0 = decode/prefill steps ratio"})
    kv_heads: int = field(default=0, metadata={
        "minimum": 0, "help": "KV heads (GQA); 0 = from the attention op's shapes"})
    capacity_gb: float = field(default=0.0, metadata={
        "minimum": 0, "help": "GPU memory (GB); 0 = the recorded GPU's, from the "
        "catalog"})
    gpus_per_host_link: int = field(default=2, metadata={
        "minimum": 1, "help": "GPUs sharing one PCIe host link (DGX A100: 2)",
        "maximum": limits.MAX_GPUS})

    def match(self, graph: TaskGraph, ctx: TransformContext) -> np.ndarray:
        return find_blocks(graph)["task"].to_numpy(np.int64)

    def _search(self, graph: TaskGraph, ctx: TransformContext) -> ReshardSearch:
        return search_reshard(graph, ctx, gpus=self.gpus, topology=self.topology, buffer_gb=self.buffer_gb,
                              prompt_tokens=self.prompt_tokens, output_tokens=self.output_tokens,
                              kv_heads=self.kv_heads, capacity_gb=self.capacity_gb,
                              gpus_per_host_link=self.gpus_per_host_link)

    def placement(self, placement: Placement, graph: TaskGraph, ctx: TransformContext) -> Placement:
        """The decode plan's GPUs (the phase that holds the KV cache while serving)."""
        t, p = (int(x[2:]) for x in self._search(graph, ctx).best["decode_plan"].split("·"))
        return placement.spread(tensor=t, pipeline=p)

    def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
        """The graph of the best pair: its decode plan applied to decode steps' view (one representative
        rank; the graph holds one plan, so the prefill plan and the transitions are in the change log)."""
        s = self._search(graph, ctx)
        t, p = (int(x[2:]) for x in s.best["decode_plan"].split("·"))
        g = TensorParallel(degree=t, topology=self.topology).apply(graph, ctx) if t > 1 else graph.copy()
        g = PipelineParallel(degree=p, schedule="serving", topology=self.topology).apply(g, ctx) if p > 1 else g
        return note(g, "plan pair", reason=s.why)
