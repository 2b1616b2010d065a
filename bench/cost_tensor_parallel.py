"""Tensor-parallel degree from TP=1 measurements: predict Vidur's TP = 2, 4, 8 operator times on
A100 and A40 from the TP = 1 rows only, with the calibrated roofline.

Megatron-LM sharding divides the GEMMs' N (QKV, MLP up) or K (attention output, MLP down) and
the per-head/FFN-wide elementwise ops (RoPE, activation) by t; layer norms and the residual add
work on the full hidden size. A calibrated roofline is fitted on the TP = 1 rows of the same model
and GPU (all token counts), and each TP > 1 operator is priced like its TP = 1 peers.
Goal (issue 5): median absolute error <= 10 %. Prints tables; a few seconds.

    .venv/bin/python bench/cost_tensor_parallel.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common.vidur import (
    GROUP,
    abs_pct_error,
    compute_models,
    load_compute,
    require_perfdata,
    summarize,
)

from whatif.core.dtypes import DType
from whatif.hardware.devices import get_device
from whatif.hardware.roofline import CalibratedRoofline

DEVICES = {"a100": get_device("A100_SXM_80GB"), "a40": get_device("A40")}
GOAL_PCT = 10.0


def predict(df: pd.DataFrame, device, peers: str) -> np.ndarray:
    """Predicted ns for TP>1 rows of one model; peers = 'class' (one curve per kernel class) or
    'op' (one curve per operator, i.e. per kernel)."""
    train = df[df["tp"] == 1]
    test = df[df["tp"] > 1]
    pred = np.empty(len(test))
    if peers == "class":
        cal = CalibratedRoofline.fit(device, train["cls"], train["flops"], train["bytes"],
                                     train["dur_ns"], DType.FP16)
        for i, (c, f, b) in enumerate(zip(test["cls"], test["flops"], test["bytes"])):
            pred[i] = cal.kernel_time_ns(c, f, b)
        return pred
    cals = {op: CalibratedRoofline.fit(device, g["cls"], g["flops"], g["bytes"], g["dur_ns"],
                                       DType.FP16) for op, g in train.groupby("op")}
    for i, (op, c, f, b) in enumerate(zip(test["op"], test["cls"], test["flops"], test["bytes"])):
        pred[i] = cals[op].kernel_time_ns(c, f, b)
    return pred


def evaluate(peers: str) -> pd.DataFrame:
    rows = []
    for gpu, dev in DEVICES.items():
        for model in compute_models(gpu):
            df = load_compute(gpu, model)
            test = df[df["tp"] > 1]
            if test.empty:
                continue
            r = test[["model", "tokens", "tp", "op"]].copy()
            r["gpu"] = gpu
            r["err"] = abs_pct_error(predict(df, dev, peers), test["dur_ns"].to_numpy())
            rows.append(r)
    out = pd.concat(rows, ignore_index=True)
    out["class"] = out["op"].map(GROUP)
    return out


def main() -> int:
    require_perfdata()
    res = {}
    for peers, label in (("class", "peers = same kernel class (GEMM / normalization / "
                                   "elementwise) of the model's TP=1 rows"),
                         ("op", "peers = same operator (kernel) of the model's TP=1 rows")):
        e = evaluate(peers)
        res[peers] = e
        print(f"== TP>1 from TP=1, {label}")
        print(summarize(e, ["gpu", "tp", "class"]).to_string())
        print()
    e = res["op"]
    print("== per operator (peers = same operator)")
    print(summarize(e, ["op"]).to_string())
    print()
    for peers, e in res.items():
        med = e.groupby("class")["err"].median()
        print(f"peers={peers}: overall median {e['err'].median():.1f} %, "
              + ", ".join(f"{k} {v:.1f} %" for k, v in med.items()))
    med = res["op"].groupby("class")["err"].median()
    print("goal: median <= 10 % per class (peers = same operator) ->",
          "MET" if (med <= GOAL_PCT).all() else "MISSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
