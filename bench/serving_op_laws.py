"""The serving iteration model's kernel laws against measured operators: Vidur's A100 and A40
per-layer operator times (../shared/perfdata/vidur/compute, TP 1), one token count taken as the
recorded iteration and every operator predicted at 1/4, 3x, 8x and 32x its tokens.

The laws are those of predictors/serving/iteration_costs.py (``Kernels.measured(...).at(...)``):
a GEMM keeps the efficiency it was measured at on the achievable roofline of the catalog GPU, its
weights inferred from its measured time (no shapes read); a norm/rotary/activation/add kernel
grows by 4·h·s bytes per token at the achievable bandwidth. Two baselines: "no change" (the
recorded time) and "proportional" (time × tokens ratio, what scaling a whole iteration does).

Caveat: the A100 catalog's small-GEMM figure was set from Vidur's own A100 GEMM rows
(hardware/devices.py), so A100 GEMMs are not fully independent of this data; A40 has the same.

A second table compares forms of the GEMM law on the layers' four weight GEMMs at every TP degree
Vidur measured (1-8), from 8 tokens to 1-1,024, the weights taken from the shape columns: the
previous law (``max`` of weight reads and FLOPs at the size-dependent rate, no tiles) and the
variants of tile rows (none, 64, 128, 64 then 128) x overlap (``max``, ``√(c²+m²)``, cube-root
of cubes) x rate (size-dependent, the largest GEMMs'). Scored without Llama-2-7B (the model
of the Vidur serving check, bench/serving_vidur.py) and on it alone.

Run: .venv/bin/python bench/serving_op_laws.py [--write-docs]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common.docs import replace_section
from common.vidur import GEMM_OPS, compute_models, require_perfdata

from whatif.core.dtypes import DType
from whatif.hardware.devices import get_device
from whatif.hardware.roofline import GEMM_ROW_TILE, gemm_rows_in_tiles
from whatif.predictors.serving.iteration_costs import DeviceLaw, Drivers, KernelLaw, Kernels

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- bench/serving_op_laws.py begin -->", "<!-- bench/serving_op_laws.py end -->"
VBEGIN, VEND = "<!-- bench/serving_op_laws.py variants begin -->", "<!-- bench/serving_op_laws.py variants end -->"
HELD_OUT = "Llama-2-7b-hf"
GPUS = {"a100": "A100_SXM_80GB", "a40": "A40"}
PER_TOKEN_OPS = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add")
ANCHORS = (8, 32, 128, 512, 2048)
FACTORS = (0.25, 3.0, 8.0, 32.0)


def drivers(tokens: float) -> Drivers:
    return Drivers(tokens=tokens, seqs=tokens, pairs=tokens, keys=tokens, context=tokens)


def layer_table(path: Path) -> pd.DataFrame:
    """TP 1 rows: tokens and each operator's median time (ns)."""
    df = pd.read_csv(path)
    df = df[df["num_tensor_parallel_workers"] == 1]
    ops = [op for op in (*GEMM_OPS, *PER_TOKEN_OPS) if f"time_stats.{op}.median" in df.columns]
    out = df.groupby("num_tokens")[[f"time_stats.{op}.median" for op in ops]].median() * 1e6
    out.columns = ops
    first = df.iloc[0]
    out.attrs.update(hidden=int(first["n_embd"]), heads=int(first["n_head"]), kv_heads=int(first["n_kv_head"]))
    return out.dropna(axis=1)


def rows_for(gpu: str, model: str, table: pd.DataFrame) -> list[dict]:
    a = table.attrs
    law = DeviceLaw.of(get_device(GPUS[gpu]), DType.FP16, a["heads"] / a["kv_heads"], a["hidden"] // a["heads"],
                       a["hidden"])
    ops = list(table.columns)
    laws = np.array([KernelLaw.GEMM if op in GEMM_OPS else KernelLaw.PER_TOKEN for op in ops])
    tokens = table.index.to_numpy()
    out = []
    for x0 in ANCHORS:
        if x0 not in table.index:
            continue
        t0 = table.loc[x0].to_numpy(float)
        kernels = Kernels.measured(laws, t0, drivers(x0), law)
        for f in FACTORS:
            x = tokens[np.argmin(np.abs(np.log(tokens / (x0 * f))))]
            if x == x0 or abs(np.log(x / (x0 * f))) > 0.2:
                continue
            truth = table.loc[x].to_numpy(float)
            pred = kernels.at(drivers(x), law)
            for op, p, tr, r in zip(ops, pred, truth, t0):
                out.append({"gpu": gpu, "model": model, "x0": x0, "factor": f, "op": op,
                            "group": "GEMM" if op in GEMM_OPS else "per-token",
                            "law": p / tr - 1, "no_change": r / tr - 1, "proportional": r * x / x0 / tr - 1})
            out.append({"gpu": gpu, "model": model, "x0": x0, "factor": f, "op": "layer", "group": "layer",
                        "law": pred.sum() / truth.sum() - 1, "no_change": t0.sum() / truth.sum() - 1,
                        "proportional": t0.sum() * x / x0 / truth.sum() - 1})
    return out


