"""Predicted effect of lower precision (``precision`` transform) on shared traces, and our
fp32→fp16 factors against Daydream's published AMP factors.

There is no ground truth for these what-ifs in ../shared (no trace pair differs only in
precision), so part 1 reports predictions only: step time and GPU busy time per dtype.
Part 2 is the reference point the issue names: Daydream (Zhu et al., ATC 2020) models AMP on a
V100 as compute-bound kernels ×1/3 and memory-bound kernels ×1/2; we apply both models to the
fp32 ResNet-50 V100 trace and compare per kernel class and on the step. Prints tables measured
in one run; about half a minute.

    .venv/bin/python bench/whatif_precision.py
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from whatif.api import Analysis, analyze, make_context
from whatif.depgraph.graph import TaskGraph, TaskKind
from whatif.hardware.devices import find_device
from whatif.predictors.replay import replay
from whatif.predictors.steps import step_times
from whatif.transforms.base import TransformError
from whatif.transforms.generic import Scale
from whatif.transforms.optimizations.precision import Precision
from whatif.transforms.scenario import Scenario
from whatif.transforms.select import Selector, kernel_classes

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
V100_RESNET = "kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"
CASES = [  # (trace, dtypes to try; refusals are reported as such)
    (V100_RESNET, ["fp16", "bf16", "int8", "int4_weight"]),
    ("hta/negative_queue_a100_rank0of16.json.gz", ["tf32", "bf16", "fp8", "int8", "int4_weight"]),
    ("tracelens/hf_h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", ["fp8", "int8", "int4_weight"]),
    ("tracelens/sglang_qwen3_8b_decode_mi300x.json.gz", ["fp8", "int4_weight"]),
    ("tracelens/b200_eager_rank0of8.json.gz", ["fp8", "int4_weight"]),
]
MATRIX = ["gemm", "conv", "attention"]
DAYDREAM = {"compute": 1 / 3, "memory": 1 / 2}


def kernel_busy_ms(graph: TaskGraph) -> float:
    t = graph.tasks
    k = (t["kind"].to_numpy() == int(TaskKind.KERNEL)) & (t["step"].to_numpy() >= 0)
    return float(t["dur_ns"].to_numpy()[k].sum() / 1e6)


def mean_step_ms(graph: TaskGraph) -> float:
    return float(step_times(replay(graph))["predicted_ns"].mean() / 1e6)


def predictions() -> pd.DataFrame:
    rows = []
    for rel, dtypes in CASES:
        path = TRACES / rel
        if not path.exists():
            continue
        a = analyze(path)
        ctx = make_context(a.trace)
        base_step, base_busy = a.steps["predicted_ns"].mean() / 1e6, kernel_busy_ms(a.graph)
        found = find_device(ctx.device)
        dev = found.name if found is not None else "?"
        for d in dtypes:
            row = {"trace": Path(rel).name[:42], "gpu": dev, "dtype": d, "step_ms": base_step}
            try:
                g = Precision(dtype=d).apply(a.graph, ctx)
            except TransformError as exc:
                rows.append(row | {"predicted_ms": np.nan, "speedup": np.nan, "kernel_busy_x": np.nan,
                                   "note": str(exc)[:90]})
                continue
            p = mean_step_ms(g)
            rows.append(row | {"predicted_ms": p, "speedup": base_step / p,
                               "kernel_busy_x": base_busy / kernel_busy_ms(g), "note": ""})
    return pd.DataFrame(rows)


def daydream_comparison(a: Analysis) -> tuple[pd.DataFrame, pd.DataFrame]:
    ctx = make_context(a.trace)
    g = a.graph
    ours = Precision(dtype="fp16").apply(g, ctx)
    dd = Scenario("daydream AMP", [
        Scale(select=Selector(kind="kernel", kernel_class=MATRIX), factor=DAYDREAM["compute"]),
        Scale(select=Selector(kind="kernel", kernel_class=["elementwise", "reduction", "normalization", "copy",
                                                          "memset", "other"]), factor=DAYDREAM["memory"]),
    ]).apply(g, ctx)[-1]
    t = g.tasks
    k = np.flatnonzero((t["kind"].to_numpy() == int(TaskKind.KERNEL)) & (t["step"].to_numpy() >= 0)
                       & (t["dur_ns"].to_numpy() > 0))
    cls = kernel_classes(g)[k]
    before = t["dur_ns"].to_numpy()[k].astype(float)
    after = ours.tasks["dur_ns"].to_numpy()[k].astype(float)
    df = pd.DataFrame({"class": cls, "before": before, "after": after, "factor": after / np.maximum(before, 1)})
    per = df.groupby("class").agg(kernels=("factor", "size"), fp32_ms=("before", "sum"), fp16_ms=("after", "sum"),
                                  p10=("factor", lambda x: np.quantile(x, 0.1)),
                                  median=("factor", "median"), p90=("factor", lambda x: np.quantile(x, 0.9)))
    per["fp32_ms"] /= 1e6
    per["fp16_ms"] /= 1e6
    per["time_weighted"] = per["fp16_ms"] / per["fp32_ms"]
    per["daydream"] = [DAYDREAM["compute"] if c in MATRIX else DAYDREAM["memory"] for c in per.index]
    steps = pd.DataFrame([
        {"model": "measured fp32 (replay)", "mean_step_ms": a.steps["predicted_ns"].mean() / 1e6,
         "kernel_busy_ms": kernel_busy_ms(g)},
        {"model": "ours: precision(fp16)", "mean_step_ms": mean_step_ms(ours), "kernel_busy_ms": kernel_busy_ms(ours)},
        {"model": "Daydream AMP (x1/3, x1/2)", "mean_step_ms": mean_step_ms(dd), "kernel_busy_ms": kernel_busy_ms(dd)},
    ])
    return per, steps


def main() -> int:
    if not TRACES.is_dir():
        print(f"whatif_precision: shared traces not found at {TRACES} (../shared is absent); nothing to measure",
              file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    pd.set_option("display.width", 220)
    pd.set_option("display.max_colwidth", 90)
    print("## Predicted effect of precision(dtype) (no ground truth: predictions only)\n")
    print(predictions().to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    per, steps = daydream_comparison(analyze(TRACES / V100_RESNET))
    print("\n## fp32 -> fp16 on the V100 ResNet-50 trace: our per-kernel factors vs Daydream's AMP factors\n")
    print(per.to_string(float_format=lambda x: f"{x:.3f}"))
    print()
    print(steps.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    print(f"\n({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
