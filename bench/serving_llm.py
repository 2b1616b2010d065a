"""Validate `whatif serve` against real runs of examples/llm_serve.py on this machine.

1. record one configuration with `whatif record` (its --log goes into the run folder, where
   `whatif serve` finds it through the run folder's meta.jsonc), and run the same configuration once without the
   profiler (its log gives the profiler-overhead factor, --unprofiled-log);
2. for each other configuration (rate, max batch, prompt/output lengths): predict with
   `whatif serve --json` (same seed, so the very same request list), and run the example for real,
   un-profiled, --repeats times, interleaved across configurations, recording os.getloadavg();
3. compare predicted mean/p99 TTFT and TPOT with the median over repeats of the measured ones;
4. diagnostic ("oracle"): the same simulator fed with an iteration model fitted on each measured
   run's *own* logged iteration times, which separates the simulator's error from the error of
   the iteration times (other jobs on the shared cores change those from run to run).

Nothing is stored or assumed: every figure comes from this run.

  .venv/bin/python bench/serving_llm.py [--repeats 3] [--out bench/results/serving_llm.json]
"""
from __future__ import annotations

import argparse
import itertools
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
EXAMPLE = ROOT / "examples" / "llm_serve.py"
COMMON = ["--device", "cpu", "--threads", "1", "--seed", "0"]

# (name, rate req/s, max batch, num requests, prompt min:max, output min:max)
RECORDED = ("recorded", 20.0, 8, 40, (16, 128), (16, 96))
CONFIGS = [
    ("A rate5 b8 short", 5.0, 8, 30, (16, 64), (32, 128)),
    ("B rate20 b4", 20.0, 4, 40, (16, 128), (16, 96)),
    ("C rate10 b16", 10.0, 16, 40, (32, 96), (16, 64)),
    ("D burst b8 long-prompt", float("inf"), 8, 24, (64, 128), (16, 48)),
    ("E rate60 b8 (3x recorded)", 60.0, 8, 40, (16, 128), (16, 96)),   # issue 18: 3x the fitted rate
]
METRICS = [("ttft_ms", "mean"), ("ttft_ms", "p99"), ("tpot_ms", "mean"), ("tpot_ms", "p99"), ("e2e_ms", "mean"),
           ("e2e_ms", "p99")]


def example_args(cfg: tuple, log: Path) -> list[str]:
    _, rate, batch, n, (pmin, pmax), (omin, omax) = cfg
    return [*COMMON, "--rate", str(rate), "--max-batch", str(batch), "--num-requests", str(n),
            "--prompt-min", str(pmin), "--prompt-max", str(pmax), "--output-min", str(omin),
            "--output-max", str(omax), "--log", str(log)]


def run_plain(cfg: tuple, log: Path) -> dict:
    load = os.getloadavg()[0]
    subprocess.run([PY, str(EXAMPLE), *example_args(cfg, log)], check=True, capture_output=True, cwd=ROOT)
    doc = json.loads(log.read_text())
    return {"load1": load, "load1_after": os.getloadavg()[0], **{f"{k}.{q}": doc["summary"][k][q] for k, q in METRICS},
            "output_tok_s": doc["summary"]["output_throughput_tok_s"]}


def oracle(log: Path) -> dict:
    """Simulate the run's configuration with iteration times fitted on its own log (duration_ms plus
    the median gap between back-to-back iterations)."""
    import numpy as np

    from whatif.predictors.serving import (
        SchedulerConfig,
        logs,
        simulate_llm,
        synthetic_workload,
    )
    from whatif.predictors.serving.iteration_model import (
        DECODE_CANDIDATES,
        PREFILL_CANDIDATES,
        IterationModel,
        fit_phase,
        llm_features,
    )
    doc = json.loads(log.read_text())
    comp, its = logs.llm_compositions(logs.read_log(log)), doc["iterations"]
    gaps = [b["start_s"] - a["end_s"] for a, b in itertools.pairwise(its) if b["phase"] == "decode"]
    over = float(np.median(gaps)) * 1e9
    y = np.array([it["duration_ms"] * 1e6 + over for it in its])
    fits = {}
    for ph, cands in (("prefill", PREFILL_CANDIDATES), ("decode", DECODE_CANDIDATES)):
        idx = [i for i, (p, _) in enumerate(comp) if p == ph]
        fits[ph] = fit_phase(ph, [llm_features(comp[i][1]) for i in idx], y[idx], cands)
    c = doc["config"]
    reqs = synthetic_workload(c["num_requests"], float(c["rate"]), (c["prompt_min"], c["prompt_max"]),
                              (c["output_min"], c["output_max"]), c["seed"])
    s = simulate_llm(reqs, IterationModel(fits, over).time_ns,
                     SchedulerConfig(max_seqs=c["max_batch"], max_batched_tokens=c["max_batched_tokens"])).summary
    return {f"{k}.{q}": s[k][q] / doc["summary"][k][q] - 1 for k, q in METRICS}


