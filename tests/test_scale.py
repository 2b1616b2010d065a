"""Rank-parallel analysis (issue 15 items 2-3): a job's ranks read, built and replayed in rank
groups that exchange only their collectives' arrivals give, task for task, the one-process
replay's times; on synthetic jobs (no ../shared needed), on generated jobs and on the shared
multi-rank folders."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from tracegen import KinetoTrace

from whatif.cli import main
from whatif.core.errors import TraceError
from whatif.depgraph.build import build_graph
from whatif.depgraph.graph import GraphError, TaskGraph
from whatif.jobgen import JobOptions, generate_job
from whatif.predictors.replay import ReplayEngine, replay
from whatif.predictors.steps import step_times
from whatif.scale.group import task_times
from whatif.scale.job import Backend, ParallelOptions, _ranks_per_group, partition, replay_job
from whatif.tracer.trace import load_trace

KEY = ["rank", "kind", "event_in_rank", "nth"]


def synthetic_job(folder: Path, ranks: int = 4, steps: int = 3, late: int = 2) -> Path:
    """``ranks`` ranks, ``steps`` steps each: a GEMM whose length differs by rank, an all-reduce
    on every rank, then an all-gather within each pair of ranks, then another GEMM; rank ``late``
    computes 50 us longer before the all-reduce, so the others wait for it."""
    folder.mkdir()
    for rank in range(ranks):
        clock = 1000 * rank  # each rank's own clock
        tr = KinetoTrace(rank=rank, world_size=ranks)
        for s in range(steps):
            t0 = clock + s * 1000
            corr = 10 * s
            tr.step(s, t0, 900)
            gemm_us = 100 + 10 * rank + (50 if rank == late else 0)
            tr.runtime("cudaLaunchKernel", t0 + 5, 3, corr=corr + 1)
            tr.gpu("gemm_a", t0 + 10, gemm_us, corr=corr + 1)
            tr.runtime("cudaLaunchKernel", t0 + 9, 3, corr=corr + 2)
            arrive = t0 + 10 + gemm_us
            last = t0 + 10 + 100 + 10 * (ranks - 1) + (50 if late < ranks else 0)
            tr.gpu("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*)", arrive, last + 80 - arrive, corr=corr + 2,
                   stream=20, **{"Collective name": "allreduce", "Process Group Name": "0", "Group size": ranks})
            pair = rank // 2
            tr.runtime("cudaLaunchKernel", t0 + 12, 3, corr=corr + 3)
            tr.gpu("ncclDevKernel_AllGather_RING_LL(ncclDevComm*)", last + 80, 40, corr=corr + 3, stream=20,
                   **{"Collective name": "_allgather_base", "Process Group Name": f"pair{pair}", "Group size": 2})
            tr.runtime("cudaLaunchKernel", t0 + 15, 3, corr=corr + 4)
            tr.gpu("gemm_b", last + 130, 60, corr=corr + 4)
            tr.runtime("cudaDeviceSynchronize", t0 + 20, last + 200 - (t0 + 20), corr=corr + 5)
        tr.write(folder / f"rank{rank}.pt.trace.json.gz")
    return folder


def one_process(folder: Path) -> tuple[TaskGraph, pd.DataFrame]:
    graph = build_graph(load_trace(folder))
    r = replay(graph)
    return graph, task_times(graph, r.start_ns, r.end_ns)


def assert_same_times(expected: pd.DataFrame, got: pd.DataFrame | None) -> None:
    assert got is not None
    m = expected.merge(got, on=KEY, how="outer", suffixes=("_one", "_par"), indicator=True)
    assert (m["_merge"] == "both").all(), m[m["_merge"] != "both"].head()
    assert (m["start_ns_one"] == m["start_ns_par"]).all()
    assert (m["end_ns_one"] == m["end_ns_par"]).all()


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_job(tmp_path_factory.mktemp("scale") / "job")


@pytest.mark.parametrize("groups", [1, 2, 3, 4])
def test_rank_groups_replay_every_task_as_one_process(synthetic: Path, groups: int) -> None:
    graph, expected = one_process(synthetic)
    assert graph.report["collectives_matched"] == 3 * (1 + 2)
    job = replay_job(synthetic, ParallelOptions(groups=groups, backend=Backend.INLINE), with_tasks=True)
    assert_same_times(expected, job.task_times)
    assert job.tasks == len(graph.tasks) and job.edges == len(graph.edges)
    assert job.collectives == 9 and len(job.groups) == groups
    pd.testing.assert_frame_equal(job.steps, step_times(replay(graph)).sort_values(["rank", "step"])
                                  .reset_index(drop=True))


def test_the_waits_are_computed_across_groups(synthetic: Path) -> None:
    """Rank 2's longer GEMM makes every other rank wait at the all-reduce: with one rank per
    group, that wait crosses processes, and a rank with a shorter GEMM waits longer."""
    job = replay_job(synthetic, ParallelOptions(groups=4, backend=Backend.INLINE), with_tasks=True)
    t = job.task_times
    assert t is not None
    arrive = t[t["kind"] == 8].groupby("rank")["end_ns"].min()
    barrier = t[t["kind"] == 9]["start_ns"].min()
    assert barrier == arrive.max() == arrive[2]
    assert (barrier - arrive[0]) > (barrier - arrive[1]) > (barrier - arrive[3]) > 0
    assert job.rounds >= 3 * 2  # every step: the all-reduce, then the pairs' all-gathers


def test_processes_give_the_inline_result(synthetic: Path) -> None:
    a = replay_job(synthetic, ParallelOptions(groups=2, backend=Backend.INLINE), with_tasks=True)
    b = replay_job(synthetic, ParallelOptions(groups=2, backend=Backend.PROCESSES), with_tasks=True)
    assert a.task_times is not None and b.task_times is not None
    pd.testing.assert_frame_equal(a.task_times, b.task_times)
    assert all(g.peak_mib > 0 for g in b.groups)


def test_generated_job_task_for_task(shared_traces: Path, tmp_path: Path) -> None:
    generate_job(shared_traces / "hta" / "nccl_data_a100_rank0of2.json.gz", tmp_path / "job",
                 JobOptions(ranks=6, jitter_ns=20_000, clock_skew_ns=5_000_000, seed=7), stragglers={4: 200_000})
    _, expected = one_process(tmp_path / "job")
    job = replay_job(tmp_path / "job", ParallelOptions(groups=4, backend=Backend.PROCESSES), with_tasks=True)
    assert job.collectives == 21 and job.rounds == 21
    assert_same_times(expected, job.task_times)


SHARED_FOLDERS = ["hta/sampled_world128", "hta/trace_compare", "tracelens/hf_h100", "tracelens/hf_mi300"]


def test_every_shared_folder_is_checked(shared_traces: Path) -> None:
    folders = sorted(str(p.relative_to(shared_traces)) for p in shared_traces.glob("*/*") if p.is_dir())
    assert folders == sorted(SHARED_FOLDERS)


@pytest.mark.parametrize("folder", SHARED_FOLDERS)
def test_shared_folders_task_for_task(shared_traces: Path, folder: str) -> None:
    """Each shared folder replays the same task for task, or is refused with the same line
    (``trace_compare`` holds two runs that both claim rank 1)."""
    options = ParallelOptions(groups=2, backend=Backend.INLINE)
    try:
        _, expected = one_process(shared_traces / folder)
    except TraceError as refused:
        with pytest.raises(TraceError) as also:
            replay_job(shared_traces / folder, options)
        assert str(also.value) == str(refused)
        return
    assert_same_times(expected, replay_job(shared_traces / folder, options, with_tasks=True).task_times)


def test_partition_is_contiguous_balanced_and_never_empty(tmp_path: Path) -> None:
    paths = []
    for i, size in enumerate([10, 10, 10, 10, 1000, 10]):
        p = tmp_path / f"rank{i}.json"
        p.write_bytes(b"x" * size)
        paths.append(p)
    chunks = partition(paths, 3)
    assert [p for c in chunks for p in c] == paths
    assert all(chunks) and len(chunks) == 3
    assert [paths[4]] in chunks  # the big file alone
    assert partition(paths[:2], 5) == [[paths[0]], [paths[1]]]
    with pytest.raises(ValueError):
        partition(paths, 0)


def test_a_rank_split_over_two_groups_is_refused() -> None:
    chunks = [[Path("a"), Path("b")], [Path("c")]]
    assert _ranks_per_group(Path("job"), chunks, [0, 1, 2]) == [[0, 1], [2]]
    with pytest.raises(TraceError, match=r"rank 1's files .* fall in rank groups 0 and 1"):
        _ranks_per_group(Path("job"), chunks, [0, 1, 1])


def _chain() -> TaskGraph:
    tasks = pd.DataFrame({"kind": [0, 2, 9, 4], "resource": [0, 1, 2, 3], "rank": [0, 0, 0, 0],
                          "dur_ns": [0, 5, 0, 100], "measured_start_ns": [1000, 1000, 1000, 1010]})
    edges = pd.DataFrame({"src": [0, 1, 2], "dst": [1, 2, 3], "lat_ns": [0, 0, 0], "kind": [0, 0, 0]})
    return TaskGraph(tasks=tasks, edges=edges, resources=pd.DataFrame({"ordered": [False, True, False, True]}),
                     steps=pd.DataFrame())


def test_engine_holds_a_barrier_until_released() -> None:
    engine = ReplayEngine(_chain(), held=np.array([2]))
    reached = engine.run()
    assert [(h.task, h.ready_ns) for h in reached] == [(2, 1005)]
    with pytest.raises(GraphError, match="cycle"):
        engine.result()  # the barrier was never released
    with pytest.raises(GraphError, match="not a held task"):
        engine.release(1, 2000)
    engine.release(2, 1005)
    assert engine.run() == []
    assert engine.result().end_ns.tolist() == replay(_chain()).end_ns.tolist()
    with pytest.raises(GraphError, match="not a held task"):
        engine.release(2, 3000)  # released twice


def test_a_barrier_occupies_no_resource() -> None:
    """Two barriers on the same (unordered) barrier resource: instants, neither delays the other."""
    tasks = pd.DataFrame({"kind": [0, 2, 9, 9], "resource": [0, 1, 2, 2], "rank": [0, 0, 0, 0],
                          "dur_ns": [0, 50, 0, 0], "measured_start_ns": [0, 0, 0, 0]})
    edges = pd.DataFrame({"src": [0, 0, 1], "dst": [1, 3, 2], "lat_ns": [0, 10, 0], "kind": [0, 0, 0]})
    r = replay(TaskGraph(tasks=tasks, edges=edges, resources=pd.DataFrame({"ordered": [False, True, False]}),
                         steps=pd.DataFrame()))
    assert r.start_ns.tolist() == [0, 0, 50, 10]


def test_job_command_writes_the_steps_analyze_writes(synthetic: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["job", str(synthetic), "--groups", "2", "--inline", "--json", str(tmp_path / "j.json")]) == 0
    out = capsys.readouterr().out
    assert "4 ranks in 2 rank groups" in out and "9 collectives matched" in out
    assert main(["analyze", str(synthetic), "-q", "--json", str(tmp_path / "a.json")]) == 0
    job, one = json.loads((tmp_path / "j.json").read_text()), json.loads((tmp_path / "a.json").read_text())
    assert job["schema"] == "whatif.job" and job["steps"] == one["steps"] and job["tasks"] == one["tasks"]
    assert main(["job", str(synthetic), "--groups", "2", "-q", "--json", str(tmp_path / "k.json")]) == 0
    assert (tmp_path / "k.json").read_bytes() == (tmp_path / "j.json").read_bytes()


def test_job_counts_the_steps_analyze_counts(synthetic: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The per-rank means leave the warm-up step out as ``analyze`` does (until 2026-11-28 they
    averaged it in), and ``--include-warmup`` counts it in both."""
    assert main(["job", str(synthetic), "--inline"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if re.match(r"^\s*│?\s*\d+\s*│\s*\d+\s*│", line)]
    assert len(rows) == 4 and {r[2] for r in rows} == {"2"}       # rank │ steps: 2 of 3 counted
    assert "excluded from means: step 0 of ranks 0-3 (warm-up" in out and "--include-warmup" in out
    for flags in ([], ["--include-warmup"]):
        assert main(["job", str(synthetic), "--inline", "-q", "--json", str(tmp_path / "j.json"), *flags]) == 0
        assert main(["analyze", str(synthetic), "-q", "--json", str(tmp_path / "a.json"), *flags]) == 0
        job, one = json.loads((tmp_path / "j.json").read_text()), json.loads((tmp_path / "a.json").read_text())
        assert job["steps"] == one["steps"]
        assert any("excluded" in s for s in job["steps"]) == (not flags)
    assert main(["job", str(synthetic), "--inline", "--include-warmup"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if re.match(r"^\s*│?\s*\d+\s*│\s*\d+\s*│", line)]
    assert {r[2] for r in rows} == {"3"} and "excluded from means" not in out


@pytest.mark.slow
def test_ray_actors_give_the_same_result(synthetic: Path) -> None:
    pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'whatif[ray]')")
    a = replay_job(synthetic, ParallelOptions(groups=4, backend=Backend.INLINE), with_tasks=True)
    b = replay_job(synthetic, ParallelOptions(groups=4, backend=Backend.RAY), with_tasks=True)  # more than the cores
    assert a.task_times is not None and b.task_times is not None
    pd.testing.assert_frame_equal(a.task_times, b.task_times)


def test_ray_missing_is_one_line(synthetic: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    assert main(["job", str(synthetic), "--ray"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["whatif: --ray needs Ray: pip install 'whatif[ray]'"]
