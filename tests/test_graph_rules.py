"""One small hand-written trace per step of the build pipeline (:data:`whatif.depgraph.rules.RULES`):
the edge exists, the replay reproduces the measured times, and changing a duration moves exactly
what the rule says it moves. ``@covers`` names the steps a test checks; every declared step has one."""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest
from tracegen import MAIN_TID, KinetoTrace

from whatif.analysis import predict
from whatif.api import analyze
from whatif.depgraph.build import build_graph
from whatif.depgraph.graph import EdgeKind, TaskGraph, TaskKind, check_acyclic
from whatif.depgraph.rules import (
    RULES,
    AnchorRoots,
    ArrivalOrder,
    BlockingCallIssue,
    BuildStep,
    BurstGaps,
    ClockAlignment,
    CollectiveBarriers,
    CollectiveSplit,
    ContentionLaunches,
    DeviceContention,
    EventWaitLaunches,
    EventWaits,
    Flows,
    FlowWakesThread,
    ForkJoins,
    LaunchEdges,
    LauncherAttribution,
    LaunchQueue,
    SingleStep,
    StepWindows,
    StreamOrder,
    SyncEdges,
    SyncWakeUps,
    ThreadOrder,
    check_order,
)
from whatif.predictors.replay import Replay, replay
from whatif.predictors.steps import step_times
from whatif.tracer.trace import load_trace
from whatif.transforms.generic import Scale
from whatif.transforms.select import Selector

US = 1000  # ns per microsecond
ROOT = Path(__file__).resolve().parents[1]
Test = TypeVar("Test", bound=Callable[..., None])
COVERED: dict[type[BuildStep], list[str]] = {}


def covers(*steps: type[BuildStep]) -> Callable[[Test], Test]:
    """Declare which build steps a test checks."""
    def mark(test: Test) -> Test:
        for step in steps:
            COVERED.setdefault(step, []).append(test.__name__)
        return test
    return mark


def task_named(graph: TaskGraph, name: str, nth: int = 0) -> int:
    ids = np.flatnonzero(graph.tasks["name"].astype(str).to_numpy() == name)
    assert len(ids) > nth, f"no task {name!r}"
    return int(ids[nth])


def edges_of(graph: TaskGraph, kind: EdgeKind) -> set[tuple[int, int]]:
    e = graph.edges[graph.edges["kind"] == int(kind)]
    return set(zip(e["src"].tolist(), e["dst"].tolist()))


def with_duration(graph: TaskGraph, task: int, dur_ns: int) -> TaskGraph:
    g = graph.copy()
    g.tasks.loc[task, "dur_ns"] = dur_ns
    return g


def assert_exact(analysis) -> None:
    steps = analysis.steps
    assert (steps["predicted_ns"] == steps["measured_ns"]).all(), steps


