"""The papers' setups, reproduced on synthetic Kineto traces (tests/_llm_tracegen.py) through the
public API, for docs/multi-gpu.md's "Papers" table. Run: .venv/bin/python bench/papers.py (~1 min).

Kernel model of the traces: ``3 us + A(F, B)``, ``A`` the device catalog's achievable roofline
(``llm_trace(device=...)``, :func:`whatif.hardware.roofline.achievable_time_ns`: the achievable bf16
GEMM rate at the kernel's size, from 159 TFLOP/s at 2^31 FLOPs to 794.5 at 2^40 on the H100 SXM,
271.2 on the A100 SXM at large sizes, and the streaming bandwidth, 3.07 / 1.76 TB/s; sources in
docs/cost-models.md), the roofline the transforms price with. Until 2026-11-27 this bench timed
kernels at one rate per GPU, the H100's measured fractions of its datasheet (0.81, 0.90), whatever
their size.

StreamFusion (arXiv 2601.20273): a FLUX-like DiT block stack (hidden 3072, 24 heads, FLUX's 4h GELU
MLP as a gated MLP of width 8192, the same 8h^2 weights; until 2026-11-28 a gated 12288, 1.5x FLUX's MLP;
bf16, 8 blocks: the ratio is per block) at 16k-64k tokens on 2x8 H100 (DGX H100 preset): torus over
the best USP that can run (ulysses degree dividing 24 and 16: 1, 2, 4, 8), and on one machine.
Paper: 1.35x on average, up to 1.77x, over xDiT (USP) on two machines.

NanoFlow (OSDI 2025): 8x A100 SXM TP8 (DGX A100 preset), Llama-2-70B-like (hidden 8192, GQA 8/64,
FFN 28672, 80 layers: the pipeline fills once per iteration). Two iterations: NanoFlow's own dense
batch for this model, 2,048 tokens = 1,280 decode sequences (1,024 tokens of context) + 768 prefill
tokens (one causal prompt), the design point its auto-search pipelines (efeslab/Nanoflow @ d1bbe27,
autosearch/search-70.ipynb: global_batch_size 2048, decode_batch_size 1280, prefill_batch_size 768,
decode attention priced at getGEMV70B(batch_size, 1024);
pipeline/config_all/llama2-70B/2048.json: global_batch_size 2048); and a dense decode-only batch of
1,024 sequences of 1,024 tokens (this bench's setup until 2026-11-28). search_nanoflow over
nano-batches and GPU partitions with NanoFlow's own measured A100 interference curves
(autosearch/trace/*_interference.csv), and with idealized ones for comparison; each schedule also as
a share of NanoFlow's optimal throughput (2 FLOPs per parameter per token, every token of the
batch, at the datasheet peak). The sequential iteration (one kernel at a time on the whole GPU) is
NanoFlow's own `non-overlap` ablation baseline: the same kernels without nano-batches or overlap
(pipeline/config_all/llama2-70B/non-overlap.json; efeslab/Nanoflow issue #11). Each schedule is also
put on NanoFlow's own scale: tokens/s per GPU against the optimum NanoFlow's evaluation divides by and
the throughput it measured for itself and for TensorRT-LLM (NANOFLOW_* constants below). Paper: 1.91x
throughput over TensorRT-LLM, 68.5 % of the optimal for Llama-2-70B and 59-72 % across models
(README; ../shared/BACKGROUND.md).

TokenWeave (MLSys 2026): 8x H100 TP8 (DGX H100 preset), a Llama-70B-like layer stack (hidden 8192,
64 heads, 8 KV heads, FFN 28672, 4 layers) at 256-4,096 tokens per iteration, each residual add
and norm as vLLM's fused_add_rms_norm kernel (the paper's baseline is vLLM); TP8 against: TokenWeave
(overlap with 2 token splits and the fused AllReduce + residual add + RMSNorm on 8 SMs:
fuse_norm, comm_sms=8), the split alone (the collective on 8 SMs), the split with NCCL's own
all-reduce (its NVLS kernel on NCCL's default 16 channels, one SM each: what an engine splitting
without TokenWeave's kernel runs), the fused kernel alone (no split), the split at the generic
interference 1.15, and TP8 without communication (TokenWeave's reference: it can beat it). Paper: up
to 1.28x latency; a loss at small token counts for the split.

AttAcc (ASPLOS 2024): a GPT-3-175B-like model (96 layers, hidden 12288, 96 heads, a gated FFN of
32768 = GPT-3's 8h² MLP weights) on 8x H100 (TP8, DGX H100 preset), each GPU with AttAcc's 5 HBM
stacks of 16 GB (power-limited x9); requests of 2,048 + 128 tokens. The decode batch each can
hold comes from the memory model after the scenario's transforms (KV in HBM vs KV in PIM);
throughput = batch / step time. Paper: up to 2.81x for 175B, from the larger batch.

DCC (arXiv 2511.15503) on its AttAcc backend (bank-level units, x16 without the power limit, the
backend DCC's figures use; NVLink4 link): GPT3-13B (40 layers, hidden 5120, 40 heads, FFN 20480)
and LLaMA-33B (60 layers, 6656, 52 heads, FFN 17920) on an H100, decode at batch 1 and 4 with a
2,048-token context; end to end = one 2,048-token prefill (no PIM candidate) + 256 decode steps.
Paper: end to end up to 7.71x, 4.88x on average, on AttAcc.

Seesaw (arXiv 2503.06433): 8x A100, Llama-70B-like (80 layers, hidden 8192, 64 heads, 8 KV heads,
FFN 28672, bf16), prefill 8 prompts of 1,024 tokens per step, decode 256 in-flight sequences at
1,024 + 256 tokens, 256 output tokens per request, a 512 GB CPU KV buffer. Paper: reshard (prefill
plan != decode plan) over the best static plan up to 1.78x, 1.36x on average over vLLM, and less
where TP is cheap (NVLink/NVSwitch).
"""
from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from _llm_tracegen import llm_trace  # noqa: E402