TILE_RULES = {"none": lambda x: x, "64": gemm_rows_in_tiles, "128": lambda x: 128 * np.ceil(x / 128),
              "64, then 128": lambda x: np.where(x <= GEMM_ROW_TILE, float(GEMM_ROW_TILE), 128 * np.ceil(x / 128))}
OVERLAPS = {"max": 0, "sqrt(c^2+m^2)": 2, "cbrt(c^3+m^3)": 3}
PRODUCT = ("64", "sqrt(c^2+m^2)", True)   # whatif's form: DeviceLaw.gemm_ns, computed by it below


def _variant_ns(law: DeviceLaw, params: np.ndarray, x: float, rule: str, overlap: str, large: bool) -> float:
    if (rule, overlap, large) == PRODUCT:
        return float(law.gemm_ns(params, x).sum())
    k = OVERLAPS[overlap]
    rows = float(TILE_RULES[rule](np.array([x]))[0])
    rate = law.large_rate if large else law.rate(2 * params * rows)
    c, m = 2 * params * rows / rate, law.elem_bytes * params / law.bw_bytes_per_ns
    return float((np.maximum(c, m) if k == 0 else (c ** k + m ** k) ** (1 / k)).sum())


Curve = tuple[str, str, int, DeviceLaw, np.ndarray, pd.Series]   # gpu, model, TP, law, weights, ns by tokens


def gemm_curves() -> list[Curve]:
    """Each (GPU, model, TP) of Vidur's tables: the layer's four GEMM weights and their summed
    measured time (ns) by tokens, up to 1,024."""
    cases = []
    for gpu in GPUS:
        law = DeviceLaw.of(get_device(GPUS[gpu]), DType.FP16, 1.0, 128, 4096)
        for model, path in compute_models(gpu).items():
            df = pd.read_csv(path)
            for tp, d in df.groupby("num_tensor_parallel_workers"):
                t = d.groupby("num_tokens")[[f"time_stats.{op}.median" for op in GEMM_OPS]].median().sum(axis=1)
                t = t[t.index <= 1024] * 1e6
                r = d.iloc[0]
                h, hd = int(r["n_embd"]), int(r["n_embd"]) // int(r["n_head"])
                ff, gated = int(r["n_expanded_embd"]), bool(r["use_gated_mlp"])
                params = np.array([h * (int(r["n_head"]) + 2 * int(r["n_kv_head"])) * hd, h * h,
                                   h * ff * (2 if gated else 1), ff * h], dtype=float) / int(tp)
                cases.append((gpu, model, int(tp), law, params, t))
    return cases


def gemm_variants(cases: list[Curve]) -> str:
    """Median |error| of each GEMM-law form on the layers' GEMM time from 8 tokens (module doc)."""
    rows = []
    for rule in TILE_RULES:
        for name in OVERLAPS:
            for large in (False, True):
                errs: dict[bool, list[float]] = {True: [], False: []}
                for _, model, _, law, params, t in cases:
                    pred = np.array([_variant_ns(law, params, float(x), rule, name, large) for x in t.index])
                    i = list(t.index).index(8)
                    rel = pred / pred[i] * t.iloc[i] / t.to_numpy() - 1
                    errs[model == HELD_OUT].append(float(np.median(np.abs(rel))))
                rows.append((float(np.median(errs[False])), float(np.max(errs[False])), float(np.median(errs[True])),
                             rule, name, "largest GEMMs'" if large else "size-dependent"))
    rows.sort()
    product = (PRODUCT[0], PRODUCT[1], "largest GEMMs'")
    previous = ("none", "max", "size-dependent")
    lines = ["| tile rows | overlap | rate | median over other models % | worst % | Llama-2-7B median % | |",
             "|---|---|---|---|---|---|---|"]
    for med, worst, held, rule, name, rate in rows:
        tag = "**whatif**" if (rule, name, rate) == product else "previous" if (rule, name, rate) == previous else ""
        lines.append(f"| {rule} | {name} | {rate} | {100 * med:.1f} | {100 * worst:.1f} | {100 * held:.1f} | {tag} |")
    n_other = sum(1 for c in cases if c[1] != HELD_OUT)
    lines += ["", f"{len(cases)} (GPU, model, TP) curves, {n_other} without {HELD_OUT}; each the sum of the "
              "layer's four weight GEMMs, predicted from its time at 8 tokens at every measured count up to 1,024."]
    return "\n".join(lines)


