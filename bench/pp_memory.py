"""The memory ``pipeline_parallel`` predicts for each stage (``whatif memory -s``) against the
program run with 1F1B pipeline parallelism: each setup is recorded on this machine's CPU with
``whatif record --memory --record-shapes``, once alone (``examples/train.py``, the whole batch in
one pass) and once as ``p`` gloo ranks started by torchrun (``--pp p --micro-batches m``, rank
``s`` = stage ``s``); the alone recording's timeline is edited to each stage's and its peak
compared with that rank's (``--schedule gpipe`` for GPipe rows). Two bars to beat: predicting no
change, and every allocation / p. One setup also runs tensor parallelism inside each stage
(``--tp 2 --pp 2``: the scenario ``tensor_parallel`` then ``pipeline_parallel``, their shares
multiplied).

Run: .venv/bin/python bench/pp_memory.py [--write-docs]   (the table goes into docs/memory.md)
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from whatif.depgraph.build import build_graph
from whatif.memory import memory
from whatif.tracer.trace import Trace
from whatif.transforms.parallel.pipeline import PipelineParallel
from whatif.transforms.parallel.tensor import TensorParallel

try:
    from common.docs import replace_section
    from common.memory_pair import RanksRun, alone_and_ranks, predict_pair, span
except ImportError:  # run as a module from the repo root
    from bench.common.docs import replace_section
    from bench.common.memory_pair import RanksRun, alone_and_ranks, predict_pair, span

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- bench/pp_memory.py begin -->", "<!-- bench/pp_memory.py end -->"
MiB = 2**20


@dataclass(frozen=True)
class Setup:
    label: str
    args: tuple[str, ...]
    plans: tuple[tuple[int, int, int, str], ...]   # (tensor-parallel degree, stages, micro-batches, schedule)


MODEL = ("--steps", "3", "--d-model", "256", "--heads", "8", "--layers", "4")
SETUPS = (
    Setup("fp32, SDPA math, 4 layers, d 256, 8 heads, 8 × 256 tokens",
          (*MODEL, "--batch-size", "8", "--seq-len", "256", "--sdpa", "math"),
          ((1, 2, 4, "1f1b"), (1, 4, 4, "1f1b"), (1, 4, 8, "1f1b"), (1, 2, 4, "gpipe"), (2, 2, 4, "1f1b"))),
    Setup("fp32, SDPA flash, 4 layers, d 512, 8 heads, 8 × 128 tokens: weights and optimizer state",
          ("--steps", "3", "--d-model", "512", "--heads", "8", "--layers", "4", "--batch-size", "8", "--seq-len", "128",
           "--sdpa", "flash"), ((1, 2, 4, "1f1b"),)),
    Setup("bf16 autocast, SDPA math, 4 layers, d 256, 8 heads, 8 × 256 tokens",
          (*MODEL, "--batch-size", "8", "--seq-len", "256", "--sdpa", "math", "--autocast", "bf16"),
          ((1, 2, 4, "1f1b"),)),
)


def rows(setup: Setup, alone: Trace, ranks: Trace, t: int, p: int, m: int, schedule: str) -> list[str]:
    measured = {d.rank: d for d in memory(ranks, build_graph(ranks)).devices}
    out = []
    for s in range(p):
        stage_of_plan = PipelineParallel(degree=p, stage=s, micro_batches=m, schedule=schedule)
        docs = predict_pair(alone, alone, *([TensorParallel(degree=t)] if t > 1 else []), stage_of_plan)
        (was,), (got,) = docs.recorded.devices, docs.predicted.devices
        w, pred = was.peak_allocated_bytes, got.peak_allocated_bytes
        stage = [measured[s * t + j] for j in range(t)]
        meas = [d.peak_allocated_bytes for d in stage]
        print(f"{setup.label} tp {t} pp {p} mb {m} {schedule} stage {s}: {' | '.join(docs.lines)}", flush=True)
        out.append(f"| {setup.label} | {t} | {p} | {m} | {schedule} | {s} | {w / MiB:,.1f} | {pred / MiB:,.1f} | "
                   f"{span([x / MiB for x in meas], ',.1f')} | {span([pred / x - 1 for x in meas], '+.1%')} | "
                   f"{span([w / x - 1 for x in meas], '+.1%')} | {span([w / (t * p) / x - 1 for x in meas], '+.1%')} | "
                   f"{got.peak_op} | {', '.join(sorted({d.peak_op for d in stage}))} | {docs.what_if_s:.2f} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/memory.md")
    args = parser.parse_args()
    table = ["| setup | t | p | m | schedule | stage | recorded alone, peak MiB | predicted | measured, per rank | "
             "error | predicting no change | every allocation / (t·p) | op at the predicted peak | "
             "op at the measured peak | what-if s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for setup in SETUPS:
        runs = [RanksRun(("--tp", str(t), "--pp", str(p), "--micro-batches", str(m), "--schedule", schedule), t * p)
                for t, p, m, schedule in setup.plans]
        for plan, (_, alone, ranks) in zip(setup.plans, alone_and_ranks("train.py", setup.args, runs)):
            table.extend(rows(setup, alone, ranks, *plan))
    text = "\n".join(table)
    print(text)
    if args.write_docs:
        replace_section(ROOT / "docs" / "memory.md", BEGIN, END, text)


if __name__ == "__main__":
    main()
