"""The wave term of a GEMM split or grown by rows, against measurements: predict Vidur's GEMM
times at 1/4, 1/2, 2 and 4 x the tokens (A100 and A40, every model, every TP degree) from the
rows at 1 x, as ``batch_part_ns`` (micro- and nano-batches: ``overlap``, ``pipeline_parallel``'s
serving schedule), ``sequence_parallel``'s token split and ``batch`` price a forward kernel of a trace.

The rule (predictors/costs.py ``anchored_time_ns``): FLOPs x r, activation bytes x r, weights read
once, the measured time moved by the achievable roofline's ratio, and the compute term stretched
by ``wave_tail_ratio(w, r·w)`` (hardware/roofline.py): w = the GEMM's 128 x 128 output tiles over
the GPU's SMs at the recorded size, a wave expected to take ``w + 1/2``. Shown against the same rule without the
wave term (what the transforms did before), *linear* (r x T) and *unchanged* (T). Also the *split
penalty*, n x T(M/n) / T(M): what the n parts of a split cost over the whole, measured and
predicted. ``--tile`` prices the waves with another tile edge (64, 256) to show the sensitivity.
A few seconds.

    .venv/bin/python bench/wave_split.py [--write-docs] [--tile 128]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common.docs import replace_section
from common.vidur import abs_pct_error, compute_models, load_compute, require_perfdata
from parallel_tp import DEVICES, gemm_waves, io_bytes

from whatif.core.kernels import GEMM_TILE
from whatif.predictors.costs import anchored_time_ns

ROOT = Path(__file__).resolve().parents[1]
ROWS = (0.25, 0.5, 2.0, 4.0)
GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
BEGIN, END = "<!-- bench/wave_split.py begin -->", "<!-- bench/wave_split.py end -->"


def predict_model(gpu: str, model: str, path: Path, tile: int) -> pd.DataFrame:
    dev = DEVICES[gpu]
    df = load_compute(gpu, model)
    df = df[df["op"].isin(GEMMS)]
    shape = pd.read_csv(path, nrows=1).iloc[0]
    base = df.set_index(["op", "tp", "tokens"])
    out = []
    for r in ROWS:
        test = df.copy()
        to = test["tokens"] * r
        test = test[(to == np.round(to)) & (to >= 1)].copy()
        test["to_tokens"] = (test["tokens"] * r).round().astype(int)
        keys = pd.MultiIndex.from_arrays([test["op"], test["tp"], test["to_tokens"]])
        have = keys.isin(base.index)
        test, keys = test[have].copy(), keys[have]
        if test.empty:
            continue
        t0, f0, b0 = (test[c].to_numpy(float) for c in ("dur_ns", "flops", "bytes"))
        tokens, tp = test["tokens"].to_numpy(float), test["tp"].to_numpy(float)
        weight, w0 = np.zeros(len(test)), np.zeros(len(test))
        for op in test["op"].unique():
            m = (test["op"] == op).to_numpy()
            _, wb, _ = io_bytes(shape, op, tokens[m], b0[m])
            weight[m] = wb / tp[m]
            w0[m] = gemm_waves(shape, op, tokens[m], tp[m], dev.sm_count, tile)
        weight = np.minimum(weight, b0)
        f1, b1 = f0 * r, (b0 - weight) * r + weight
        cls = test["cls"].to_numpy()
        w1 = w0 * r   # as CostModel.kernel_time_ns moves them: the recorded tiles times the rows
        test["r"] = r
        test["actual"] = base.loc[keys, "dur_ns"].to_numpy(float)
        test["rule"] = anchored_time_ns(dev, t0, cls, f0, b0, f1, b1, "fp16", waves=w0, new_waves=w1)
        test["no_waves"] = anchored_time_ns(dev, t0, cls, f0, b0, f1, b1, "fp16")
        test["linear"], test["unchanged"] = t0 * r, t0
        test["gpu"] = gpu
        out.append(test)
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


COLS = ("rule", "no_waves", "linear", "unchanged")


def table(e: pd.DataFrame) -> str:
    e = e.assign(bin=pd.cut(e["tokens"], [0, 128, 512, 1024, 4096, 1 << 20],
                            labels=["<=128", "129-512", "513-1024", "1025-4096", ">4096"]))
    for c in COLS:
        e[f"err_{c}"] = abs_pct_error(e[c].to_numpy(), e["actual"].to_numpy())
    split = e["r"] < 1
    e["pen_actual"] = np.where(split, e["actual"] / e["r"] / e["dur_ns"], np.nan)
    e["pen_rule"] = np.where(split, e["rule"] / e["r"] / e["dur_ns"], np.nan)
    e["pen_no_waves"] = np.where(split, e["no_waves"] / e["r"] / e["dur_ns"], np.nan)
    lines = ["| GPU | rows × | tokens (before) | GEMM rows | rule | without the wave term | linear | unchanged "
             "| split penalty measured | predicted | without the wave term |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (gpu, r, b), g in e.groupby(["gpu", "r", "bin"], observed=True):
        med = g[[f"err_{c}" for c in COLS] + ["pen_actual", "pen_rule", "pen_no_waves"]].median()
        pen = (f"{med['pen_actual']:.2f} | {med['pen_rule']:.2f} | {med['pen_no_waves']:.2f}" if r < 1
               else "| |")
        lines.append(f"| {gpu} | {r:g} | {b} | {len(g):,} | " + " | ".join(f"{med[f'err_{c}']:.1f}" for c in COLS)
                     + f" | {pen} |")
    for (gpu, r), g in e.groupby(["gpu", "r"]):
        med = g[[f"err_{c}" for c in COLS]].median()
        lines.append(f"| {gpu} | {r:g} | **all** | {len(g):,} | "
                     + " | ".join(f"**{med[f'err_{c}']:.1f}**" for c in COLS) + " | | | |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/accuracy.md")
    parser.add_argument("--tile", type=int, default=GEMM_TILE, help="output tile edge for the wave count")
    args = parser.parse_args()
    require_perfdata()
    e = pd.concat([predict_model(gpu, model, path, args.tile) for gpu in DEVICES
                   for model, path in compute_models(gpu).items()], ignore_index=True)
    text = table(e)
    print(f"{len(e):,} GEMM rows predicted at r x their tokens from the rows at 1 x, tile {args.tile} "
          f"(median absolute % error; split penalty: n x T(M/n) / T(M), median)\n")
    print(text)
    worse = 0
    for (gpu, r), g in e.groupby(["gpu", "r"]):
        errs = {c: float(np.median(abs_pct_error(g[c].to_numpy(), g["actual"].to_numpy()))) for c in COLS}
        best_free = min(errs["linear"], errs["unchanged"])
        verdict = "beats linear and unchanged" if errs["rule"] < best_free else "MISS: worse than a model-free answer"
        worse += errs["rule"] >= best_free
        print(f"{gpu} x{r:g}: rule {errs['rule']:.1f} %, without the wave term {errs['no_waves']:.1f} %, "
              f"linear {errs['linear']:.1f} %, unchanged {errs['unchanged']:.1f} % -> {verdict}")
    if args.write_docs and args.tile == GEMM_TILE:
        replace_section(ROOT / "docs" / "accuracy.md", BEGIN, END, text)
        print("wrote docs/accuracy.md")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