from whatif.api import analyze, make_context  # noqa: E402
from whatif.core.dtypes import element_bytes  # noqa: E402
from whatif.depgraph.graph import TaskGraph  # noqa: E402
from whatif.predictors.replay import replay  # noqa: E402
from whatif.predictors.steps import step_times  # noqa: E402
from whatif.transforms.base import TransformContext, TransformError  # noqa: E402
from whatif.transforms.generic import Scale  # noqa: E402
from whatif.transforms.parallel.memory import device_capacity_bytes, kv_capacity_tokens, model_shape  # noqa: E402
from whatif.transforms.parallel.nanoflow import (  # noqa: E402
    NANOFLOW_GEMV,
    NANOFLOW_NETWORK,
    saturating_curve,
    search_nanoflow,
)
from whatif.transforms.parallel.overlap import NCCL_NVLS_CTAS, TOKENWEAVE_SMS, Overlap  # noqa: E402
from whatif.transforms.parallel.pim import PimOffload  # noqa: E402
from whatif.transforms.parallel.reshard import ReshardSearch, search_reshard  # noqa: E402
from whatif.transforms.parallel.sequence import SequenceParallel  # noqa: E402
from whatif.transforms.parallel.tensor import TensorParallel  # noqa: E402
from whatif.transforms.placement import Placement  # noqa: E402
from whatif.transforms.scenario import scenario_placement  # noqa: E402
from whatif.transforms.select import Selector  # noqa: E402

ATTACC_PROMPT, ATTACC_OUTPUT = 2048, 128
SEESAW_DECODE_BATCH = 256   # vLLM's default max_num_seqs


@dataclass(frozen=True)
class Setup:
    label: str
    gpu_name: str
    topology: str


SEESAW = (Setup("8x A100 PCIe", "NVIDIA A100 80GB PCIe", "pcie_a100_8"),
          Setup("8x A100 NVSwitch", "NVIDIA A100-SXM4-80GB", "dgx_a100"))


