"""Write a Vidur-format ``attention.csv`` for Llama-2-7B on A100 (TP 1, block 16) from the measured
rows in ``attention_samples.csv`` (see README.md beside this file: why, and how good the fit is).

Run in the Vidur peer's own venv (numpy, pandas, scipy): ``python make_attention_table.py OUT.csv``.
Per layer, in ms, non-negative least squares weighted for relative error:

* decode:  t = d0 + d1*b + d2*b*kv + d3*kv          (b sequences, kv context tokens each)
* prefill: t = p0 + p1*c*kv + p2*c^2 + p3*kv + p4*c  (chunk c tokens after kv cached tokens)

The grid is the one Vidur's profiler writes (vidur/profiling/utils: batch 1..128; context
32..1024 step 32 then 64 to 4032; chunks 64..4096 with kv in the same steps while c + kv <= 4096).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import nnls

HERE = Path(__file__).resolve().parent
SHAPE = {"n_embd": 4096, "n_q_head": 32, "n_kv_head": 32, "block_size": 16, "num_tensor_parallel_workers": 1,
         "max_model_len": 4096}
DECODE = ("b", "b*kv", "kv")
PREFILL = ("c*kv", "c^2", "kv", "c")


def features(b: np.ndarray, c: np.ndarray, kv: np.ndarray, names: tuple[str, ...]) -> np.ndarray:
    cols = {"b": b, "c": c, "kv": kv, "b*kv": b * kv, "c*kv": c * kv, "c^2": c * c}
    return np.column_stack([np.ones(len(b))] + [cols[n] for n in names]).astype(float)


def fit(rows: pd.DataFrame, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    x = features(rows.batch_size.to_numpy(), rows.prefill_chunk_size.to_numpy(), rows.kv_cache_size.to_numpy(), names)
    y = rows.median_ms.to_numpy(float)
    coef, _ = nnls(x / y[:, None], np.ones(len(y)))
    return coef, x @ coef / y - 1


def contexts() -> list[int]:
    return list(range(32, 1024, 32)) + list(range(1024, 4096, 64))


def chunks() -> list[int]:
    return list(range(64, 128, 16)) + list(range(128, 1024, 32)) + list(range(1024, 4097, 64))


def main(out: Path) -> None:
    s = pd.read_csv(HERE / "attention_samples.csv")
    dec, dec_err = fit(s[s.kind == "decode"], DECODE)
    pre, pre_err = fit(s[s.kind == "prefill"], PREFILL)
    print(f"decode  coef {dec}  mean |err| {np.abs(dec_err).mean():.3f}  max {np.abs(dec_err).max():.3f}")
    print(f"prefill coef {pre}  mean |err| {np.abs(pre_err).mean():.3f}  max {np.abs(pre_err).max():.3f}")
    b, kv = (a.ravel() for a in np.meshgrid(np.arange(1, 129), contexts(), indexing="ij"))
    d = pd.DataFrame({"batch_size": b, "prefill_chunk_size": 0, "kv_cache_size": kv, "is_prefill": False,
                      "time_stats.attn_decode.median": features(b, 0 * b, kv, DECODE) @ dec})
    pairs = [(c, k) for c in chunks() for k in [0, *contexts()] if c + k <= 4096]
    c, k = (np.array(v) for v in zip(*pairs))
    p = pd.DataFrame({"batch_size": 1, "prefill_chunk_size": c, "kv_cache_size": k, "is_prefill": True,
                      "time_stats.attn_prefill.median": features(0 * c + 1, c, k, PREFILL) @ pre})
    table = pd.concat([d, p], ignore_index=True)
    for col, val in SHAPE.items():
        table[col] = val
    table["attention_backend"] = "AttentionBackend.FLASH_ATTENTION"
    table.round(6).to_csv(out, index=False)
    print(f"wrote {out}: {len(d)} decode rows, {len(p)} prefill rows")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
