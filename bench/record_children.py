"""What following child processes costs (``whatif record``, docs/recording.md "Child processes").

1. Start-up of a Python child that never imports torch (``python -c pass``), with and without
   whatif's bootstrap (``sitecustomize.py`` first on ``PYTHONPATH``, ``WHATIF_RECORD_START`` set):
   the price every non-torch child of a recorded program pays.
2. ``examples/engine_split.py`` (front-end + engine core, spawn) run plainly, under
   ``whatif record --no-follow-children`` and under ``whatif record`` (following): the front-end's
   serving time (the example's ``summary.duration_s``: engine start to last result) and the
   whole process's wall time, interleaved, each in a fresh process.

Prints medians over runs from this one run on this machine; nothing is stored or assumed.

  .venv/bin/python bench/record_children.py [--runs 3] [--startups 20] [--requests 8]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "engine_split.py"
SITE = ROOT / "tracer" / "record" / "child_site.py"
VARIANTS = ("plain", "record --no-follow-children", "record")


def startup_s(env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
    return time.perf_counter() - t0


def startups(count: int) -> tuple[float, float]:
    """Median start-up of ``python -c pass`` without and with the bootstrap, interleaved."""
    folder = tempfile.mkdtemp(prefix="whatif-bench-site-")
    try:
        shutil.copyfile(SITE, Path(folder) / "sitecustomize.py")
        plain = {k: v for k, v in os.environ.items() if not k.startswith("WHATIF_RECORD")}
        booted = {**plain, "PYTHONPATH": folder, "WHATIF_RECORD_START": "whatif.tracer.record.children:start_child",
                  "WHATIF_RECORD_SITE_DIR": folder}
        times: dict[str, list[float]] = {"plain": [], "bootstrap": []}
        for _ in range(count):
            times["plain"].append(startup_s(plain))
            times["bootstrap"].append(startup_s(booted))
        return statistics.median(times["plain"]), statistics.median(times["bootstrap"])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def engine_run(variant: str, requests: int, work: Path) -> tuple[float, float]:
    """(serving s, process wall s) of one run of the example."""
    log = work / "log.json"
    run = work / "run"
    shutil.rmtree(run, ignore_errors=True)
    example = [str(EXAMPLE), "--num-requests", str(requests), "--log", str(log)]
    if variant == "plain":
        cmd = [sys.executable, *example]
    else:
        cmd = [sys.executable, "-m", "whatif.cli", *variant.split(), "--no-summary", "-o", str(run), *example]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    wall = time.perf_counter() - t0
    return float(json.loads(log.read_text())["summary"]["duration_s"]), wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--startups", type=int, default=20)
    parser.add_argument("--requests", type=int, default=8)
    args = parser.parse_args()

    plain_s, booted_s = startups(args.startups)
    print(f"python -c pass, median of {args.startups}: plain {plain_s * 1e3:.1f} ms, with the bootstrap "
          f"{booted_s * 1e3:.1f} ms ({(booted_s - plain_s) * 1e3:+.1f} ms)")

    results: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="whatif-bench-children-") as tmp:
        for _ in range(args.runs):
            for variant in VARIANTS:
                results[variant].append(engine_run(variant, args.requests, Path(tmp)))
    print(f"\nexamples/engine_split.py --num-requests {args.requests}, median of {args.runs} runs")
    print("| variant | serving s | process wall s | serving / plain |")
    print("|---|---|---|---|")
    base = statistics.median(s for s, _ in results["plain"])
    for variant in VARIANTS:
        serving = statistics.median(s for s, _ in results[variant])
        wall = statistics.median(w for _, w in results[variant])
        print(f"| {variant} | {serving:.3f} | {wall:.3f} | {serving / base:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