def _seesaw_search(tmp: Path, setup: Setup, decode_batch: int) -> tuple[ReshardSearch, int]:
    """The search, and the decode batch the memory holds (KV of 1,024 + 256 tokens a sequence)."""
    # a prefill step of 8 x 1,024 tokens, then decode steps of decode_batch sequences attending to 1,024 tokens
    path = llm_trace(tmp / f"seesaw_{setup.topology}_{decode_batch}.json.gz", batch=8, decode_batch=decode_batch,
                     kv_tokens=1024, steps=4, phases=("prefill", "decode", "decode", "decode"), layers=80,
                     hidden=8192, heads=64, kv_heads=8, ffn=28672, gpu_name=setup.gpu_name, device=setup.gpu_name)
    a = analyze(path)
    ctx = make_context(a.trace)
    held = kv_capacity_tokens(model_shape(a.graph, ctx), device_capacity_bytes(ctx), Placement(tensor=8))
    return search_reshard(a.graph, ctx, gpus=8, topology=setup.topology, buffer_gb=512, prompt_tokens=1024,
                          output_tokens=256, prefill_batch=8, decode_batch=decode_batch), held // (1024 + 256)


def _static(s: ReshardSearch) -> dict[str, float]:
    t = s.table
    return t[t["prefill_plan"] == t["decode_plan"]].iloc[0].to_dict()


def seesaw(tmp: Path, setup: Setup) -> None:
    s, capacity = _seesaw_search(tmp, setup, SEESAW_DECODE_BATCH)
    t = s.table
    static = _static(s)
    steps = t.drop_duplicates("prefill_plan").set_index("prefill_plan")["prefill_step_ms"].to_frame().join(
        t.drop_duplicates("decode_plan").set_index("decode_plan")["decode_step_ms"])
    print(f"\n{setup.label} ({setup.topology})")
    print(steps.round(2).to_string())
    print(f"best pair {s.best['prefill_plan']} -> {s.best['decode_plan']}: {s.best['throughput_rps']:.2f} req/s; "
          f"best static {static['prefill_plan']}: {static['throughput_rps']:.2f} req/s; "
          f"reshard / static = {s.best['throughput_rps'] / static['throughput_rps']:.2f}x "
          f"(paper: up to 1.78x, less on NVSwitch)")
    inter = t.dropna(subset=["interleaved_rps"]).set_index("prefill_plan")["interleaved_rps"]
    print("static plans with the phases interleaved (prefill first, one scheduler per stage: vLLM without chunked "
          "prefill), req/s: " + ", ".join(f"{k} {v:.2f}" for k, v in inter.items())
          + f"; reshard / best of them ({inter.idxmax()}) = {s.best['throughput_rps'] / inter.max():.2f}x")
    print(f"transition {s.best['transition_ms']:.1f} ms, KV swap {s.best['kv_swap_ms']:.1f} ms, "
          f"{s.best['requests_per_cycle']:.0f} requests per cycle")
    for line in s.assumptions:
        print(f"assumption: {line}")
    # the decode batch the memory holds instead of vLLM's max_num_seqs
    big, _ = _seesaw_search(tmp, setup, capacity)
    dec = big.table.drop_duplicates("decode_plan").set_index("decode_plan")["decode_step_ms"].round(1)
    print(f"at the decode batch the memory holds ({capacity} sequences): decode step ms "
          + ", ".join(f"{k} {v}" for k, v in dec.items())
          + f"; best pair {big.best['prefill_plan']} -> {big.best['decode_plan']}, reshard / static = "
          f"{big.best['throughput_rps'] / _static(big)['throughput_rps']:.2f}x, over the interleaved static "
          f"{big.best['throughput_rps'] / big.table['interleaved_rps'].max():.2f}x")


def _step_ms(graph: TaskGraph, ctx: TransformContext, transform: SequenceParallel) -> float:
    return _ms(transform.apply(graph, ctx))


def _all_to_all_ms(graph: TaskGraph) -> float:
    """ms of the intra-machine all-to-alls one GPU (the first rank) runs per step."""
    t = graph.tasks
    mine = (t["rank"] == t["rank"].min()).to_numpy() & t["name"].astype(str).str.contains("all_to_all").to_numpy()
    return float(t["dur_ns"].to_numpy()[mine].sum()) / 1e6 / max(int(t["step"].max()) + 1, 1)


