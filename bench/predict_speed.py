"""Re-prediction speed: a scenario of several transforms on a >= 100 k-task graph.

Goal (issue 4): <= 1 s to re-predict (the dashboard needs it interactive). The graph is a real
trace's steps repeated (``repeat_trace``); the scenario uses every registered optimization that
applies to it plus the generic ones. Reports the time to apply the scenario and replay the final
graph, and separately with the per-transform waterfall (one replay per transform).

Usage: python bench/predict_speed.py [--trace PATH] [--tasks 100000]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from whatif.api import make_context
from whatif.depgraph.build import build_graph
from whatif.predictors.replay import replay
from whatif.predictors.steps import step_times
from whatif.tracer import load_trace
from whatif.tracer.repeat import repeat_trace
from whatif.transforms import registry
from whatif.transforms.base import TransformError
from whatif.transforms.scenario import Scenario, build_transform

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = (ROOT.parent / "shared" / "traces" / "kineto"
                 / "resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz")
CANDIDATES = [
    ("scale", {"factor": 0.8, "select": {"kernel_class": "gemm"}}),
    ("fuse", {}),
    ("precision", {"dtype": "fp16"}),
    ("gpu", {"device": "A100_SXM_80GB"}),
    ("dataloader", {"workers": 4}),
    ("cuda_graph", {}),
    ("remove", {"select": {"kind": "cpu_work", "name": "^aten::empty"}}),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--tasks", type=int, default=100_000)
    args = ap.parse_args()
    if not Path(args.trace).exists():
        print(f"trace not found: {args.trace} (../shared is absent?)", file=sys.stderr)
        return 2
    trace = load_trace(args.trace)
    one = build_graph(trace).num_tasks
    big = repeat_trace(trace, -(-args.tasks // one))
    graph = build_graph(big)
    ctx = make_context(big)
    base = step_times(replay(graph))["predicted_ns"].sum()
    transforms, skipped = [], []
    for name, params in CANDIDATES:
        if name not in registry.names():
            skipped.append(f"{name} (not registered)")
            continue
        t = build_transform(name, params)
        try:
            t.apply(graph, ctx)
        except TransformError as exc:
            skipped.append(f"{name} ({exc})")
            continue
        transforms.append(t)
    scenario = Scenario(name="bench", transforms=transforms)
    print(f"graph: {graph.num_tasks:,} tasks, {graph.num_edges:,} edges; scenario: "
          f"{', '.join(t.label() for t in transforms)}")
    if skipped:
        print("skipped: " + "; ".join(skipped))
    rows = []
    for _run in range(3):
        t0 = time.perf_counter()
        graphs = scenario.apply(graph, ctx)
        t1 = time.perf_counter()
        final = replay(graphs[-1])
        total = step_times(final)["predicted_ns"].sum()
        t2 = time.perf_counter()
        for g in graphs[:-1]:
            step_times(replay(g))
        t3 = time.perf_counter()
        rows.append((t1 - t0, t2 - t1, t3 - t0))
    print(f"{'run':>3} {'transforms s':>12} {'replay s':>9} {'re-predict s':>12} {'with waterfall s':>16}")
    for i, (a, b, c) in enumerate(rows):
        print(f"{i:>3} {a:>12.3f} {b:>9.3f} {a + b:>12.3f} {c:>16.3f}")
    best = min(a + b for a, b, _ in rows)
    print(f"predicted speedup {base / total:.3f}x; best re-predict {best:.3f} s -> "
          f"{'meets' if best <= 1.0 else 'MISSES'} the goal (<= 1 s)")
    per = []
    for t in transforms:
        t0 = time.perf_counter()
        t.apply(graph, ctx)
        per.append(f"{t.name} {time.perf_counter() - t0:.3f} s")
    print("each transform alone on the base graph: " + ", ".join(per))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
