"""Properties of the replay: it computes starts (never copies them), responds to durations on
the critical path exactly and ignores slack, and is deterministic."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from tracegen import KinetoTrace

from whatif.api import analyze
from whatif.depgraph.build import build_graph
from whatif.depgraph.graph import TaskKind
from whatif.predictors.replay import replay
from whatif.predictors.steps import critical_path, step_times
from whatif.tracer import load_trace

US = 1000


def gpu_bound_trace(durations_us: list[int], launch_gap_us: int) -> KinetoTrace:
    """One step: kernels launched every ``launch_gap_us``, each longer than the gap (queued)."""
    tr = KinetoTrace()
    t_gpu = 20
    for i, d in enumerate(durations_us):
        tr.runtime("cudaLaunchKernel", 5 + i * launch_gap_us, 3, corr=i + 1)
        tr.gpu(f"k{i}", t_gpu, d, corr=i + 1)
        t_gpu += d + 1
    tr.runtime("cudaDeviceSynchronize", 5 + len(durations_us) * launch_gap_us, t_gpu - 4 - len(durations_us)
               * launch_gap_us, corr=10_000)
    tr.step(0, 0, t_gpu + 2)
    return tr


durations = st.lists(st.integers(min_value=20, max_value=500), min_size=2, max_size=12)


@settings(max_examples=25, deadline=None)
@given(durations=durations, which=st.integers(min_value=0, max_value=11))
def test_doubling_a_critical_kernel_adds_its_duration(tmp_path_factory, durations: list[int], which: int) -> None:
    which %= len(durations)
    path = gpu_bound_trace(durations, launch_gap_us=8).write(tmp_path_factory.mktemp("t") / "t.json.gz")
    a = analyze(path)
    assert (a.steps["predicted_ns"] == a.steps["measured_ns"]).all()
    g = a.graph.copy()
    k = int(np.flatnonzero(g.tasks["name"].astype(str).to_numpy() == f"k{which}")[0])
    assert k in critical_path(a.replay, 0).tasks
    g.tasks.loc[k, "dur_ns"] *= 2
    longer = step_times(replay(g))["predicted_ns"].iat[0]
    assert longer - a.steps["predicted_ns"].iat[0] == durations[which] * US


def test_kernel_with_slack_does_not_move_a_cpu_bound_step(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.step(0, 0, 500)
    tr.runtime("cudaLaunchKernel", 10, 5, corr=1)
    tr.gpu("short", 20, 10, corr=1)
    tr.op("aten::python_heavy", 20, 470)   # the CPU is the bottleneck
    a = analyze(tr.write(tmp_path / "t.json.gz"))
    g = a.graph.copy()
    k = int(np.flatnonzero(g.tasks["name"].astype(str).to_numpy() == "short")[0])
    assert k not in critical_path(a.replay, 0).tasks
    g.tasks.loc[k, "dur_ns"] *= 3
    assert step_times(replay(g))["predicted_ns"].iat[0] == a.steps["predicted_ns"].iat[0]
    assert critical_path(a.replay, 0).breakdown_ns["cpu"] > 0.9 * a.steps["predicted_ns"].iat[0]


def test_starts_are_computed_not_copied(tmp_path: Path) -> None:
    a = analyze(gpu_bound_trace([50, 80, 30], 8).write(tmp_path / "t.json.gz"))
    g = a.graph.copy()
    not_origin = g.tasks["kind"].to_numpy() != int(TaskKind.ORIGIN)
    g.tasks.loc[not_origin, "measured_start_ns"] = 0   # replay must not read these
    r = replay(g)
    assert np.array_equal(r.start_ns, a.replay.start_ns)
    assert np.array_equal(r.end_ns, a.replay.end_ns)


def test_critical_path_breakdown_sums_to_the_step(tmp_path: Path) -> None:
    a = analyze(gpu_bound_trace([50, 80, 30], 8).write(tmp_path / "t.json.gz"))
    cp = critical_path(a.replay, 0)
    assert cp.length_ns == a.steps["predicted_ns"].iat[0]
    assert cp.breakdown_ns["gpu"] == (50 + 80 + 30) * US


def test_build_and_replay_are_deterministic(tmp_path: Path) -> None:
    path = gpu_bound_trace([50, 80, 30, 70], 8).write(tmp_path / "t.json.gz")
    g1, g2 = build_graph(load_trace(path)), build_graph(load_trace(path))
    assert g1.edges.equals(g2.edges)
    r1, r2 = replay(g1), replay(g2)
    assert np.array_equal(r1.start_ns, r2.start_ns) and np.array_equal(r1.end_ns, r2.end_ns)
