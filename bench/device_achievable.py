"""Achievable device figures measured by others, as the device catalog quotes them.

Two public sources are read here, so the figures in ``hardware/devices.py`` can be checked:

* Vidur's operator timings (``../shared/perfdata/vidur``, A100 80GB SXM and A40): the best and the
  90th-percentile GEMM rate among GEMMs of at least 0.5 TFLOP (the catalog's large figure), the
  90th percentile among GEMMs of 1-4.3 GFLOP (its small figure: 2^31 FLOPs = M=N=K=1024), and the
  best bandwidth of the elementwise ``add`` (read 2, write 1) over 200 MB (its stream figure).
* The shared third-party traces (``../shared/traces``): per GPU, the shortest kernel and the 1st
  percentile of kernel durations (the catalog's launch figure: an empty kernel's time on the GPU),
  and the rate of bf16 GEMMs of 0.5-8 GFLOP, fitted log-linearly in log FLOPs and read at 2^31
  FLOPs (the catalog's small-GEMM figure where Vidur has none).
* How the achievable GEMM rate between the small and the large figure is drawn: per band of
  GEMM size, the share of Vidur's GEMMs whose measured rate lies above the catalog's curve, for
  the curve the catalog uses (a time affine in the FLOPs through both figures,
  ``devices.gemm_time_law``) and the log-linear curve it used until 2026-11-28. An achievable
  roof that many measured GEMMs exceed is not one.

Run: ``python bench/device_achievable.py``; it prints one table per source.
"""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common.vidur import GEMM_OPS, PERFDATA, compute_models, op_work

from whatif.core.dtypes import DType
from whatif.core.errors import WhatifError
from whatif.hardware.devices import LARGE_GEMM_FLOPS, SMALL_GEMM_FLOPS, find_device, get_device
from whatif.ops import ops_table, table_frame
from whatif.tracer.kinds import EventKind
from whatif.tracer.trace import load_trace

TRACES = PERFDATA.parents[1] / "traces"
LARGE_MIN_FLOPS = 0.5e12
SMALL_FLOPS = (1e9, 4.3e9)
TRACE_SMALL_FLOPS = (0.5e9, 8e9)
STREAM_MIN_BYTES = 2e8


def vidur_rows(gpu: str) -> pd.DataFrame:
    """One row per (model, tokens, TP, op) with FLOPs, bytes and the median time in seconds."""
    rows = []
    for path in compute_models(gpu).values():
        table = pd.read_csv(path)
        for record in table.to_dict("records"):
            for op in (*GEMM_OPS, "add"):
                seconds = record.get(f"time_stats.{op}.median")
                if seconds is None or pd.isna(seconds):
                    continue
                flops, nbytes = op_work(record, op)
                rows.append((op, flops, nbytes, seconds * 1e-3))
    return pd.DataFrame(rows, columns=["op", "flops", "bytes", "s"])


@dataclass(frozen=True)
class VidurFigures:
    large_max_tflops: float
    large_p90_tflops: float
    large_count: int
    small_p90_tflops: float
    small_count: int
    add_max_gbps: float


@dataclass(frozen=True)
class TraceFigures:
    kernels: int
    min_us: float
    p1_us: float
    files: int
    small_gemms: int
    small_tflops: float | None


def vidur_figures() -> dict[str, VidurFigures]:
    """Per Vidur GPU (a100, a40): the GEMM and bandwidth figures the catalog quotes."""
    out = {}
    for gpu in ("a100", "a40"):
        t = vidur_rows(gpu)
        gemm = t[t.op != "add"]
        rate = gemm.flops / gemm.s / 1e12
        large = rate[gemm.flops >= LARGE_MIN_FLOPS]
        small = rate[(gemm.flops > SMALL_FLOPS[0]) & (gemm.flops < SMALL_FLOPS[1])]
        add = t[(t.op == "add") & (t.bytes > STREAM_MIN_BYTES)]
        out[gpu] = VidurFigures(float(large.max()), float(large.quantile(0.9)), len(large),
                                float(small.quantile(0.9)), len(small), float((add.bytes / add.s / 1e9).max()))
    return out


