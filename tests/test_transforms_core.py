"""Primitives, selection, registry, scenario files and `whatif predict`."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import orjson
import pytest
from tracegen import KinetoTrace

from whatif.api import analyze, predict
from whatif.cli import main
from whatif.depgraph.graph import EdgeKind, GraphError, TaskKind
from whatif.predictors.replay import replay
from whatif.predictors.steps import step_times
from whatif.transforms import edit, registry
from whatif.transforms.base import Transform, TransformContext, TransformError
from whatif.transforms.generic import Remove, Scale
from whatif.transforms.scenario import ScenarioError, load_scenario
from whatif.transforms.select import SelectionError, Selector, select

US = 1000


@pytest.fixture()
def launch_bound(tmp_path: Path):
    """One step, CPU-bound: ops and launches on the thread, short kernels on one stream."""
    tr = KinetoTrace()
    tr.step(0, 0, 200)
    for i in range(4):
        t0 = 10 + 45 * i
        tr.op("aten::relu", t0, 20)
        tr.runtime("cudaLaunchKernel", t0 + 22, 5, corr=i + 1)
        tr.gpu(f"relu_kernel_{i}", t0 + 30, 8, corr=i + 1)
    return analyze(tr.write(tmp_path / "t.json.gz"))


def predicted(graph) -> int:
    return int(step_times(replay(graph))["predicted_ns"].sum())


def assert_launches_in_program_order(graph) -> None:
    """Each launch call's THREAD-edge successors lead to the next launch of the program (by
    measured start) before any other launch, and the replay starts them in that order."""
    calls = select(graph, name="cudaLaunchKernel")
    calls = [int(c) for c in calls[np.argsort(graph.tasks["measured_start_ns"].to_numpy()[calls], kind="stable")]]
    thread = graph.edges[graph.edges["kind"] == int(EdgeKind.THREAD)]
    assert not thread["src"].duplicated().any()  # one thread: one chain, each task has one successor
    successor = dict(zip(thread["src"].astype(int), thread["dst"].astype(int)))
    launches = set(calls)

    def next_launch(task: int) -> int | None:
        task = successor.get(task)
        while task is not None and task not in launches:
            task = successor.get(task)
        return task

    assert len(calls) >= 2
    assert [next_launch(a) for a in calls[:-1]] == calls[1:]
    starts = replay(graph).start_ns[calls]
    assert np.all(np.diff(starts) > 0), starts


def test_primitives_never_mutate_and_log(launch_bound) -> None:
    g = launch_bound.graph
    tasks_before, edges_before = g.tasks.copy(), g.edges.copy()
    ops = select(g, name="aten::relu")
    for h in (edit.scale(g, ops, 0.5, reason="r"), edit.set_duration(g, ops, 1, reason="r"),
              edit.remove(g, ops, reason="r"), edit.move(g, select(g, kind="kernel"), 0, reason="r")):
        assert len(h.changes) == len(g.changes) + 1 and h.changes[-1].reason == "r"
    assert g.tasks.equals(tasks_before) and g.edges.equals(edges_before)
    assert g.changes == []


def test_remove_keeps_order_and_gaps(launch_bound) -> None:
    g = launch_bound.graph
    ops = select(g, name="aten::relu")
    h = edit.remove(g, ops, reason="ops vanish")
    assert len(h.tasks) == len(g.tasks) - 4
    assert h.changes[-1].before_ns == 4 * 20 * US
    # the launches keep their program order: walking the thread's chain of THREAD edges from each
    # launch reaches the next launch (in measured order) before any other launch ...
    assert_launches_in_program_order(h)
    # ... and the step loses at most the removed CPU time
    before, after = predicted(g), predicted(h)
    assert 0 < before - after <= 4 * 20 * US


def test_remove_refuses_markers(launch_bound) -> None:
    g = launch_bound.graph
    markers = np.flatnonzero(g.tasks["kind"].to_numpy() == int(TaskKind.MARKER))
    with pytest.raises(GraphError, match="markers"):
        edit.remove(g, markers[:1], reason="no")


def test_remove_a_long_run_bridges_in_closed_form(launch_bound) -> None:
    g = launch_bound.graph
    cpu = select(g, kind="cpu")  # every op and call on the thread: runs of removed tasks
    h = edit.remove(g, cpu, reason="all CPU work")
    r = replay(h)
    assert np.all(r.end_ns >= r.start_ns)
    assert predicted(h) <= predicted(g)


def test_insert_splices_into_a_thread(launch_bound) -> None:
    g = launch_bound.graph
    first_op = int(select(g, name="aten::relu")[0])
    h, new = edit.insert(g, name="extra", kind=TaskKind.CPU_WORK, resource=int(g.tasks.at[first_op, "resource"]),
                         dur_ns=30 * US, splice_after=first_op, reason="more CPU work")
    assert new == len(g.tasks) and h.tasks.at[new, "name"] == "extra"
    r = replay(h)
    assert r.start_ns[new] == r.end_ns[first_op] + h.edges[(h.edges["dst"] == new)]["lat_ns"].iat[0]
    assert predicted(h) - predicted(g) == 30 * US  # the thread is the critical path


def test_fuse_and_duplicate(launch_bound) -> None:
    g = launch_bound.graph
    kernels = select(g, kind="kernel")
    h = edit.fuse(g, kernels[:2], 10 * US, name="fused", reason="fuse two")
    assert len(h.tasks) == len(g.tasks) - 2  # one kernel and one launch call gone
    assert (h.tasks["name"].astype(str) == "fused").sum() == 1
    d, new_ids = edit.duplicate(g, kernels[:1], reason="copy")
    assert len(d.tasks) == len(g.tasks) + 1 and len(new_ids) == 1
    assert (d.edges["dst"] == new_ids[0]).any()


def test_add_and_remove_edges(launch_bound) -> None:
    g = launch_bound.graph
    k = select(g, kind="kernel")
    h = edit.add_edges(g, [k[0]], [k[3]], lat_ns=500 * US, reason="artificial wait")
    assert predicted(h) > predicted(g)
    mask = (h.edges["kind"] == int(EdgeKind.FLOW)).to_numpy()
    assert predicted(edit.remove_edges(h, mask, reason="undo")) == predicted(g)


def test_selection_errors(launch_bound) -> None:
    g = launch_bound.graph
    with pytest.raises(SelectionError, match="unknown task kind"):
        select(g, kind="kernal")
    with pytest.raises(SelectionError, match="bad pattern"):
        select(g, name="(")
    with pytest.raises(SelectionError, match="unknown kernel class"):
        select(g, kernel_class="gemmm")
    assert len(select(g, kernel_class="elementwise")) == 4


def test_generic_transforms_and_empty_selection(launch_bound) -> None:
    g = launch_bound.graph
    ctx = TransformContext()
    faster = Scale(select=Selector(name="aten::relu"), factor=0.5).apply(g, ctx)
    assert predicted(faster) < predicted(g)
    with pytest.raises(TransformError, match="matches no task"):
        Remove(select=Selector(name="nothing-like-this")).apply(g, ctx)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_scenario_file_round_trip(tmp_path: Path, launch_bound) -> None:
    path = write(tmp_path / "faster.toml", """
