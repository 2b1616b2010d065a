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

Run: ``python bench/device_achievable.py``; it prints one table per source.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common.vidur import GEMM_OPS, PERFDATA, compute_models, op_work

from whatif.hardware.devices import SMALL_GEMM_FLOPS, find_device
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


def vidur_figures() -> None:
    print("Vidur operator timings (fp16/bf16)")
    print(f"{'gpu':6} {'large max':>10} {'large p90':>10} {'n':>5} {'small p90':>10} {'n':>5} {'add GB/s max':>13}")
    for gpu in ("a100", "a40"):
        t = vidur_rows(gpu)
        gemm = t[t.op != "add"]
        rate = gemm.flops / gemm.s / 1e12
        large = rate[gemm.flops >= LARGE_MIN_FLOPS]
        small = rate[(gemm.flops > SMALL_FLOPS[0]) & (gemm.flops < SMALL_FLOPS[1])]
        add = t[(t.op == "add") & (t.bytes > STREAM_MIN_BYTES)]
        bw = (add.bytes / add.s / 1e9).max()
        print(f"{gpu:6} {large.max():10.1f} {large.quantile(0.9):10.1f} {len(large):5d} "
              f"{small.quantile(0.9):10.1f} {len(small):5d} {bw:13.0f}")


def small_gemm_points(trace) -> pd.DataFrame:
    """(FLOPs per call, TFLOP/s) of the trace's bf16 GEMM groups in the small range."""
    rows = table_frame(ops_table(trace))
    rows = rows[(rows["kernel_class"] == "gemm") & (rows["dtype"] == "bf16")]
    per_call = rows["flops"] / rows["count"]
    keep = (per_call >= TRACE_SMALL_FLOPS[0]) & (per_call <= TRACE_SMALL_FLOPS[1])
    return pd.DataFrame({"flops": per_call[keep], "tflops": rows["achieved_tflops"][keep]})


def small_gemm_rate(points: pd.DataFrame) -> float:
    """log(rate) fitted linearly in log(FLOPs), read at 2^31 FLOPs."""
    slope, intercept = np.polyfit(np.log(points["flops"]), np.log(points["tflops"]), 1)
    return float(np.exp(intercept + slope * np.log(SMALL_GEMM_FLOPS)))


def trace_figures() -> None:
    print("\nShortest kernels and small bf16 GEMMs in the shared traces")
    print(f"{'catalog GPU':16} {'kernels':>8} {'min us':>7} {'p1 us':>6} {'files':>5} "
          f"{'GEMMs':>5} {'2^31 TFLOP/s':>13}")
    durations: dict[str, list[np.ndarray]] = {}
    files: dict[str, int] = {}
    gemms: dict[str, list[pd.DataFrame]] = {}
    for path in sorted(TRACES.rglob("*.json*")):
        try:
            trace = load_trace(path)
        except Exception as error:  # a corpus file the reader refuses is reported, not fatal
            print(f"  skipped {path.name}: {error}", file=sys.stderr)
            continue
        device = find_device(trace.ranks[0].gpu_name)
        if device is None:
            continue
        ev = trace.events
        dur = ev.loc[(ev["kind"] == int(EventKind.KERNEL)) & (ev["dur_ns"] > 0), "dur_ns"].to_numpy()
        if len(dur):
            durations.setdefault(device.name, []).append(dur)
            files[device.name] = files.get(device.name, 0) + 1
            gemms.setdefault(device.name, []).append(small_gemm_points(trace))
    for name in sorted(durations):
        dur = np.concatenate(durations[name]) / 1e3
        points = pd.concat(gemms[name])
        small = f"{small_gemm_rate(points):13.1f}" if points["flops"].nunique() >= 2 else f"{'-':>13}"
        print(f"{name:16} {len(dur):8d} {dur.min():7.2f} {np.percentile(dur, 1):6.2f} {files[name]:5d} "
              f"{len(points):5d} {small}")


def main() -> int:
    if not PERFDATA.is_dir() or not TRACES.is_dir():
        print(f"skipped: needs {PERFDATA} and {TRACES} next to the repository")
        return 0
    vidur_figures()
    trace_figures()
    return 0


if __name__ == "__main__":
    sys.exit(main())
