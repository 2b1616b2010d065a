"""The memory ``autocast`` predicts (``whatif memory -s``) against the program recorded under
``torch.autocast``: each setup of examples/train.py is recorded twice on this machine's CPU with
``whatif record --memory --record-shapes`` (fp32, then ``--autocast bf16|fp16``), the fp32
recording's timeline is edited as autocast would allocate, and its peak is compared with the
autocast recording's. Two bars to beat: predicting no change, and the rule of thumb "mixed
precision halves the activations" (every activation block at half its bytes, nothing added).

Run: .venv/bin/python bench/autocast_memory.py [--write-docs]   (the table goes into docs/memory.md)
"""
from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from whatif.depgraph.build import build_graph
from whatif.memory import memory
from whatif.tracer.memory import BlockScaling, scaled_edit
from whatif.tracer.trace import Trace, load_trace
from whatif.transforms.optimizations.autocast import Autocast
from whatif.transforms.optimizations.batch_memory import BlockRole, block_roles

try:
    from common.docs import replace_section
    from common.memory_pair import predict_pair
    from common.recording import record_cpu
except ImportError:  # run as a module from the repo root
    from bench.common.docs import replace_section
    from bench.common.memory_pair import predict_pair
    from bench.common.recording import record_cpu

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- bench/autocast_memory.py begin -->", "<!-- bench/autocast_memory.py end -->"
MiB = 2**20


@dataclass(frozen=True)
class Setup:
    label: str
    dtype: str
    args: tuple[str, ...]


def _model(layers: int, d: int, heads: int, batch: int, seq: int, sdpa: str, vocab: int = 512) -> tuple[str, ...]:
    return ("--steps", "3", "--batch-size", str(batch), "--seq-len", str(seq), "--d-model", str(d), "--heads",
            str(heads), "--layers", str(layers), "--vocab", str(vocab), "--sdpa", sdpa)


SETUPS = (
    Setup("2 layers, d 256, 8 heads, 4 × 256 tokens, SDPA math (sample_traces/tp_memory/tp1)", "bf16",
          _model(2, 256, 8, 4, 256, "math")),
    Setup("2 layers, d 256, 8 heads, 4 × 256 tokens, SDPA flash", "bf16", _model(2, 256, 8, 4, 256, "flash")),
    Setup("2 layers, d 256, 8 heads, 4 × 256 tokens, SDPA math", "fp16", _model(2, 256, 8, 4, 256, "math")),
    Setup("4 layers, d 512, 8 heads, 4 × 512 tokens, SDPA math", "bf16", _model(4, 512, 8, 4, 512, "math")),
    Setup("2 layers, d 1,024, 16 heads, 8 × 256 tokens, SDPA flash, vocabulary 8,192", "bf16",
          _model(2, 1024, 16, 8, 256, "flash", 8192)),
    Setup("2 layers, d 1,024, 16 heads, 4 × 64 tokens, SDPA math, vocabulary 8,192 (weights dominate)", "bf16",
          _model(2, 1024, 16, 4, 64, "math", 8192)),
)


def halved_peak(trace: Trace) -> int:
    """The peak when every activation block is held at half its bytes and nothing else changes."""
    roles = block_roles(trace, "autocast")
    rows = roles.of(BlockRole.ACTIVATION)
    edit = scaled_edit(trace.memory, BlockScaling(rows, np.full(len(rows), 0.5)), "activations halved")
    return memory(trace, build_graph(trace), edits=[edit]).devices[0].peak_allocated_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/memory.md")
    args = parser.parse_args()
    rows = ["| setup (examples/train.py, 3 steps) | autocast | fp32, peak MiB | predicted | autocast, measured | "
            "error (bytes) | predicting no change | activations halved | step peaks, largest error | "
            "peak at (predicted / measured) | what-if s |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for setup in SETUPS:
        with tempfile.TemporaryDirectory() as tmp:
            before = load_trace(record_cpu("train.py", setup.args, Path(tmp) / "fp32"))
            after = load_trace(record_cpu("train.py", (*setup.args, "--autocast", setup.dtype),
                                          Path(tmp) / setup.dtype))
        docs = predict_pair(before, after, Autocast(dtype=setup.dtype))
        (was,), (got,), (truth,) = docs.recorded.devices, docs.predicted.devices, docs.measured.devices
        steps = {s.step: s.peak_allocated_bytes for s in docs.predicted.steps}
        worst = max(abs(steps[s.step] / s.peak_allocated_bytes - 1) for s in docs.measured.steps
                    if s.excluded is None and s.step in steps)
        t = truth.peak_allocated_bytes
        err = got.peak_allocated_bytes / t - 1
        halved = halved_peak(before) / t - 1
        rows.append(f"| {setup.label} | {setup.dtype} | {was.peak_allocated_bytes / MiB:,.1f} | "
                    f"{got.peak_allocated_bytes / MiB:,.1f} | {t / MiB:,.1f} | {err:+.2%} "
                    f"({got.peak_allocated_bytes - t:+,}) | {was.peak_allocated_bytes / t - 1:+.1%} | {halved:+.1%} | "
                    f"{worst:.2%} | {got.peak_op} / {truth.peak_op} | {docs.what_if_s:.2f} |")
        print(f"{setup.label}: {docs.line}", flush=True)
    table = "\n".join(rows)
    print(table)
    if args.write_docs:
        replace_section(ROOT / "docs" / "memory.md", BEGIN, END, table)


if __name__ == "__main__":
    main()
