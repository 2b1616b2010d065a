"""Scale: a >= 1 M-task graph from a real trace (its steps repeated), loaded, built and replayed.

Goal (issue 2): <= 10 s and <= 2 GB peak memory on this 2-core machine. Each size runs in a fresh
subprocess so its peak RSS is its own. Also times HolisticTraceAnalysis's
``critical_path_analysis`` on one step of the same trace, for comparison (needs the HTA venv
that ``bench/parse_speed.py`` creates; skipped with a note when it is absent).

Usage: python bench/scale.py [--trace PATH] [--tasks 1000000]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from common.hta import HTA_HOME

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = (ROOT.parent / "shared" / "traces" / "kineto"
                 / "resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz")
HTA_PYTHON = HTA_HOME / "bin" / "python"  # bench/common/hta.py makes it
HTA_FALLBACKS = [ROOT.parent / "shared" / "traces" / "hta" / name for name in  # HTA's own test traces
                 ("nccl_data_a100_rank0of2.json.gz", "negative_queue_a100_rank0of16.json.gz",
                  "trace_diff_control_rank3.json.gz")]


def measure(trace: str, copies: int) -> dict:
    """Run in the child: load, repeat, build, replay, step times + critical paths."""
    from whatif.depgraph.build import build_graph
    from whatif.predictors.replay import replay
    from whatif.predictors.steps import critical_path, step_times
    from whatif.tracer import load_trace
    from whatif.tracer.repeat import repeat_trace

    out: dict = {}
    t0 = time.perf_counter()
    tr = load_trace(trace)
    t1 = time.perf_counter()
    big = repeat_trace(tr, copies) if copies > 1 else tr
    t2 = time.perf_counter()
    g = build_graph(big)
    t3 = time.perf_counter()
    r = replay(g)
    t4 = time.perf_counter()
    steps = step_times(r)
    critical_path(r, len(steps) - 1)
    t5 = time.perf_counter()
    out.update(tasks=g.num_tasks, edges=g.num_edges, events=len(big.events), steps=len(steps),
               load_s=t1 - t0, repeat_s=t2 - t1, build_s=t3 - t2, replay_s=t4 - t3, steps_s=t5 - t4,
               total_s=t5 - t0, max_abs_error=float(steps["error"].abs().max()),
               peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return out


HTA_SCRIPT = """
import sys, time, shutil, tempfile, os
from hta.trace_analysis import TraceAnalysis
src = sys.argv[1]
d = tempfile.mkdtemp()
os.symlink(src, os.path.join(d, "rank-0.json.gz"))
t0 = time.perf_counter()
ta = TraceAnalysis(trace_dir=d)
t1 = time.perf_counter()
cp, ok = ta.critical_path_analysis(rank=0, annotation="ProfilerStep", instance_id=int(sys.argv[2]))
t2 = time.perf_counter()
print(f"{t1 - t0:.3f} {t2 - t1:.3f} {ok} {cp.number_of_nodes() if ok else 0}")
shutil.rmtree(d)
"""


def hta_critical_path(trace: str, step: int) -> str:
    if not HTA_PYTHON.exists():
        return "HTA venv absent (bench/interop.py, breakdown_hta.py or parse_speed.py create it)"
    proc = subprocess.run([str(HTA_PYTHON), "-c", HTA_SCRIPT, trace, str(step)], capture_output=True, text=True,
                          timeout=900)
    if proc.returncode != 0:
        return "HTA failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1]
    parse_s, cp_s, _ok, nodes = proc.stdout.split()
    return f"HTA parse {float(parse_s):.2f} s, critical_path_analysis of one step {float(cp_s):.2f} s ({nodes} nodes)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--tasks", type=int, default=1_000_000, help="target graph size (default 1,000,000)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.trace, args.child)))
        return 0
    if not Path(args.trace).exists():
        print(f"trace not found: {args.trace} (../shared is absent?)", file=sys.stderr)
        return 2

    def run(copies: int) -> dict:
        proc = subprocess.run([sys.executable, __file__, "--trace", args.trace, "--child", str(copies)],
                              capture_output=True, text=True, check=True)
        return json.loads(proc.stdout)

    one = run(1)
    copies = -(-args.tasks // one["tasks"])
    print(f"trace: {args.trace}\none copy: {one['tasks']:,} tasks, {one['steps']} steps")
    print(f"{'copies':>6} {'tasks':>10} {'edges':>10} {'load s':>7} {'repeat s':>8} {'build s':>8} {'replay s':>8} "
          f"{'steps s':>7} {'total s':>7} {'peak MB':>8} {'build t/s':>10} {'replay t/s':>10} {'max err':>8}")
    for c in (1, max(2, copies // 4), copies):
        m = one if c == 1 else run(c)
        print(f"{c:>6} {m['tasks']:>10,} {m['edges']:>10,} {m['load_s']:>7.2f} {m['repeat_s']:>8.2f} "
              f"{m['build_s']:>8.2f} {m['replay_s']:>8.2f} {m['steps_s']:>7.2f} {m['total_s']:>7.2f} "
              f"{m['peak_rss_mb']:>8.0f} {m['tasks'] / m['build_s']:>10,.0f} {m['tasks'] / m['replay_s']:>10,.0f} "
              f"{m['max_abs_error'] * 100:>7.3f}%")
    big = m
    verdict = "meets" if big["total_s"] <= 10 and big["peak_rss_mb"] <= 2048 else "MISSES"
    print(f"{big['tasks']:,} tasks: {big['total_s']:.2f} s, {big['peak_rss_mb']:.0f} MB peak -> {verdict} "
          f"the goal (<= 10 s, <= 2048 MB)")
    print(networkx_comparison(args.trace))
    for trace in [args.trace, *map(str, HTA_FALLBACKS)]:
        step = 1  # the second ProfilerStep instance (HTA's instance_id; ours: the second step row)
        if not Path(trace).exists():
            continue
        hta = hta_critical_path(trace, step)
        ours = ours_critical_path(trace, step)
        print(f"one step of {Path(trace).name}: {hta}; whatif load+build+replay+critical path {ours:.2f} s")
        if not hta.startswith("HTA failed"):
            break
    return 0


def networkx_comparison(trace: str) -> str:
    """Why the hot path is arrays: the same graph as a networkx view, built and walked."""
    import networkx as nx

    from whatif.depgraph.build import build_graph
    from whatif.depgraph.graph import to_networkx
    from whatif.predictors.replay import replay
    from whatif.tracer import load_trace

    g = build_graph(load_trace(trace))
    t0 = time.perf_counter()
    view = to_networkx(g)
    t1 = time.perf_counter()
    nx.dag_longest_path_length(view, weight="lat_ns")
    t2 = time.perf_counter()
    replay(g)
    t3 = time.perf_counter()
    return (f"representation ({g.num_tasks:,} tasks): networkx view built in {t1 - t0:.2f} s, its longest path "
            f"in {t2 - t1:.2f} s; array replay (which also computes every start/end) in {t3 - t2:.2f} s")


def ours_critical_path(trace: str, step: int) -> float:
    from whatif.api import analyze

    t0 = time.perf_counter()
    a = analyze(trace)
    a.critical_path(min(step, len(a.steps) - 1))
    return time.perf_counter() - t0


if __name__ == "__main__":
    raise SystemExit(main())
