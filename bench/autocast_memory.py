"""The memory ``autocast`` and ``precision`` predict (``whatif memory -s``) against the program
recorded under ``torch.autocast`` and converted to 16 bits: each setup of examples/train.py is
recorded on this machine's CPU with ``whatif record --memory --record-shapes`` in fp32, under
``--autocast bf16|fp16`` and converted with ``--dtype bfloat16|float16``; the fp32 recording's
timeline is edited as each would allocate, and its peak is compared with the other recording's.
Two bars to beat: predicting no change, and a rule of thumb (mixed precision halves the
activations; a converted model halves every block).

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
from whatif.transforms.base import Transform
from whatif.transforms.optimizations.autocast import Autocast
from whatif.transforms.optimizations.batch_memory import BlockRole, block_roles
from whatif.transforms.optimizations.precision import Precision

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
    converted: bool = True   # also recorded converted to the dtype (--dtype)
    program: str = "train.py"
    autocast: bool = True    # also recorded under --autocast (train.py, dit_serve.py)


MODEL_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def _model(layers: int, d: int, heads: int, batch: int, seq: int, sdpa: str, vocab: int = 512) -> tuple[str, ...]:
    return ("--steps", "3", "--batch-size", str(batch), "--seq-len", str(seq), "--d-model", str(d), "--heads",
            str(heads), "--layers", str(layers), "--vocab", str(vocab), "--sdpa", sdpa)


SETUPS = (
    Setup("2 layers, d 256, 8 heads, 4 × 256 tokens, SDPA math (sample_traces/tp_memory/tp1)", "bf16",
          _model(2, 256, 8, 4, 256, "math")),
    Setup("2 layers, d 256, 8 heads, 4 × 256 tokens, SDPA flash", "bf16", _model(2, 256, 8, 4, 256, "flash")),
    # fp16 without loss scaling: AdamW's eps (1e-8) underflows and the converted model's loss is NaN
    Setup("2 layers, d 256, 8 heads, 4 × 256 tokens, SDPA math", "fp16", _model(2, 256, 8, 4, 256, "math"),
          converted=False),
    Setup("4 layers, d 512, 8 heads, 4 × 512 tokens, SDPA math", "bf16", _model(4, 512, 8, 4, 512, "math")),
    Setup("2 layers, d 1,024, 16 heads, 8 × 256 tokens, SDPA flash, vocabulary 8,192", "bf16",
          _model(2, 1024, 16, 8, 256, "flash", 8192)),
    Setup("2 layers, d 1,024, 16 heads, 4 × 64 tokens, SDPA math, vocabulary 8,192 (weights dominate)", "bf16",
          _model(2, 1024, 16, 4, 64, "math", 8192)),
    Setup("LLM serving (llm_serve.py), 4 requests of 8-16 output tokens, KV cache, SDPA math", "bf16",
          ("--seed", "0", "--num-requests", "4", "--rate", "inf", "--output-min", "8", "--output-max", "16",
           "--sdpa", "math"), program="llm_serve.py", autocast=False),
    Setup("DiT inference (dit_serve.py), 2 requests × 3 denoising steps with CFG, SDPA math", "bf16",
          ("--seed", "0", "--num-requests", "2", "--steps", "3", "--rate", "inf", "--resolution", "32", "--frames",
           "2", "--sdpa", "math"), program="dit_serve.py"),
    Setup("DiT inference (dit_serve.py), 4 requests × 2 denoising steps with CFG, SDPA flash, d 384", "bf16",
          ("--seed", "0", "--num-requests", "4", "--batch", "4", "--steps", "2", "--rate", "inf", "--resolution",
           "32", "--d-model", "384", "--heads", "6", "--sdpa", "flash"), program="dit_serve.py"),
)
BASELINE = {"train.py": ()}
"""What records the fp32 program (train.py is fp32 by default; the servers pick by --dtype)."""


def halved_peak(trace: Trace, roles_halved: tuple[BlockRole, ...]) -> int:
    """The peak when every block of ``roles_halved`` is held at half its bytes and nothing else changes."""
    roles = block_roles(trace, "autocast")
    rows = np.sort(np.concatenate([roles.of(r) for r in roles_halved]))
    edit = scaled_edit(trace.memory, BlockScaling(rows, np.full(len(rows), 0.5)), "halved")
    return memory(trace, build_graph(trace), edits=[edit]).devices[0].peak_allocated_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/memory.md")
    args = parser.parse_args()
    rows = ["| setup (examples/train.py, 3 steps, unless named) | what-if | fp32, peak MiB | predicted | measured | "
            "error (bytes) | predicting no change | rule of thumb | step peaks, largest error | "
            "peak at (predicted / measured) | what-if s |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for setup in SETUPS:
        runs: list[tuple[str, tuple[BlockRole, ...], Transform, tuple[str, ...]]] = []
        if setup.autocast:
            runs.append((f"autocast {setup.dtype}", (BlockRole.ACTIVATION,), Autocast(dtype=setup.dtype),
                         ("--autocast", setup.dtype)))
        if setup.converted:
            runs.append((f"precision {setup.dtype} (converted)", tuple(BlockRole), Precision(dtype=setup.dtype),
                         ("--dtype", MODEL_DTYPES[setup.dtype])))
        with tempfile.TemporaryDirectory() as tmp:
            fp32 = BASELINE.get(setup.program, ("--dtype", "float32"))
            before = load_trace(record_cpu(setup.program, (*setup.args, *fp32), Path(tmp) / "fp32"))
            afters = [load_trace(record_cpu(setup.program, (*setup.args, *extra), Path(tmp) / f"after{i}"))
                      for i, (_, _, _, extra) in enumerate(runs)]
        for (label, halved, transform, _), after in zip(runs, afters):
            docs = predict_pair(before, after, transform)
            (was,), (got,), (truth,) = docs.recorded.devices, docs.predicted.devices, docs.measured.devices
            steps = {s.step: s.peak_allocated_bytes for s in docs.predicted.steps}
            worst = max(abs(steps[s.step] / s.peak_allocated_bytes - 1) for s in docs.measured.steps
                        if s.excluded is None and s.step in steps)
            t = truth.peak_allocated_bytes
            err = got.peak_allocated_bytes / t - 1
            rule = halved_peak(before, halved) / t - 1
            unchanged = was.peak_allocated_bytes / t - 1
            rows.append(f"| {setup.label} | {label} | {was.peak_allocated_bytes / MiB:,.1f} | "
                        f"{got.peak_allocated_bytes / MiB:,.1f} | {t / MiB:,.1f} | {err:+.2%} "
                        f"({got.peak_allocated_bytes - t:+,}) | {unchanged:+.1%} | {rule:+.1%} | "
                        f"{worst:.2%} | {got.peak_op} / {truth.peak_op} | {docs.what_if_s:.2f} |")
            print(f"{setup.label}: {docs.line}", flush=True)
    table = "\n".join(rows)
    print(table)
    if args.write_docs:
        replace_section(ROOT / "docs" / "memory.md", BEGIN, END, table)


if __name__ == "__main__":
    main()
