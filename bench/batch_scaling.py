"""The ``batch`` transform's pricing rule against measurements: predict Vidur's operator times at
k x the tokens (k = 2, 4; A100 and A40, every model, every TP degree) from the rows at 1 x, as the
transform prices a kernel of a trace.

The rule (transforms/optimizations/batch.py, predictors/costs.py ``anchored_time_ns``): a kernel
at k x the batch does k x its FLOPs and moves k x its activation bytes, its weights once
(``(B - W)·k + W``); its measured time T moves to ``F' + (T − F')·roofline(f', b')/roofline(f, b)``
with ``F' = min(T, 2 us)``, the GEMM rate read at the measured size, a GEMM's compute term
stretched by ``wave_tail_ratio`` of its waves (bench/wave_split.py), and at most ``MAX_SLOWDOWN``
(4) x the roofline time counted as work (the rest is latency). Also shown: the rule without that
cap, the ratio on a roofline calibrated on the operators at 1 x only (what one trace holds), and
the two answers a user has without a model: *unchanged* (T) and *linear* (k·T).
A prediction worse than either is a miss. A few seconds.

    .venv/bin/python bench/batch_scaling.py [--write-docs]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common.docs import replace_section
from common.vidur import GROUP, abs_pct_error, compute_models, load_compute, require_perfdata
from parallel_tp import DEVICES, gemm_waves, io_bytes

from whatif.core.dtypes import DType
from whatif.hardware.roofline import CalibratedRoofline
from whatif.predictors.costs import anchored_time_ns
from whatif.transforms.optimizations.batch import MAX_SLOWDOWN

ROOT = Path(__file__).resolve().parents[1]
FACTORS = (2, 4)
BEGIN, END = "<!-- bench/batch_scaling.py begin -->", "<!-- bench/batch_scaling.py end -->"


def predict_model(gpu: str, model: str, path: Path) -> pd.DataFrame:
    dev = DEVICES[gpu]
    df = load_compute(gpu, model)
    shape = pd.read_csv(path, nrows=1).iloc[0]
    base = df.set_index(["op", "tp", "tokens"])
    out = []
    for k in FACTORS:
        test = df.copy()
        test["from_tokens"] = test["tokens"] // k
        keys = pd.MultiIndex.from_arrays([test["op"], test["tp"], test["from_tokens"]])
        have = keys.isin(base.index) & (test["tokens"] % k == 0)
        test, keys = test[have].copy(), keys[have]
        if test.empty:
            continue
        b = base.loc[keys]
        t0, f0, b0 = b["dur_ns"].to_numpy(), b["flops"].to_numpy(), b["bytes"].to_numpy()
        w, w0 = np.zeros(len(test)), np.zeros(len(test))
        before, tp = test["from_tokens"].to_numpy(float), test["tp"].to_numpy(float)
        for op in test["op"].unique():
            m = (test["op"] == op).to_numpy()
            _, weight, _ = io_bytes(shape, op, before[m], b0[m])
            w[m] = weight / tp[m]   # each rank holds 1/t of a sharded GEMM's weights
            w0[m] = gemm_waves(shape, op, before[m], tp[m], dev.sm_count)

        w = np.minimum(w, b0)
        f1, b1 = f0 * k, (b0 - w) * k + w
        w1 = w0 * k   # as CostModel.kernel_time_ns moves them: the recorded tiles times the rows
        cls = test["cls"].to_numpy()
        test["k"] = k
        test["rule"] = anchored_time_ns(dev, t0, cls, f0, b0, f1, b1, "fp16", max_slowdown=MAX_SLOWDOWN,
                                        waves=w0, new_waves=w1)
        test["uncapped"] = anchored_time_ns(dev, t0, cls, f0, b0, f1, b1, "fp16", waves=w0, new_waves=w1)
        calibrated = np.empty(len(test))
        frame = pd.DataFrame({"n": test["from_tokens"].to_numpy(), "tp": test["tp"].to_numpy()})
        for (n, tp), idx in frame.groupby(["n", "tp"]).indices.items():
            one = df[(df["tokens"] == n) & (df["tp"] == tp)]   # what a trace at n tokens holds: its operators at n
            cal = CalibratedRoofline.fit(dev, one["cls"], one["flops"], one["bytes"], one["dur_ns"], DType.FP16)
            calibrated[idx] = anchored_time_ns(dev, t0[idx], cls[idx], f0[idx], b0[idx], f1[idx], b1[idx], "fp16",
                                               calibration=cal)
        test["calibrated"] = calibrated
        test["unchanged"] = t0
        test["linear"] = t0 * k
        actual = test["dur_ns"].to_numpy()
        for col in ("rule", "uncapped", "calibrated", "unchanged", "linear"):
            test[f"err_{col}"] = abs_pct_error(test[col].to_numpy(), actual)
        test["gpu"], test["class"] = gpu, test["op"].map(GROUP)
        out.append(test)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def table(e: pd.DataFrame) -> str:
    e = e.assign(tokens_bin=pd.cut(e["tokens"], [0, 64, 512, 4096, 1 << 20],
                                   labels=["<=64", "65-512", "513-4096", ">4096"]))
    cols = ["err_rule", "err_uncapped", "err_calibrated", "err_unchanged", "err_linear"]
    lines = ["| GPU | k | class | tokens (after) | rows | rule | rule without the cap | ratio on the roofline "
             "calibrated on the 1x operators | unchanged | linear |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    grouped = e.groupby(["gpu", "k", "class", "tokens_bin"], observed=True)
    for (gpu, k, cls, tb), g in grouped:
        med = g[cols].median()
        lines.append(f"| {gpu} | {k} | {cls} | {tb} | {len(g):,} | " + " | ".join(f"{med[c]:.1f}" for c in cols) + " |")
    for (gpu, k), g in e.groupby(["gpu", "k"]):
        med = g[cols].median()
        lines.append(f"| {gpu} | {k} | **all** |  | {len(g):,} | " + " | ".join(f"**{med[c]:.1f}**" for c in cols)
                     + " |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/accuracy.md")
    args = parser.parse_args()
    require_perfdata()
    rows = [predict_model(gpu, model, path) for gpu in DEVICES for model, path in compute_models(gpu).items()]
    e = pd.concat([r for r in rows if not r.empty], ignore_index=True)
    text = table(e)
    print(f"{len(e):,} operator rows predicted at k x their tokens from the rows at 1 x "
          f"(median absolute % error)\n")
    print(text)
    worse = []
    for (gpu, k), g in e.groupby(["gpu", "k"]):
        rule, unchanged, linear = (g[c].median() for c in ("err_rule", "err_unchanged", "err_linear"))
        verdict = "beats both" if rule < min(unchanged, linear) else "MISS: worse than a model-free answer"
        if rule >= min(unchanged, linear):
            worse.append((gpu, k))
        print(f"{gpu} k={k}: rule {rule:.1f} %, unchanged {unchanged:.1f} %, linear {linear:.1f} % -> {verdict}")
    if args.write_docs:
        replace_section(ROOT / "docs" / "accuracy.md", BEGIN, END, text)
        print("wrote docs/accuracy.md")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