def streamfusion(tmp: Path) -> None:
    print("## StreamFusion (sequence_parallel torus vs usp): FLUX-like, 24 heads, H100, ms per step")
    device = "H100_SXM"
    for tokens in (16384, 32768, 65536):
        a = analyze(llm_trace(tmp / f"dit_{tokens}.json.gz", new_tokens=tokens, kv_tokens=tokens, layers=8,
                              hidden=3072, heads=24, ffn=8192, steps=1, device=device))
        ctx = make_context(a.trace)
        ms = partial(_step_ms, a.graph, ctx)

        for gpus in (16, 8):
            usp: dict[str, float] = {}
            for u in (x for x in (1, 2, 4, 8, 16) if gpus % x == 0):
                try:
                    usp[f"usp {u}x{gpus // u}"] = ms(SequenceParallel(mode="usp", degree=gpus, ulysses_degree=u,
                                                                      topology="dgx_h100"))
                except TransformError as exc:
                    usp[f"usp {u}x{gpus // u}"] = float("nan")
                    why = str(exc).split(": ", 1)[1]
            torus_graph = SequenceParallel(mode="torus", degree=gpus, topology="dgx_h100").apply(a.graph, ctx)
            torus = _ms(torus_graph)
            best = min((v, k) for k, v in usp.items() if v == v)
            cells = ", ".join(f"{k} {v:.2f}" if v == v else f"{k} refused" for k, v in usp.items())
            a2a = _all_to_all_ms(torus_graph)
            print(f"{tokens // 1024}k tokens, {gpus} GPUs: torus {torus:.2f}; {cells}; "
                  f"torus / best usp ({best[1]}) = {best[0] / torus:.2f}x; torus all-to-alls {a2a:.2f} ms per GPU "
                  f"({a2a / torus:.0%} of the step: hiding all of them gives at most {torus / (torus - a2a):.2f}x)")
    print(f"(refused: {why})")


DCC_MODELS = {"GPT3-13B": {"layers": 40, "hidden": 5120, "heads": 40, "ffn": 20480},
              "LLaMA-33B": {"layers": 60, "hidden": 6656, "heads": 52, "ffn": 17920}}


def dcc(tmp: Path) -> None:
    print("## DCC (pim_offload, attacc backend without the power limit): end-to-end, 2k context, 256 tokens")
    device = "H100_SXM"
    for name, shape in DCC_MODELS.items():
        pf = analyze(llm_trace(tmp / f"dcc_{name}_pf.json.gz", new_tokens=2048, kv_tokens=2048, steps=1, device=device,
                               **shape))
        t_pf = float(step_times(replay(pf.graph))["predicted_ns"].sum())
        for batch in (1, 4):
            dec = analyze(llm_trace(tmp / f"dcc_{name}_{batch}.json.gz", batch=batch, new_tokens=1, kv_tokens=2048,
                                    steps=2, device=device, **shape))
            ctx = make_context(dec.trace)
            t0 = float(step_times(replay(dec.graph))["predicted_ns"].mean())
            row = [f"{name} batch {batch}: decode step {t0 / 1e6:.2f} ms"]
            for label, limited in (("x16 (DCC)", False), ("x9 power-limited", True)):
                try:
                    g = PimOffload(power_limited=limited).apply(dec.graph, ctx)
                    t1 = float(step_times(replay(g))["predicted_ns"].mean())
                    e2e = (t_pf + 256 * t0) / (t_pf + 256 * t1)
                    row.append(f"{label}: {t1 / 1e6:.2f} ms, decode {t0 / t1:.2f}x, end to end {e2e:.2f}x")
                except TransformError as exc:
                    row.append(f"{label}: refused ({str(exc).split(': ', 1)[1]})")
            print("; ".join(row))


