"""Recording overhead on a GPU (issue 19 item 4), from the program's own clock in the first GPU
harvest (``sample_traces/gpu``, an H200; ``bench/gpu_harvest/run.py``): the same program run with no
profiler (``plain``), under bare ``torch.profiler`` (``bare``, ``bench/record_overhead.py --_bare``),
under ``whatif record`` (``torch``) and under ``whatif record --backend cupti`` (``cupti``).

Every recorded job of the manifest whose program log has the same configuration (all settings but
``--steps`` and ``--log``) joins a group, so the pairs' runs that match the overhead group's
configuration add samples (``p1_precision-after`` is the overhead group's training run under
``whatif record``). Per group and variant it prints each run's figures (with the harvest call
that ran it: each call started a fresh machine), their median, and the ratios of medians to
``plain`` and to ``bare``:

* train: median ``step_ms`` over the steps after the first (``duration_s`` is left out: the
  matching runs differ in ``--steps``);
* llm_serve: ``duration_s``, median TTFT and TPOT, median decode-iteration time, and the stalls:
  how many iterations took over twice the run's median iteration, and the slowest one;
* dit_serve: ``duration_s`` and median denoising step time after the first.

Only one or two runs per variant exist (the harvest's time budget skipped the second round of
most): the figures are single measurements, not distributions. Prints in well under a second.

    .venv/bin/python bench/gpu_overhead.py [HARVEST_DIR]
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HARVEST = ROOT / "sample_traces" / "gpu"
MODES = ("plain", "bare", "torch", "cupti")
RUN_SETTINGS = ("log", "steps")  # settings that do not change what one step or iteration does


@dataclass(frozen=True)
class Run:
    """One program run's figures from its own JSON log."""

    job: str
    mode: str
    call: int
    program: str
    config: str
    figures: tuple[tuple[str, float], ...]


def _median_after_first(values: list[float]) -> float:
    return median(values[1:]) if len(values) > 1 else float("nan")


def figures(log: dict[str, Any]) -> tuple[str, tuple[tuple[str, float], ...]] | None:
    """The program name (from the log's schema) and the figures compared for it; ``None`` for a
    program with no overhead runs (the decode workload of the pairs).

    >>> figures({"schema": "whatif.examples.train/1", "summary": {"duration_s": 1.0},
    ...          "steps": [{"step_ms": 500.0}, {"step_ms": 10.0}, {"step_ms": 12.0}, {"step_ms": 11.0}]})
    ('train', (('step_ms', 11.0),))
    """
    program = str(log["schema"]).split(".")[-1].split("/")[0]
    summary = log["summary"]
    if program == "train":
        return program, (("step_ms", _median_after_first([float(s["step_ms"]) for s in log["steps"]])),)
    if program == "llm_serve":
        decode = [float(i["duration_ms"]) for i in log["iterations"] if i["phase"] == "decode"]
        every = [float(i["duration_ms"]) for i in log["iterations"]]
        typical = median(every)
        return program, (("duration_s", float(summary["duration_s"])),
                         ("ttft_p50_ms", float(summary["ttft_ms"]["p50"])),
                         ("tpot_p50_ms", float(summary["tpot_ms"]["p50"])),
                         ("decode_iter_ms", _median_after_first(decode)),
                         ("iters_over_2x_median", float(sum(d > 2 * typical for d in every))),
                         ("slowest_iter_ms", max(every)))
    if program == "dit_serve":
        return program, (("duration_s", float(summary["duration_s"])),
                         ("denoise_step_ms", _median_after_first([float(s["duration_ms"]) for s in log["steps"]])))
    return None


def read_runs(harvest: Path) -> list[Run]:
    """Every job of ``harvest/manifest.json`` that ran and left a program log."""
    manifest = json.loads((harvest / "manifest.json").read_text())
    runs = []
    for job in manifest["jobs"]:
        if job["status"] != "ok" or not job["log"] or job["mode"] not in MODES:
            continue
        log = json.loads((harvest / job["log"]).read_text())
        config = {k: v for k, v in log["config"].items() if k not in RUN_SETTINGS}
        found = figures(log)
        if found is not None:
            runs.append(Run(job=job["name"], mode=job["mode"], call=int(job["call"]), program=found[0],
                            config=json.dumps(config, sort_keys=True), figures=found[1]))
    return runs


def groups(runs: list[Run]) -> list[list[Run]]:
    """Runs of one program and configuration, for configurations run under several variants."""
    by_key: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        by_key.setdefault((run.program, run.config), []).append(run)
    return [g for g in by_key.values() if len({r.mode for r in g}) > 1]


def medians(group: list[Run]) -> dict[str, dict[str, float]]:
    """Per variant, per figure: the median over the variant's runs."""
    out: dict[str, dict[str, float]] = {}
    for mode in MODES:
        runs = [r for r in group if r.mode == mode]
        if runs:
            names = [name for name, _ in runs[0].figures]
            out[mode] = {name: median(dict(r.figures)[name] for r in runs) for name in names}
    return out


def report(group: list[Run]) -> list[str]:
    """The printed lines of one group."""
    first = group[0]
    config = json.loads(first.config)
    shown = " ".join(f"{k}={config[k]}" for k in ("d_model", "layers", "batch_size", "seq_len", "autocast",
                                                   "num_requests", "rate", "steps") if k in config)
    lines = [f"== {first.program} ({shown})"]
    meds = medians(group)
    names = [name for name, _ in first.figures]
    for mode in MODES:
        runs = [r for r in group if r.mode == mode]
        if not runs:
            continue
        each = "; ".join(f"{r.job} (call {r.call}): " + ", ".join(f"{n} {v:.3f}" for n, v in r.figures) for r in runs)
        lines.append(f"{mode:6s} n={len(runs)}  {each}")
    for ref in ("plain", "bare"):
        if ref not in meds:
            continue
        for mode in MODES:
            if mode == ref or mode not in meds or (ref == "bare" and mode == "plain"):
                continue
            ratios = ", ".join(f"{n} {meds[mode][n] / meds[ref][n]:.3f}" for n in names if meds[ref][n] > 0)
            lines.append(f"{mode} / {ref}: {ratios}")
    if "plain" not in meds and {"torch", "cupti"} <= set(meds):
        lines.append("cupti / torch: " + ", ".join(f"{n} {meds['cupti'][n] / meds['torch'][n]:.3f}" for n in names))
    return lines


def main(argv: list[str]) -> int:
    harvest = Path(argv[0]) if argv else HARVEST
    if not (harvest / "manifest.json").is_file():
        print(f"{harvest}: no manifest.json (a GPU harvest folder, bench/gpu_harvest/run.py)", file=sys.stderr)
        return 2
    for group in sorted(groups(read_runs(harvest)), key=lambda g: (g[0].program, g[0].job)):
        print("\n".join(report(group)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
