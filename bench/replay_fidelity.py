"""Replay fidelity on every shared trace: measured vs replayed step time.

Goal (issue 2): median step error <= 1 % and worst step <= 3 % on every trace with GPU activity.
Prints a Markdown table (docs/accuracy.md holds the last run's output).

Usage: python bench/replay_fidelity.py [TRACES_DIR]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from whatif.api import analyze
from whatif.tracer import TraceError
from whatif.tracer.readers import is_trace_name

ROOT = Path(__file__).resolve().parents[1]
MULTI_RANK_DIRS = ("hta/sampled_world128",)


def inputs(root: Path) -> list[Path]:
    multi = [root / d for d in MULTI_RANK_DIRS if (root / d).is_dir()]
    files = [p for p in sorted(root.rglob("*")) if is_trace_name(p.name)
             and not any(m in p.parents for m in multi)]
    return files + multi


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT.parent / "shared" / "traces"
    if not root.is_dir():
        print(f"traces not found at {root} (../shared is absent)", file=sys.stderr)
        return 2
    print("| trace | ranks | steps | tasks | median abs error | worst step error | build+replay s |")
    print("|---|---|---|---|---|---|---|")
    worst_all, misses = 0.0, []
    for path in inputs(root):
        name = str(path.relative_to(root))
        t0 = time.perf_counter()
        try:
            a = analyze(path)
        except TraceError as exc:
            print(f"| `{name}` | refused: {exc.problem} | | | | | |")
            continue
        elapsed = time.perf_counter() - t0
        err = a.steps["error"].abs()
        worst_all = max(worst_all, float(err.max()))
        if err.median() > 0.01 or err.max() > 0.03:
            misses.append(name)
        print(f"| `{name}` | {a.steps['rank'].nunique()} | {len(a.steps)} | {a.graph.num_tasks:,} | "
              f"{err.median() * 100:.3f} % | {err.max() * 100:.3f} % | {elapsed:.2f} |")
    print(f"\nworst step error over all traces: {worst_all * 100:.3f} %; traces missing the goal: "
          f"{', '.join(misses) if misses else 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
