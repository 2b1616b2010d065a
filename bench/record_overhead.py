"""Overhead of ``whatif record`` vs bare ``torch.profiler`` vs no profiler, on the LLM example.

Runs the workload (``examples/llm_serve.py``, all requests at t=0 so it is compute-bound; a
small built-in transformer loop if the example is missing) in three ways, interleaved, several
times, each in a fresh process:

  plain  - the program alone
  bare   - the program under torch.profiler with the options whatif uses by default
           (CPU [+CUDA] activities, record from start, ProfilerStep#N at each whatif.step(),
           gzipped Chrome trace export at the end)
  whatif - ``whatif record`` (with its summary)

and prints, for two clocks, the median over runs and the ratios: the program's own serving
time (``summary.duration_s`` from the example's log; the loop time for the built-in workload)
and the whole process's wall time. Numbers are from this one run on this machine; nothing is
stored or assumed.

  .venv/bin/python bench/record_overhead.py [--runs 5] [--requests 12]
"""
from __future__ import annotations

import argparse
import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LLM_EXAMPLE = ROOT / "examples" / "llm_serve.py"
VARIANTS = ("plain", "bare", "whatif")

BUILTIN_WORKLOAD = '''
import json, sys, time, torch, whatif
torch.manual_seed(0); torch.set_num_threads(1)
layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, batch_first=True)
model = torch.nn.TransformerEncoder(layer, num_layers=4).eval()
x = torch.randn(8, 64, 256)
t0 = time.perf_counter()
with torch.no_grad():
    for i in range(60):
        with whatif.phase("decode"):
            model(x)
        whatif.step()
json.dump({"summary": {"duration_s": time.perf_counter() - t0}}, open(sys.argv[sys.argv.index("--log") + 1], "w"))
'''


def bare_profiler_main(out_path: str, script: str, args: list[str]) -> None:
    """The ``bare`` variant, run in the child process: torch.profiler around the script."""
    import torch
    from torch.profiler import ProfilerAction, ProfilerActivity, profile

    from whatif.tracer.markers import add_step_hook

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    prof = profile(activities=activities, schedule=lambda step: ProfilerAction.RECORD,
                   on_trace_ready=lambda p: p.export_chrome_trace(out_path))
    add_step_hook(prof.step)
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    prof.start()
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        prof.stop()


def command(variant: str, script: str, args: list[str], work: Path) -> list[str]:
    py = sys.executable
    if variant == "plain":
        return [py, script, *args]
    if variant == "bare":
        return [py, __file__, "--_bare", str(work / "bare.pt.trace.json.gz"), script, *args]
    return [py, "-m", "whatif.cli", "record", "-f", "-o", str(work / "whatif-run"), script, "--", *args]


def run_once(variant: str, script: str, args: list[str], work: Path, log: Path) -> tuple[float, float]:
    """(program's own duration s, process wall time s) of one run."""
    log.unlink(missing_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.run(command(variant, script, args, work), cwd=ROOT, capture_output=True, text=True)
    wall_s = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"record_overhead: {variant} run failed (exit {proc.returncode}): {proc.stderr.strip()[-400:]}")
    program_s = float(json.loads(log.read_text())["summary"]["duration_s"])
    return program_s, wall_s


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--_bare":
        bare_profiler_main(sys.argv[2], sys.argv[3], sys.argv[4:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="runs per variant (interleaved)")
    parser.add_argument("--requests", type=int, default=12, help="LLM example: number of requests")
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="whatif-bench-") as tmp:
        work = Path(tmp)
        log = work / "log.json"
        if LLM_EXAMPLE.exists():
            script = str(LLM_EXAMPLE)
            args = ["--device", "cpu", "--num-requests", str(opts.requests), "--rate", "inf", "--seed", "0",
                    "--log", str(log)]
            workload = f"examples/llm_serve.py {' '.join(args[:-2])}"
        else:
            script = str(work / "builtin_workload.py")
            Path(script).write_text(BUILTIN_WORKLOAD)
            args = ["--log", str(log)]
            workload = "built-in 4-layer transformer loop (examples/llm_serve.py missing)"
        program: dict[str, list[float]] = {v: [] for v in VARIANTS}
        wall: dict[str, list[float]] = {v: [] for v in VARIANTS}
        for i in range(opts.runs):
            for variant in VARIANTS:
                p, w = run_once(variant, script, args, work, log)
                program[variant].append(p)
                wall[variant].append(w)
            print(f"run {i + 1}/{opts.runs}: " + "  ".join(
                f"{v} {program[v][-1]:.3f}/{wall[v][-1]:.2f} s" for v in VARIANTS), file=sys.stderr)
    print(f"workload: {workload}; {opts.runs} runs per variant, interleaved; cpu_count={os.cpu_count()}")
    for label, table in (("program time (serving loop)", program), ("process wall time", wall)):
        med = {v: statistics.median(table[v]) for v in VARIANTS}
        spread = {v: (min(table[v]), max(table[v])) for v in VARIANTS}
        print(f"{label}: median " + ", ".join(
            f"{v} {med[v]:.3f} s [{spread[v][0]:.3f}-{spread[v][1]:.3f}]" for v in VARIANTS))
        print(f"  bare torch.profiler / plain: {med['bare'] / med['plain']:.3f}   "
              f"whatif record / plain: {med['whatif'] / med['plain']:.3f}   "
              f"whatif record / bare torch.profiler: {med['whatif'] / med['bare']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
