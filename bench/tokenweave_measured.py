"""whatif's TokenWeave model against TokenWeave's own measurements on 8x H100 (DGX, TP 8).

The measurements are the paper's artifact (microsoft/tokenweave @ f483d1c, ``artifact/csvs/``,
MIT): figure_11a.csv, prefill latency of Llama-3.3-70B-Instruct (hidden 8192, 64 heads, 8 KV heads,
FFN 28672; one iteration of N prompt tokens, batch 1) with vLLM's multimem all-reduce
(``baseline_multimem``), with every all-reduce removed (``no_ar``) and with TokenWeave
(``overlap_fused``); figure_7.csv, the multimem all-reduce and PyTorch's (NCCL) all-reduce of N x
8192 bf16 values; figure_10.csv, TokenWeave's fused AllReduce + RMSNorm kernel. Both kernel figures
at 8 thread blocks (CTAs), the SM count bench/papers.py uses. The numbers are typed in below from
those files.

whatif's side is bench/papers.py's TokenWeave setup (tests/_llm_tracegen.py, the same layer shapes,
4 layers, kernels at the H100's achievable roofline, vLLM's fused_add_rms_norm): TP 8 on the DGX H100
preset, the same TP 8 with every collective x0, and ``overlap`` with 2 splits, ``fuse_norm`` and
``comm_sms = 8``. The all-reduce is NCCL's tuning model on the preset (it picks NVLS, the in-switch
reduction multimem uses). The fused kernel's extra time over the all-reduce alone is
``absorbed_part_ns`` for one part of all N tokens.

  .venv/bin/python bench/tokenweave_measured.py      (~30 s)
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from _llm_tracegen import llm_trace  # noqa: E402

from whatif.api import analyze, make_context  # noqa: E402
from whatif.hardware.collectives import estimate  # noqa: E402
from whatif.hardware.topology import preset  # noqa: E402
from whatif.predictors.replay import replay  # noqa: E402
from whatif.predictors.steps import step_times  # noqa: E402
from whatif.transforms.generic import Scale  # noqa: E402
from whatif.transforms.parallel.fused_norm import absorbed_part_ns, fusable  # noqa: E402
from whatif.transforms.parallel.overlap import TOKENWEAVE_SMS, Overlap, _regions  # noqa: E402
from whatif.transforms.parallel.tensor import TensorParallel  # noqa: E402
from whatif.transforms.select import Selector  # noqa: E402

HIDDEN = 8192
# figure_11a.csv, Llama-3.3-70B-Instruct, 8 GPUs: prompt tokens -> (baseline_multimem, no_ar, overlap_fused) ms
MEASURED_MS = {1024: (53.661, 41.938, 46.164), 2048: (94.227, 74.922, 76.732), 4096: (179.483, 144.896, 142.226)}
# figure_7.csv (multimem all-reduce at 8 CTAs, PyTorch's all-reduce) and figure_10.csv (fused AllReduce +
# RMSNorm at 8 CTAs): tokens -> (multimem us, pytorch us, fused us)
MEASURED_US = {256: (28.480, 67.072, 33.664), 1024: (75.136, 136.966, 86.624), 2048: (135.744, 219.488, 155.424),
               4096: (257.280, 348.077, 290.848)}


def _ms(graph) -> float:
    return float(step_times(replay(graph))["predicted_ns"].sum()) / 1e6


def _pct(ours: float, measured: float) -> str:
    return f"{(ours / measured - 1) * 100:+.1f} %"


def kernels(tmp: Path) -> None:
    print("## Kernels: all-reduce of N x 8192 bf16 on 8 H100s, and TokenWeave's fused AllReduce + RMSNorm (8 CTAs)")
    print("| tokens | all-reduce, whatif (algorithm) | multimem, measured | PyTorch (NCCL), measured | "
          "fused kernel's extra over the all-reduce: whatif | measured |")
    print("|---|---|---|---|---|---|")
    dgx = preset("dgx_h100")
    for tokens, (multimem, torch, fused) in MEASURED_US.items():
        e = estimate("all_reduce", tokens * HIDDEN * 2, 8, dgx)
        graph, ctx = _tp8(tmp, tokens)
        reg = _regions(graph)
        kernels_, ranks = next((k, r) for k, r in fusable(graph, reg["comm"].to_numpy(), reg["consumer"].to_numpy())
                               if len(k))
        extra_us = absorbed_part_ns(graph, ctx, kernels_, ranks, 1, TOKENWEAVE_SMS) / 1e3
        print(f"| {tokens:,} | {e.time_ns / 1e3:.1f} us ({e.algorithm.value}; {_pct(e.time_ns / 1e3, multimem)}) "
              f"| {multimem:.1f} us | {torch:.1f} us | {extra_us:.1f} us | {fused - multimem:.1f} us |")


def _tp8(tmp: Path, tokens: int):
    a = analyze(llm_trace(tmp / f"tw_{tokens}.json.gz", new_tokens=tokens, kv_tokens=tokens, layers=4,
                          hidden=HIDDEN, heads=64, kv_heads=8, ffn=28672, steps=1, device="H100_SXM",
                          fused_add_norm=True))
    ctx = make_context(a.trace)
    return TensorParallel(degree=8, topology="dgx_h100").apply(a.graph, ctx), ctx


def iterations(tmp: Path) -> None:
    print("## One prefill iteration of N tokens, TP 8: speedup over TP 8 (whatif vs measured, Llama-3.3-70B)")
    print("| tokens | communication share, whatif | measured | TokenWeave, whatif | measured | error | "
          "error of predicting no change | no communication, whatif | measured |")
    print("|---|---|---|---|---|---|---|---|---|")
    for tokens, (base_m, no_ar_m, tw_m) in MEASURED_MS.items():
        graph, ctx = _tp8(tmp, tokens)
        base = _ms(graph)
        no_comm = _ms(Scale(select=Selector(kind="comm"), factor=0.0).apply(graph, ctx))
        tokenweave = Overlap(nano_batches=2, comm_sms=TOKENWEAVE_SMS, fuse_norm=True, topology="dgx_h100")
        tw = _ms(tokenweave.apply(graph, ctx))
        ours, measured = base / tw, base_m / tw_m
        print(f"| {tokens:,} | {1 - no_comm / base:.1%} | {1 - no_ar_m / base_m:.1%} | {ours:.3f}x | {measured:.3f}x | "
              f"{_pct(ours, measured)} | {_pct(1.0, measured)} | {base / no_comm:.3f}x | {base_m / no_ar_m:.3f}x |")


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="whatif-tokenweave-"))
    kernels(tmp)
    print()
    iterations(tmp)


if __name__ == "__main__":
    main()
