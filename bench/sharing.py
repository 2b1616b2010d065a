"""Kernels beside collectives, against measurements (transforms/sharing.py).

1. **Held-out durations.** In the shared traces where the same compute kernel ran both beside a
   collective and alone (``calibrated_interference`` finds pairs), leave one step out: φ is
   calibrated on the other steps, and each of the step's kernels that ran beside a collective is
   predicted from the median time of the same kernel (name and occurrence in its step: the same
   shapes in a repeating loop) alone in the other steps: *sharing* ``T_alone · (1 + (φ − 1)·f)``
   with ``f`` the measured fraction of its time beside a collective, against *unchanged*
   ``T_alone`` (the interference ignored, what the replay did before). Median |error| per
   kernel, and the error of their sum (what a step's time is made of).
2. **What it moves.** Collectives ×0 on the same traces, and ``data_parallel`` (its gradient
   all-reduces run beside the backward) on our own recorded training step and on the shared
   ResNet-50 one: the predicted steps and compute time with and without the replay's re-pricing.

    .venv/bin/python bench/sharing.py [--write-docs]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common.docs import replace_section

from whatif.analysis import analyze, predict
from whatif.transforms.generic import Interference, Scale
from whatif.transforms.parallel.data import DataParallel
from whatif.transforms.scenario import Scenario
from whatif.transforms.select import Selector
from whatif.transforms.sharing import (
    calibrated_interference,
    compute_mask,
    covered_fraction,
)

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
TRACES = ("hta/nccl_data_a100_rank0of2.json.gz", "hta/negative_queue_a100_rank0of16.json.gz")
TRAINING = ROOT / "sample_traces" / "gpu" / "backends" / "train-torch"
RESNET = "kineto/resnet50_autograd_api_num_workers_0__worker0.pt.trace.json.gz"
BEGIN, END = "<!-- bench/sharing.py begin -->", "<!-- bench/sharing.py end -->"


def held_out(path: Path) -> dict[str, object]:
    """Leave one step out (module doc, part 1): each kernel beside a collective is predicted from
    the same kernel (name and occurrence in its step) alone in the other steps."""
    g = analyze(path).graph
    t = g.tasks
    ms, me = t["measured_start_ns"].to_numpy(np.int64), t["measured_end_ns"].to_numpy(np.int64)
    step = t["step"].to_numpy()
    ok = compute_mask(g) & (ms >= 0) & (step >= 0)
    f = covered_fraction(g, np.where(ms >= 0, ms, 0), np.where(ms >= 0, me, 0))
    df = pd.DataFrame({"name": t["name"].astype(str).to_numpy(), "step": step, "start": ms,
                       "dur": (me - ms).astype(float), "f": f})[ok].sort_values(["step", "start"], kind="stable")
    df["nth"] = df.groupby(["step", "name"]).cumcount()
    rows = []
    for s in sorted(df["step"].unique().tolist()):
        phi, _ = calibrated_interference(g, among=ok & (step != s))
        other = df[(df["step"] != s) & (df["f"] == 0)].groupby(["name", "nth"])["dur"].median()
        mine = df[(df["step"] == s) & (df["f"] > 0)].join(other.rename("alone"), on=["name", "nth"], how="inner")
        mine["sharing"] = mine["alone"] * (1 + ((phi or 1.0) - 1) * mine["f"])
        rows.append(mine)
    b = pd.concat(rows) if rows else pd.DataFrame(columns=["dur", "alone", "sharing"])

    def err(col: str) -> float:
        return float((100 * (b[col] - b["dur"]).abs() / b["dur"]).median()) if len(b) else float("nan")

    def total(col: str) -> float:
        return float(100 * (b[col].sum() / b["dur"].sum() - 1)) if len(b) else float("nan")

    phi_all, names = calibrated_interference(g)
    return {"trace": path.name.split(".")[0], "steps": int(df["step"].nunique()), "phi": phi_all, "names": names,
            "kernels": len(b), "ratio_median": float((b["dur"] / b["alone"]).median()) if len(b) else float("nan"),
            "median_sharing_pct": err("sharing"), "median_unchanged_pct": err("alone"),
            "sum_ms": float(b["dur"].sum() / 1e6), "sum_sharing_pct": total("sharing"),
            "sum_unchanged_pct": total("alone")}


def moved(path: Path, label: str, scenario: Scale | DataParallel) -> dict[str, object]:
    """The scenario's predicted steps (ms, summed) with and without the replay's re-pricing
    (``interference`` with factor 1 turns it off)."""
    a = analyze(path)
    with_sharing, without = predict(a, [Scenario(label, [scenario]),
                                        Scenario(f"{label}, phi 1", [Interference(factor=1.0), scenario])]).scenarios
    cm = compute_mask(with_sharing.replay.graph)
    busy = with_sharing.replay.graph.tasks["dur_ns"].to_numpy()[cm].sum() / 1e6
    busy0 = without.replay.graph.tasks["dur_ns"].to_numpy()[compute_mask(without.replay.graph)].sum() / 1e6
    return {"trace": path.name.split(".")[0] if path.is_file() else path.name, "scenario": label,
            "baseline_ms": a.steps["predicted_ns"].sum() / 1e6,
            "without_ms": without.steps["predicted_ns"].sum() / 1e6,
            "with_ms": with_sharing.steps["predicted_ns"].sum() / 1e6,
            "compute_without_ms": busy0, "compute_with_ms": busy}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    if not SHARED.is_dir():
        print(f"{SHARED}: the shared traces are not here", file=sys.stderr)
        return 2
    held = pd.DataFrame([held_out(SHARED / name) for name in TRACES])
    none = Scale(select=Selector(kernel_class="collective"), factor=0.0)
    rows = [moved(SHARED / name, "collectives x0", none) for name in TRACES]
    rows += [moved(path, f"data_parallel {w}", DataParallel(degree=w)) for path in (TRAINING, SHARED / RESNET)
             for w in (2, 8) if path.exists()]
    move = pd.DataFrame(rows)
    pd.set_option("display.width", 200)
    text = ("held-out kernels beside a collective (leave one step out): median |error| % per kernel, and the "
            "error % of their sum\n"
            + held.round(3).to_string(index=False) + "\n\nwhat the re-pricing moves (ms, all steps)\n"
            + move.round(3).to_string(index=False))
    print(text)
    if args.write_docs:
        replace_section(ROOT / "docs" / "accuracy.md", BEGIN, END, "```\n" + text + "\n```")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