name = "faster relu"

[[transform]]
name = "scale"
factor = 0.5
select = { name = "aten::relu" }

[[transform]]
name = "set_duration"
dur_us = 1
select = { kind = "kernel" }
""")
    sc = load_scenario(path)
    assert sc.name == "faster relu" and [t.name for t in sc.transforms] == ["scale", "set_duration"]
    graphs = sc.apply(launch_bound.graph)
    assert len(graphs) == 2 and len(graphs[-1].changes) == 2


@pytest.mark.parametrize("text, message", [
    ('[[transform]]\nname = "scael"\n', ":1: unknown transform 'scael'"),
    ('[[transform]]\nname = "scale"\nfactor = "fast"\n', ":1: scale.factor: expected float"),
    ('[[transform]]\nname = "scale"\nfactr = 2\n', ":1: scale: unknown parameter 'factr'"),
    ('name = "x"\n\n[[transform]]\nname = "scale"\nselect = { kindd = "kernel" }\n',
     ":3: scale.select: unknown selection key"),
    ('[[transform]]\nfactor = 2\n', ":1: a [[transform]] needs name"),
    ("name = 'x'\n", "no [[transform]] tables"),
    ("[[transform]\n", "not valid TOML"),
    ('[[transform]]\nname = "gpu"\ndevice = "H100_SXM"\nhost_speed = -3\n',
     ":1: gpu.host_speed: must be a finite number > 0, got -3"),
    ('name = "x"\n[[transform]]\nname = "tensor_parallel"\ndegree = 0\n',
     ":2: tensor_parallel.degree: must be an integer >= 1 and <= 131072, got 0"),
    ('[[transform]]\nname = "cuda_graph"\nkernel_gap_us = -1.0\n',
     ":1: cuda_graph.kernel_gap_us: must be a finite number >= 0"),
])
def test_scenario_errors_name_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path / "bad.toml", text)
    with pytest.raises(ScenarioError) as exc:
        load_scenario(path)
    assert str(path) in str(exc.value) and message in str(exc.value)


def test_every_numeric_parameter_declares_its_bounds() -> None:
    """A number a transform takes says, once, in its field, what it may be: the scenario loader, the
    transform's own construction, ``whatif transforms`` and the dashboard's form all read it there."""
    from whatif.transforms.registry import _without_none
    unbounded = [f"{n}.{p.name}" for n in registry.names() for p in registry.parameters(n)
                 if _without_none(p.type) in (int, float) and p.choices is None and p.bounds is None]
    assert unbounded == []


@pytest.mark.parametrize("name, params, message", [
    ("gpu", {"device": "H100_SXM", "host_speed": 0.0}, "gpu: host_speed must be a finite number > 0, got 0.0"),
    ("scale", {"factor": -1.0}, "scale: factor must be a finite number >= 0, got -1.0"),
    ("batch", {"factor": float("nan")}, "batch: factor must be a finite number > 0"),
    ("pipeline_parallel", {"micro_batches": -2}, "pipeline_parallel: micro_batches must be an integer >= 0"),
])
def test_a_transform_built_in_code_refuses_out_of_bounds_values(name, params, message) -> None:
    with pytest.raises(TransformError, match=re.escape(message)):
        registry.get(name)(**params)


def test_predict_cli_json(tmp_path: Path, launch_bound, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = write(tmp_path / "s.toml", '[[transform]]\nname = "remove"\nselect = { name = "aten::relu" }\n')
    trace = launch_bound.trace.ranks[0].path
    out = tmp_path / "p.json"
    assert main(["predict", str(trace), "-s", str(scenario), "--json", str(out)]) == 0
    doc = orjson.loads(out.read_bytes())
    assert (doc["schema"], doc["version"]) == ("whatif.prediction", 1)
    (sc,) = doc["scenarios"]
    assert sc["name"] == "s" and sc["speedup"] > 1
    assert sc["steps"][0]["predicted_ns"] < doc["baseline"]["steps"][0]["predicted_ns"]
    assert sc["changes"][0]["tasks"] == 4 and len(sc["waterfall"]) == 1
    assert "Predicted step time per scenario" in capsys.readouterr().out


def test_predict_cli_bad_scenario_exits_2(tmp_path: Path, launch_bound, capsys: pytest.CaptureFixture[str]) -> None:
    bad = write(tmp_path / "bad.toml", '[[transform]]\nname = "nope"\n')
    assert main(["predict", str(launch_bound.trace.ranks[0].path), "-s", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.toml:1: unknown transform 'nope'" in err[0]


def test_transforms_cli_lists_parameters(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each parameter: its type and bounds, then its default (or ``required``); a maximum that only
    guards against overflow is left out of the listing, not out of a refusal."""
    from whatif.core.limits import MAX_DURATION_NS
    monkeypatch.setenv("COLUMNS", "250")  # one table row per line
    assert main(["transforms"]) == 0
    out = capsys.readouterr().out
    assert "factor: float, a finite number > 0 and <= 4096; default: 2.0" in out          # batch
    assert "kernel_gap_us: float, a finite number >= 0; default: 1.0" in out              # cuda_graph
    assert "workers: int, an integer >= 1 and <= 4096; required" in out                   # dataloader
    guard = MAX_DURATION_NS // 1000                                                      # cuda_graph's us maximum
    assert str(guard) not in out
    with pytest.raises(TransformError, match=re.escape(f"must be a finite number >= 0 and <= {guard}")):
        registry.get("cuda_graph")(kernel_gap_us=1e16)


