"""The memory ``tensor_parallel`` predicts for one rank (``whatif memory -s``) against the program
run with Megatron tensor parallelism: each setup is recorded on this machine's CPU with ``whatif
record --memory --record-shapes``, once alone (``examples/train.py``) and once as ``t`` gloo ranks
started by torchrun (``--tp t``); the alone recording's timeline is edited to one rank's and its
peak compared with each rank's. Two bars to beat: predicting no change, and every allocation / t.

Run: .venv/bin/python bench/tp_memory.py [--write-docs]   (the table goes into docs/memory.md)
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from whatif.tracer.trace import Trace
from whatif.transforms.parallel.tensor import TensorParallel

try:
    from common.docs import replace_section
    from common.memory_pair import RanksRun, alone_and_ranks, predict_pair, span
except ImportError:  # run as a module from the repo root
    from bench.common.docs import replace_section
    from bench.common.memory_pair import RanksRun, alone_and_ranks, predict_pair, span

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- bench/tp_memory.py begin -->", "<!-- bench/tp_memory.py end -->"
MiB = 2**20


@dataclass(frozen=True)
class Setup:
    """One setup of examples/train.py, recorded alone and as each tensor-parallel degree."""

    label: str
    args: tuple[str, ...]
    degrees: tuple[int, ...]


MODEL = ("--steps", "3", "--heads", "8", "--layers", "2")
SETUPS = (
    Setup("fp32, SDPA math, 2 layers, d 256, 8 heads, 4 × 256 tokens (sample_traces/tp_memory)",
          (*MODEL, "--batch-size", "4", "--seq-len", "256", "--d-model", "256", "--sdpa", "math"), (2, 4)),
    Setup("fp32, SDPA math, 2 layers, d 256, 8 heads, 2 × 512 tokens: attention's peak",
          (*MODEL, "--batch-size", "2", "--seq-len", "512", "--d-model", "256", "--sdpa", "math"), (2,)),
    Setup("fp32, SDPA flash, 2 layers, d 512, 8 heads, 4 × 256 tokens: weights and optimizer state",
          (*MODEL, "--batch-size", "4", "--seq-len", "256", "--d-model", "512", "--sdpa", "flash"), (2,)),
    Setup("bf16 autocast, SDPA math, 2 layers, d 256, 8 heads, 4 × 256 tokens",
          (*MODEL, "--batch-size", "4", "--seq-len", "256", "--d-model", "256", "--sdpa", "math", "--autocast",
           "bf16"), (2,)),
)


def row(setup: Setup, alone: Trace, ranks: Trace, t: int) -> str:
    docs = predict_pair(alone, ranks, TensorParallel(degree=t))
    (was,), (got,) = docs.recorded.devices, docs.predicted.devices
    w, p = was.peak_allocated_bytes, got.peak_allocated_bytes
    measured = [d.peak_allocated_bytes for d in docs.measured.devices]
    same_op = sum(d.peak_op == got.peak_op for d in docs.measured.devices)

    print(f"{setup.label} tp {t}: {docs.line}", flush=True)
    return (f"| {setup.label} | {t} | {w / MiB:,.1f} | {p / MiB:,.1f} | {span([m / MiB for m in measured], ',.1f')} | "
            f"{span([p / m - 1 for m in measured], '+.2%')} ({span([p - m for m in measured], '+,')}) | "
            f"{span([w / m - 1 for m in measured], '+.1%')} | "
            f"{span([w / t / m - 1 for m in measured], '+.1%')} | {got.peak_op} ({same_op} of {len(measured)}) | "
            f"{docs.what_if_s:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/memory.md")
    args = parser.parse_args()
    rows = ["| setup | t | recorded alone, peak MiB | predicted, one rank | measured, per rank | "
            "error (bytes) | predicting no change | every allocation / t | op at the predicted peak (ranks peaking "
            "there) | what-if s |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for setup in SETUPS:
        runs = [RanksRun(("--tp", str(t)), t) for t in setup.degrees]
        rows += [row(setup, alone, ranks, run.ranks) for run, alone, ranks in alone_and_ranks("train.py", setup.args,
                                                                                             runs)]
    table = "\n".join(rows)
    print(table)
    if args.write_docs:
        replace_section(ROOT / "docs" / "memory.md", BEGIN, END, table)


if __name__ == "__main__":
    main()
