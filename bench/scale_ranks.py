"""How whatif's single-process path scales with the ranks of a job (issue 15): jobs of N ranks
generated from one real A100 rank (``whatif.jobgen``: 21 collectives, jitter, a straggler, skewed
clocks), each analyzed in fresh child processes that report load, build, replay and
``whatif collectives`` times and resident memory: the peak of the whole run (VmHWM), and per phase
its own peak and what it leaves resident (VmHWM reset between phases through
``/proc/self/clear_refs``). The first child parses the files and writes the trace cache (a fresh
cache folder per job, what a user's first command does); a second child reloads the entry.

Prints one row per N and the per-rank and per-million-task costs measured in this run, the memory
per phase, the growth per million tasks between the two largest jobs, and checks that
``whatif collectives`` names the injected straggler at every size.

Run: .venv/bin/python bench/scale_ranks.py [--ranks 8,16,32,64] [--write-docs]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common.docs import replace_section

from whatif.jobgen import JobOptions, generate_job

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT.parent / "shared" / "traces" / "hta" / "nccl_data_a100_rank0of2.json.gz"
BEGIN, END = "<!-- bench/scale_ranks.py begin -->", "<!-- bench/scale_ranks.py end -->"

CHILD = r"""
import json, sys, time
def status():
    out = {}
    for line in open('/proc/self/status'):
        if line.startswith(('VmHWM:', 'VmRSS:')):
            key, kib = line.split()[:2]
            out[key[:-1]] = int(kib) / 1024
    return out
def reset_peak():
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
        return True
    except OSError:
        return False
phases, whole = {}, 0.0
def phase(name, run):
    global whole
    before = status()
    whole = max(whole, before['VmHWM'])
    resettable = reset_peak()
    t = time.perf_counter()
    result = run()
    seconds = time.perf_counter() - t
    after = status()
    whole = max(whole, after['VmHWM'])
    phases[name] = {"s": seconds, "peak_mib": after['VmHWM'] if resettable else None, "kept_mib": after['VmRSS']}
    return result
from whatif.tracer.trace import load_trace
from whatif.depgraph.build import build_graph
from whatif.predictors.replay import replay
from whatif.collectives import collectives
imports_mib = status()['VmRSS']
trace = phase("load", lambda: load_trace(sys.argv[1]))
graph = phase("build", lambda: build_graph(trace))
phase("replay", lambda: replay(graph))
doc = phase("collectives", lambda: collectives(trace, graph))
whole = max(whole, status()['VmHWM'])
top = max(doc.ranks, key=lambda r: r.caused_wait_ns)
print(json.dumps({"phases": phases, "imports_mib": imports_mib, "tasks": len(graph.tasks), "events": len(trace.events),
                  "peak_mib": whole, "straggler": top.rank, "calls": len(doc.calls)}))
"""
PHASES = ("load", "build", "replay", "collectives")


def _child(folder: Path, cache: Path) -> dict:
    env = {**os.environ, "WHATIF_CACHE_DIR": str(cache)}
    env.pop("WHATIF_NO_CACHE", None)
    done = subprocess.run([sys.executable, "-c", CHILD, str(folder)], capture_output=True, text=True, timeout=3600,
                          env=env)
    if done.returncode != 0:
        raise SystemExit(f"{folder}: the analysis failed: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout)


def measure(ranks: int, straggler: int, folder: Path) -> dict:
    t = time.perf_counter()
    generate_job(SOURCE, folder, JobOptions(ranks=ranks, seed=ranks), stragglers={straggler: 300_000})
    gen_s = time.perf_counter() - t
    first = _child(folder, folder.parent / "cache")
    again = _child(folder, folder.parent / "cache")
    return {"ranks": ranks, "generate_s": gen_s, **first, "reload": again}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="8,16,32,64", help="job sizes (comma-separated)")
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/scale.md")
    args = parser.parse_args()
    if not SOURCE.exists():
        print(f"skipped: the source rank {SOURCE} is absent (../shared)")
        return 0
    rows = []
    for n in [int(x) for x in args.ranks.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(measure(n, n // 2 + 1, Path(tmp) / "job"))
        r = rows[-1]
        ph = r["phases"]
        print(f"{n} ranks: {r['tasks']:,} tasks, load {ph['load']['s']:.1f} s, build {ph['build']['s']:.1f} s, "
              f"replay {ph['replay']['s']:.1f} s, collectives {ph['collectives']['s']:.1f} s, "
              f"peak {r['peak_mib']:,.0f} MiB (reload: {r['reload']['peak_mib']:,.0f} MiB), "
              f"straggler found: {r['straggler'] == n // 2 + 1}", flush=True)
    table = _times_table(rows) + "\n" + _memory_table(rows) + _growth(rows)
    print(table)
    if args.write_docs:
        replace_section(ROOT / "docs" / "scale.md", BEGIN, END, table)
        print("wrote docs/scale.md")
    return 0 if all(r["straggler"] == r["ranks"] // 2 + 1 for r in rows) else 1


def _times_table(rows: list[dict]) -> str:
    lines = ["| ranks | events | tasks | load s | build s | replay s | collectives s | total s per rank | "
             "peak MiB | MiB per M tasks | reload: load s | reload: peak MiB | injected straggler found |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ph = r["phases"]
        total = sum(ph[p]["s"] for p in PHASES)
        lines.append(f"| {r['ranks']} | {r['events']:,} | {r['tasks']:,} | "
                     + " | ".join(f"{ph[p]['s']:.1f}" for p in PHASES)
                     + f" | {total / r['ranks']:.2f} | {r['peak_mib']:,.0f} | "
                     f"{r['peak_mib'] / (r['tasks'] / 1e6):,.0f} | "
                     f"{r['reload']['phases']['load']['s']:.2f} | {r['reload']['peak_mib']:,.0f} | "
                     f"{'yes' if r['straggler'] == r['ranks'] // 2 + 1 else 'NO'} |")
    return "\n".join(lines) + "\n"


def _memory_table(rows: list[dict]) -> str:
    """Per phase of the first load: its own peak and what stays resident after it (MiB)."""
    lines = ["| ranks | after imports MiB | " + " | ".join(f"{p}: peak / after MiB" for p in PHASES) + " |",
             "|---|---|" + "---|" * len(PHASES)]
    for r in rows:
        ph = r["phases"]
        cells = [f"{ph[p]['peak_mib']:,.0f} / {ph[p]['kept_mib']:,.0f}" if ph[p]["peak_mib"] is not None
                 else f"- / {ph[p]['kept_mib']:,.0f}" for p in PHASES]
        lines.append(f"| {r['ranks']} | {r['imports_mib']:,.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _growth(rows: list[dict]) -> str:
    """How the peak grows per million tasks between the two largest jobs (the fixed part of the
    interpreter and libraries left out)."""
    if len(rows) < 2:
        return ""
    a, b = sorted(rows, key=lambda r: r["tasks"])[-2:]
    slope = (b["peak_mib"] - a["peak_mib"]) / ((b["tasks"] - a["tasks"]) / 1e6)
    return (f"\nPeak growth from {a['ranks']} to {b['ranks']} ranks: {slope:,.0f} MiB per million tasks "
            f"({slope * 2**20 / 1e9:.2f} GB).\n")


if __name__ == "__main__":
    sys.exit(main())