def test_entry_point_transforms_are_registered(monkeypatch: pytest.MonkeyPatch, transform_registry) -> None:
    from dataclasses import dataclass

    @dataclass
    class Nothing(Transform):
        name = "third_party_nothing"
        description = "does nothing"

        def match(self, graph, ctx):  # noqa: ANN001, ANN202
            return np.empty(0, dtype=np.int64)

        def apply(self, graph, ctx):  # noqa: ANN001, ANN202
            return graph.copy()

    class FakeEntryPoint:
        name, value = "nothing", "pkg:Nothing"

        def load(self) -> type:
            return Nothing

    from whatif.core import plugins

    monkeypatch.setattr(registry, "_loaded", False)
    monkeypatch.setattr(plugins, "entry_points", lambda group: [FakeEntryPoint()] if group == "whatif.transforms"
                        else [])
    assert "third_party_nothing" in registry.names()


def test_predict_api_accepts_transform_objects(launch_bound) -> None:
    p = predict(launch_bound, [Scale(select=Selector(kind="cpu"), factor=0.0)])
    assert step_times(p.scenarios[0].replay)["predicted_ns"].sum() < launch_bound.steps["predicted_ns"].sum()


def test_scenario_names_are_distinct(tmp_path: Path, launch_bound, capsys: pytest.CaptureFixture[str]) -> None:
    """Results are keyed by scenario name: a name given twice, or ``baseline``, is refused before
    the trace is read, naming the files."""
    trace = str(launch_bound.trace.ranks[0].path)
    a = write(tmp_path / "a.toml", 'name = "fast"\n[[transform]]\nname = "scale"\nfactor = 0.5\n')
    (tmp_path / "sub").mkdir()
    b = write(tmp_path / "sub" / "b.toml", 'name = "fast"\n[[transform]]\nname = "scale"\nfactor = 0.25\n')
    base = write(tmp_path / "base.toml", 'name = "baseline"\n[[transform]]\nname = "scale"\n')
    for files, message in (([a, b], f"{b}: scenario name 'fast' is also that of {a}"),
                           ([a, a], f"{a}: this scenario is given twice"),
                           ([base], "scenario name 'baseline' is also that of the recorded trace")):
        argv = ["predict", trace] + [x for f in files for x in ("-s", str(f))]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0]
    with pytest.raises(ScenarioError, match="is also that of"):
        predict(trace, [a, b])
