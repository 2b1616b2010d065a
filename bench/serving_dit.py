"""Validate `whatif serve` on DiT serving against real runs of examples/dit_serve.py on this machine.

Record one resolution / step count with `whatif record` (Poisson arrivals, so batches of several
sizes occur and the fit can separate per-step overhead from per-sample work), run the same
configuration once without the profiler (--unprofiled-log), then for other resolutions, step
counts and batch sizes: predict with `whatif serve --json` (same seed: the same arrival times) and
run the example for real --repeats times, interleaved, with os.getloadavg(); compare predicted
request latency (mean, p99) and mean step time with the median over repeats.

  .venv/bin/python bench/serving_dit.py [--repeats 3] [--out bench/results/serving_dit.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
EXAMPLE = ROOT / "examples" / "dit_serve.py"
COMMON = ["--device", "cpu", "--threads", "1", "--seed", "0"]

# (name, resolution, steps, batch, num requests, rate)
RECORDED = ("recorded", 16, 6, 4, 16, 30.0)
CONFIGS = [
    ("res24 (2.25x tokens)", 24, 6, 4, 12, 10.0),
    ("steps12 batch2", 16, 12, 2, 12, 10.0),
    ("batch8 burst", 16, 6, 8, 16, float("inf")),
    ("res32 steps4 (4x tokens)", 32, 4, 2, 8, 5.0),
]


def example_args(cfg: tuple, log: Path) -> list[str]:
    _, res, steps, batch, n, rate = cfg
    return [*COMMON, "--resolution", str(res), "--steps", str(steps), "--batch", str(batch), "--num-requests", str(n),
            "--rate", str(rate), "--log", str(log)]


def run_plain(cfg: tuple, log: Path) -> dict:
    load = os.getloadavg()[0]
    subprocess.run([PY, str(EXAMPLE), *example_args(cfg, log)], check=True, capture_output=True, cwd=ROOT)
    s = json.loads(log.read_text())["summary"]
    return {"load1": load, "load1_after": os.getloadavg()[0], "latency.mean": s["latency_ms"]["mean"],
            "latency.p99": s["latency_ms"]["p99"], "step.mean": s["step_ms"]["mean"]}


def predict(run: Path, plain_log: Path, cfg: tuple, out: Path) -> dict:
    _, res, steps, batch, n, rate = cfg
    subprocess.run([PY, "-m", "whatif.cli", "serve", str(run), "--unprofiled-log", str(plain_log), "--rate", str(rate),
                    "--num-requests", str(n), "--seed", "0", "--resolution", str(res), "--steps", str(steps),
                    "--batch", str(batch), "--json", str(out), "-q"], check=True, cwd=ROOT)
    s = json.loads(out.read_text())["scenarios"][0]
    service = s["service_ms"]["mean"]  # per batch: steps x step + overhead; mean step over the batches served
    return {"latency.mean": s["latency_ms"]["mean"], "latency.p99": s["latency_ms"]["p99"],
            "step.mean": (service - s["iteration_model"]["batch_overhead_ns"] / 1e6) / steps,
            "model": s["iteration_model"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--run", type=Path, help="reuse this recording (run folder with its log)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "serving_dit.json")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="serving_dit_"))
    run = args.run or tmp / "rec"
    if args.run is None:
        load = os.getloadavg()[0]
        subprocess.run([PY, "-m", "whatif.cli", "record", "-f", "-o", str(run), "--no-summary", str(EXAMPLE), "--",
                        *example_args(RECORDED, run / "dit_serve.log")], check=True, capture_output=True, cwd=ROOT)
        print(f"recorded (load {load:.2f})", file=sys.stderr)
    plain_log = run / "unprofiled.log"
    twin = run_plain(RECORDED, plain_log)
    measured: dict[str, list[dict]] = {c[0]: [] for c in CONFIGS}
    for rep in range(args.repeats):
        for cfg in CONFIGS:
            measured[cfg[0]].append(run_plain(cfg, tmp / "m.log"))
            print(f"  ran {cfg[0]} #{rep}: latency {measured[cfg[0]][-1]['latency.mean']:.1f} ms", file=sys.stderr)
    rows = []
    for cfg in CONFIGS:
        pred = predict(run, plain_log, cfg, tmp / "pred.json")
        reps = measured[cfg[0]]
        med = {k: statistics.median(r[k] for r in reps) for k in reps[0]}
        rows.append({"config": cfg[0], "resolution": cfg[1], "steps": cfg[2], "batch": cfg[3], "num_requests": cfg[4],
                     "rate": cfg[5], "predicted": {k: v for k, v in pred.items() if k != "model"},
                     "measured_median": med, "measured_runs": reps,
                     "error": {k: pred[k] / med[k] - 1 for k in ("latency.mean", "latency.p99", "step.mean")},
                     "load1_range": [min(r["load1"] for r in reps), max(r["load1_after"] for r in reps)]})
    doc = {"recorded": {"config": RECORDED, "unprofiled_twin": twin}, "iteration_model": pred["model"], "rows": rows,
           "repeats": args.repeats, "date": time.strftime("%Y-%m-%d %H:%M")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, default=str))
    m = pred["model"]
    print(f"step model at {m['tokens_ref']} tokens: attention {m['attention_ns']}, rest {m['rest_ns']} "
          f"(ns, ns/sample); "
          f"model batches seen {m['model_batches_seen']}, MAPE {m['mape']:.1%}, LOO {m['loo_mape']:.1%}, "
          f"profiler correction {m['profiler_correction']:.3f}")
    print(f"{'config':26} {'metric':13} {'pred':>9} {'meas':>9} {'err':>7}   load")
    for r in rows:
        for k in ("latency.mean", "latency.p99", "step.mean"):
            print(f"{r['config']:26} {k:13} {r['predicted'][k]:9.2f} {r['measured_median'][k]:9.2f} "
                  f"{r['error'][k]:+7.1%}   {r['load1_range'][0]:.2f}-{r['load1_range'][1]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
