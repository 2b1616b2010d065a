"""`whatif breakdown`: HTA's temporal, idle, overlap, launch-delay, queue and kernel-class
breakdowns, on a hand-made trace with known answers and against an independent computation on the
raw JSON of shared traces (within 0.1 %)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from tracegen import KinetoTrace

from whatif.breakdown import OUTSIDE_STEPS, WHOLE_RANK, BreakdownOptions, breakdown, gpu_work, queue_series, union_ns
from whatif.cli import main
from whatif.depgraph.build import build_graph
from whatif.documents import BreakdownDocument, from_json
from whatif.tracer.trace import load_trace


def test_union_of_intervals():
    assert union_ns(np.array([0, 5, 20]), np.array([10, 12, 25])) == 17
    assert union_ns(np.array([0, 1, 2]), np.array([100, 3, 4])) == 100   # nested in the first
    assert union_ns(np.array([], dtype=np.int64), np.array([], dtype=np.int64)) == 0
    assert union_ns(np.array([0, 10]), np.array([10, 20])) == 20          # touching


def _known(tmp_path: Path) -> Path:
    """Stream 7: k1 [0, 100), k2 [110, 150) launched at 20 (in time: a 10 us kernel-wait gap),
    k3 [300, 400) launched at 250, after k2 ended (a 150 us host-wait gap), k4 [500, 600)
    launched at 260 (a 100 us gap with the launch in time: other). Stream 9: an NCCL all-reduce
    [350, 550), launched at 270, half under k3/k4 compute; a memcpy [700, 720) on stream 7
    launched at 650 (host wait of 100 us). Steps: ProfilerStep#0 [0, 280), ProfilerStep#1 [280, 800)."""
    t = KinetoTrace()
    t.step(0, 0, 280)
    t.step(1, 280, 520)
    t.runtime("cudaLaunchKernel", 0, 5, corr=1)
    t.gpu("k1_gemm", 0, 100, corr=1)
    t.runtime("cudaLaunchKernel", 20, 5, corr=2)
    t.gpu("k2_elementwise_kernel", 110, 40, corr=2)
    t.runtime("cudaLaunchKernel", 250, 5, corr=3)
    t.gpu("k3_gemm", 300, 100, corr=3)
    t.runtime("cudaLaunchKernel", 260, 5, corr=4)
    t.gpu("k4_gemm", 500, 100, corr=4)
    t.runtime("cudaLaunchKernel", 270, 5, corr=5)
    t.gpu("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 350, 200, corr=5, stream=9)
    t.runtime("cudaMemcpyAsync", 650, 5, corr=6)
    t.gpu("Memcpy DtoH (Device -> Pinned)", 700, 20, corr=6, cat="gpu_memcpy")
    return t.write(tmp_path / "known.json.gz")


def test_known_trace_every_breakdown(tmp_path):
    trace = load_trace(_known(tmp_path))
    doc = breakdown(trace, build_graph(trace))
    whole = next(r for r in doc.temporal if r.step == WHOLE_RANK)
    us = 1000
    assert whole.span_ns == 720 * us
    # busy: [0,100) + [110,150) + [300,600) + [700,720) = 460
    assert whole.idle_ns == 260 * us
    assert whole.compute_ns == (100 + 40 + 100 + 100) * us
    assert whole.communication_ns == 200 * us and whole.memory_ns == 20 * us
    assert whole.non_compute_ns == (460 - 340) * us
    assert whole.comm_overlapped_ns == (50 + 50) * us          # [350,400) under k3, [500,550) under k4
    assert whole.idle_ns + whole.compute_ns + whole.non_compute_ns == whole.span_ns

    gaps = {g.stream: g for g in doc.idle}
    s7 = gaps["0:7"]
    assert (s7.gaps, s7.host_wait_ns, s7.kernel_wait_ns, s7.other_ns) == (4, 250 * us, 10 * us, 100 * us)
    assert gaps["0:9"].gaps == 0

    (launch,) = doc.launches
    assert launch.launches == 6
    # delays: 0-5<0 -> 0, 110-25=85, 300-255=45, 500-265=235, 350-275=75, 700-655=45
    assert launch.max_ns == 235 * us and launch.p50_ns == 45 * us
    assert launch.long_delays == 1                                   # 235 us > 100 us
    assert launch.shorter_than_launch == 0

    q7 = next(q for q in doc.queues if q.stream == "0:7")
    assert q7.max == 2                                               # k3 and k4 launched, neither started
    t, q = queue_series(gpu_work(trace).query("stream == '0:7'"))
    assert q[-1] == 0 and q.min() >= 0 and np.all(np.diff(t) >= 0)

    by_step = {r.step: r for r in doc.temporal}
    assert set(by_step) == {WHOLE_RANK, 0, 1}
    assert by_step[0].activities == 5 and by_step[1].activities == 1   # launched in step 0: k1-k4 + nccl
    classes = {(c.step, c.kernel_class): c for c in doc.classes}
    assert classes[(WHOLE_RANK, "gemm")].count == 3
    assert classes[(WHOLE_RANK, "collective")].total_ns == 200 * us
    assert sum(c.share for c in doc.classes if c.step == WHOLE_RANK) == pytest.approx(1.0, abs=1e-3)


def test_kernel_wait_threshold_moves_gaps(tmp_path):
    trace = load_trace(_known(tmp_path))
    tight = breakdown(trace, options=BreakdownOptions(kernel_wait_ns=5_000))
    loose = breakdown(trace, options=BreakdownOptions(kernel_wait_ns=200_000))
    s_tight = next(g for g in tight.idle if g.stream == "0:7")
    s_loose = next(g for g in loose.idle if g.stream == "0:7")
    assert s_tight.kernel_wait_ns == 0 and s_tight.other_ns == 110_000
    assert s_loose.kernel_wait_ns == 110_000 and s_loose.other_ns == 0
    assert s_tight.host_wait_ns == s_loose.host_wait_ns


def test_without_a_graph_only_rank_rows(tmp_path):
    doc = breakdown(load_trace(_known(tmp_path)))
    assert {r.step for r in doc.temporal} == {WHOLE_RANK}


def test_cli_text_and_json(tmp_path, capsys):
    path = _known(tmp_path)
    out = tmp_path / "b.json"
    assert main(["breakdown", str(path), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "idle" in text and "host wait" in text and "launch delay" in text
    doc = from_json(out.read_text(), BreakdownDocument)
    assert doc.temporal[0].span_ns == 720_000
    assert main(["breakdown", str(tmp_path / "missing.json")]) == 2


# --- the raw JSON, read independently -----------------------------------------------------------

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}
CALL_CATS = {"cuda_runtime", "cuda_driver", "Runtime"}


def _raw(path: Path) -> list[dict]:
    doc = json.loads(gzip.open(path).read() if path.suffix == ".gz" else path.read_text())
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def _corr(e: dict) -> int | None:
    args = e.get("args") or {}
    c = args.get("correlation")
    return int(c) if c is not None and int(c) >= 0 else None


def _union_us(iv: list[tuple[float, float]]) -> float:
    total, reach = 0.0, -float("inf")
    for s, e in sorted(iv):
        if e <= reach:
            continue
        total += e - max(s, reach)
        reach = e
    return total


def raw_breakdown(path: Path, kernel_wait_us: float = 30.0) -> dict[str, float] | None:
    """Span, idle, compute, non-compute and the idle causes of a one-rank trace, in µs; None
    when it has no GPU activity."""
    events = _raw(path)
    gpu = [e for e in events if e.get("cat") in GPU_CATS]
    if not gpu:
        return None
    iv = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in gpu]
    lower = [str(e["name"]).lower() for e in gpu]
    memory = [e["cat"] in ("gpu_memcpy", "gpu_memset", "Memcpy", "Memset") for e in gpu]
    comm = [("nccl" in n or "rccl" in n or "all_reduce" in n) and not m for n, m in zip(lower, memory)]
    comp = [not c and not m for c, m in zip(comm, memory)]
    span = max(e for _, e in iv) - min(s for s, _ in iv)
    busy = _union_us(iv)
    compute = _union_us([x for x, c in zip(iv, comp) if c])
    launch: dict[int, float] = {}
    for e in sorted((e for e in events if e.get("cat") in CALL_CATS), key=lambda e: (float(e["ts"]), -float(e["dur"]))):
        c = _corr(e)
        if c is not None and c not in launch:
            launch[c] = float(e["ts"])
    host = kernel = other = 0.0
    streams: dict[tuple, list] = {}
    for e, (s, end) in zip(gpu, iv):
        streams.setdefault((e["pid"], e["tid"]), []).append((s, end, launch.get(_corr(e), -1.0)))
    for items in streams.values():
        items.sort(key=lambda x: x[0])
        reach = items[0][1]
        for s, end, at in items[1:]:
            gap = s - reach
            if gap > 0:
                if at >= 0 and at > reach:
                    host += gap
                elif gap < kernel_wait_us:
                    kernel += gap
                else:
                    other += gap
            reach = max(reach, end)
    return {"span": span, "idle": span - busy, "compute": compute, "non_compute": busy - compute,
            "host_wait": host, "kernel_wait": kernel, "other": other}


RAW_CHECKED = ["kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz",
               "hta/nccl_data_a100_rank0of2.json.gz",
               "hta/negative_queue_a100_rank0of16.json.gz",
               "hta/trace_diff_control_rank3.json.gz",
               "tracelens/hf_h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
               "tracelens/mi300x_resnet_act_ckpt_rank0of8.json.gz",
               "tracelens/b200_eager_rank0of8.json.gz"]


def _ours(path: Path) -> dict[str, float]:
    doc = breakdown(load_trace(path))
    (whole,) = [r for r in doc.temporal if r.step == WHOLE_RANK]
    ns = {"span": whole.span_ns, "idle": whole.idle_ns, "compute": whole.compute_ns,
          "non_compute": whole.non_compute_ns, "host_wait": sum(g.host_wait_ns for g in doc.idle),
          "kernel_wait": sum(g.kernel_wait_ns for g in doc.idle), "other": sum(g.other_ns for g in doc.idle)}
    return {k: v / 1000 for k, v in ns.items()}


def _differences(path: Path) -> dict[str, tuple[float, float]]:
    raw = raw_breakdown(path)
    if raw is None:
        return {}
    ours = _ours(path)
    return {k: (ours[k], v) for k, v in raw.items() if ours[k] != pytest.approx(v, rel=1e-3, abs=1.0)}


@pytest.mark.parametrize("name", RAW_CHECKED)
def test_equals_an_independent_computation_on_the_raw_json(shared_traces, name):
    path = shared_traces / name
    assert raw_breakdown(path) is not None
    assert _differences(path) == {}


@pytest.mark.slow
def test_every_shared_trace_equals_the_raw_json(shared_traces):
    files = sorted(p for p in shared_traces.rglob("*") if p.name.endswith((".json", ".json.gz")))
    assert len(files) >= 40
    bad = {str(p.relative_to(shared_traces)): d for p in files if (d := _differences(p))}
    assert bad == {}


def test_steps_partition_the_activities(shared_traces):
    trace = load_trace(shared_traces / "kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz")
    doc = breakdown(trace, build_graph(trace))
    whole = next(r for r in doc.temporal if r.step == WHOLE_RANK)
    steps = [r for r in doc.temporal if r.step != WHOLE_RANK]
    assert sum(r.activities for r in steps) == whole.activities
    assert any(r.step == OUTSIDE_STEPS for r in steps)             # launched before ProfilerStep#5
    for r in steps:
        assert r.idle_ns + r.compute_ns + r.non_compute_ns == r.span_ns
        assert r.span_ns <= whole.span_ns


def test_left_out_steps_are_shown_with_their_reason(tmp_path):
    t = KinetoTrace()
    for n in range(4):
        t.step(n, 1000 * n, 900)
        for k in range(3):
            corr = 10 * n + k
            t.runtime("cudaLaunchKernel", 1000 * n + 10 * k, 5, corr=corr)
            t.gpu("gemm_kernel", 1000 * n + 100 + 50 * k, 40, corr=corr)
    trace = load_trace(t.write(tmp_path / "steps.json.gz"))
    doc = breakdown(trace, build_graph(trace))
    reasons = {r.step: r.excluded for r in doc.temporal}
    assert reasons[0] == "warm-up" and reasons[1] is None and reasons[WHOLE_RANK] is None
    assert next(r for r in doc.temporal if r.step == WHOLE_RANK).activities == 12   # the warm-up counts in the rank


def test_a_trace_without_gpu_activity(capsys):
    assert main(["breakdown", "sample_traces/llm_serve"]) == 0
    assert "no GPU activity" in capsys.readouterr().out


def test_epoch_launch_times_stay_exact(tmp_path):
    """Launch times in epoch nanoseconds (~1.7e18) are beyond float64's 53 bits: carried through a
    NaN-filled column they moved by up to 128 ns, which turned a gap that HTA calls kernel wait
    (launch exactly at the previous end) into host wait (trace_diff_test, stream 14)."""
    t = KinetoTrace(base_us=1661938466240491)
    t.runtime("cudaLaunchKernel", 600630, 7, corr=1)
    t.gpu("gemm", 600640, 10, corr=1)
    t.runtime("cudaLaunchKernel", 600650, 7, corr=2)     # launched exactly when gemm ends
    t.gpu("relu", 600672, 27, corr=2)
    t.gpu("orphan", 600710, 5, corr=99)                 # no launch call in the trace
    trace = load_trace(t.write(tmp_path / "epoch.json.gz"))
    w = gpu_work(trace)
    base_ns = 1661938466240491 * 1000
    assert w["launch_ns"].tolist() == [base_ns + 600630_000, base_ns + 600650_000, -1]
    idle = breakdown(trace).idle[0]
    assert (idle.host_wait_ns, idle.kernel_wait_ns) == (0, 22_000 + 11_000)
