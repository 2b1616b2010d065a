"""The memory ``flash_attention`` predicts (``whatif memory -s``) against the program recorded with
the flash backend: each setup is recorded twice on this machine's CPU with ``whatif record --memory
--record-shapes`` (SDPA forced to its math backend, then to its flash backend), the math recording's
timeline is edited as FlashAttention would allocate, and its peak is compared with the flash
recording's. Predicting no change is the bar to beat.

Run: .venv/bin/python bench/flash_memory.py [--write-docs]   (the table goes into docs/memory.md)
"""
from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path

from whatif.tracer.trace import load_trace
from whatif.transforms.optimizations.flash_attention import FlashAttention

try:
    from common.docs import replace_section
    from common.memory_pair import predict_pair
    from common.recording import record_cpu
except ImportError:  # run as a module from the repo root
    from bench.common.docs import replace_section
    from bench.common.memory_pair import predict_pair
    from bench.common.recording import record_cpu

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- bench/flash_memory.py begin -->", "<!-- bench/flash_memory.py end -->"
MiB = 2**20


@dataclass(frozen=True)
class Setup:
    label: str
    program: str
    args: tuple[str, ...]


SETUPS = (
    Setup("training, 2 layers, 4 heads of 64, 4 × 512 tokens (sample_traces/sdpa_memory)", "train.py",
          ("--steps", "4", "--batch-size", "4", "--seq-len", "512", "--d-model", "256", "--heads", "4",
           "--layers", "2", "--autocast", "bf16")),
    Setup("training, 3 layers, 8 heads of 64, 2 × 1,024 tokens", "train.py",
          ("--steps", "3", "--batch-size", "2", "--seq-len", "1024", "--d-model", "512", "--heads", "8",
           "--layers", "3", "--autocast", "bf16")),
    Setup("training, 2 layers, 4 heads of 80, 3 × 300 tokens", "train.py",
          ("--steps", "3", "--batch-size", "3", "--seq-len", "300", "--d-model", "320", "--heads", "4",
           "--layers", "2", "--autocast", "bf16")),
    Setup("DiT inference (bf16), 2 requests × 3 denoising steps with CFG, 512 tokens", "dit_serve.py",
          ("--dtype", "bfloat16", "--num-requests", "2", "--steps", "3", "--rate", "inf", "--resolution", "32",
           "--frames", "2")),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/memory.md")
    args = parser.parse_args()
    rows = ["| setup | SDPA calls edited | math backend, peak MiB | predicted | flash backend, measured | error "
            "(bytes) | predicting no change | step peaks, largest error | what-if s |",
            "|---|---|---|---|---|---|---|---|---|"]
    for setup in SETUPS:
        with tempfile.TemporaryDirectory() as tmp:
            before, after = (load_trace(record_cpu(setup.program, (*setup.args, "--sdpa", b), Path(tmp) / b))
                             for b in ("math", "flash"))
        docs = predict_pair(before, after, FlashAttention())
        (was,), (got,), (truth,) = docs.recorded.devices, docs.predicted.devices, docs.measured.devices
        counted = [s.step for s in docs.measured.steps if s.excluded is None]
        steps = {s.step: s.peak_allocated_bytes for s in docs.predicted.steps}
        worst = max(abs(steps[s.step] / s.peak_allocated_bytes - 1) for s in docs.measured.steps
                    if s.step in counted)
        err = got.peak_allocated_bytes / truth.peak_allocated_bytes - 1
        unchanged = was.peak_allocated_bytes / truth.peak_allocated_bytes - 1
        calls = docs.line.split(" SDPA math calls")[0].removeprefix("flash_attention: ")
        rows.append(f"| {setup.label} | {calls} | {was.peak_allocated_bytes / MiB:,.1f} | "
                    f"{got.peak_allocated_bytes / MiB:,.1f} | {truth.peak_allocated_bytes / MiB:,.1f} | {err:+.2%} "
                    f"({got.peak_allocated_bytes - truth.peak_allocated_bytes:+,}) | "
                    f"{unchanged:+.1%} | {worst:.2%} | {docs.what_if_s:.2f} |")
        print(f"{setup.label}: {docs.line}", flush=True)
    table = "\n".join(rows)
    print(table)
    if args.write_docs:
        replace_section(ROOT / "docs" / "memory.md", BEGIN, END, table)


if __name__ == "__main__":
    main()