def predict(run: Path, plain_log: Path, cfg: tuple, out: Path) -> dict:
    _, rate, batch, n, (pmin, pmax), (omin, omax) = cfg
    subprocess.run([PY, "-m", "whatif.cli", "serve", str(run), "--unprofiled-log", str(plain_log),
                    "--rate", str(rate), "--max-seqs", str(batch), "--num-requests", str(n), "--seed", "0",
                    "--prompt-tokens", f"{pmin}:{pmax}", "--output-tokens", f"{omin}:{omax}",
                    "--json", str(out), "-q"], check=True, cwd=ROOT)
    s = json.loads(out.read_text())["scenarios"][0]
    return {**{f"{k}.{q}": s[k][q] for k, q in METRICS}, "output_tok_s": s["throughput_tokens_per_s"],
            "model": s["iteration_model"], "extrapolated": s["extrapolated_iterations"],
            "iterations": sum(s["iterations"].values())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--run", type=Path, help="reuse this recording (run folder with its log) instead of recording")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "serving_llm.json")
    ap.add_argument("--configs", default="", help="only these configurations, by letter (e.g. E or A,E)")
    args = ap.parse_args()
    configs = [c for c in CONFIGS if not args.configs or c[0][0] in args.configs.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="serving_llm_"))
    run = args.run or tmp / "rec"
    if args.run is None:
        load = os.getloadavg()[0]
        subprocess.run([PY, "-m", "whatif.cli", "record", "-f", "-o", str(run), "--no-summary", str(EXAMPLE), "--",
                        *example_args(RECORDED, run / "llm_serve.log")], check=True, capture_output=True, cwd=ROOT)
        print(f"recorded {RECORDED[0]} (load {load:.2f})", file=sys.stderr)
    plain_log = run / "unprofiled.log"
    twin = run_plain(RECORDED, plain_log)
    print(f"un-profiled twin: TTFT mean {twin['ttft_ms.mean']:.1f} ms (load {twin['load1']:.2f})", file=sys.stderr)
    measured: dict[str, list[dict]] = {c[0]: [] for c in configs}
    for rep in range(args.repeats):
        for cfg in configs:
            log = tmp / f"m{rep}.log"
            measured[cfg[0]].append(run_plain(cfg, log))
            measured[cfg[0]][-1]["oracle_error"] = oracle(log)
            print(f"  ran {cfg[0]} #{rep}: TTFT {measured[cfg[0]][-1]['ttft_ms.mean']:.1f} ms", file=sys.stderr)
    rows = []
    for cfg in configs:
        pred = predict(run, plain_log, cfg, tmp / "pred.json")
        reps = measured[cfg[0]]
        med = {k: statistics.median(r[k] for r in reps) for k in reps[0] if k != "oracle_error"}
        oracle_err = {m: statistics.median(r["oracle_error"][m] for r in reps) for m in reps[0]["oracle_error"]}
        err = {f"{k}.{q}": pred[f"{k}.{q}"] / med[f"{k}.{q}"] - 1 for k, q in METRICS}
        rows.append({"config": cfg[0], "rate": cfg[1], "max_batch": cfg[2], "num_requests": cfg[3],
                     "prompt_tokens": cfg[4], "output_tokens": cfg[5],
                     "predicted": {k: v for k, v in pred.items() if k != "model"},
                     "extrapolated_iterations": f"{pred['extrapolated']} of {pred['iterations']}",
                     "measured_median": med, "measured_runs": reps, "error": err,
                     "oracle_error_median": oracle_err,
                     "load1_range": [min(r["load1"] for r in reps), max(r["load1_after"] for r in reps)]})
    model = pred["model"]
    doc = {"recorded": {"config": RECORDED, "unprofiled_twin": twin}, "iteration_model": model, "rows": rows,
           "repeats": args.repeats, "date": time.strftime("%Y-%m-%d %H:%M")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, default=str))
    print(f"profiler correction {model['profiler_correction']}")
    for p, f in model["phases"].items():
        print(f"{p}: {'+'.join(f['features'])}, n={f['n']}, R2={f['r2']:.2f}, MAPE {f['mape']:.1%}, "
              f"LOO {f['loo_mape']:.1%}")
    print(f"{'config':24} {'metric':10} {'pred':>9} {'meas':>9} {'err':>7} {'oracle':>7}   load")
    for r in rows:
        for k, q in METRICS:
            key = f"{k}.{q}"
            print(f"{r['config']:24} {key:10} {r['predicted'][key]:9.2f} {r['measured_median'][key]:9.2f} "
                  f"{r['error'][key]:+7.1%} {r['oracle_error_median'][key]:+7.1%}   "
                  f"{r['load1_range'][0]:.2f}-{r['load1_range'][1]:.2f}")
        print(f"{r['config']:24} simulated iterations beyond the fitted range: {r['extrapolated_iterations']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