def attacc(tmp: Path) -> None:
    print("## AttAcc (tensor_parallel 8 + pim_offload on DGX H100, power-limited x9): GPT-3-175B-like decode")
    device = "H100_SXM"
    shape = {"layers": 96, "hidden": 12288, "heads": 96, "ffn": 32768}   # gated FFN of 3·h·32768 = 8h² weights
    context = ATTACC_PROMPT + ATTACC_OUTPUT

    def graphs(batch: int) -> tuple[TaskGraph, TaskGraph, TransformContext]:
        a = analyze(llm_trace(tmp / f"attacc_{batch}.json.gz", batch=batch, new_tokens=1, kv_tokens=context, steps=2,
                              device=device, **shape))
        ctx = make_context(a.trace)
        return a.graph, TensorParallel(degree=8, topology="dgx_h100").apply(a.graph, ctx), ctx

    def per_step_ms(graph: TaskGraph) -> float:
        return float(step_times(replay(graph))["predicted_ns"].mean()) / 1e6

    g, tp, ctx = graphs(16)
    found = model_shape(g, ctx, "attacc")
    pim = PimOffload()
    on_gpu = scenario_placement([TensorParallel(degree=8)], [g], ctx)
    with_pim = scenario_placement([TensorParallel(degree=8), pim], [g, tp], ctx)
    cap = device_capacity_bytes(ctx)
    batches = {}
    for label, where in (("HBM", on_gpu), ("PIM", with_pim)):
        tokens = kv_capacity_tokens(found, cap, where)
        batches[label] = tokens // context
        print(f"KV in {label}: {tokens:,} tokens per replica ({where.label()}) -> {batches[label]} sequences of "
              f"{context} tokens")
    rows = {}
    for label, batch, offload in (("GPU, HBM-limited batch", batches["HBM"], False),
                                  ("AttAcc, same batch", batches["HBM"], True),
                                  ("AttAcc, PIM-capacity batch", batches["PIM"], True)):
        g, tp, ctx = graphs(batch)
        ms = per_step_ms(pim.apply(tp, ctx) if offload else tp)
        rows[label] = batch / ms * 1e3
        print(f"{label}: batch {batch}, {ms:.2f} ms per step, {rows[label]:,.0f} tokens/s per replica")
    base = rows["GPU, HBM-limited batch"]
    print(f"throughput over the GPU: same batch {rows['AttAcc, same batch'] / base:.2f}x, "
          f"with the capacity model's batch {rows['AttAcc, PIM-capacity batch'] / base:.2f}x (paper: up to 2.81x)")


def _ms(graph: TaskGraph) -> float:
    return float(step_times(replay(graph))["predicted_ns"].sum()) / 1e6


def _no_comm_ms(graph: TaskGraph, ctx: TransformContext) -> float:
    return _ms(Scale(select=Selector(kind="comm"), factor=0.0).apply(graph, ctx))


TOKENWEAVE_LAYERS = 4


def tokenweave_tp(tmp: Path, tokens: int, gpus: int = 8) -> tuple[TaskGraph, TransformContext]:
    """TokenWeave's setup: a Llama-70B-like stack of one iteration of ``tokens`` tokens on an H100,
    vLLM's fused add + norm, after ``tensor_parallel(gpus)`` on the DGX H100 preset."""
    a = analyze(llm_trace(tmp / f"tw_{tokens}.json.gz", new_tokens=tokens, kv_tokens=tokens, layers=TOKENWEAVE_LAYERS,
                          hidden=8192, heads=64, kv_heads=8, ffn=28672, steps=1, device="H100_SXM",
                          fused_add_norm=True))
    ctx = make_context(a.trace)
    return TensorParallel(degree=gpus, topology="dgx_h100").apply(a.graph, ctx), ctx


def tokenweave(tmp: Path) -> None:
    print("## TokenWeave (overlap after tensor_parallel 8 on DGX H100, vLLM's fused_add_rms_norm): ms per iteration")
    for tokens in (256, 1024, 2048, 4096):
        tp, ctx = tokenweave_tp(tmp, tokens)
        base = _ms(tp)
        cells = [f"{tokens} tokens: tp8 {base:.3f}"]
        variants = (("TokenWeave (2 splits, fused AllReduce-RMSNorm on 8 SMs)",
                     Overlap(nano_batches=2, comm_sms=TOKENWEAVE_SMS, fuse_norm=True, topology="dgx_h100")),
                    ("the split alone, collective on 8 SMs",
                     Overlap(nano_batches=2, comm_sms=TOKENWEAVE_SMS, topology="dgx_h100")),
                    ("the split with NCCL's all-reduce (NVLS, 16 SMs)",
                     Overlap(nano_batches=2, comm_sms=NCCL_NVLS_CTAS, topology="dgx_h100")),
                    ("the fused kernel alone (no split)",
                     Overlap(nano_batches=1, comm_sms=TOKENWEAVE_SMS, fuse_norm=True, topology="dgx_h100")),
                    ("the split at interference 1.15", Overlap(nano_batches=2, interference=1.15, topology="dgx_h100")))
        for label, transform in variants:
            t = _ms(transform.apply(tp, ctx))
            cells.append(f"{label}: {t:.3f} ({base / t:.3f}x)")
        no_comm = _no_comm_ms(tp, ctx)
        cells.append(f"no communication: {no_comm:.3f} ({base / no_comm:.3f}x)")
        print("; ".join(cells))


