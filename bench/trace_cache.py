"""Cold parse against a reload from the columnar trace cache (issue 15 item 1; tracer/cache.py),
on the biggest shared traces, a two-rank folder and jobs of 8 and 32 ranks generated from a real
A100 rank (``whatif.jobgen``).

Every figure is one ``load_trace`` in a fresh child process (imports and the reader registry not
counted), the median of ``--repeat`` children: *parse* with the cache off, *first load* (parse
and write the entry, once), *reload* (read the entry back); and both again followed by every
argument column ``Trace.arg`` declares (*+ args*: what the cost model reads; a reload defers the
decoding of the events' arguments to it).
Prints one row per trace and the ratios; ``--write-docs`` puts the table into docs/scale.md and
docs/accuracy.md.

Run: .venv/bin/python bench/trace_cache.py [--repeat 3] [--ranks 8,32] [--write-docs]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common.docs import replace_section

from whatif.jobgen import JobOptions, generate_job

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
JOB_SOURCE = TRACES / "hta" / "nccl_data_a100_rank0of2.json.gz"
SHARED = ["tracelens/xdit_flux1_aiter_sage_mi300x.json.gz", "tracelens/xdit_flux1_baseline_mi300x.json.gz",
          "hta/df_index_resolver_v100_rank1of2.json.gz", "hta/trace_diff_control_rank3.json.gz",
          "hta/negative_queue_a100_rank0of16.json.gz", "hta/trace_diff_test_rank1.json.gz",
          "kineto/resnet50_autograd_api_num_workers_0__worker0.pt.trace.json.gz",
          "kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz",
          "hta/nccl_data_a100_rank0of2.json.gz", "hta/sampled_world128"]
BEGIN, END = "<!-- bench/trace_cache.py begin -->", "<!-- bench/trace_cache.py end -->"

CHILD = r"""
import json, sys, time
from whatif.tracer.args import Arg
from whatif.tracer.readers import suffixes
from whatif.tracer.trace import load_trace
suffixes()  # the reader registry (loaded by every CLI command before it loads a trace)
t0 = time.perf_counter(); trace = load_trace(sys.argv[1]); t1 = time.perf_counter()
if sys.argv[2] == "args":
    for arg in Arg:
        trace.arg(arg)
t2 = time.perf_counter()
print(json.dumps({"load_s": t1 - t0, "args_s": t2 - t1, "events": len(trace.events)}))
"""


def child(path: Path, cache_dir: Path, *, cache: bool, args: bool = False) -> dict:
    env = {**os.environ, "WHATIF_CACHE_DIR": str(cache_dir), "WHATIF_NO_CACHE": "0" if cache else "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), "args" if args else "-"], capture_output=True,
                          text=True, env=env, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{path}: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout)


def measure(label: str, path: Path, repeat: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cache_dir = Path(tmp)
        parse = [child(path, cache_dir, cache=False, args=True) for _ in range(repeat)]
        first = child(path, cache_dir, cache=True)
        reload = [child(path, cache_dir, cache=True, args=True) for _ in range(repeat)]
        entry_bytes = sum(f.stat().st_size for f in cache_dir.rglob("*") if f.is_file())
    files = [path] if path.is_file() else [f for f in path.iterdir() if f.is_file()]
    return {"trace": label, "events": first["events"], "trace_mb": sum(f.stat().st_size for f in files) / 1e6,
            "entry_mb": entry_bytes / 1e6, "first_s": first["load_s"],
            "parse_s": statistics.median(r["load_s"] for r in parse),
            "parse_args_s": statistics.median(r["load_s"] + r["args_s"] for r in parse),
            "reload_s": statistics.median(r["load_s"] for r in reload),
            "reload_args_s": statistics.median(r["load_s"] + r["args_s"] for r in reload)}


def table(rows: list[dict]) -> str:
    lines = ["| trace | events | trace MB | entry MB | parse s | first load s | reload s | parse / reload | "
             "parse + args s | reload + args s | ratio + args |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio, with_args = r["parse_s"] / r["reload_s"], r["parse_args_s"] / r["reload_args_s"]
        lines.append(f"| {r['trace']} | {r['events']:,} | {r['trace_mb']:.1f} | {r['entry_mb']:.1f} | "
                     f"{r['parse_s']:.3f} | {r['first_s']:.3f} | {r['reload_s']:.3f} | **{ratio:.1f}x** | "
                     f"{r['parse_args_s']:.3f} | {r['reload_args_s']:.3f} | {with_args:.1f}x |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="children per figure (the median is shown)")
    parser.add_argument("--ranks", default="8,32", help="generated job sizes (comma-separated; empty for none)")
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/scale.md and accuracy.md")
    args = parser.parse_args()
    if not TRACES.is_dir():
        print(f"skipped: the shared traces are absent ({TRACES})")
        return 0
    rows = []
    for name in SHARED:
        rows.append(measure(name, TRACES / name, args.repeat))
        r = rows[-1]
        print(f"{name}: parse {r['parse_s']:.3f} s, reload {r['reload_s']:.3f} s "
              f"({r['parse_s'] / r['reload_s']:.1f}x)", flush=True)
    for n in [int(x) for x in args.ranks.split(",") if x]:
        with tempfile.TemporaryDirectory() as tmp:
            job = Path(tmp) / "job"
            generate_job(JOB_SOURCE, job, JobOptions(ranks=n, seed=n), stragglers={n // 2 + 1: 300_000})
            rows.append(measure(f"generated job, {n} ranks", job, args.repeat))
        r = rows[-1]
        print(f"{n} ranks: parse {r['parse_s']:.3f} s, reload {r['reload_s']:.3f} s "
              f"({r['parse_s'] / r['reload_s']:.1f}x)", flush=True)
    text = table(rows)
    print(text)
    ratios = [r["parse_s"] / r["reload_s"] for r in rows]
    print(f"parse / reload: min {min(ratios):.1f}x, median {statistics.median(ratios):.1f}x, max {max(ratios):.1f}x; "
          f"{sum(x >= 10 for x in ratios)} of {len(ratios)} at >= 10x")
    if args.write_docs:
        for doc in ("scale.md", "accuracy.md"):
            replace_section(ROOT / "docs" / doc, BEGIN, END, text)
        print("wrote docs/scale.md and docs/accuracy.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
