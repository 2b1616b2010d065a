"""The GPU harvest's nine before/after pairs: each "after" predicted from its "before" trace, against
what the "after" recording measured and against predicting no change (issue 19, item 3).

Reads the recordings of ``bench/gpu_harvest/run.py`` (round 1 committed under
``sample_traces/gpu/pairs``; round 2's traces with ``--round2 DIR`` when they are at hand, else
round 2's program logs only). For the step-time pairs the figure is the mean step time of the
counted steps (warm-up and partial steps left out) in the trace, their median (a compiled
program's rare recompilation step would dominate a mean of 11 to 60 steps); for the serving pairs it is the
serving metrics of ``whatif serve`` against the example's own log; for p1 (precision) also the GPU time
per kernel class before, predicted and after. A prediction "beats unchanged"
when its error is smaller than that of predicting the "before" value.

    .venv/bin/python bench/gpu_pairs.py [--round2 /path/to/round2/pairs] [--json OUT]

About a minute and a half on a 2-core machine; figures measured in this run are printed, nothing
is stored or assumed. docs/accuracy.md holds the table of one run.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from whatif.api import analyze, predict
from whatif.depgraph.graph import TaskGraph, TaskKind
from whatif.hardware.devices import find_device
from whatif.transforms.optimizations.flash_attention import (
    FlashAttention,
    calibrated_efficiency,
    dispatch_ns_per_event,
    find_unfused,
)
from whatif.transforms.optimizations.gpu import Gpu
from whatif.transforms.scenario import Scenario
from whatif.transforms.select import kernel_classes

ROOT = Path(__file__).resolve().parents[1]
PAIRS_DIR = ROOT / "sample_traces" / "gpu" / "pairs"
SCENARIOS = ROOT / "bench" / "gpu_harvest" / "scenarios"


@dataclass(frozen=True)
class StepPair:
    """A pair judged on the mean step time; ``scenario`` is a TOML file under :data:`SCENARIOS`."""

    name: str
    change: str
    scenario: str


STEP_PAIRS = (
    StepPair("p1_precision", "fp32 -> bf16 autocast", "p1_precision.toml"),
    StepPair("p2_cuda_graph", "eager -> CUDA graph", "p2_cuda_graph.toml"),
    StepPair("p3_compile", "eager -> torch.compile", "p3_compile.toml"),
    StepPair("p4_sdpa", "SDPA math -> flash", "p4_sdpa.toml"),
    StepPair("p5_dataloader", "num_workers 0 -> 4", "p5_dataloader.toml"),
    StepPair("p6_batch", "decode batch 8 -> 32", "p6_batch.toml"),
    StepPair("p9_tp", "TP-1 -> TP-2 emulated", "p9_tp.toml"),
)


@dataclass
class StepRow:
    pair: str
    change: str
    round: int
    before_ms: float
    after_ms: float
    predicted_ms: float | None
    gpu_before_ms: float
    gpu_after_ms: float
    gpu_predicted_ms: float | None

    @property
    def error(self) -> float | None:
        return None if self.predicted_ms is None else self.predicted_ms / self.after_ms - 1

    @property
    def unchanged_error(self) -> float:
        return self.before_ms / self.after_ms - 1


def median_counted_ms(steps: pd.DataFrame, column: str) -> float:
    """Median over the counted steps (robust to the rare recompilation or GC step), ms."""
    counted = steps[steps["included"]]
    return float(counted[column].median() / 1e6)


def kernel_busy_ms(graph: TaskGraph, steps: pd.DataFrame) -> float:
    """GPU kernel time (compute kernels, not collectives) per counted step, ms."""
    t = graph.tasks
    counted = set(steps.loc[steps["included"], "step"].tolist())
    dur = t["dur_ns"].to_numpy()
    keep = (t["kind"].to_numpy() == int(TaskKind.KERNEL)) & np.isin(t["step"].to_numpy(), list(counted))
    return float(dur[keep].sum() / 1e6 / max(len(counted), 1))


def class_ms(graph: TaskGraph, steps: pd.DataFrame) -> pd.Series:
    """GPU kernel time per kernel class per counted step, ms (what :func:`kernel_busy_ms` sums)."""
    t = graph.tasks
    counted = set(steps.loc[steps["included"], "step"].tolist())
    keep = (t["kind"].to_numpy() == int(TaskKind.KERNEL)) & np.isin(t["step"].to_numpy(), list(counted))
    per = pd.Series(t["dur_ns"].to_numpy()[keep] / 1e6 / max(len(counted), 1))
    return per.groupby(kernel_classes(graph)[keep]).sum()


def precision_classes(before: Path, after: Path) -> pd.DataFrame:
    """p1 per kernel class: GPU ms per counted step before, predicted by its scenario (``autocast``),
    predicted as a model converted to bf16 (``precision``), and after."""
    b, a = analyze(before), analyze(after)
    auto, converted = predict(b, [SCENARIOS / "p1_precision.toml",
                                  SCENARIOS / "p1_precision_converted.toml"]).scenarios
    return pd.DataFrame({"before": class_ms(b.graph, b.steps), "autocast": class_ms(auto.graph, auto.steps),
                         "converted": class_ms(converted.graph, converted.steps),
                         "after": class_ms(a.graph, a.steps)}).fillna(0.0)


def flash_classes(before: Path, after: Path) -> pd.DataFrame:
    """p4 per kernel class: GPU ms per counted step before, predicted by ``flash_attention``, and after."""
    b, a = analyze(before), analyze(after)
    pred = predict(b, [SCENARIOS / "p4_sdpa.toml"]).scenarios[0]
    return pd.DataFrame({"before": class_ms(b.graph, b.steps), "flash_attention": class_ms(pred.graph, pred.steps),
                         "after": class_ms(a.graph, a.steps)}).fillna(0.0)


def flash_details(before: Path, after: Path) -> None:
    """p4: what ``flash_attention`` read (events and CPU time per event of the calls it replaces,
    the efficiency the after recording's own flash kernels reach) and whether it commutes with a
    GPU move (kernel ms per counted step, flash then gpu / gpu then flash - 1)."""
    b, a = analyze(before), analyze(after)
    calls = find_unfused(b.graph)
    for side in ("forward", "backward"):
        passes = [getattr(c, side) for c in calls if getattr(c, side) is not None]
        events = sorted({p.events for p in passes})
        us = [p.ns_per_event / 1e3 for p in passes]
        median = dispatch_ns_per_event(calls)[side == "backward"] / 1e3
        print(f"p4 {side}: {len(passes)} calls, {events[0]}-{events[-1]} events each, "
              f"{min(us):.1f}-{max(us):.1f} us of CPU per event (median {median:.2f})")
    adds = [np.median(ev["dur_ns"].to_numpy()[(ev["name"].astype(str) == "aten::add").to_numpy()]) / 1e3
            for ev in (b.trace.events, a.trace.events)]
    print(f"p4 hosts: aten::add {adds[0]:.1f} us median before, {adds[1]:.1f} us after")
    fwd, bwd, n_fwd, n_bwd = calibrated_efficiency(a.graph, find_device(a.trace.ranks[0].gpu_name))
    print(f"p4 after's own flash kernels reach e = {fwd:.2f} forward ({n_fwd} ops), {bwd:.2f} backward ({n_bwd} ops)")
    for device in ("H100_SXM", "A100_SXM_80GB", "MI300X"):
        flash_first, move_first = predict(b, [
            Scenario(name="flash then gpu", transforms=[FlashAttention(), Gpu(device=device)]),
            Scenario(name="gpu then flash", transforms=[Gpu(device=device), FlashAttention()])]).scenarios
        ratio = kernel_busy_ms(flash_first.graph, flash_first.steps) / kernel_busy_ms(move_first.graph,
                                                                                       move_first.steps)
        print(f"p4 on {device}: flash_attention then gpu / gpu then flash_attention, kernels {ratio - 1:+.1%}")


def step_row(pair: StepPair, before: Path, after: Path, rnd: int) -> StepRow:
    b, a = analyze(before), analyze(after)
    pred = predict(b, [SCENARIOS / pair.scenario]).scenarios[0]
    return StepRow(pair.name, pair.change, rnd,
                   before_ms=median_counted_ms(b.steps, "measured_ns"),
                   after_ms=median_counted_ms(a.steps, "measured_ns"),
                   predicted_ms=median_counted_ms(pred.steps, "predicted_ns"),
                   gpu_before_ms=kernel_busy_ms(b.graph, b.steps), gpu_after_ms=kernel_busy_ms(a.graph, a.steps),
                   gpu_predicted_ms=kernel_busy_ms(pred.graph, pred.steps))


def log_step_ms(run: Path) -> float:
    """The program's own median step time (after the first step), from its log."""
    steps = json.loads((run / "program.log").read_text())["steps"]
    return float(np.median([s["step_ms"] for s in steps[1:]]))


# -- serving pairs ------------------------------------------------------------------------------
SERVE_PAIRS = {
    "p7_serve_rate": ("LLM server 8 -> 24 req/s",
                      ["--rate", "24", "--num-requests", "16", "--prompt-tokens", "16:64", "--output-tokens", "32:48",
                       "--seed", "0"],
                      {"ttft_ms": "ttft_ms", "tpot_ms": "tpot_ms", "e2e_ms": "e2e_ms"}),
    "p8_dit_tokens": ("DiT latent 16 -> 32 (tokens x4)",
                      ["--rate", "inf", "--num-requests", "8", "--resolution", "32", "--steps", "8", "--batch", "4"],
                      {"latency_ms": "latency_ms", "service_ms": "service_ms"}),
}
# The DiT log's step_ms p50 is the steady step at full batch (its mean holds the recording's first,
# start-up step, which the model leaves out as the warm-up).
STEP_METRIC = ("step_ms p50", "step_ms", "p50", "step_ms_at_full_batch")


@dataclass
class ServeRow:
    pair: str
    change: str
    round: int
    metric: str
    before: float
    after: float
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.after - 1

    @property
    def unchanged_error(self) -> float:
        return self.before / self.after - 1


def serve_rows(name: str, before: Path, after: Path, rnd: int) -> list[ServeRow]:
    change, flags, metrics = SERVE_PAIRS[name]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "serve.json"
        subprocess.run([sys.executable, "-m", "whatif.cli", "serve", str(before), *flags, "--json", str(out), "-q"],
                       check=True, cwd=ROOT)
        doc = json.loads(out.read_text())["scenarios"][0]
    b = json.loads((before / "program.log").read_text())["summary"]
    a = json.loads((after / "program.log").read_text())["summary"]
    rows = [ServeRow(name, change, rnd, f"{m} mean", b[m]["mean"], a[m]["mean"], doc[key]["mean"])
            for m, key in metrics.items()]
    label, metric, stat, key = STEP_METRIC
    if metric in b and key in doc:
        rows.append(ServeRow(name, change, rnd, label, b[metric][stat], a[metric][stat], doc[key]))
    return rows


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--round2", type=Path, default=None, help="folder of round 2's pair run folders (with traces)")
    ap.add_argument("--json", type=Path, default=None, help="also write every row here")
    opts = ap.parse_args()
    rounds = [(1, PAIRS_DIR)] + ([(2, opts.round2)] if opts.round2 else [])
    rows: list[StepRow] = []
    srows: list[ServeRow] = []
    for rnd, folder in rounds:
        for pair in STEP_PAIRS:
            before, after = (folder / f"{pair.name}-{side}-r{rnd}" for side in ("before", "after"))
            rows.append(step_row(pair, before, after, rnd))
        for name in SERVE_PAIRS:
            srows += serve_rows(name, folder / f"{name}-before-r{rnd}", folder / f"{name}-after-r{rnd}", rnd)
    print("Step-time pairs (median of counted steps in the trace, ms; error = predicted / measured after - 1)")
    print(f"{'pair':15} {'rnd':>3} {'before':>8} {'after':>8} {'predicted':>9} {'error':>8} "
          f"{'unchanged':>9} {'beats':>5} | {'GPU ms/step before':>18} {'after':>7} {'predicted':>9}")
    for r in rows:
        beats = "yes" if r.error is not None and abs(r.error) < abs(r.unchanged_error) else "no"
        print(f"{r.pair:15} {r.round:>3} {r.before_ms:8.3f} {r.after_ms:8.3f} {r.predicted_ms:9.3f} "
              f"{pct(r.error):>8} {pct(r.unchanged_error):>9} {beats:>5} | {r.gpu_before_ms:18.3f} "
              f"{r.gpu_after_ms:7.3f} {r.gpu_predicted_ms:9.3f}")
    print("\np1 (fp32 -> bf16 autocast) per kernel class, GPU ms per counted step, round 1: predicted by "
          "`autocast` and by `precision` (a model converted to bf16)")
    classes = precision_classes(PAIRS_DIR / "p1_precision-before-r1", PAIRS_DIR / "p1_precision-after-r1")
    print(pd.concat([classes, classes.sum().to_frame("total").T]).to_string(float_format=lambda x: f"{x:.3f}"))
    b = analyze(PAIRS_DIR / "p1_precision-before-r1")
    converted = predict(b, [SCENARIOS / "p1_precision_converted.toml"]).scenarios[0]
    step_ms = median_counted_ms(converted.steps, "predicted_ns")
    print(f"p1 step as a converted model (`precision dtype=bf16`): {step_ms:.3f} ms")
    print("\np4 (SDPA math -> flash) per kernel class, GPU ms per counted step, round 1: predicted by "
          "`flash_attention`")
    classes = flash_classes(PAIRS_DIR / "p4_sdpa-before-r1", PAIRS_DIR / "p4_sdpa-after-r1")
    print(pd.concat([classes, classes.sum().to_frame("total").T]).to_string(float_format=lambda x: f"{x:.3f}"))
    flash_details(PAIRS_DIR / "p4_sdpa-before-r1", PAIRS_DIR / "p4_sdpa-after-r1")
    p4 = next(r for r in rows if r.pair == "p4_sdpa" and r.round == 1)
    logged = [log_step_ms(PAIRS_DIR / f"p4_sdpa-{side}-r{rnd}") for rnd in (1, 2) for side in ("before", "after")]
    print(f"p4 step after / before: predicted {p4.predicted_ms / p4.before_ms:.3f}; measured in the traces "
          f"{p4.after_ms / p4.before_ms:.3f} (round 1); in the program logs {logged[1] / logged[0]:.3f} (round 1), "
          f"{logged[3] / logged[2]:.3f} (round 2)")
    print("\nServing pairs (whatif serve on the before trace vs the example's own log)")
    print(f"{'pair':15} {'rnd':>3} {'metric':15} {'before':>9} {'after':>9} {'predicted':>9} {'error':>8} "
          f"{'unchanged':>9} {'beats':>5}")
    for s in srows:
        beats = "yes" if abs(s.error) < abs(s.unchanged_error) else "no"
        print(f"{s.pair:15} {s.round:>3} {s.metric:15} {s.before:9.2f} {s.after:9.2f} {s.predicted:9.2f} "
              f"{pct(s.error):>8} {pct(s.unchanged_error):>9} {beats:>5}")
    print("\nRun-to-run noise (program's own median step time, ms, round 1 vs round 2)")
    for pair in STEP_PAIRS:
        for side in ("before", "after"):
            r1, r2 = (PAIRS_DIR / f"{pair.name}-{side}-r{k}" for k in (1, 2))
            if (r2 / "program.log").exists():
                a, b = log_step_ms(r1), log_step_ms(r2)
                print(f"  {pair.name:15} {side:6} r1 {a:8.3f}  r2 {b:8.3f}  ({pct(b / a - 1)})")
    if opts.json:
        def judged(row: StepRow | ServeRow) -> dict[str, object]:
            return asdict(row) | {"error": row.error, "unchanged_error": row.unchanged_error}
        opts.json.write_text(json.dumps({"steps": [judged(r) for r in rows], "serving": [judged(s) for s in srows]},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
