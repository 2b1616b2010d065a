"""Rank-parallel analysis of large jobs (issue 15 items 2-3): a job of N ranks generated from one
real A100 rank (``whatif.jobgen``: 17.6k tasks and 21 collectives per rank, jitter, a straggler,
skewed clocks) analyzed by ``whatif.scale.replay_job`` with G rank groups: cold (trace cache
off: every file parsed), first load (parse and write each group's cache entry) and reload (from
the cache), each in a fresh process. Prints wall seconds per stage (read, build, replay), the
total, each group's peak resident memory (the largest), the coordinator's, and the time per
rank; optionally the same on a local Ray cluster (``--ray``), and a projection of a 16-node
cluster from the measured per-rank costs (what it assumes is printed with it).

``--source-steps K`` first trims the source rank to its first K profiler steps (fewer tasks per
rank: a 1,024-rank job of the full source needs ~33 GB in all, more than this machine has).

Run: .venv/bin/python bench/scale_parallel.py [--ranks 292] [--groups 8] [--runs cold,first,reload,ray]
     [--source-steps K] [--write-docs]
"""
from __future__ import annotations

import argparse
import gzip
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
DOC = ROOT / "docs" / "scale.md"


def markers(ranks: int) -> tuple[str, str]:
    """docs/scale.md's markers of the table of a job of ``ranks`` ranks (one section per size)."""
    return (f"<!-- bench/scale_parallel.py {ranks} ranks begin -->",
            f"<!-- bench/scale_parallel.py {ranks} ranks end -->")

CHILD = r"""
import json, sys, time
from whatif.scale.job import Backend, ParallelOptions, replay_job
from whatif.tracer import cache
path, groups, backend, use_cache = sys.argv[1], int(sys.argv[2]), Backend(sys.argv[3]), sys.argv[4] == "1"
t0 = time.perf_counter()
with cache.bypassed(not use_cache):
    job = replay_job(path, ParallelOptions(groups=groups, backend=backend))
wall = time.perf_counter() - t0
peak_kib = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:'))
steps = job.steps
print(json.dumps({"wall_s": wall, **{f"{k}_s": v for k, v in job.seconds.items()}, "tasks": job.tasks,
                  "events": job.events, "ranks": len(job.ranks), "rounds": job.rounds,
                  "collectives": job.collectives, "groups": len(job.groups),
                  "group_peak_mib": max(g.peak_mib for g in job.groups), "coordinator_peak_mib": peak_kib / 1024,
                  "group_cpu_s": sum(sum(g.cpu_seconds.values()) for g in job.groups),
                  "group_cpu_max_s": max(sum(g.cpu_seconds.values()) for g in job.groups),
                  "worst_step_error": float(steps["error"].abs().max()) if len(steps) else 0.0}))
"""


