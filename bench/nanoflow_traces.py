"""``whatif nanoflow`` (:func:`whatif.api.nanoflow`) on shared third-party traces: one iteration's
GEMM, memory-bound and collective time and NanoFlow's best schedule, with NanoFlow's measured A100
curves and the collectives' parts priced on the DGX A100 preset. For docs/multi-gpu.md.

    .venv/bin/python bench/nanoflow_traces.py
"""
from __future__ import annotations

import sys
from pathlib import Path

from whatif.api import NanoFlowOptions, nanoflow

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
CASES = ("tracelens/xdit_flux1_baseline_mi300x.json.gz", "tracelens/hf_h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
         "hta/nccl_data_a100_rank0of2.json.gz", "hta/negative_queue_a100_rank0of16.json.gz")


def main() -> int:
    if not TRACES.is_dir():
        print(f"skipped: {TRACES} is absent (the shared third-party traces)")
        return 0
    print("| trace | GEMM ms | memory-bound ms | collectives ms | nano-batches | shares GEMM / memory / comm "
          "| speedup |")
    print("|---|---|---|---|---|---|---|")
    for name in CASES:
        doc, _ = nanoflow(TRACES / name, options=NanoFlowOptions(topology="dgx_a100"))
        p = doc.partition
        shares = "-" if p is None else f"{p.gemm_share:.2f} / {p.memory_share:.2f} / {p.comm_share:.2f}"
        print(f"| `{name}` | {doc.gemm_ns / 1e6:.1f} | {doc.memory_ns / 1e6:.1f} | {doc.comm_ns / 1e6:.1f} | "
              f"{doc.nano_batches if p is not None else '-'} | {shares} | {doc.speedup:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
