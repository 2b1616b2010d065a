"""The Graph page's critical path: each segment's time is what it adds to the step, so a CPU
thread blocked in a synchronize while the GPU work it waits for is on the path is not counted
twice (the dashboard audit of 2026-11-28 found a 14.1 ms cudaDeviceSynchronize drawn beside the
GPU segments it waited for, the segments summing to 65.4 ms of a 49.4 ms step)."""
from __future__ import annotations

from _llm_tracegen import llm_trace

from whatif.api import analyze
from whatif.dashboard.derive import critical_path_elements
from whatif.predictors.steps import critical_path


def test_segment_times_sum_to_the_step_and_a_sync_adds_only_its_tail(tmp_path) -> None:
    a = analyze(llm_trace(tmp_path / "t.json.gz", layers=2, steps=2))
    t = a.graph.tasks
    for row in range(len(a.graph.steps)):
        path = critical_path(a.replay, row)
        nodes = [e["data"] for e in critical_path_elements(a.replay, row, max_nodes=len(path.tasks))
                 if "source" not in e["data"]]
        assert len(nodes) == len(path.tasks)
        assert abs(sum(n["time_us"] for n in nodes) * 1e3 - path.length_ns) <= len(nodes)   # us to 3 decimals
        names = t["name"].astype(str).to_numpy()[path.tasks]
        syncs = [i for i, n in enumerate(names) if n == "cudaDeviceSynchronize"]
        assert syncs, "the step ends on its synchronize"
        for i in syncs:
            waited = int(a.replay.end_ns[path.tasks[i]] - a.replay.start_ns[path.tasks[i]])
            added = int(a.replay.end_ns[path.tasks[i]] - a.replay.end_ns[path.tasks[i - 1]])
            assert nodes[i]["time_us"] * 1e3 == added < waited
            assert f"{added / 1e3:,.1f} us on the path" in nodes[i]["label"]


def test_merged_segments_keep_the_sum(tmp_path) -> None:
    a = analyze(llm_trace(tmp_path / "t.json.gz", layers=4, steps=1))
    path = critical_path(a.replay, 0)
    nodes = [e["data"] for e in critical_path_elements(a.replay, 0, max_nodes=5) if "source" not in e["data"]]
    assert len(nodes) == 5 < len(path.tasks)
    assert abs(sum(n["time_us"] for n in nodes) * 1e3 - path.length_ns) <= 5