def run(folder: Path, groups: int, backend: str, use_cache: bool, cache_dir: Path) -> dict:
    env = {**os.environ, "WHATIF_CACHE_DIR": str(cache_dir)}
    env.pop("WHATIF_NO_CACHE", None)
    done = subprocess.run([sys.executable, "-c", CHILD, str(folder), str(groups), backend, "1" if use_cache else "0"],
                          capture_output=True, text=True, timeout=3600, env=env)
    if done.returncode != 0:
        raise SystemExit(f"the analysis failed: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def trimmed_source(source: Path, steps: int, out: Path) -> Path:
    """``source`` with only the events that start before its ``steps``-th profiler step ends."""
    doc = json.loads(gzip.decompress(source.read_bytes()))
    events = doc["traceEvents"]
    marks = sorted((e["ts"] + e.get("dur", 0)) for e in events
                   if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X")
    if len(marks) < steps:
        raise SystemExit(f"{source} has {len(marks)} profiler steps, fewer than {steps}")
    cut = marks[steps - 1]
    doc["traceEvents"] = [e for e in events if "ts" not in e or e["ts"] < cut]
    out.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return out


RUNS = {"cold": ("cold (cache off)", "processes", False),
        "first": ("first load (writes the cache)", "processes", True),
        "reload": ("reload (from the cache)", "processes", True),
        "ray": ("reload, Ray actors (local cluster)", "ray", True),
        "ray-cold": ("cold, Ray actors (local cluster)", "ray", False)}


def row(label: str, r: dict) -> str:
    return (f"| {label} | {r['ranks']} | {r['groups']} | {r['tasks']:,} | {r['read_s']:.1f} | {r['build_s']:.1f} | "
            f"{r['replay_s']:.1f} | **{r['wall_s']:.1f}** | {r['wall_s'] / r['ranks'] * 1000:.0f} | "
            f"{r['group_peak_mib']:,.0f} | {r['coordinator_peak_mib']:,.0f} | {r['rounds']} | "
            f"{r['worst_step_error']:.2%} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=292,
                        help="ranks (default 292: x 17.6k tasks = 5.14 M, issue 15's 256 ranks x 20k tasks)")
    parser.add_argument("--groups", type=int, default=8, help="rank groups (processes or actors)")
    parser.add_argument("--runs", default="cold,first,reload",
                        help=f"runs in order, of {', '.join(RUNS)} (reload/ray after first use its cache)")
    parser.add_argument("--source-steps", type=int, default=0, help="trim the source rank to its first K steps")
    parser.add_argument("--job", type=Path, help="reuse (or keep) the generated job in this folder")
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/scale.md")
    args = parser.parse_args()
    if not SOURCE.exists():
        print(f"skipped: the source rank {SOURCE} is absent (../shared)")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.job or Path(tmp) / "job"
        if not folder.exists():
            t = time.perf_counter()
            source = trimmed_source(SOURCE, args.source_steps, Path(tmp) / "source.json.gz") \
                if args.source_steps else SOURCE
            generate_job(source, folder, JobOptions(ranks=args.ranks, seed=args.ranks),
                         stragglers={args.ranks // 2 + 1: 300_000})
            print(f"generated {args.ranks} ranks in {time.perf_counter() - t:.0f} s", flush=True)
        cache_dir = Path(tmp) / "cache"
        rows = []
        for label, backend, use_cache in (RUNS[k] for k in args.runs.split(",")):
            r = run(folder, args.groups, backend, use_cache, cache_dir)
            rows.append((label, r))
            print(f"{label}: {r['wall_s']:.1f} s (read {r['read_s']:.1f}, build {r['build_s']:.1f}, replay "
                  f"{r['replay_s']:.1f}), {r['tasks']:,} tasks, group peak {r['group_peak_mib']:,.0f} MiB, "
                  f"coordinator {r['coordinator_peak_mib']:,.0f} MiB, {r['rounds']} rounds", flush=True)
    measured = [(label, r) for label, r in rows if "first" not in label]
    lines = ["| run | ranks | groups | tasks | read s | build s | replay s | total s | ms per rank | "
             "largest group peak MiB | coordinator peak MiB | rounds | worst step error |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [row(label, r) for label, r in rows]
    lines += ["", "Projection to 16 nodes x 32 cores (512 groups, one per core), from each run's measured costs: "
              "per rank, the groups' CPU seconds (read, build, link, replay, steps) over the ranks; the "
              "coordinator's CPU (rank assignment, collective plan, rounds) scaled with the ranks; plus one "
              "network round trip per round (assumed 1 ms). It assumes the groups never wait for each other "
              "beyond the rounds, files read from local disks at this machine's speed, and no Ray or process "
              "start-up (a few seconds once per cluster). Group CPU per rank: "
              + "; ".join(f"{label} {r['group_cpu_s'] / r['ranks']:.2f} s" for label, r in measured) + "."]
    for ranks in (1024, 4096):
        cells = []
        for label, r in measured:
            per_rank = r["group_cpu_s"] / r["ranks"]
            coordinator = r["coordinator_cpu_s"] * ranks / r["ranks"]
            cells.append(f"{label}: {ranks / 512 * per_rank + coordinator + r['rounds'] * 0.001:.1f} s")
        lines.append(f"* {ranks:,} ranks: " + "; ".join(cells))
    print("\n".join(lines))
    if args.write_docs:
        replace_section(DOC, *markers(args.ranks), "\n".join(lines) + "\n")
        print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
