"""The memory ``batch`` predicts (``whatif memory -s``) against the program recorded at the other
batch: each setup is recorded twice on this machine's CPU with ``whatif record --memory
--record-shapes`` (at batch b and at k·b), each recording's timeline is edited to the other batch
(k and 1/k), and its peak is compared with the other recording's. Two bars to beat: predicting no
change, and every allocation × k.

Run: .venv/bin/python bench/batch_memory.py [--write-docs]   (the table goes into docs/memory.md)
"""
from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path

from whatif.tracer.trace import Trace, load_trace
from whatif.transforms.optimizations.batch import Batch

try:
    from common.docs import replace_section
    from common.memory_pair import predict_pair
    from common.recording import record_cpu
except ImportError:  # run as a module from the repo root
    from bench.common.docs import replace_section
    from bench.common.memory_pair import predict_pair
    from bench.common.recording import record_cpu

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- bench/batch_memory.py begin -->", "<!-- bench/batch_memory.py end -->"
MiB = 2**20


@dataclass(frozen=True)
class Setup:
    label: str
    program: str
    args: tuple[str, ...]
    batch_flag: str
    batches: tuple[int, int]


TRAIN = ("--steps", "3", "--layers", "2", "--autocast", "bf16")
SETUPS = (
    Setup("training (bf16 autocast, SDPA math), 2 layers, d 256, 512 tokens (sample_traces/sdpa_memory)", "train.py",
          ("--steps", "4", "--seq-len", "512", "--d-model", "256", "--heads", "4", "--layers", "2", "--autocast",
           "bf16", "--sdpa", "math"), "--batch-size", (2, 4)),
    Setup("training (bf16 autocast, SDPA flash), 2 layers, d 256, 256 tokens", "train.py",
          (*TRAIN, "--seq-len", "256", "--d-model", "256", "--heads", "4", "--sdpa", "flash"), "--batch-size", (4, 8)),
    Setup("training (fp32), 2 layers, d 256, 4 heads, 512 tokens", "train.py",
          ("--steps", "3", "--layers", "2", "--seq-len", "512", "--d-model", "256", "--heads", "4"),
          "--batch-size", (1, 3)),
    Setup("training (fp32), 3 layers, d 512, 8 heads, 128 tokens: the optimizer's peak", "train.py",
          ("--steps", "3", "--layers", "3", "--seq-len", "128", "--d-model", "512", "--heads", "8"),
          "--batch-size", (1, 3)),
    Setup("training (bf16 autocast), 2 layers, d 1,024 = tokens per step (4 × 256): activation and weight shapes "
          "collide", "train.py", (*TRAIN, "--seq-len", "256", "--d-model", "1024", "--heads", "8"),
          "--batch-size", (4, 8)),
    Setup("DiT inference (bf16), 4 requests × 3 denoising steps with CFG, 512 tokens, requests per batch",
          "dit_serve.py", ("--dtype", "bfloat16", "--num-requests", "4", "--steps", "3", "--rate", "inf",
                           "--resolution", "32", "--frames", "2", "--warmup", "0"), "--batch", (1, 2)),
)


def row(setup: Setup, before: Trace, after: Trace, factor: float, pair: str) -> str:
    docs = predict_pair(before, after, Batch(factor=factor))
    (was,), (got,), (truth,) = docs.recorded.devices, docs.predicted.devices, docs.measured.devices
    steps = {s.step: s.peak_allocated_bytes for s in docs.measured.steps if s.excluded is None}
    common = [s for s in docs.predicted.steps if s.step in steps and s.excluded is None]
    worst = max(abs(s.peak_allocated_bytes / steps[s.step] - 1) for s in common)
    p, t, w = got.peak_allocated_bytes, truth.peak_allocated_bytes, was.peak_allocated_bytes
    print(f"{setup.label} {pair}: {docs.line}", flush=True)
    return (f"| {setup.label} | {pair} | {w / MiB:,.1f} | {p / MiB:,.1f} | {t / MiB:,.1f} | {p / t - 1:+.2%} "
            f"({p - t:+,}) | {w / t - 1:+.1%} | {w * factor / t - 1:+.1%} | {worst:.2%} ({len(common)}) | "
            f"{docs.what_if_s:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/memory.md")
    args = parser.parse_args()
    rows = ["| setup | batch | recorded peak MiB | predicted | measured | error (bytes) | predicting no change | "
            "every allocation × k | step peaks, largest error (steps compared) | what-if s |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for setup in SETUPS:
        small, large = setup.batches
        with tempfile.TemporaryDirectory() as tmp:
            a, b = (load_trace(record_cpu(setup.program, (*setup.args, setup.batch_flag, str(n)), Path(tmp) / f"b{n}"))
                    for n in setup.batches)
        rows.append(row(setup, a, b, large / small, f"{small} → {large}"))
        rows.append(row(setup, b, a, small / large, f"{large} → {small}"))
    table = "\n".join(rows)
    print(table)
    if args.write_docs:
        replace_section(ROOT / "docs" / "memory.md", BEGIN, END, table)


if __name__ == "__main__":
    main()