@dataclass(frozen=True)
class SharedTrace:
    """What the figures read of one shared trace of a catalog GPU: its kernels' durations and its
    ``whatif ops`` table."""

    device: str
    file: str
    kernel_dur_ns: np.ndarray
    ops: pd.DataFrame


@functools.cache
def shared_traces() -> tuple[SharedTrace, ...]:
    """Every shared trace that names its GPU, one of the catalog's, loaded and tabled once per run
    (a trace whose GPU the reader names from its properties is left out: the catalog's figures
    were read from the named ones)."""
    out = []
    for path in sorted(TRACES.rglob("*.json*")):
        try:
            trace = load_trace(path)
        except WhatifError as error:  # a corpus file the reader refuses is reported, not fatal
            print(f"  skipped {path.name}: {error}", file=sys.stderr)
            continue
        device = find_device(trace.ranks[0].gpu_name)
        if device is None or not any(trace.ranks[0].recorded_device_names):
            continue
        ev = trace.events
        dur = ev.loc[(ev["kind"] == int(EventKind.KERNEL)) & (ev["dur_ns"] > 0), "dur_ns"].to_numpy()
        out.append(SharedTrace(device.name, path.name, dur, table_frame(ops_table(trace))))
    return tuple(out)


def small_gemm_points(ops: pd.DataFrame) -> pd.DataFrame:
    """(FLOPs per call, TFLOP/s) of an ops table's bf16 GEMM groups in the small range."""
    rows = ops[(ops["kernel_class"] == "gemm") & (ops["dtype"] == "bf16")]
    per_call = rows["flops"] / rows["count"]
    keep = (per_call >= TRACE_SMALL_FLOPS[0]) & (per_call <= TRACE_SMALL_FLOPS[1])
    return pd.DataFrame({"flops": per_call[keep], "tflops": rows["achieved_tflops"][keep]})


def small_gemm_rate(points: pd.DataFrame) -> float:
    """log(rate) fitted linearly in log(FLOPs), read at 2^31 FLOPs."""
    slope, intercept = np.polyfit(np.log(points["flops"]), np.log(points["tflops"]), 1)
    return float(np.exp(intercept + slope * np.log(SMALL_GEMM_FLOPS)))


def trace_figures() -> dict[str, TraceFigures]:
    """Per catalog GPU with shared traces: its shortest kernels and its small-GEMM rate."""
    durations: dict[str, list[np.ndarray]] = {}
    gemms: dict[str, list[pd.DataFrame]] = {}
    for t in shared_traces():
        if len(t.kernel_dur_ns):
            durations.setdefault(t.device, []).append(t.kernel_dur_ns)
            gemms.setdefault(t.device, []).append(small_gemm_points(t.ops))
    out = {}
    for name in sorted(durations):
        dur = np.concatenate(durations[name]) / 1e3
        points = pd.concat(gemms[name])
        small = small_gemm_rate(points) if points["flops"].nunique() >= 2 else None
        out[name] = TraceFigures(len(dur), float(dur.min()), float(np.percentile(dur, 1)), len(durations[name]),
                                 len(points), small)
    return out


def roof_shares() -> pd.DataFrame:
    """Per GEMM op group of at least 2^31 FLOPs per call in the shared traces (``whatif ops``): the
    catalog GPU, file, op, dtype, FLOPs per call and its % of the achievable roof."""
    rows = []
    for t in shared_traces():
        f = t.ops
        f = f[(f["kernel_class"] == "gemm") & f["roofline_pct"].notna() & (f["flops"] / f["count"] >= SMALL_GEMM_FLOPS)]
        rows += [(t.device, t.file, r.op, r.dtype, r.flops / r.count, r.roofline_pct) for r in f.itertuples()]
    return pd.DataFrame(rows, columns=["gpu", "file", "op", "dtype", "flops", "roofline_pct"])


VIDUR_DEVICE = {"a100": "A100_SXM_80GB", "a40": "A40"}
SIZE_BANDS_FLOPS = (0.0, 4e9, 16e9, 64e9, 256e9, float("inf"))


