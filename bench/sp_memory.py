"""The memory ``sequence_parallel`` predicts for one rank (``whatif memory -s``) in Ulysses, Ring
and USP mode against the DiT server run that way: each setup of examples/dit_serve.py is recorded
on this machine's CPU with ``whatif record --memory --record-shapes``, once alone and once per
layout as ``P`` gloo ranks started by torchrun (``--sp P --ring R``: Ulysses over ``P/R`` ranks, a
ring over ``R``); the alone recording's timeline is edited to one rank's and its peak (and each
denoising step's) compared with each rank's. Two bars to beat: predicting no change, and a rule of
thumb (every activation at 1/P, nothing added). A second table runs ``batch`` and
``sequence_parallel`` in one scenario: recorded alone at b requests per batch, predicted as ranks
each denoising k·b together (``--batch``), against that run.

Run: .venv/bin/python bench/sp_memory.py [--write-docs]   (the table goes into docs/memory.md)
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from whatif.depgraph.build import build_graph
from whatif.memory import memory, memory_edits
from whatif.tracer.memory import BlockScaling, scaled_edit
from whatif.tracer.trace import Trace
from whatif.transforms.base import Transform
from whatif.transforms.optimizations.batch import Batch
from whatif.transforms.optimizations.batch_memory import BlockRole, block_roles
from whatif.transforms.parallel.sequence import SequenceParallel

try:
    from common.docs import replace_section
    from common.memory_pair import RanksRun, alone_and_ranks, predict_pair, span
except ImportError:  # run as a module from the repo root
    from bench.common.docs import replace_section
    from bench.common.memory_pair import RanksRun, alone_and_ranks, predict_pair, span

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- bench/sp_memory.py begin -->", "<!-- bench/sp_memory.py end -->"
BATCH_BEGIN, BATCH_END = "<!-- bench/sp_memory.py batch begin -->", "<!-- bench/sp_memory.py batch end -->"
MiB = 2**20


@dataclass(frozen=True)
class Setup:
    """One setup of examples/dit_serve.py and the layouts it is run with: ``(P, R)``, Ulysses over
    ``P/R`` ranks and a ring over ``R``."""

    label: str
    args: tuple[str, ...]
    layouts: tuple[tuple[int, int], ...]

    def runs(self, flags: tuple[str, ...] = ()) -> list[RanksRun]:
        return [RanksRun((*flags, "--sp", str(p), "--ring", str(r)), p) for p, r in self.layouts]


@dataclass(frozen=True)
class BatchSetup:
    """A setup recorded alone at ``batches[0]`` requests per batch and run as ranks at ``batches[1]``."""

    setup: Setup
    batches: tuple[int, int]


COMMON = ("--seed", "0", "--rate", "inf", "--warmup", "1")
SETUPS = (
    Setup("fp32, SDPA math, 4 layers, d 192, 4 heads, 2 requests × 2 steps with CFG, 256 tokens "
          "(sample_traces/sp_memory)",
          (*COMMON, "--num-requests", "2", "--batch", "2", "--steps", "2", "--resolution", "32", "--sdpa", "math"),
          ((2, 1), (4, 1), (2, 2), (4, 4), (4, 2))),
    Setup("fp32, SDPA flash, 4 layers, d 256, 8 heads, 2 requests × 2 steps with CFG, 1,024 tokens",
          (*COMMON, "--num-requests", "2", "--batch", "2", "--steps", "2", "--resolution", "64",
           "--d-model", "256", "--heads", "8", "--sdpa", "flash"), ((2, 1), (4, 1), (8, 1), (2, 2), (4, 4), (4, 2))),
    Setup("bf16, SDPA math, 2 layers, d 256, 8 heads, video 4 frames, 1 request × 2 steps, 1,024 tokens",
          (*COMMON, "--num-requests", "1", "--batch", "1", "--steps", "2", "--resolution", "32", "--frames", "4",
           "--layers", "2", "--d-model", "256", "--heads", "8", "--dtype", "bfloat16", "--sdpa", "math"),
          ((2, 1), (4, 1), (2, 2), (4, 2))),
    Setup("fp32, SDPA math, 6 layers, d 384, 6 heads, 4 requests × 2 steps without CFG, 144 tokens",
          (*COMMON, "--num-requests", "4", "--batch", "4", "--steps", "2", "--resolution", "24", "--layers", "6",
           "--d-model", "384", "--heads", "6", "--cfg-scale", "1", "--sdpa", "math"), ((2, 1), (3, 1), (3, 3), (6, 3))),
)


BATCH_SETUPS = (
    BatchSetup(Setup("fp32, SDPA math, 4 layers, d 192, 4 heads, 2 requests × 2 steps with CFG, 256 tokens",
                     (*COMMON, "--num-requests", "2", "--steps", "2", "--resolution", "32", "--sdpa", "math"),
                     ((2, 1), (2, 2), (4, 2))), (1, 2)),
    BatchSetup(Setup("fp32, SDPA flash, 4 layers, d 256, 8 heads, 2 requests × 2 steps with CFG, 1,024 tokens",
                     (*COMMON, "--num-requests", "2", "--steps", "2", "--resolution", "64", "--d-model", "256",
                      "--heads", "8", "--sdpa", "flash"), ((2, 1), (2, 2), (4, 2))), (1, 2)),
    BatchSetup(Setup("bf16, SDPA math, 2 layers, d 256, 8 heads, video 4 frames, 2 requests × 2 steps, 1,024 tokens",
                     (*COMMON, "--num-requests", "2", "--steps", "2", "--resolution", "32", "--frames", "4",
                      "--layers", "2", "--d-model", "256", "--heads", "8", "--dtype", "bfloat16", "--sdpa", "math"),
                     ((2, 1), (2, 2))), (1, 2)),
    BatchSetup(Setup("fp32, SDPA math, 6 layers, d 384, 6 heads, 4 requests × 2 steps without CFG, 144 tokens",
                     (*COMMON, "--num-requests", "4", "--steps", "2", "--resolution", "24", "--layers", "6",
                      "--d-model", "384", "--heads", "6", "--cfg-scale", "1", "--sdpa", "math"), ((3, 1), (3, 3))),
               (2, 4)),
)


def transform(degree: int, ring: int) -> SequenceParallel:
    if ring == 1:
        return SequenceParallel(mode="ulysses", degree=degree)
    if ring == degree:
        return SequenceParallel(mode="ring", degree=degree)
    return SequenceParallel(mode="usp", degree=degree, ulysses_degree=degree // ring)


def layout(degree: int, ring: int) -> str:
    return "Ulysses" if ring == 1 else "Ring" if ring == degree else f"USP {degree // ring}×{ring}"


def activations_scaled_peak(trace: Trace, degree: int) -> int:
    """The peak when every activation block is held at 1/P of its bytes and nothing else changes."""
    rows = block_roles(trace, "sequence_parallel").of(BlockRole.ACTIVATION)
    edit = scaled_edit(trace.memory, BlockScaling(rows, np.full(len(rows), 1 / degree)), "activations / P")
    return memory(trace, build_graph(trace), edits=[edit]).devices[0].peak_allocated_bytes


def row(setup: Setup, alone: Trace, ranks: Trace, degree: int, ring: int) -> str:
    docs = predict_pair(alone, ranks, transform(degree, ring))
    (was,), (got,) = docs.recorded.devices, docs.predicted.devices
    w, p = was.peak_allocated_bytes, got.peak_allocated_bytes
    measured = [d.peak_allocated_bytes for d in docs.measured.devices]
    predicted_steps = {s.step: s.peak_allocated_bytes for s in docs.predicted.steps}
    worst = max(abs(predicted_steps[s.step] / s.peak_allocated_bytes - 1) for s in docs.measured.steps
                if s.excluded is None and s.step in predicted_steps)
    rule = activations_scaled_peak(alone, degree)
    same_op = sum(d.peak_op == got.peak_op for d in docs.measured.devices)
    print(f"{setup.label} {layout(degree, ring)} {degree}: {docs.line}", flush=True)
    return (f"| {setup.label} | {layout(degree, ring)} | {degree} | {w / MiB:,.2f} | {p / MiB:,.2f} | "
            f"{span([m / MiB for m in measured], ',.2f')} | {span([p / m - 1 for m in measured], '+.2%')} "
            f"({span([p - m for m in measured], '+,')}) | {worst:.2%} | "
            f"{span([w / m - 1 for m in measured], '+.1%')} | {span([rule / m - 1 for m in measured], '+.1%')} | "
            f"{got.peak_op} ({same_op} of {len(measured)}) | {docs.what_if_s:.2f} |")


def rows() -> list[str]:
    out = []
    for setup in SETUPS:
        runs = alone_and_ranks("dit_serve.py", setup.args, setup.runs())
        out += [row(setup, alone, ranks, *at) for at, (_, alone, ranks) in zip(setup.layouts, runs)]
    return out


def peak(trace: Trace, *transforms: Transform) -> int:
    graph = build_graph(trace)
    return memory(trace, graph, edits=memory_edits(graph, list(transforms))[0]).devices[0].peak_allocated_bytes


def batch_row(b: BatchSetup, alone: Trace, ranks: Trace, degree: int, ring: int) -> str:
    """Recorded alone at b requests per batch, predicted as one rank of the layout at k·b."""
    small, large = b.batches
    grown, sp = Batch(factor=large / small), transform(degree, ring)
    docs = predict_pair(alone, ranks, grown, sp)
    (was,), (got,) = docs.recorded.devices, docs.predicted.devices
    w, p = was.peak_allocated_bytes, got.peak_allocated_bytes
    measured = [d.peak_allocated_bytes for d in docs.measured.devices]
    bars = [peak(alone, sp), peak(alone, grown)]
    print(f"{b.setup.label} batch {small}->{large} {layout(degree, ring)} {degree}: {docs.lines[-1]}", flush=True)
    return (f"| {b.setup.label} | {small} → {large} | {layout(degree, ring)} | {degree} | {w / MiB:,.2f} | "
            f"{p / MiB:,.2f} | {span([m / MiB for m in measured], ',.2f')} | "
            f"{span([p / m - 1 for m in measured], '+.2%')} ({span([p - m for m in measured], '+,')}) | "
            f"{span([w / m - 1 for m in measured], '+.1%')} | "
            + " | ".join(span([x / m - 1 for m in measured], '+.1%') for x in bars) + f" | {docs.what_if_s:.2f} |")


def batch_rows() -> list[str]:
    out = []
    for b in BATCH_SETUPS:
        small, large = (("--batch", str(n)) for n in b.batches)
        runs = alone_and_ranks("dit_serve.py", b.setup.args, b.setup.runs(large), small)
        out += [batch_row(b, alone, ranks, *at) for at, (_, alone, ranks) in zip(b.setup.layouts, runs)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true", help="write the tables into docs/memory.md")
    parser.add_argument("--only", choices=["layouts", "batch"], help="run one table")
    args = parser.parse_args()
    tables = {"layouts": (LAYOUTS_HEADER, rows, (BEGIN, END)),
              "batch": (BATCH_HEADER, batch_rows, (BATCH_BEGIN, BATCH_END))}
    for name, (header, make, (begin, end)) in tables.items():
        if args.only in (None, name):
            table = "\n".join([header, "|" + "---|" * header.count(" | ") + "---|", *make()])
            print(table)
            if args.write_docs:
                replace_section(ROOT / "docs" / "memory.md", begin, end, table)


LAYOUTS_HEADER = ("| setup (examples/dit_serve.py) | layout | P | recorded alone, peak MiB | predicted, one rank "
                  "| measured, per rank | error (bytes) | step peaks, largest error | predicting no change "
                  "| activations / P | op at the predicted peak (ranks peaking there) | what-if s |")
BATCH_HEADER = ("| setup (examples/dit_serve.py) | requests per batch, alone → ranks | layout | P | recorded alone, "
                "peak MiB | predicted, one rank | measured, per rank | error (bytes) | predicting no change "
                "| the layout at the recorded batch | the batch on one GPU | what-if s |")


if __name__ == "__main__":
    main()