NANOFLOW_LAYERS, NANOFLOW_HIDDEN, NANOFLOW_HEADS, NANOFLOW_KV_HEADS, NANOFLOW_FFN = 80, 8192, 64, 8, 28672
NANOFLOW_CONTEXT = 1024
NANOFLOW_GPUS = 8
# NanoFlow's own scale for Llama-2-70B on 8 A100s (efeslab/Nanoflow @ d6b381e): the optimum its evaluation
# divides by (pipeline/eval/plot_all.py and calculate_speedup.py, `optimal_thorughput`, tokens/s per GPU),
# the share of it NanoFlow measured (README: 68.5 %), and the baselines it measured, offline, constant
# lengths 512-512 / 1024-512 / 512-1024 (pipeline/eval/baseline_data.py). Tokens = prompt + output tokens
# over time and GPUs (pipeline/utils/serve_8B.py), as whatif counts an iteration's tokens.
NANOFLOW_OPTIMAL_TOKS_PER_GPU = 1857.0
NANOFLOW_MEASURED_SHARE = 0.685
NANOFLOW_MEASURED_TOKS_PER_GPU = NANOFLOW_MEASURED_SHARE * NANOFLOW_OPTIMAL_TOKS_PER_GPU
NANOFLOW_BASELINES_TOKS_PER_GPU = {"TensorRT-LLM": (735.0, 817.0, 636.0), "DeepSpeed-FastGen": (490.0, 513.0, 372.0),
                                   "vLLM": (469.0, 549.0, 346.0)}


@dataclass(frozen=True)
class NanoFlowBatch:
    """One iteration's dense batch: ``decode`` sequences of one new token each at
    :data:`NANOFLOW_CONTEXT` tokens of context, and ``prefill`` prompt tokens."""

    label: str
    decode: int
    prefill: int

    @property
    def tokens(self) -> int:
        return self.decode + self.prefill


NANOFLOW_BATCHES = (
    NanoFlowBatch("NanoFlow's dense batch for Llama-2-70B: 1,280 decode + 768 prefill tokens", 1280, 768),
    NanoFlowBatch("dense decode batch of 1,024 sequences", 1024, 0),
)


def nanoflow_batch(tmp: Path, batch: NanoFlowBatch) -> None:
    print(f"### {batch.label}")
    a = analyze(llm_trace(tmp / f"nanoflow_{batch.decode}_{batch.prefill}.json.gz", batch=batch.decode, new_tokens=1,
                          kv_tokens=NANOFLOW_CONTEXT, layers=NANOFLOW_LAYERS, hidden=NANOFLOW_HIDDEN,
                          heads=NANOFLOW_HEADS, kv_heads=NANOFLOW_KV_HEADS, ffn=NANOFLOW_FFN, steps=1,
                          device="A100_SXM_80GB", gpu_name="NVIDIA A100-SXM4-80GB", prefill_tokens=batch.prefill))
    ctx = make_context(a.trace)
    tp = TensorParallel(degree=8, topology="dgx_a100").apply(a.graph, ctx)
    params = model_shape(a.graph, ctx).weight_bytes / element_bytes("bf16")   # the trace's GEMM weights
    optimal_ns = 2 * params * batch.tokens / (8 * 312e12) * 1e9   # NanoFlow's bound: 2 FLOPs per parameter per token
    print(f"optimal (compute-bound at the 312 TFLOP/s datasheet, {params / 1e9:.1f} B parameters, 8 GPUs): "
          f"{optimal_ns / 1e6:.3f} ms per iteration of {batch.tokens:,} tokens")
    curves = (("NanoFlow's measured A100 curves", NANOFLOW_GEMV, NANOFLOW_NETWORK),
              ("idealized: HBM saturated on 40% of the SMs, NCCL on 10%", saturating_curve(0.4),
               saturating_curve(0.1)),
              ("idealized: HBM saturated on 10% of the SMs, NCCL on 5%", saturating_curve(0.1),
               saturating_curve(0.05)))
    for i, (label, memory, comm) in enumerate(curves):
        s = search_nanoflow(tp, ctx, topology="dgx_a100", memory_curve=memory, comm_curve=comm)
        b = s.best
        if i == 0:
            p = s.parts.mean()
            print(f"per step (ms): GEMM {p['gemm_ns'] / 1e6:.3f}, memory-bound {p['memory_ns'] / 1e6:.3f}, "
                  f"collectives {p['comm_ns'] / 1e6:.3f}; sequential (NanoFlow's non-overlap) "
                  f"{b['sequential_ns'] / 1e6:.3f} ({optimal_ns / b['sequential_ns']:.1%} of optimal)")
            _nanoflow_scale("sequential", batch.tokens, b["sequential_ns"])
        it = b["iteration_ns"]
        print(f"{label}: best {int(b['nano_batches'])} nano-batches, GPU shares GEMM {b['gemm_share']:.2f} / "
              f"memory-bound {b['memory_share']:.2f} / collectives {b['comm_share']:.2f}: "
              f"{it / 1e6:.3f} ms ({s.speedup:.2f}x, {optimal_ns / it:.1%} of optimal)")
        if i == 0:
            _nanoflow_scale("NanoFlow, measured curves", batch.tokens, it)


