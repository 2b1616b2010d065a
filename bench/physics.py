"""Physics relations (whatif.physics) on every shared trace and bundled sample: does each
prediction move as the hardware would? Prints a Markdown table (docs/accuracy.md holds the last
run's output) and, per trace, the detail of every relation that fails.

Usage: python bench/physics.py [TRACES_DIR]
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

from whatif.api import analyze
from whatif.physics import Relation, check
from whatif.tracer import TraceError
from whatif.tracer.readers import run_folders

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay_fidelity import inputs

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = run_folders(ROOT / "sample_traces")  # the CPU samples and every GPU harvest recording


def _num(x: float, fmt: str) -> str:
    return "" if math.isnan(x) else format(x, fmt)


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT.parent / "shared" / "traces"
    paths = ([*inputs(root)] if root.is_dir() else []) + SAMPLES
    rels = list(Relation)
    print("| trace | steps | " + " | ".join(r.value for r in rels) +
          " | GPU x0 ms (all steps) | CPU own-work floor ms | GPU x0.5 speedup | Amdahl ceiling | s |")
    print("|---|---|" + "---|" * len(rels) + "---|---|---|---|---|")
    failures: list[str] = []
    held = {r: 0 for r in rels}
    applied = {r: 0 for r in rels}
    for path in paths:
        name = str(path.relative_to(root)) if path.is_relative_to(root) else str(path.relative_to(ROOT))
        t0 = time.perf_counter()
        try:
            a = analyze(path)
        except TraceError:
            continue
        results = {r.relation: r for r in check(a)}
        cells = []
        for rel in rels:
            r = results[rel]
            applied[rel] += r.applies
            held[rel] += r.applies and r.holds
            cells.append("–" if not r.applies else ("ok" if r.holds else "**fails**"))
            if r.applies and not r.holds:
                failures.append(f"* `{name}` {rel.value}: {r.detail}")
        z, b = results[Relation.GPU_ZERO], results[Relation.BOUNDED]
        print(f"| `{name}` | {len(a.steps)} | " + " | ".join(cells) +
              f" | {_num(z.value, '.2f')} | {_num(z.bound, '.2f')} | {_num(b.value, '.3f')} | "
              f"{_num(b.bound, '.3f')} | {time.perf_counter() - t0:.1f} |")
    print("\nholds / applies: " + ", ".join(f"{r.value} {held[r]}/{applied[r]}" for r in rels))
    print("\n" + "\n".join(failures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
