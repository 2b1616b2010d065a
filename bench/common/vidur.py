"""Vidur's measured operator/collective tables (``../shared/perfdata/vidur``) and the FLOPs/bytes
of each operator of one transformer layer, derived from the table's shape columns.

Times in the CSVs are milliseconds; we convert to ns. All operators run in fp16/bf16 (2 bytes).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from whatif.core.kernels import KernelClass

REPO = Path(__file__).resolve().parents[2]
PERFDATA = REPO.parent / "shared" / "perfdata" / "vidur"
ELEM = 2  # bytes per fp16/bf16 element

GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
MEMORY_OPS = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add")
OPS = GEMM_OPS + MEMORY_OPS
OP_CLASS: dict[str, KernelClass] = {
    **{op: KernelClass.GEMM for op in GEMM_OPS},
    "input_layernorm": KernelClass.NORMALIZATION,
    "post_attention_layernorm": KernelClass.NORMALIZATION,
    "attn_rope": KernelClass.ELEMENTWISE,
    "mlp_act": KernelClass.ELEMENTWISE,
    "add": KernelClass.ELEMENTWISE,
}
GROUP = {**{op: "gemm" for op in GEMM_OPS}, **{op: "memory-bound" for op in MEMORY_OPS}}


def require_perfdata() -> Path:
    """The Vidur directory, or exit with a clear message when ../shared/perfdata is absent."""
    if not PERFDATA.is_dir():
        sys.exit(f"skipped: measured data not found at {PERFDATA} "
                 "(this bench needs ../shared/perfdata/vidur next to the repository)")
    return PERFDATA


def compute_models(gpu: str) -> dict[str, Path]:
    """model name -> mlp.csv for one GPU directory (a100, a40)."""
    root = PERFDATA / "compute" / gpu
    return {p.parent.name: p for p in sorted(root.glob("*/*/mlp.csv"))}


def op_work(row: pd.Series | dict, op: str) -> tuple[float, float]:
    """(FLOPs, bytes) of ``op`` for one table row (tokens, TP degree and model shape)."""
    n = float(row["num_tokens"])
    t = float(row["num_tensor_parallel_workers"])
    h = float(row["n_embd"])
    heads, kv_heads = float(row["n_head"]), float(row["n_kv_head"])
    hd = h / heads
    q = heads * hd / t
    kv = max(1.0, kv_heads / t) * hd          # KV heads are replicated when fewer than t
    ffn = float(row["n_expanded_embd"]) / t
    gated = str(row["use_gated_mlp"]).lower() == "true"

    def gemm(m: float, k: float, nn: float) -> tuple[float, float]:
        return 2 * m * k * nn, ELEM * (m * k + k * nn + m * nn)

    if op == "attn_pre_proj":
        return gemm(n, h, q + 2 * kv)
    if op == "attn_post_proj":
        return gemm(n, q, h)
    if op == "mlp_up_proj":
        return gemm(n, h, ffn * (2 if gated else 1))
    if op == "mlp_down_proj":
        return gemm(n, ffn, h)
    if op in ("input_layernorm", "post_attention_layernorm"):
        return 8 * n * h, ELEM * (2 * n * h + h)
    if op == "attn_rope":
        return 6 * n * (q + kv), ELEM * 2 * n * (q + kv)
    if op == "mlp_act":
        return (5 if gated else 8) * n * ffn, ELEM * n * ffn * (3 if gated else 2)
    if op == "add":
        return n * h, ELEM * 3 * n * h
    raise KeyError(op)


def load_compute(gpu: str, model: str) -> pd.DataFrame:
    """Long table: model, tokens, tp, op, class, flops, bytes, dur_ns (median of repeats)."""
    df = pd.read_csv(compute_models(gpu)[model])
    key = ["num_tokens", "num_tensor_parallel_workers"]
    shape_cols = ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp"]
    ops = [op for op in OPS if f"time_stats.{op}.median" in df.columns]   # phi-2: no 2nd norm
    df = df.groupby(key, as_index=False).agg(
        {**{f"time_stats.{op}.median": "median" for op in ops}, **{c: "first" for c in shape_cols}})
    rows = []
    for _, r in df.iterrows():
        for op in ops:
            ms = r[f"time_stats.{op}.median"]
            if not np.isfinite(ms) or ms <= 0:
                continue
            fl, by = op_work(r, op)
            rows.append((model, int(r["num_tokens"]), int(r["num_tensor_parallel_workers"]), op,
                         OP_CLASS[op].value, fl, by, ms * 1e6))
    return pd.DataFrame(rows, columns=["model", "tokens", "tp", "op", "cls", "flops", "bytes",
                                       "dur_ns"])


def load_network(cluster: str, kind: str) -> pd.DataFrame:
    """cluster, kind, ranks, ranks_per_node, bytes, dur_ns (median over repeats and ranks)."""
    df = pd.read_csv(PERFDATA / "network" / cluster / f"{kind}.csv")
    col = f"time_stats.{kind}.median"
    g = df.groupby(["num_workers", "devices_per_node", "size"], as_index=False)[col].median()
    return pd.DataFrame({
        "cluster": cluster, "kind": kind, "ranks": g["num_workers"].astype(int),
        "ranks_per_node": g["devices_per_node"].astype(int),
        # `size` is already bytes (Vidur's profiler writes 2 x the fp16 element count; ../shared/perfdata/README.md)
        "bytes": g["size"].astype(float), "dur_ns": g[col].astype(float) * 1e6})


def abs_pct_error(pred: np.ndarray, actual: np.ndarray) -> np.ndarray:
    return np.abs(np.asarray(pred) - np.asarray(actual)) / np.asarray(actual) * 100.0


def summarize(df: pd.DataFrame, by: list[str], err: str = "err") -> pd.DataFrame:
    """n, median and mean absolute % error per group."""
    g = df.groupby(by)[err]
    return pd.DataFrame({"n": g.size(), "median_%": g.median().round(1),
                         "mean_%": g.mean().round(1), "p90_%": g.quantile(0.9).round(1)})