def log_linear_rate(small: float, large: float, flops: np.ndarray) -> np.ndarray:
    """The curve the catalog drew until 2026-11-28: log(rate) linear in log(FLOPs)."""
    f = np.clip(flops, SMALL_GEMM_FLOPS, LARGE_GEMM_FLOPS)
    w = np.log(f / SMALL_GEMM_FLOPS) / np.log(LARGE_GEMM_FLOPS / SMALL_GEMM_FLOPS)
    return small * (large / small) ** w


def curve_table(gpu: str) -> pd.DataFrame:
    """Per size band of Vidur's GEMMs on ``gpu``: count, and per curve the median measured/roof
    and the share of GEMMs above the roof."""
    t = vidur_rows(gpu)
    gemm = t[t.op != "add"]
    flops, rate = gemm.flops.to_numpy(), (gemm.flops / gemm.s).to_numpy()
    achievable = get_device(VIDUR_DEVICE[gpu]).achievable
    assert achievable is not None
    affine = np.array([achievable.matrix_flops(DType.BF16, f) for f in flops])
    loglin = log_linear_rate(achievable.small_gemm_flops[DType.BF16], achievable.gemm_flops[DType.BF16], flops)
    frame = pd.DataFrame({"band": pd.cut(flops, SIZE_BANDS_FLOPS), "affine": rate / affine, "loglin": rate / loglin})
    grouped = frame.groupby("band", observed=True)
    out = {"count": grouped.size()}
    for curve in ("affine", "loglin"):
        out[f"{curve}_median"] = grouped[curve].median()
        out[f"{curve}_above"] = grouped[curve].apply(lambda x: (x > 1).mean())
    return pd.DataFrame(out)


def main() -> int:
    if not PERFDATA.is_dir() or not TRACES.is_dir():
        print(f"skipped: needs {PERFDATA} and {TRACES} next to the repository")
        return 0
    print("Vidur operator timings (fp16/bf16)")
    print(f"{'gpu':6} {'large max':>10} {'large p90':>10} {'n':>5} {'small p90':>10} {'n':>5} {'add GB/s max':>13}")
    for gpu, v in vidur_figures().items():
        print(f"{gpu:6} {v.large_max_tflops:10.1f} {v.large_p90_tflops:10.1f} {v.large_count:5d} "
              f"{v.small_p90_tflops:10.1f} {v.small_count:5d} {v.add_max_gbps:13.0f}")
    print("\nShortest kernels and small bf16 GEMMs in the shared traces")
    print(f"{'catalog GPU':16} {'kernels':>8} {'min us':>7} {'p1 us':>6} {'files':>5} "
          f"{'GEMMs':>5} {'2^31 TFLOP/s':>13}")
    for name, f in trace_figures().items():
        small = f"{f.small_tflops:13.1f}" if f.small_tflops is not None else f"{'-':>13}"
        print(f"{name:16} {f.kernels:8d} {f.min_us:7.2f} {f.p1_us:6.2f} {f.files:5d} {f.small_gemms:5d} {small}")
    shares = roof_shares()
    print("\nGEMM op groups of >= 2^31 FLOPs per call in the shared traces: % of the achievable roof")
    print(f"{'catalog GPU':16} {'dtype':5} {'groups':>6} {'median %':>9} {'max %':>7} {'above 100 %':>11}")
    for (gpu, dtype), g in shares.groupby(["gpu", "dtype"]):
        pct = g["roofline_pct"]
        print(f"{gpu:16} {dtype:5} {len(g):6d} {pct.median():9.1f} {pct.max():7.1f} {int((pct > 100).sum()):11d}")
    print("\nVidur GEMMs against the achievable curve: measured/roof median and share above the roof")
    print(f"{'gpu':5} {'GFLOP band':>14} {'n':>6} {'affine med':>10} {'above':>6} {'log-lin med':>11} {'above':>6}")
    for gpu in VIDUR_DEVICE:
        for band, row in curve_table(gpu).iterrows():
            hi = "inf" if np.isinf(band.right) else f"{band.right / 1e9:g}"
            print(f"{gpu:5} {f'{band.left / 1e9:g}-{hi}':>14} {int(row['count']):6d} {row['affine_median']:10.3f} "
                  f"{row['affine_above']:6.1%} {row['loglin_median']:11.3f} {row['loglin_above']:6.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