@covers(ThreadOrder, LaunchEdges, StreamOrder)
def test_launch_edges_and_queued_kernels(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.step(0, 0, 100)
    tr.runtime("cudaLaunchKernel", 10, 5, corr=1)
    tr.gpu("k1", 20, 30, corr=1)          # stream idle: starts 5 us after its launch returns
    tr.runtime("cudaLaunchKernel", 20, 5, corr=2)
    tr.gpu("k2", 50, 10, corr=2)          # launched at 25 but the stream is busy until 50: queued
    a = analyze(tr.write(tmp_path / "t.json.gz"))
    g = a.graph
    call1, call2 = task_named(g, "cudaLaunchKernel", 0), task_named(g, "cudaLaunchKernel", 1)
    k1, k2 = task_named(g, "k1"), task_named(g, "k2")
    assert {(call1, k1), (call2, k2)} <= edges_of(g, EdgeKind.LAUNCH)
    assert (k1, k2) in edges_of(g, EdgeKind.STREAM)
    assert (call1, call2) in edges_of(g, EdgeKind.THREAD)
    assert g.report["gpu_tasks_queued"] == 1 and g.report["gpu_tasks_launch_bound"] == 1
    assert_exact(a)
    # A slower k1 delays the queued k2 by the same amount.
    r = replay(with_duration(g, k1, 60 * US))
    assert r.start_ns[k2] - a.replay.start_ns[k2] == 30 * US


@covers(LaunchQueue)
def test_full_launch_queue_blocks_the_cpu_behind_a_slow_gpu(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.step(0, 0, 100)
    for i in range(8):  # a launch every 10 us, each kernel done 3 us later: the queue never fills
        tr.runtime("cudaLaunchKernel", 10 * i, 4, corr=i + 1)
        tr.gpu(f"k{i}", 10 * i + 6, 3, corr=i + 1)
    path = tr.write(tmp_path / "t.json.gz")
    rules = tuple(LaunchQueue(depth=2) if isinstance(r, LaunchQueue) else r for r in RULES)
    g = build_graph(load_trace(path), rules=rules)
    calls = [task_named(g, "cudaLaunchKernel", i) for i in range(8)]
    kernels = [task_named(g, f"k{i}") for i in range(8)]
    assert edges_of(g, EdgeKind.LAUNCH_QUEUE) == {(kernels[i - 2], calls[i]) for i in range(2, 8)}
    assert g.report["launch_queue_max_pending"] == 1
    base = replay(g)
    assert (base.end_ns[calls] - base.start_ns[calls] == 4 * US).all()

    def gpu_times(factor: float) -> TaskGraph:
        out = g.copy()
        out.tasks.loc[kernels, "dur_ns"] = (out.tasks.loc[kernels, "dur_ns"] * factor).astype(np.int64)
        return out

    # 10x slower kernels (30 us each, back to back): from the third launch on, each call returns
    # only when the kernel two entries back has finished, so the CPU runs at the GPU's pace.
    slow = replay(gpu_times(10))
    for i in range(2, 8):
        assert slow.end_ns[calls[i]] == max(slow.start_ns[calls[i]] + 4 * US, slow.end_ns[kernels[i - 2]])
    assert slow.end_ns[calls[7]] == slow.end_ns[kernels[5]] > base.end_ns[calls[7]] + 100 * US
    deep = build_graph(load_trace(path))  # the real depth: 8 launches never fill it
    assert edges_of(deep, EdgeKind.LAUNCH_QUEUE) == set()
    deep.tasks.loc[kernels, "dur_ns"] *= 10
    assert (replay(deep).end_ns[calls] == base.end_ns[calls]).all()
    # A faster GPU frees the CPU: the calls keep their measured times.
    assert (replay(gpu_times(0.5)).end_ns[calls] == base.end_ns[calls]).all()


@covers(SyncEdges, SyncWakeUps)
def test_stream_synchronize_wait_is_recomputed(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.step(0, 0, 130)
    tr.runtime("cudaLaunchKernel", 0, 5, corr=1)
    tr.gpu("gemm", 10, 100, corr=1)
    tr.runtime("cudaStreamSynchronize", 10, 102, corr=2)  # returns 2 us after the kernel ends
    tr.cuda_sync("Stream Sync", 10, 102, corr=2, stream=7)
    tr.op("aten::item", 115, 5)
    a = analyze(tr.write(tmp_path / "t.json.gz"))
    g = a.graph
    k, sync, item = task_named(g, "gemm"), task_named(g, "cudaStreamSynchronize"), task_named(g, "aten::item")
    assert (k, sync) in edges_of(g, EdgeKind.SYNC)
    assert g.tasks.at[sync, "dur_ns"] == 2 * US  # the wake-up, not the measured wait
    assert_exact(a)
    r = replay(with_duration(g, k, 50 * US))
    assert r.end_ns[sync] == r.end_ns[k] + 2 * US
    assert a.replay.start_ns[item] - r.start_ns[item] == 50 * US


@covers(SyncEdges)
def test_stream_synchronize_without_sync_record_uses_thread_stream(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.runtime("cudaLaunchKernel", 0, 5, corr=1)
    tr.gpu("gemm", 10, 100, corr=1, stream=13)
    tr.runtime("cudaStreamSynchronize", 10, 102, corr=2)
    g = analyze(tr.write(tmp_path / "t.json.gz")).graph
    assert (task_named(g, "gemm"), task_named(g, "cudaStreamSynchronize")) in edges_of(g, EdgeKind.SYNC)
    assert g.report["stream_syncs_stream_inferred"] == 1


@covers(SyncEdges, SyncWakeUps)
def test_device_synchronize_waits_for_every_stream(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.runtime("cudaLaunchKernel", 0, 5, corr=1)
    tr.gpu("a", 10, 50, corr=1, stream=7)
    tr.runtime("cudaLaunchKernel", 6, 5, corr=2)
    tr.gpu("b", 15, 80, corr=2, stream=20)
    tr.runtime("cudaDeviceSynchronize", 12, 85, corr=3)
    a = analyze(tr.write(tmp_path / "t.json.gz"))
    g = a.graph
    sync = task_named(g, "cudaDeviceSynchronize")
    assert {(task_named(g, "a"), sync), (task_named(g, "b"), sync)} <= edges_of(g, EdgeKind.SYNC)
    assert_exact(a)
    r = replay(with_duration(g, task_named(g, "a"), 200 * US))  # now stream 7 finishes last
    assert r.end_ns[sync] == r.end_ns[task_named(g, "a")] + g.tasks.at[sync, "dur_ns"]


@covers(SyncEdges, SyncWakeUps, AnchorRoots)
def test_device_synchronize_waits_for_work_queued_before_the_window(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.step(0, 0, 130)
    tr.gpu("queued_a", 0, 40, corr=90)                        # launched before the trace window
    tr.gpu("queued_b", 41, 39, corr=91)
    tr.runtime("cudaDeviceSynchronize", 5, 77, corr=1)        # returns 2 us after queued_b
    tr.runtime("cudaLaunchKernel", 90, 5, corr=2)
    tr.gpu("after", 100, 10, corr=2)
    a = analyze(tr.write(tmp_path / "t.json.gz"))
    g = a.graph
    qa, qb, sync = task_named(g, "queued_a"), task_named(g, "queued_b"), task_named(g, "cudaDeviceSynchronize")
    assert (qb, sync) in edges_of(g, EdgeKind.SYNC)
    assert (qa, qb) in edges_of(g, EdgeKind.STREAM)
    assert g.tasks.at[sync, "dur_ns"] == 2 * US
    assert g.report["gpu_tasks_before_window"] == 2 and g.report["sync_wait_unattributed"] == 0
    assert_exact(a)
    r = replay(with_duration(with_duration(g, qa, 0), qb, 0))   # the queued work takes no time
    assert r.end_ns[qb] < r.start_ns[sync] and r.end_ns[sync] == r.start_ns[sync] + 2 * US
    assert a.replay.end_ns[sync] - r.end_ns[sync] == 75 * US


@covers(SyncEdges)
def test_sync_wait_no_gpu_work_explains_is_reported(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.runtime("cudaLaunchKernel", 0, 5, corr=1)
    tr.gpu("launched", 10, 80, corr=1)
    tr.runtime("cudaDeviceSynchronize", 100, 100, corr=2)
    tr.gpu("unlaunched", 110, 85, corr=99)     # no launch: taken as launched at its start, after the sync's
    g = analyze(tr.write(tmp_path / "t.json.gz")).graph
    sync = task_named(g, "cudaDeviceSynchronize")
    assert (task_named(g, "launched"), sync) in edges_of(g, EdgeKind.SYNC)
    assert (task_named(g, "unlaunched"), sync) not in edges_of(g, EdgeKind.SYNC)
    assert g.report["gpu_tasks_before_window"] == 0
    assert (g.report["sync_wait_unattributed"], g.report["sync_wait_unattributed_ns"]) == (1, 85 * US)


@covers(EventWaits)
def test_event_record_and_stream_wait_link_two_streams(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.runtime("cudaLaunchKernel", 0, 5, corr=1)
    tr.gpu("producer", 10, 50, corr=1, stream=7)
    tr.runtime("cudaEventRecord", 6, 1, corr=2)
    tr.runtime("cudaStreamWaitEvent", 8, 1, corr=3)
    tr.cuda_sync("Stream Wait Event", 8, 1, corr=3, stream=20, wait_on_stream=7,
                 wait_on_cuda_event_record_corr_id=2, wait_on_cuda_event_id=1)
    tr.runtime("cudaLaunchKernel", 10, 5, corr=4)
    tr.gpu("consumer", 60, 20, corr=4, stream=20)
    a = analyze(tr.write(tmp_path / "t.json.gz"))
    g = a.graph
    prod, cons = task_named(g, "producer"), task_named(g, "consumer")
    assert (prod, cons) in edges_of(g, EdgeKind.EVENT_WAIT)
    assert_exact(a)
    r = replay(with_duration(g, prod, 100 * US))
    assert r.start_ns[cons] == r.end_ns[prod]


@covers(EventWaits, EventWaitLaunches)
def test_recorded_stream_wait_recomputes_the_wait_not_the_launch_gap(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.runtime("cudaLaunchKernel", 0, 5, corr=1)
    tr.gpu("producer", 10, 50, corr=1, stream=7)
    tr.runtime("cudaEventRecord", 6, 1, corr=2)
    tr.runtime("cudaStreamWaitEvent", 8, 1, corr=3)
    tr.cuda_sync("Stream Wait Event", 8, 1, corr=3, stream=20, wait_on_stream=7,
                 wait_on_cuda_event_record_corr_id=2, wait_on_cuda_event_id=1)
    tr.runtime("cudaLaunchKernel", 10, 5, corr=4)
    tr.gpu("consumer", 62, 20, corr=4, stream=20)  # 2 us after the producer ends
    a = analyze(tr.write(tmp_path / "t.json.gz"))
    g = a.graph
    prod, cons = task_named(g, "producer"), task_named(g, "consumer")
    wait = g.edges[g.edges["kind"] == int(EdgeKind.EVENT_WAIT)]
    assert wait[["src", "dst", "lat_ns"]].values.tolist() == [[prod, cons, 2 * US]]
    assert g.report["stream_waits_holding_work"] == 1
    assert_exact(a)
    r = replay(with_duration(g, prod, 10 * US))  # a faster producer frees the consumer: the wait shrinks
    assert r.start_ns[cons] == r.end_ns[prod] + 2 * US
    assert r.start_ns[cons] < a.replay.start_ns[cons]


@covers(EventWaits, EventWaitLaunches)
def test_stream_wait_without_sync_record_is_inferred_from_timing(tmp_path: Path) -> None:
    tr = KinetoTrace()
    for i in range(10):  # idle-stream launches: the device's launch latency is 2 us
        tr.runtime("cudaLaunchKernel", 200 + 20 * i, 5, corr=10 + i)
        tr.gpu(f"warm{i}", 207 + 20 * i, 3, corr=10 + i, stream=7)
    tr.runtime("cudaLaunchKernel", 0, 5, corr=1)
    tr.gpu("producer", 10, 50, corr=1, stream=7)
    tr.runtime("cudaStreamWaitEvent", 8, 1, corr=3)  # no cuda_sync record, no cudaEventRecord
    tr.runtime("cudaLaunchKernel", 10, 5, corr=4)
    tr.gpu("consumer", 61, 20, corr=4, stream=20)
    a = analyze(tr.write(tmp_path / "t.json.gz"))
    g = a.graph
    prod, cons = task_named(g, "producer"), task_named(g, "consumer")
    assert (prod, cons) in edges_of(g, EdgeKind.EVENT_WAIT)
    assert g.report["stream_waits_inferred"] == 1 and g.report["stream_waits_without_sync_record"] == 1
    launch = g.edges[(g.edges["kind"] == int(EdgeKind.LAUNCH)) & (g.edges["dst"] == cons)]
    assert launch["lat_ns"].tolist() == [2 * US]
    assert_exact(a)
    r = replay(with_duration(g, prod, 20 * US))
    assert r.start_ns[cons] == r.end_ns[prod] + 1 * US
    assert a.replay.start_ns[cons] - r.start_ns[cons] == 30 * US


@covers(EventWaits)
def test_a_late_start_nothing_explains_stays_measured_and_is_reported(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.runtime("cudaLaunchKernel", 0, 5, corr=1)
    tr.gpu("early", 7, 3, corr=1, stream=7)           # ended before the consumer's launch returned
    tr.runtime("cudaStreamWaitEvent", 8, 1, corr=3)
    tr.runtime("cudaLaunchKernel", 10, 5, corr=4)
    tr.gpu("consumer", 400, 20, corr=4, stream=20)    # waited for something the trace does not show
    a = analyze(tr.write(tmp_path / "t.json.gz"))
    g = a.graph
    assert not edges_of(g, EdgeKind.EVENT_WAIT)
    assert g.report["stream_waits_unattributed"] == 1
    assert g.report["stream_waits_unattributed_ns"] == (400 - 15 - 2) * US
    assert_exact(a)


@covers(DeviceContention, ContentionLaunches)
def test_a_kernel_held_by_another_streams_kernel_starts_as_that_one_finishes(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.runtime("cudaLaunchKernel", 0, 5, corr=1)
    tr.gpu("hog", 10, 200, corr=1, stream=7)           # fills the device's SMs
    tr.runtime("cudaLaunchKernel", 20, 5, corr=2)
    tr.gpu("held", 205, 20, corr=2, stream=20)         # its stream was idle; it starts in hog's last wave
    tr.runtime("cudaLaunchKernel", 230, 5, corr=3)
    tr.gpu("ncclKernel_AllReduce_RING_LL_Sum_float", 240, 150, corr=3, stream=21)
    tr.runtime("cudaLaunchKernel", 250, 5, corr=4)
    tr.gpu("late", 391, 10, corr=4, stream=22)         # a collective's few SMs hold nothing back
    a = analyze(tr.write(tmp_path / "t.json.gz"))
    g = a.graph
    hog, held = task_named(g, "hog"), task_named(g, "held")
    assert edges_of(g, EdgeKind.CONTENTION) == {(hog, held)}
    contention = g.edges[g.edges["kind"] == int(EdgeKind.CONTENTION)]
    assert contention["lat_ns"].tolist() == [-5 * US]
    launch = g.edges[(g.edges["kind"] == int(EdgeKind.LAUNCH)) & (g.edges["dst"] == held)]
    assert launch["lat_ns"].tolist() == [2 * US]      # the device's launch latency, not the 180 us wait
    assert g.report["kernels_held_by_other_streams"] == 1
    assert g.report["kernels_held_by_other_streams_ns"] == (205 - 27) * US
    assert a.replay.start_ns[held] == g.tasks.at[held, "measured_start_ns"]
    assert_exact(a)
    r = replay(with_duration(g, hog, 100 * US))
    assert r.start_ns[held] == r.end_ns[hog] - 5 * US
    assert a.replay.start_ns[held] - r.start_ns[held] == 100 * US


@covers(BlockingCallIssue, SyncEdges, SyncWakeUps)
def test_blocking_copy_waits_for_its_own_copy(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.runtime("cudaMemcpyAsync", 0, 60, corr=1)
    tr.gpu("Memcpy DtoH (Device -> Pageable)", 10, 40, corr=1, cat="gpu_memcpy")
    tr.op("aten::add", 65, 5)
    a = analyze(tr.write(tmp_path / "t.json.gz"))
    g = a.graph
    copy = task_named(g, "Memcpy DtoH (Device -> Pageable)")
    wait = int(np.flatnonzero(g.tasks["kind"].to_numpy() == int(TaskKind.WAIT))[0])
    assert (copy, wait) in edges_of(g, EdgeKind.SYNC)
    assert g.report["blocking_copies"] == 1
    call = task_named(g, "cudaMemcpyAsync")
    assert g.tasks.at[call, "dur_ns"] == 10 * US  # issuing the copy; the WAIT task holds the rest
    assert g.tasks.at[wait, "dur_ns"] == 10 * US  # woken 10 us after the copy ended
    check_acyclic(g)
    assert_exact(a)
    add = task_named(g, "aten::add")
    r = replay(with_duration(g, copy, 80 * US))
    assert r.start_ns[add] - a.replay.start_ns[add] == 40 * US


def gpu_twice_as_fast(analysis) -> Replay:
    return predict(analysis, [Scale(select=Selector(kind="gpu"), factor=0.5)]).scenarios[0].replay


@covers(BlockingCallIssue, SyncEdges, SyncWakeUps)
def test_pageable_copy_held_behind_a_long_kernel_waits_for_its_stream(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.step(0, 0, 1100)
    tr.runtime("cudaMemcpyAsync", 0, 15, corr=1)                     # returned before its copy: did not wait
    tr.gpu("Memcpy HtoD (Pageable -> Device)", 18, 10, corr=1, cat="gpu_memcpy")
    tr.runtime("cudaLaunchKernel", 30, 5, corr=2)
    tr.gpu("gemm", 40, 1000, corr=2)
    tr.runtime("cudaMemcpyAsync", 40, 1010, corr=3)                  # held until the stream reaches its copy
    tr.gpu("Memcpy HtoD (Pageable -> Device)", 1041, 30, corr=3, cat="gpu_memcpy")  # ends after the call returns
    tr.op("aten::add", 1055, 5)
    a = analyze(tr.write(tmp_path / "t.json.gz"))
    g = a.graph
    gemm, held = task_named(g, "gemm"), task_named(g, "cudaMemcpyAsync", 1)
    wait = int(np.flatnonzero(g.tasks["kind"].to_numpy() == int(TaskKind.WAIT))[0])
    assert g.report["copy_calls_held_until_stream_reached_copy"] == 1
    assert (gemm, wait) in edges_of(g, EdgeKind.SYNC)  # the copy's predecessor on its stream
    assert g.tasks.at[held, "dur_ns"] == 15 * US       # its own cost: the call that did not wait
    assert g.tasks.at[wait, "dur_ns"] == 10 * US       # returned 10 us after the stream reached the copy
    assert g.report["copy_calls_stream_wait_ns"] == (1001 - 15) * US
    assert_exact(a)
    add = task_named(g, "aten::add")
    r = gpu_twice_as_fast(a)
    assert a.replay.start_ns[add] - r.start_ns[add] == 500 * US  # the CPU's wait shrinks with the GPU


@covers(BlockingCallIssue, SyncEdges, SyncWakeUps)
def test_item_after_a_long_kernel_waits_for_the_gpu(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.step(0, 0, 1200)
    tr.op("aten::item", 0, 30)                                       # a first .item(), stream idle
    tr.op("aten::_local_scalar_dense", 1, 28)
    tr.runtime("cudaMemcpyAsync", 2, 20, corr=1)
    tr.gpu("Memcpy DtoH (Device -> Pageable)", 14, 2, corr=1, cat="gpu_memcpy")
    tr.runtime("cudaStreamSynchronize", 24, 3, corr=2)
    tr.runtime("cudaLaunchKernel", 40, 5, corr=3)
    tr.gpu("gemm", 50, 1000, corr=3)
    tr.op("aten::item", 50, 1020)                                    # loss.item() behind the gemm
    tr.op("aten::_local_scalar_dense", 51, 1018)
    tr.runtime("cudaMemcpyAsync", 52, 1004, corr=4)                 # returns 6 us after its copy
    tr.gpu("Memcpy DtoH (Device -> Pageable)", 1051, 2, corr=4, cat="gpu_memcpy")
    tr.runtime("cudaStreamSynchronize", 1058, 5, corr=5)
    tr.op("aten::add", 1075, 5)
    a = analyze(tr.write(tmp_path / "t.json.gz"))
    g = a.graph
    copy, held = task_named(g, "Memcpy DtoH (Device -> Pageable)", 1), task_named(g, "cudaMemcpyAsync", 1)
    wait = int(np.flatnonzero(g.tasks["kind"].to_numpy() == int(TaskKind.WAIT))[1])
    assert g.report["copy_calls_held_until_copy_done"] == 2
    assert (copy, wait) in edges_of(g, EdgeKind.SYNC)
    assert g.tasks.at[held, "dur_ns"] == 12 * US  # the first call's start-to-copy time, not the 999 us held
    assert g.tasks.at[wait, "dur_ns"] == 3 * US   # woken 3 us after its copy
    assert_exact(a)
    add = task_named(g, "aten::add")
    r = gpu_twice_as_fast(a)
    assert a.replay.start_ns[add] - r.start_ns[add] == 500 * US + 2 * 1 * US  # half the gemm and both copies


@covers(LaunchEdges)
def test_graph_launch_reaches_all_its_kernels(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.runtime("cudaGraphLaunch", 0, 10, corr=1)
    for i in range(3):
        tr.gpu(f"graph_kernel_{i}", 12 + 10 * i, 9, corr=1)
    a = analyze(tr.write(tmp_path / "t.json.gz"))
    g = a.graph
    call = task_named(g, "cudaGraphLaunch")
    launched = {d for s, d in edges_of(g, EdgeKind.LAUNCH) if s == call}
    assert launched == {task_named(g, f"graph_kernel_{i}") for i in range(3)}
    assert g.report["graph_launches"] == 1
    assert_exact(a)


@covers(ClockAlignment, CollectiveSplit, ArrivalOrder, CollectiveBarriers)
def test_collective_links_ranks_and_aligns_clocks(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    # True time: rank 0 arrives at 10, rank 1 at 60; both finish at 100. Rank 1's clock reads +1000 us.
    for rank, arrive, skew in ((0, 10, 0), (1, 60, 1000)):
        tr = KinetoTrace(rank=rank, world_size=2)
        tr.step(0, skew + 0, 120)
        tr.op("aten::mul", skew + 1, arrive - 6)
        tr.runtime("cudaLaunchKernel", skew + arrive - 4, 3, corr=7)
        tr.gpu("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", skew + arrive, 100 - arrive, corr=7,
               stream=20, **{"Collective name": "allreduce", "Process Group Name": "0"})
        tr.write(run / f"rank{rank}.pt.trace.json.gz")
    a = analyze(run)
    g = a.graph
    assert g.report["collectives_matched"] == 1
    assert g.report["clock_offsets_ns_max_abs"] == 1000 * US
    comm = np.flatnonzero(g.tasks["kind"].to_numpy() == int(TaskKind.COMM))
    assert sorted(g.tasks.loc[comm, "dur_ns"].tolist()) == [40 * US, 40 * US]  # transfer after the last arrival
    kinds = g.tasks["kind"].to_numpy()
    arrive = np.flatnonzero(kinds == int(TaskKind.ARRIVE))
    (barrier,) = np.flatnonzero(kinds == int(TaskKind.BARRIER))
    assert {(int(a), int(c)) for a, c in zip(arrive, comm)} <= edges_of(g, EdgeKind.STREAM)
    assert {(int(a), int(barrier)) for a in arrive} | {(int(barrier), int(c)) for c in comm} \
        == edges_of(g, EdgeKind.COLLECTIVE)
    assert {d for _, d in edges_of(g, EdgeKind.LAUNCH)} == set(arrive.tolist())  # launches reach the arrivals
    assert_exact(a)
    # Rank 1 arrives 30 us later: rank 0's collective (which waits for it) ends 30 us later too.
    late = int(np.flatnonzero((g.tasks["name"].astype(str) == "aten::mul").to_numpy()
                              & (g.tasks["rank"].to_numpy() == 1))[0])
    r = replay(with_duration(g, late, g.tasks.at[late, "dur_ns"] + 30 * US))
    comm0 = int(comm[g.tasks.loc[comm, "rank"].to_numpy() == 0][0])
    assert r.end_ns[comm0] - a.replay.end_ns[comm0] == 30 * US


@covers(Flows)
def test_fwdbwd_flow_links_threads(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.op("aten::mm", 0, 10)
    tr.flow("fwdbwd", 5, "s", 0, MAIN_TID)
    tr.op("MmBackward0", 50, 10, tid=2)
    tr.flow("fwdbwd", 5, "f", 50, 2)
    a = analyze(tr.write(tmp_path / "t.json.gz"))
    g = a.graph
    fwd, bwd = task_named(g, "aten::mm"), task_named(g, "MmBackward0")
    assert (fwd, bwd) in edges_of(g, EdgeKind.FLOW)
    assert_exact(a)
    r = replay(with_duration(g, fwd, 30 * US))
    assert r.start_ns[bwd] - a.replay.start_ns[bwd] == 20 * US


@covers(LauncherAttribution)
def test_steps_phases_and_layers_are_attributed(tmp_path: Path) -> None:
    tr = KinetoTrace()
    for n, t0 in ((3, 0), (4, 100)):
        tr.step(n, t0, 90)
        tr.annotation("phase:prefill" if n == 3 else "phase:decode", t0 + 1, 80)
        tr.annotation("Attention", t0 + 2, 60)
        tr.op("aten::mm", t0 + 3, 20)
        tr.runtime("cudaLaunchKernel", t0 + 5, 5, corr=n)
        tr.gpu(f"gemm{n}", t0 + 12, 30, corr=n)
    a = analyze(tr.write(tmp_path / "t.json.gz"))
    t = a.graph.tasks
    for n, ph in ((3, "prefill"), (4, "decode")):
        k = task_named(a.graph, f"gemm{n}")
        assert (t.at[k, "step"], t.at[k, "phase"], t.at[k, "layer"], t.at[k, "op"]) == (n, ph, "Attention", "aten::mm")
    assert a.steps["step"].tolist() == [3, 4]
    # step 3 spans its own window; step 4 runs from step 3's completion (90 us) to its own (190 us)
    assert a.steps["measured_ns"].tolist() == [90 * US, 100 * US]


@covers(SingleStep)
def test_trace_without_steps_gets_one_step(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.runtime("cudaLaunchKernel", 0, 5, corr=1)
    tr.gpu("k", 10, 40, corr=1)
    a = analyze(tr.write(tmp_path / "t.json.gz"))
    assert a.steps[["step", "measured_ns", "predicted_ns"]].values.tolist() == [[0, 50 * US, 50 * US]]


@covers(LaunchEdges, SyncEdges)
def test_anomalies_are_counted_not_dropped(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.gpu("orphan_kernel", 0, 10, corr=99)                 # no launch in the window
    tr.runtime("cudaStreamSynchronize", 20, 1, corr=5)       # nothing launched before it
    tr.runtime("cudaLaunchKernel", 30, 5, corr=6)            # its kernel was not recorded
    g = analyze(tr.write(tmp_path / "t.json.gz")).graph
    assert g.report["gpu_tasks_without_launch"] == 1
    assert g.report["launch_calls_without_gpu_task"] == 1
    assert g.report["syncs_with_nothing_to_wait_for"] >= 1
    assert task_named(g, "orphan_kernel") >= 0


@covers(Flows, FlowWakesThread)
def test_a_flow_wakes_an_idle_thread(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.op("aten::mm", 0, 10)
    tr.flow("fwdbwd", 5, "s", 0, MAIN_TID)
    tr.op("autograd::engine::setup", 2, 3, tid=2)
    tr.op("MmBackward0", 50, 10, tid=2)
    tr.flow("fwdbwd", 5, "f", 50, 2)
    a = analyze(tr.write(tmp_path / "t.json.gz"))
    g = a.graph
    fwd, setup, bwd = task_named(g, "aten::mm"), task_named(g, "autograd::engine::setup"), task_named(g, "MmBackward0")
    thread = g.edges[g.edges["kind"] == int(EdgeKind.THREAD)]
    assert thread.loc[(thread["src"] == setup) & (thread["dst"] == bwd), "lat_ns"].tolist() == [0]
    assert_exact(a)
    r = replay(with_duration(g, fwd, 1 * US))  # the backward op follows its forward op, not the old idle gap
    assert a.replay.start_ns[bwd] - r.start_ns[bwd] == 9 * US


@covers(Flows, FlowWakesThread)
def test_a_flow_into_a_busy_thread_leaves_the_start_to_the_thread(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.op("aten::mm", 0, 10)
    tr.flow("fwdbwd", 5, "s", 0, MAIN_TID)
    tr.op("AddBackward0", 20, 25, tid=2)   # the autograd thread's previous op ends after the forward op
    tr.op("MmBackward0", 50, 10, tid=2)
    tr.flow("fwdbwd", 5, "f", 50, 2)
    a = analyze(tr.write(tmp_path / "t.json.gz"))
    g = a.graph
    fwd, prev, bwd = task_named(g, "aten::mm"), task_named(g, "AddBackward0"), task_named(g, "MmBackward0")
    flow = g.edges[(g.edges["kind"] == int(EdgeKind.FLOW)) & (g.edges["dst"] == bwd)]
    assert flow[["src", "lat_ns"]].values.tolist() == [[fwd, 0]]
    thread = g.edges[g.edges["kind"] == int(EdgeKind.THREAD)]
    assert thread.loc[(thread["src"] == prev) & (thread["dst"] == bwd), "lat_ns"].tolist() == [5 * US]
    assert g.report["flows_held_by_thread"] == 1
    assert_exact(a)
    r = replay(with_duration(g, prev, 5 * US))  # a faster previous backward op moves the next one up
    assert a.replay.start_ns[bwd] - r.start_ns[bwd] == 20 * US


@covers(ForkJoins, BurstGaps)
def test_a_burst_on_another_thread_forks_and_joins(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.op("forward", 0, 10)
    tr.op("optimizer", 100, 10)            # the main thread waited 90 us for thread 2's burst
    tr.op("bwd_a", 20, 20, tid=2)
    tr.op("bwd_b", 50, 30, tid=2)
    a = analyze(tr.write(tmp_path / "t.json.gz"))
    g = a.graph
    fwd, opt = task_named(g, "forward"), task_named(g, "optimizer")
    first, last = task_named(g, "bwd_a"), task_named(g, "bwd_b")
    assert {(fwd, first), (last, opt)} <= edges_of(g, EdgeKind.FLOW)
    assert g.report["thread_forks_joins"] == 1
    thread = g.edges[g.edges["kind"] == int(EdgeKind.THREAD)]
    assert thread.loc[(thread["src"] == fwd) & (thread["dst"] == opt), "lat_ns"].tolist() == [10 * US]
    assert_exact(a)
    r = replay(with_duration(g, last, 5 * US))  # a shorter burst: the main thread waits less
    assert a.replay.start_ns[opt] - r.start_ns[opt] == 25 * US


@covers(ForkJoins, BurstGaps)
def test_a_polling_thread_neither_forks_nor_joins(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.op("forward", 0, 10)
    tr.op("optimizer", 100, 10)
    tr.op("bwd_a", 20, 20, tid=2)
    tr.op("bwd_b", 50, 30, tid=2)
    tr.runtime("cudaEventQuery", 2, 1, corr=1, tid=3)               # a watchdog: polls, sleeps on a timer
    tr.runtime("cudaPointerGetAttributes", 45, 1, corr=2, tid=3)    # inside the main thread's gap
    tr.runtime("cudaEventQuery", 300, 1, corr=3, tid=3)             # its gap holds bwd_a and optimizer
    a = analyze(tr.write(tmp_path / "t.json.gz"))
    g = a.graph
    fwd, opt = task_named(g, "forward"), task_named(g, "optimizer")
    first, last = task_named(g, "bwd_a"), task_named(g, "bwd_b")
    polls = {task_named(g, "cudaEventQuery"), task_named(g, "cudaPointerGetAttributes"),
             task_named(g, "cudaEventQuery", 1)}
    flows = edges_of(g, EdgeKind.FLOW)
    assert flows == {(fwd, first), (last, opt)}
    assert (g.report["thread_forks_joins"], g.report["polling_threads"]) == (1, 1)
    thread = g.edges[g.edges["kind"] == int(EdgeKind.THREAD)]
    gaps = dict(zip(zip(thread["src"], thread["dst"]), thread["lat_ns"]))
    poll_a, poll_b, poll_c = sorted(polls, key=lambda t: g.tasks["measured_start_ns"].iloc[t])
    assert (gaps[(poll_a, poll_b)], gaps[(poll_b, poll_c)]) == (42 * US, 254 * US)  # its sleeps, as measured
    assert gaps[(fwd, opt)] == 10 * US
    assert_exact(a)
    r = replay(with_duration(g, last, 5 * US))  # nothing the poller did holds the main thread
    assert a.replay.start_ns[opt] - r.start_ns[opt] == 25 * US


@covers(StepWindows)
def test_tasks_outside_step_annotations_get_the_window_step(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.step(3, 0, 50)
    tr.step(4, 60, 50)
    tr.op("aten::mm", 5, 10)
    tr.gpu("orphan_kernel", 20, 5, corr=99)           # launched by nothing: step 3's window
    tr.op("DataLoader.__next__", 65, 10, tid=2)       # another thread: step 4's window
    g = analyze(tr.write(tmp_path / "t.json.gz")).graph
    step = g.tasks["step"]
    assert (step[task_named(g, "orphan_kernel")], step[task_named(g, "DataLoader.__next__")]) == (3, 4)


@covers(StepWindows)
def test_a_polling_threads_calls_complete_no_step(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.step(3, 0, 100)
    tr.op("aten::mm", 5, 90)
    tr.runtime("cudaEventQuery", 40, 1, corr=-1, tid=3)   # a watchdog: every call a query, on a timer
    tr.runtime("cudaEventQuery", 97, 1, corr=-1, tid=3)
    a = analyze(tr.write(tmp_path / "t.json.gz"))
    g = a.graph
    assert (g.tasks["step"].to_numpy()[g.tasks["name"].astype(str).to_numpy() == "cudaEventQuery"] == -1).all()
    assert_exact(a)
    faster = step_times(replay(with_duration(g, task_named(g, "aten::mm"), 40 * US)))
    assert faster["predicted_ns"].tolist() == [50 * US]  # the poller's call at 97 us does not hold the step


@covers(AnchorRoots)
def test_tasks_without_a_predecessor_are_anchored_at_their_origin(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.op("aten::mm", 0, 10)
    tr.op("worker", 30, 10, tid=2)
    a = analyze(tr.write(tmp_path / "t.json.gz"))
    g = a.graph
    (origin,) = np.flatnonzero(g.tasks["kind"].to_numpy() == int(TaskKind.ORIGIN))
    anchors = g.edges[g.edges["kind"] == int(EdgeKind.ANCHOR)]
    assert set(zip(anchors["dst"].tolist(), anchors["lat_ns"].tolist())) == {
        (task_named(g, "aten::mm"), 0), (task_named(g, "worker"), 30 * US)}
    assert (anchors["src"] == origin).all()
    indeg = np.bincount(g.edges["dst"].to_numpy(), minlength=g.num_tasks)
    assert (indeg[np.arange(g.num_tasks) != origin] > 0).all()
    assert_exact(a)


def test_every_declared_step_has_a_test() -> None:
    declared = {type(step) for step in RULES}
    assert declared - set(COVERED) == set(), "steps of RULES with no test here"
    assert set(COVERED) - declared == set(), "tests of steps RULES does not declare"


def test_the_declared_order_is_checked() -> None:
    check_order(RULES)
    with pytest.raises(ValueError, match="ThreadOrder runs before BlockingCallIssue"):
        check_order((ThreadOrder(), BlockingCallIssue()))
    with pytest.raises(ValueError, match="AnchorRoots runs last, but ThreadOrder follows it"):
        check_order((BlockingCallIssue(), AnchorRoots(), ThreadOrder()))
    with pytest.raises(ValueError, match="declared twice"):
        check_order((BlockingCallIssue(), BlockingCallIssue()))


def test_a_step_left_out_is_left_out(tmp_path: Path) -> None:
    """The pipeline is what RULES declares: without SyncWakeUps a waiting call keeps its measured wait."""
    tr = KinetoTrace()
    tr.runtime("cudaLaunchKernel", 0, 5, corr=1)
    tr.gpu("gemm", 10, 100, corr=1)
    tr.runtime("cudaStreamSynchronize", 10, 102, corr=2)
    trace = load_trace(tr.write(tmp_path / "t.json.gz"))
    full = build_graph(trace)
    partial = build_graph(trace, tuple(step for step in RULES if not isinstance(step, SyncWakeUps)))
    sync = task_named(full, "cudaStreamSynchronize")
    assert (full.tasks.at[sync, "dur_ns"], partial.tasks.at[sync, "dur_ns"]) == (2 * US, 102 * US)
    assert full.edges.equals(partial.edges)


def test_the_architecture_lists_the_steps_in_order() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("**The build pipeline**", 1)[1].split("\n\n**", 1)[0]
    listed = re.findall(r"^\d+\. `(\w+)`", section, flags=re.M)
    assert listed == [type(step).__name__ for step in RULES]


def test_build_state_is_freed_when_the_build_returns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No reference cycle keeps a build's state (its task table, lookups, memos) alive for the
    garbage collector to find later: it goes as soon as the graph is returned, before a replay
    allocates its own arrays."""
    import gc
    import weakref

    from whatif.depgraph import build as build_module
    tr = KinetoTrace()
    tr.step(0, 0, 130)
    tr.runtime("cudaLaunchKernel", 0, 5, corr=1)
    tr.gpu("gemm", 10, 100, corr=1)
    tr.runtime("cudaStreamSynchronize", 10, 102, corr=2)
    tr.cuda_sync("Stream Sync", 10, 102, corr=2, stream=7)
    trace = load_trace(tr.write(tmp_path / "t.json.gz"))
    states: list[weakref.ref] = []
    made = build_module.initial_state
    monkeypatch.setattr(build_module, "initial_state", lambda t: states.append(weakref.ref(s := made(t))) or s)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        graph = build_graph(trace)
        assert states and states[0]() is None
    finally:
        if was_enabled:
            gc.enable()
    assert len(graph.edges)
