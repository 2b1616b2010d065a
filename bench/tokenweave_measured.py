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

  .venv/bin/python bench/tokenweave_measured.py      (~5 s)
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from papers import TOKENWEAVE_LAYERS, _ms, _no_comm_ms, tokenweave_tp

from whatif.hardware.collectives import Algorithm, estimate, estimates
from whatif.hardware.topology import preset
from whatif.transforms.generic import Scale
from whatif.transforms.parallel.fused_norm import absorbed_part_ns, fusable
from whatif.transforms.parallel.overlap import TOKENWEAVE_SMS, Overlap, _regions
from whatif.transforms.select import Selector

HIDDEN = 8192
# figure_11a.csv (8 GPUs) and figure_11b.csv (4 GPUs), Llama-3.3-70B-Instruct:
# (GPUs, prompt tokens) -> (baseline_multimem, no_ar, overlap_fused) ms
MEASURED_MS = {(8, 1024): (53.661, 41.938, 46.164), (8, 2048): (94.227, 74.922, 76.732),
               (8, 4096): (179.483, 144.896, 142.226),
               (4, 1024): (82.166, 70.781, 72.485), (4, 2048): (150.607, 132.505, 137.112),
               (4, 4096): (295.198, 257.206, 261.902)}
# figure_7.csv: tokens -> (multimem all-reduce at 8 CTAs, PyTorch's all-reduce) us
MEASURED_AR_US = {64: (17.056, 35.891), 128: (20.384, 55.558), 256: (28.480, 67.072), 512: (43.776, 94.381),
                  1024: (75.136, 136.966), 2048: (135.744, 219.488), 4096: (257.280, 348.077),
                  8192: (501.024, 646.170), 16384: (986.560, 1231.622), 32768: (1959.200, 2405.530)}
# figure_10.csv: tokens -> fused AllReduce + RMSNorm at 8 CTAs, us
MEASURED_FUSED_US = {256: 33.664, 1024: 86.624, 2048: 155.424, 4096: 290.848}


def _pct(ours: float, measured: float) -> str:
    return f"{(ours / measured - 1) * 100:+.1f} %"


def all_reduces() -> None:
    print("## All-reduce of N x 8192 bf16 on 8 H100s (DGX H100 preset): whatif's NCCL model vs measured")
    print("| tokens | MiB | whatif, NCCL's pick | multimem, measured | error | whatif, ring | PyTorch (NCCL), measured "
          "| error |")
    print("|---|---|---|---|---|---|---|---|")
    dgx = preset("dgx_h100")
    for tokens, (multimem, torch) in MEASURED_AR_US.items():
        nbytes = tokens * HIDDEN * 2
        pick = estimate("all_reduce", nbytes, 8, dgx)
        ring = min((e for e in estimates("all_reduce", nbytes, 8, dgx) if e.algorithm is Algorithm.RING),
                   key=lambda e: e.time_ns)
        print(f"| {tokens:,} | {nbytes / 2**20:g} | {pick.time_ns / 1e3:.1f} us ({pick.algorithm.value}) | "
              f"{multimem:.1f} us | {_pct(pick.time_ns / 1e3, multimem)} | {ring.time_ns / 1e3:.1f} us | "
              f"{torch:.1f} us | {_pct(ring.time_ns / 1e3, torch)} |")


def fused_kernels(tmp: Path) -> None:
    print("## TokenWeave's fused AllReduce + RMSNorm on 8 SMs: its time over the all-reduce alone")
    print("| tokens | whatif | measured |")
    print("|---|---|---|")
    for tokens, fused in MEASURED_FUSED_US.items():
        graph, ctx = tokenweave_tp(tmp, tokens)
        reg = _regions(graph)
        kernels_, ranks = next((k, r) for k, r in fusable(graph, reg["comm"].to_numpy(), reg["consumer"].to_numpy())
                               if len(k))
        extra_us = absorbed_part_ns(graph, ctx, kernels_, ranks, 1, TOKENWEAVE_SMS) / 1e3
        print(f"| {tokens:,} | {extra_us:.1f} us | {fused - MEASURED_AR_US[tokens][0]:.1f} us |")


def _speedups(graph, ctx, fuse_norm: bool = True) -> tuple[float, float, float]:
    """(TP step ms, its step without communication, TokenWeave's step; without ``fuse_norm``, the
    split alone)."""
    tokenweave = Overlap(nano_batches=2, comm_sms=TOKENWEAVE_SMS, fuse_norm=fuse_norm, topology="dgx_h100")
    return _ms(graph), _no_comm_ms(graph, ctx), _ms(tokenweave.apply(graph, ctx))


def iterations(tmp: Path) -> None:
    print("## One prefill iteration of N tokens: speedup over TP without overlap (whatif vs measured, "
          "Llama-3.3-70B)")
    print("| TP | tokens | communication share, whatif | measured | TokenWeave, whatif | measured | error | "
          "error of predicting no change | the split alone (no fused norm), whatif | error | no communication, "
          "whatif | measured | ms per layer without communication, whatif | measured / 80 layers | kernels x k "
          "so that they match it: k | communication share | TokenWeave | error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (gpus, tokens), (base_m, no_ar_m, tw_m) in MEASURED_MS.items():
        graph, ctx = tokenweave_tp(tmp, tokens, gpus)
        base, no_comm, tw = _speedups(graph, ctx)
        split = base / _speedups(graph, ctx, fuse_norm=False)[2]
        ours, measured = base / tw, base_m / tw_m
        layer_ms = no_comm / TOKENWEAVE_LAYERS
        k = (no_ar_m / 80) / layer_ms
        scaled = Scale(select=Selector(kind="kernel"), factor=k).apply(graph, ctx)
        base_k, no_comm_k, tw_k = _speedups(scaled, ctx)
        print(f"| {gpus} | {tokens:,} | {1 - no_comm / base:.1%} | {1 - no_ar_m / base_m:.1%} | {ours:.3f}x | "
              f"{measured:.3f}x | {_pct(ours, measured)} | {_pct(1.0, measured)} | {split:.3f}x | "
              f"{_pct(split, measured)} | {base / no_comm:.3f}x | {base_m / no_ar_m:.3f}x | {layer_ms:.3f} | "
              f"{no_ar_m / 80:.3f} | {k:.3f} | {1 - no_comm_k / base_k:.1%} | {base_k / tw_k:.3f}x | "
              f"{_pct(base_k / tw_k, measured)} |")


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="whatif-tokenweave-"))
    all_reduces()
    print()
    fused_kernels(tmp)
    print()
    iterations(tmp)


if __name__ == "__main__":
    main()