def _nanoflow_scale(label: str, tokens: int, iteration_ns: float) -> None:
    """An iteration on NanoFlow's own scale: tokens/s per GPU, its share of NanoFlow's optimum, and
    its ratio to the throughput NanoFlow measured for itself and for TensorRT-LLM."""
    per_gpu = tokens / (iteration_ns / 1e9) / NANOFLOW_GPUS
    measured = NANOFLOW_MEASURED_TOKS_PER_GPU
    trt = NANOFLOW_BASELINES_TOKS_PER_GPU["TensorRT-LLM"]
    print(f"  on NanoFlow's scale, {label}: {per_gpu:,.0f} tokens/s per GPU = "
          f"{per_gpu / NANOFLOW_OPTIMAL_TOKS_PER_GPU:.1%} of its {NANOFLOW_OPTIMAL_TOKS_PER_GPU:,.0f}; "
          f"{per_gpu / measured - 1:+.1%} vs NanoFlow measured ({measured:,.0f}); "
          f"{per_gpu / max(trt):.2f}-{per_gpu / min(trt):.2f}x TensorRT-LLM measured ({min(trt):.0f}-{max(trt):.0f})")


def nanoflow(tmp: Path) -> None:
    print("## NanoFlow (search_nanoflow after tensor_parallel 8 on DGX A100): Llama-2-70B-like, "
          f"{NANOFLOW_CONTEXT:,} tokens of context per decode sequence")
    for batch in NANOFLOW_BATCHES:
        nanoflow_batch(tmp, batch)
    opt = NANOFLOW_OPTIMAL_TOKS_PER_GPU
    rows = "; ".join(f"{name} {min(v):.0f}-{max(v):.0f} ({min(v) / opt:.0%}-{max(v) / opt:.0%})"
                     for name, v in NANOFLOW_BASELINES_TOKS_PER_GPU.items())
    print(f"paper: NanoFlow at {NANOFLOW_MEASURED_SHARE:.1%} of its optimum of {opt:,.0f} tokens/s per GPU for "
          f"Llama-2-70B ({NANOFLOW_MEASURED_TOKS_PER_GPU:,.0f}; 59-72% across models), up to 1.91x over the best "
          f"baseline; baselines it measured, offline 512-512 / 1024-512 / 512-1024 tokens, tokens/s per GPU: {rows}")


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="whatif-papers-"))
    nanoflow(tmp)
    print()
    tokenweave(tmp)
    print()
    dcc(tmp)
    print()
    attacc(tmp)
    print()
    streamfusion(tmp)
    print()
    print("## Seesaw (reshard): 8x A100, Llama-70B-like, prefill 8x1024 tokens, decode 256 sequences")
    for setup in SEESAW:
        seesaw(tmp, setup)


if __name__ == "__main__":
    main()
