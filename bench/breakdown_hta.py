"""`whatif breakdown` against HolisticTraceAnalysis itself, on the shared traces.

HTA (installed in a throw-away venv; skipped when it cannot be) computes its temporal, idle-time
and comm/comp-overlap breakdowns of each trace. whatif computes the same breakdowns twice:

* **as whatif shows them**: every GPU activity of the rank, times in nanoseconds;
* **inside HTA's window**: only the activities HTA keeps (those whose launch call started before
  the last ProfilerStep began; HTA drops the last step and every activity with no launch call),
  with HTA's rounding of float-microsecond traces (start rounded up, end down, to the microsecond).

The second must equal HTA's figures; the first shows what HTA's window leaves out.

Run: .venv/bin/python bench/breakdown_hta.py [--hta-python PATH]
     (default: $HTA_PYTHON, else a venv made under ~/.cache/whatif-bench/hta with pip)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from common.hta import hta_python

from whatif.breakdown import BreakdownOptions, gpu_work, summarize
from whatif.depgraph.build import build_graph
from whatif.documents import BreakdownDocument
from whatif.tracer.kinds import EventKind
from whatif.tracer.kineto import step_number
from whatif.tracer.trace import Trace, load_trace

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
HTA_SCRIPT = Path(__file__).resolve().parent / "hta" / "hta_breakdowns.py"
TRACES = ["kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz",
          "hta/trace_diff_control_rank3.json.gz",
          "hta/trace_diff_test_rank1.json.gz",
          "hta/nccl_data_a100_rank0of2.json.gz",
          "hta/df_index_resolver_v100_rank1of2.json.gz",
          "hta/negative_queue_a100_rank0of16.json.gz",
          "hta/sampled_world128",
          "tracelens/mi300x_resnet_act_ckpt_rank0of8.json.gz",
          "hta/mi250_minitoy_rocm6.2.json.gz"]
US = 1000


def run_hta(py: Path, trace: Path) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        files = sorted(trace.iterdir()) if trace.is_dir() else [trace]
        for f in files:
            os.symlink(f, Path(folder) / f.name)
        done = subprocess.run([py, HTA_SCRIPT, folder], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "HTA failed")
    return json.loads(done.stdout)


def _round_in(ns: np.ndarray, base: np.ndarray, up: bool) -> np.ndarray:
    rel = ns - base
    return base + (-((-rel) // US) if up else rel // US) * US


def hta_window(trace: Trace, work: pd.DataFrame) -> pd.DataFrame:
    """The activities HTA keeps, with HTA's rounding, in whatif's work table. HTA's "last
    ProfilerStep start" is the latest start of any event so named that is not a GPU activity with
    a correlation id, so a ``gpu_user_annotation`` step mirrored on the GPU counts too (on the
    MI300X trace it starts 37 ms after the CPU's last step began)."""
    ev = trace.events
    ann = ev[np.isin(ev["kind"].to_numpy(), [int(EventKind.ANNOTATION), int(EventKind.GPU_ANNOTATION)])]
    is_step = np.array([step_number(str(n)) is not None and str(n).startswith("ProfilerStep#")
                        for n in ann["name"].tolist()], dtype=bool)
    last = ann[is_step].groupby("rank")["ts_ns"].max()
    base_of = {r.rank: int(r.metadata.get("baseTimeNanoseconds") or 0) for r in trace.ranks}
    ranks = work["rank"].to_numpy()
    cut = last.reindex(ranks).to_numpy()
    launch = work["launch_ns"].to_numpy()
    keep = (launch >= 0) & ~np.isnan(cut) & (launch < np.nan_to_num(cut, nan=0))
    w = work[keep].copy()
    base = np.array([base_of[int(r)] for r in w["rank"].tolist()], dtype=np.int64)
    for col, up in (("ts_ns", True), ("end_ns", False), ("launch_ns", True), ("launch_end_ns", False)):
        w[col] = _round_in(w[col].to_numpy(), base, up)
    w["end_ns"] = np.maximum(w["end_ns"].to_numpy(), w["ts_ns"].to_numpy())
    return w


def hta_classes(work: pd.DataFrame) -> pd.DataFrame:
    """HTA's kernel types (hta/common/types.py): communication = name starts with nccl/hip/hccl or
    holds ncclKernel; memory = Memcpy/Memset/dma prefixes; compute = the rest."""
    names = work["name"].astype(str)
    comm = names.str.match(r"(^nccl.*)|(^hip)|(^hccl)|(.*ncclKernel.*)")
    mem = names.str.match(r"(^(hip)?Memcpy)|(^(hip)?Memset)|(^dma)")
    w = work.copy()
    w["work"] = np.where(comm, "communication", np.where(mem, "memory", "compute"))
    return w


def hta_rule_idle(work: pd.DataFrame, rank: int, kernel_wait_ns: int) -> dict[str, float]:
    """Idle by cause with HTA's own gap rule (``_analyze_idle_time_for_stream``): each gap from the
    *previous* activity's end in start order (not the latest end so far), every gap summed, the
    negative ones of activities that overlap on a stream included. whatif counts a gap only where
    nothing runs on the stream."""
    out: dict[str, float] = {}
    mine = work[work["rank"].to_numpy() == rank]
    for stream in sorted(set(mine["stream"].tolist())):
        w = mine[mine["stream"].to_numpy() == stream].sort_values("ts_ns", kind="stable")
        ts, end, launch = w["ts_ns"].to_numpy(), w["end_ns"].to_numpy(), w["launch_ns"].to_numpy()
        gap, prev_end = ts[1:] - end[:-1], end[:-1]
        host = launch[1:] > prev_end
        kernel = ~host & (gap < kernel_wait_ns)
        s = stream.split(":")[1]
        out[f"host_wait s{s}"] = gap[host].sum() / US
        out[f"kernel_wait s{s}"] = gap[kernel].sum() / US
        out[f"other s{s}"] = gap[~host & ~kernel].sum() / US
    return out


def figures(doc: BreakdownDocument, rank: int) -> dict[str, float]:
    row = next(t for t in doc.temporal if t.rank == rank and t.step == -2)
    comm = row.communication_ns
    out = {"idle": row.idle_ns / US, "compute": row.compute_ns / US, "non_compute": row.non_compute_ns / US,
           "span": row.span_ns / US, "overlap_pct": 100 * row.comm_overlapped_ns / comm if comm else 0.0}
    for g in doc.idle:
        if g.rank == rank:
            stream = g.stream.split(":")[1]
            out[f"host_wait s{stream}"] = g.host_wait_ns / US
            out[f"kernel_wait s{stream}"] = g.kernel_wait_ns / US
            out[f"other s{stream}"] = g.other_ns / US
    return out


def hta_figures(hta: dict, rank: int) -> dict[str, float]:
    t = next(r for r in hta["temporal"] if int(r["rank"]) == rank)
    out = {"idle": t["idle_time(us)"], "compute": t["compute_time(us)"], "non_compute": t["non_compute_time(us)"],
           "span": t["kernel_time(us)"]}
    ov = [r for r in hta["overlap"] if int(r["rank"]) == rank]
    out["overlap_pct"] = ov[0]["comp_comm_overlap_pctg"] if ov else 0.0
    for r in hta["idle"]:
        if int(r["rank"]) == rank:
            key = {"host_wait": "host_wait", "kernel_wait": "kernel_wait", "other": "other"}[r["idle_category"]]
            out[f"{key} s{int(r['stream'])}"] = r["idle_time"]
    return out


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hta-python", default=os.environ.get("HTA_PYTHON"))
    args = parser.parse_args()
    py = hta_python(args.hta_python)
    if py is None:
        print("HolisticTraceAnalysis could not be installed here: skipped")
        return 0
    worst = worst_rule = 0.0
    for name in TRACES:
        path = SHARED / name
        if not path.exists():
            print(f"{name}: absent, skipped")
            continue
        try:
            hta = run_hta(py, path)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"{name}: HTA failed ({exc}); skipped")
            continue
        trace = load_trace(path)
        graph = build_graph(trace)
        work = gpu_work(trace, graph)
        ours = summarize(work, trace.source, BreakdownOptions(), per_step=False)
        window = hta_classes(hta_window(trace, work))
        inside = summarize(window, trace.source, BreakdownOptions(), per_step=False)
        for rank in sorted({int(r["rank"]) for r in hta["temporal"]}):
            h, w, a = hta_figures(hta, rank), figures(inside, rank), figures(ours, rank)
            x = {**w, **hta_rule_idle(window, rank, BreakdownOptions().kernel_wait_ns)}
            kept = sum(hta["kept"].get(str(rank), {}).get(c, 0) for c in ("kernel", "gpu_memcpy", "gpu_memset",
                                                                            "Kernel", "Memcpy", "Memset"))
            print(f"\n{name} rank {rank}: HTA keeps {kept} of {int((work['rank'] == rank).sum())} GPU activities "
                  f"(steps {hta['iterations'].get(str(rank))}); HTA's GPU-track events by category: "
                  f"{hta['kept'].get(str(rank))}")
            print(f"  {'figure':<22}{'HTA':>14}{'whatif in window':>18}{'diff':>9}{'HTA gap rule':>14}{'diff':>9}"
                  f"{'whatif, all':>14}")
            for key in h:
                d, dx = _rel(w.get(key, 0.0), h[key]), _rel(x.get(key, 0.0), h[key])
                if key != "overlap_pct":
                    worst = max(worst, d if h[key] > 1000 else 0.0)
                    worst_rule = max(worst_rule, dx if h[key] > 1000 else 0.0)
                print(f"  {key:<22}{h[key]:>14,.1f}{w.get(key, 0.0):>18,.1f}{100 * d:>8.3f}%{x.get(key, 0.0):>14,.1f}"
                      f"{100 * dx:>8.3f}%{a.get(key, 0.0):>14,.1f}")
    print(f"\nlargest relative difference inside HTA's window (figures over 1 ms): {100 * worst:.3f} %; "
          f"with HTA's gap rule: {100 * worst_rule:.3f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
