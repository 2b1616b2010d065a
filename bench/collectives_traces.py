"""The collective cost model against the NCCL/RCCL kernels of the shared multi-rank traces.

Three questions, answered honestly on what the traces hold:

1. **Sized kernels** (PyTorch >= 2.1 records ``In/Out msg nelems``, ``Group size``, ``dtype``):
   ``hta/nccl_data_a100_rank0of2`` (A100, 2 ranks: all-reduce, broadcast),
   ``tracelens/b200_eager_rank0of8`` (B200, 8 ranks: one all-gather) and
   ``tracelens/mi300x_resnet_act_ckpt_rank0of8`` (MI300X, 8 ranks). Each kernel is priced by
   :func:`whatif.hardware.collectives.collective_time_ns` on the matching topology, uncalibrated,
   and — where a kind has >= 3 sizes — calibrated leave-one-size-out on the trace's own kernels.
   These are single-rank traces: a kernel's duration includes the time it waited for its peers, so
   the *fastest* occurrence per size is the fairer target (both are shown).
2. **How much of a measured collective is waiting**: ``hta/sampled_world128`` loads as a linked
   two-rank graph; each collective kernel is split into the wait for the last arrival and the
   transfer (``end − last arrival``). Its SendRecv kernels carry no sizes, so they cannot be priced.
3. The uncalibrated model's error on the transfer part is therefore not measurable there.

    .venv/bin/python bench/collectives_traces.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from whatif.api import analyze
from whatif.depgraph.graph import TaskKind
from whatif.hardware.collectives import calibrate, collective_time_ns
from whatif.hardware.topology import preset
from whatif.predictors.costs import MAX_WAIT_RATIO
from whatif.tracer.measured_collectives import collective_points, points_frame
from whatif.tracer.trace import load_trace

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
SIZED = {
    "hta/nccl_data_a100_rank0of2.json.gz": preset("dgx_a100"),
    "tracelens/b200_eager_rank0of8.json.gz": preset("hgx_b200"),
    "tracelens/mi300x_resnet_act_ckpt_rank0of8.json.gz": preset("mi300x_8"),
}


def pct(pred: np.ndarray, actual: np.ndarray) -> np.ndarray:
    return np.abs(pred - actual) / actual * 100


def sized() -> pd.DataFrame:
    frames = []
    for rel, topo in SIZED.items():
        path = TRACES / rel
        if not path.exists():
            print(f"  (absent: {rel})")
            continue
        df = points_frame(collective_points(load_trace(path)))
        if df.empty:
            print(f"  {rel}: no sized collective kernels")
            continue
        df["trace"] = rel.split("/")[-1].split(".")[0]
        df["model_ns"] = [collective_time_ns(k, b, r, topo) for k, b, r in zip(df["kind"], df["message_bytes"],
                                                                                df["ranks"])]
        loo = np.full(len(df), np.nan)
        for kind, g in df.groupby("kind"):
            sizes = g.groupby("message_bytes")["dur_ns"].min()
            if len(sizes) < 3:
                continue
            for b in sizes.index:
                pts = [(kind, x, int(g["ranks"].iat[0]), d) for x, d in sizes.items() if x != b]
                cal = calibrate(pts, topo, residual=False)
                loo[g.index[g["message_bytes"] == b]] = collective_time_ns(kind, b, int(g["ranks"].iat[0]), topo,
                                                                           calibration=cal)
        df["loo_ns"] = loo
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def waiting() -> pd.DataFrame | None:
    path = TRACES / "hta" / "sampled_world128"
    if not path.exists():
        return None
    a = analyze(path)
    t = a.graph.tasks
    comm = t[(t["kind"] == int(TaskKind.COMM)) & (t["event"] >= 0)]
    ev = a.trace.events
    kernel = ev["dur_ns"].to_numpy()[comm["event"].to_numpy()]
    return pd.DataFrame({"rank": comm["rank"].to_numpy(), "name": comm["name"].astype(str).str[:40].to_numpy(),
                         "kernel_ns": kernel, "transfer_ns": comm["dur_ns"].to_numpy()})


def main() -> int:
    if not TRACES.is_dir():
        sys.exit(f"skipped: shared traces not found at {TRACES}")
    print("== 1. sized collective kernels vs NCCL's tuning model")
    df = sized()
    if not df.empty:
        g = df.groupby(["trace", "kind", "ranks", "message_bytes"]).agg(
            n=("dur_ns", "size"), measured_min_us=("dur_ns", "min"), measured_median_us=("dur_ns", "median"),
            model_us=("model_ns", "first"), loo_us=("loo_ns", "first")).reset_index()
        for c in ("measured_min_us", "measured_median_us", "model_us", "loo_us"):
            g[c] = g[c] / 1e3
        g["err_min_%"] = pct(g["model_us"], g["measured_min_us"]).round(1)
        g["err_median_%"] = pct(g["model_us"], g["measured_median_us"]).round(1)
        g["loo_err_min_%"] = pct(g["loo_us"], g["measured_min_us"]).round(1)
        g["message_kB"] = (g.pop("message_bytes") / 1e3).round(1)
        g["calibrates"] = g["measured_min_us"] <= MAX_WAIT_RATIO * g["model_us"]
        print(g.round(1).to_string(index=False))
        print(f"\nuncalibrated model vs fastest occurrence: median {g['err_min_%'].median():.1f} % over "
              f"{len(g)} (trace, kind, size) points; vs median occurrence {g['err_median_%'].median():.1f} %")
        print(f"kernels within {MAX_WAIT_RATIO:g}x the model (used by TraceCostModel to calibrate): "
              f"{int(g['calibrates'].sum())} of {len(g)}; the others mostly waited for their peers")
        loo = g["loo_err_min_%"].dropna()
        if len(loo):
            print(f"calibrated on the trace's other sizes (leave-one-size-out): median {loo.median():.1f} % "
                  f"over {len(loo)} points")
    print("\n== 2. hta/sampled_world128 (2 of 128 ranks linked): kernel duration = wait + transfer")
    w = waiting()
    if w is None:
        print("  (absent)")
    else:
        w["wait_share_%"] = (1 - w["transfer_ns"] / w["kernel_ns"].clip(lower=1)) * 100
        print(w.groupby(["rank", "name"]).agg(n=("kernel_ns", "size"), kernel_ms=("kernel_ns", "median"),
                                              transfer_ms=("transfer_ns", "median"),
                                              wait_share_pct=("wait_share_%", "median")).assign(
            kernel_ms=lambda x: x["kernel_ms"] / 1e6, transfer_ms=lambda x: x["transfer_ms"] / 1e6).round(3)
            .to_string())
        share = w.groupby("rank")["wait_share_%"].median()
        print("median share of a measured collective kernel spent waiting for peers, per rank: "
              + ", ".join(f"rank {r}: {v:.0f} %" for r, v in share.items())
              + " (its SendRecv kernels record no sizes: not priceable)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
