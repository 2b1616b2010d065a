"""The memory ``pipeline_parallel`` predicts for each stage (``whatif memory -s``) against the
program run with 1F1B pipeline parallelism: each setup is recorded on this machine's CPU with
``whatif record --memory --record-shapes``, once alone (``examples/train.py``, the whole batch in
one pass) and once as ``p`` gloo ranks started by torchrun (``--pp p --micro-batches m``, rank
``s`` = stage ``s``); the alone recording's timeline is edited to each stage's and its peak
compared with that rank's. Two bars to beat: predicting no change, and every allocation / p.

Run: .venv/bin/python bench/pp_memory.py [--write-docs]   (the table goes into docs/memory.md)
"""
from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path

from whatif.depgraph.build import build_graph
from whatif.memory import memory
from whatif.tracer.trace import Trace, load_trace
from whatif.transforms.parallel.pipeline import PipelineParallel

try:
    from common.docs import replace_section
    from common.memory_pair import predict_pair
    from common.recording import record_cpu, record_cpu_ranks
except ImportError:  # run as a module from the repo root
    from bench.common.docs import replace_section
    from bench.common.memory_pair import predict_pair
    from bench.common.recording import record_cpu, record_cpu_ranks

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- bench/pp_memory.py begin -->", "<!-- bench/pp_memory.py end -->"
MiB = 2**20


@dataclass(frozen=True)
class Setup:
    label: str
    args: tuple[str, ...]
    plans: tuple[tuple[int, int], ...]   # (stages, micro-batches)


MODEL = ("--steps", "3", "--d-model", "256", "--heads", "8", "--layers", "4")
SETUPS = (
    Setup("fp32, SDPA math, 4 layers, d 256, 8 heads, 8 × 256 tokens",
          (*MODEL, "--batch-size", "8", "--seq-len", "256", "--sdpa", "math"), ((2, 4), (4, 4), (4, 8))),
    Setup("fp32, SDPA flash, 4 layers, d 512, 8 heads, 8 × 128 tokens: weights and optimizer state",
          ("--steps", "3", "--d-model", "512", "--heads", "8", "--layers", "4", "--batch-size", "8", "--seq-len", "128",
           "--sdpa", "flash"), ((2, 4),)),
    Setup("bf16 autocast, SDPA math, 4 layers, d 256, 8 heads, 8 × 256 tokens",
          (*MODEL, "--batch-size", "8", "--seq-len", "256", "--sdpa", "math", "--autocast", "bf16"), ((2, 4),)),
)


def rows(setup: Setup, alone: Trace, ranks: Trace, p: int, m: int) -> list[str]:
    measured = {d.rank: d for d in memory(ranks, build_graph(ranks)).devices}
    out = []
    for s in range(p):
        docs = predict_pair(alone, alone, PipelineParallel(degree=p, stage=s, micro_batches=m))
        (was,), (got,) = docs.recorded.devices, docs.predicted.devices
        w, pred, meas = was.peak_allocated_bytes, got.peak_allocated_bytes, measured[s].peak_allocated_bytes
        print(f"{setup.label} pp {p} mb {m} stage {s}: {docs.line}", flush=True)
        out.append(f"| {setup.label} | {p} | {m} | {s} | {w / MiB:,.1f} | {pred / MiB:,.1f} | {meas / MiB:,.1f} | "
                   f"{pred / meas - 1:+.1%} | {w / meas - 1:+.1%} | {w / p / meas - 1:+.1%} | {got.peak_op} | "
                   f"{measured[s].peak_op} | {docs.what_if_s:.2f} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/memory.md")
    args = parser.parse_args()
    table = ["| setup | p | m | stage | recorded alone, peak MiB | predicted | measured | error | "
             "predicting no change | every allocation / p | op at the predicted peak | op at the measured peak | "
             "what-if s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for setup in SETUPS:
        with tempfile.TemporaryDirectory() as tmp:
            alone = load_trace(record_cpu("train.py", setup.args, Path(tmp) / "alone"))
            for p, m in setup.plans:
                run = record_cpu_ranks("train.py", (*setup.args, "--pp", str(p), "--micro-batches", str(m)),
                                       Path(tmp) / f"pp{p}m{m}", p)
                table.extend(rows(setup, alone, load_trace(run), p, m))
    text = "\n".join(table)
    print(text)
    if args.write_docs:
        replace_section(ROOT / "docs" / "memory.md", BEGIN, END, text)


if __name__ == "__main__":
    main()