def law_misses(cases: list[Curve]) -> str:
    """Where whatif's law misses, per GPU at TP 1: its error by model from 8 tokens, the measured
    steps at 65 and 129 tokens against the law's, and the rate the largest measured GEMMs reach."""
    lines = ["| GPU | median error per model, TP 1 (from 8 tokens, 1-1,024) | t(72)/t(64) measured (median) / law "
             "| t(136-192)/t(8) measured / law | TFLOP/s at 1,024 tokens measured (median) / law's F |",
             "|---|---|---|---|---|"]
    for gpu in GPUS:
        mine = [c for c in cases if c[0] == gpu and c[2] == 1]
        errs, step65, mid, rates = [], [], [], []
        for _, _, _, law, params, t in mine:
            pred = np.array([float(law.gemm_ns(params, x).sum()) for x in t.index])
            i = list(t.index).index(8)
            errs.append(float(np.median(np.abs(pred / pred[i] * t.iloc[i] / t.to_numpy() - 1))))
            step65.append(t[72] / t[64])
            mid += [t[x] / t[8] for x in t.index if 136 <= x <= 192]
            rates.append(2 * params.sum() * 1024 / t[1024] / 1e3)
        law, params = mine[0][3], mine[0][4]
        lines.append(f"| {gpu} | {100 * min(errs):.1f}-{100 * max(errs):.1f} % | {np.median(step65):.2f} / "
                     f"{float(law.gemm_ns(params, 72).sum() / law.gemm_ns(params, 64).sum()):.2f} | "
                     f"{min(mid):.2f}-{max(mid):.2f} / "
                     f"{float(law.gemm_ns(params, 136).sum() / law.gemm_ns(params, 8).sum()):.2f} | "
                     f"{np.median(rates):.0f} / {law.large_rate / 1e3:.0f} |")
    return "\n".join(lines)


def _closest(d: pd.DataFrame) -> str:
    return f"{((d['law'] < d['no_change']) & (d['law'] < d['proportional'])).mean():.0%}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write-docs", action="store_true", help="write the table into docs/serving.md")
    args = ap.parse_args()
    require_perfdata()
    rows = []
    for gpu in GPUS:
        for model, path in compute_models(gpu).items():
            rows += rows_for(gpu, model, layer_table(path))
    df = pd.DataFrame(rows)
    for c in ("law", "no_change", "proportional"):
        df[c] = df[c].abs() * 100
    g = df.groupby(["group", "factor"])
    summary = pd.DataFrame({"n": g.size(), "laws median %": g["law"].median().round(1),
                            "laws p90 %": g["law"].quantile(0.9).round(1),
                            "no change median %": g["no_change"].median().round(1),
                            "proportional median %": g["proportional"].median().round(1),
                            "laws closest": g.apply(_closest)})
    layer = df[df["group"] == "layer"]
    flat = summary.reset_index()
    text = "\n".join(["| " + " | ".join(flat.columns) + " |", "|" + "---|" * len(flat.columns),
                      *("| " + " | ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in r) + " |"
                        for r in flat.itertuples(index=False))])
    lines = [text, "",
             f"{len(layer)} layer predictions ({df['model'].nunique()} models on A100 and A40, recorded at "
             f"{', '.join(map(str, ANCHORS))} tokens): median |error| {layer['law'].median():.1f} % (laws), "
             f"{layer['no_change'].median():.1f} % (no change), {layer['proportional'].median():.1f} % (proportional); "
             f"laws within 15 % in {(layer['law'] < 15).mean():.0%}, within 25 % in {(layer['law'] < 25).mean():.0%}"]
    worst = layer.sort_values("law").tail(3)
    lines.append("worst layer predictions: " + "; ".join(
        f"{r.gpu} {r.model} {r.x0} -> x{r.factor:g}: {r.law:.0f} %" for r in worst.itertuples()))
    out = "\n".join(lines)
    print(out)
    cases = gemm_curves()
    variants = gemm_variants(cases) + "\n\n" + law_misses(cases)
    print(variants)
    if args.write_docs:
        replace_section(ROOT / "docs" / "serving.md", BEGIN, END, out)
        replace_section(ROOT / "docs" / "serving.md", VBEGIN, VEND, variants)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
