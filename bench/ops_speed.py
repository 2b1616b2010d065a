"""Speed of the per-op roofline table (``whatif ops``, issue 17: under 1 s per 10k kernels on every
shared trace): the time of :func:`whatif.ops.ops_table` on a loaded trace, per trace and per 10k
GPU activities, over every shared trace with GPU activity and our own GPU recordings.

Loading the trace is not timed (``whatif ops`` prints its own load progress; bench/parse_speed.py
measures the reader). Each table is made twice and the faster run is kept (the machine is shared).

    .venv/bin/python bench/ops_speed.py [TRACES_DIR]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from whatif.api import load_trace
from whatif.ops import ops_table
from whatif.tracer import TraceError
from whatif.tracer.kinds import GPU_ACTIVITY_KINDS, codes
from whatif.tracer.readers import is_trace_name, run_folders

ROOT = Path(__file__).resolve().parents[1]
GOAL_S_PER_10K = 1.0
BIG = 1_000
"""Traces with fewer GPU activities are judged by their whole time: a fixed cost of tens of ms
(building the frames, pricing a handful of groups) is no rate."""


def inputs(root: Path) -> list[Path]:
    shared = sorted(p for p in root.rglob("*") if p.is_file() and is_trace_name(p.name)) if root.is_dir() else []
    return shared + run_folders(ROOT / "sample_traces" / "gpu")


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT.parent / "shared" / "traces"
    print("| trace | GPU activities | ops rows | ops_table s | s per 10k activities |")
    print("|---|---|---|---|---|")
    worst, small_worst_s = 0.0, 0.0
    for path in inputs(root):
        try:
            trace = load_trace(path)
        except TraceError:
            continue
        n = int(trace.events["kind"].isin(codes(GPU_ACTIVITY_KINDS)).sum())
        if n == 0:
            continue
        best = float("inf")
        for _ in range(2):
            t0 = time.perf_counter()
            doc = ops_table(trace)
            best = min(best, time.perf_counter() - t0)
        per = best / n * 1e4
        if n >= BIG:
            worst = max(worst, per)
        else:
            small_worst_s = max(small_worst_s, best)
        name = str(path.relative_to(root)) if path.is_relative_to(root) else str(path.relative_to(ROOT))
        print(f"| `{name}` | {n:,} | {len(doc.rows)} | {best:.3f} | {per:.3f} |")
    print(f"\ntraces with >= {BIG:,} GPU activities: worst {worst:.3f} s per 10k activities (goal "
          f"{GOAL_S_PER_10K} s): {'met' if worst < GOAL_S_PER_10K else 'MISSED'}; smaller traces: at most "
          f"{small_worst_s:.3f} s each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
