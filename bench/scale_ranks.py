"""How whatif's single-process path scales with the ranks of a job (issue 15): jobs of N ranks
generated from one real A100 rank (``whatif.jobgen``: 21 collectives, jitter, a straggler, skewed
clocks), each analyzed in a fresh child process that reports load, build, replay and
``whatif collectives`` times and its peak resident memory (VmHWM).

Prints one row per N and the per-rank and per-million-task costs measured in this run, and checks
that ``whatif collectives`` names the injected straggler at every size.

Run: .venv/bin/python bench/scale_ranks.py [--ranks 8,16,32,64] [--write-docs]
"""
from __future__ import annotations

import argparse
import json
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
t0 = time.perf_counter()
from whatif.tracer.trace import load_trace
from whatif.depgraph.build import build_graph
from whatif.predictors.replay import replay
from whatif.collectives import collectives
t1 = time.perf_counter(); trace = load_trace(sys.argv[1])
t2 = time.perf_counter(); graph = build_graph(trace)
t3 = time.perf_counter(); replay(graph)
t4 = time.perf_counter(); doc = collectives(trace, graph)
t5 = time.perf_counter()
peak_kib = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:'))
top = max(doc.ranks, key=lambda r: r.caused_wait_ns)
print(json.dumps({"load_s": t2 - t1, "build_s": t3 - t2, "replay_s": t4 - t3, "collectives_s": t5 - t4,
                  "tasks": len(graph.tasks), "events": len(trace.events), "peak_mib": peak_kib / 1024,
                  "straggler": top.rank, "calls": len(doc.calls)}))
"""


def measure(ranks: int, straggler: int, folder: Path) -> dict:
    t = time.perf_counter()
    generate_job(SOURCE, folder, JobOptions(ranks=ranks, seed=ranks), stragglers={straggler: 300_000})
    gen_s = time.perf_counter() - t
    done = subprocess.run([sys.executable, "-c", CHILD, str(folder)], capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"{ranks} ranks: the analysis failed: {done.stderr.strip().splitlines()[-1]}")
    return {"ranks": ranks, "generate_s": gen_s, **json.loads(done.stdout)}


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
        print(f"{n} ranks: {r['tasks']:,} tasks, load {r['load_s']:.1f} s, build {r['build_s']:.1f} s, "
              f"replay {r['replay_s']:.1f} s, collectives {r['collectives_s']:.1f} s, peak {r['peak_mib']:,.0f} MiB, "
              f"straggler found: {r['straggler'] == n // 2 + 1}", flush=True)
    lines = ["| ranks | events | tasks | load s | build s | replay s | collectives s | total s per rank | "
             "peak MiB | MiB per M tasks | injected straggler found |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        total = r["load_s"] + r["build_s"] + r["replay_s"] + r["collectives_s"]
        lines.append(f"| {r['ranks']} | {r['events']:,} | {r['tasks']:,} | {r['load_s']:.1f} | {r['build_s']:.1f} | "
                     f"{r['replay_s']:.1f} | {r['collectives_s']:.1f} | {total / r['ranks']:.2f} | "
                     f"{r['peak_mib']:,.0f} | {r['peak_mib'] / (r['tasks'] / 1e6):,.0f} | "
                     f"{'yes' if r['straggler'] == r['ranks'] // 2 + 1 else 'NO'} |")
    table = "\n".join(lines) + "\n"
    print(table)
    if args.write_docs:
        replace_section(ROOT / "docs" / "scale.md", BEGIN, END, table)
        print("wrote docs/scale.md")
    return 0 if all(r["straggler"] == r["ranks"] // 2 + 1 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
