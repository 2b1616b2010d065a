"""Dashboard units (fast, no browser): path guard, uploads, forms and TOML, timeline views,
figures, page bodies, and that nothing outside the allowed folders is readable through the app."""
from __future__ import annotations

import base64
import doctest
import gzip
import importlib
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("dash", reason="the dashboard needs the ui extra (pip install -e '.[ui]')")
pytest.importorskip("dash_cytoscape", reason="the dashboard needs the ui extra (pip install -e '.[ui]')")

from whatif import figures
from whatif.dashboard import timeline as tl
from whatif.dashboard.forms import (
    params_from_form,
    spec_from_toml,
    spec_to_toml,
    transform_form,
)
from whatif.dashboard.guard import AccessDenied, PathGuard
from whatif.dashboard.state import RunStore, discover
from whatif.dashboard.uploads import UploadError, save_trace
from whatif.serving import Workload
from whatif.transforms.scenario import ScenarioError, build_transform, load_scenario

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "llm_serve"


@pytest.mark.parametrize("module", ["guard", "forms", "layout", "timeline", "uploads"])
def test_doctests(module: str) -> None:
    mod = importlib.import_module(f"whatif.dashboard.{module}")
    assert doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE).failed == 0


def test_guard_allows_roots_and_refuses_escapes(tmp_path: Path) -> None:
    inside = tmp_path / "runs" / "a"
    inside.mkdir(parents=True)
    (tmp_path / "secret.txt").write_text("x")
    guard = PathGuard.for_paths([inside])
    assert guard.check(inside) == inside.resolve()
    assert guard.allows(tmp_path / "runs" / "b")          # the parent of a given path is allowed
    assert not guard.allows(tmp_path / "secret.txt")      # the grandparent is not
    assert not guard.allows(inside / ".." / ".." / "secret.txt")
    assert not guard.allows("/etc/passwd")
    (inside / "link").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(AccessDenied, match="outside"):
        guard.check(inside / "link")                      # a symlink cannot lead out
    with pytest.raises(AccessDenied):
        guard.check("a\x00b")


def test_store_refuses_paths_outside(tmp_path: Path) -> None:
    store = RunStore([SAMPLE], upload_dir=tmp_path / "up")
    with pytest.raises(AccessDenied):
        store.add_path("/etc")
    with pytest.raises(AccessDenied):
        store.add_path(str(SAMPLE / ".." / ".." / "README.md"))
    assert store.guard.allows(tmp_path / "up" / "x.json")
    assert [r.label for r in store.runs.values()] == ["sample_traces/llm_serve"]


def test_a_file_that_is_not_a_trace_is_refused_when_added(tmp_path: Path) -> None:
    """Add refuses a file whose name no trace reader takes (it became a run whose Overview said
    "not a trace file" under a spinner): one line naming the accepted suffixes, no run added."""
    notes = tmp_path / "notpy.txt"
    notes.write_text("hello")
    store = RunStore([SAMPLE], upload_dir=tmp_path)       # the upload folder: allowed
    with pytest.raises(ValueError) as refused:
        store.add_path(notes)
    assert str(refused.value) == f"{notes}: not a trace file (accepted: *.json, *.json.gz)"
    assert [r.label for r in store.runs.values()] == ["sample_traces/llm_serve"] and discover(notes) == []
    store.close()


def test_run_labels_name_the_file_and_stay_unique(tmp_path: Path) -> None:
    """A run is labelled by its folder and name; an upload by its name (its folder is a content
    hash); a name taken gets " (2)"."""
    raw = json.dumps({"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2, "pid": 1, "tid": 1}]})
    mine = tmp_path / "runs" / "Qwen.json"
    mine.parent.mkdir()
    mine.write_text(raw)
    store = RunStore([mine], upload_dir=tmp_path / "up")
    first = save_trace(store.upload_dir, "Qwen.json", _data_url(raw.encode()), 1 << 20)
    second = save_trace(store.upload_dir, "Qwen.json", _data_url(raw.replace('"a"', '"b"').encode()), 1 << 20)
    assert first.parent != second.parent                   # two uploads of one name: two hash folders
    labels = [store.add_path(p)[0].label for p in (first, second, first)]
    assert [r.label for r in store.runs.values()] == ["runs/Qwen.json", "Qwen.json", "Qwen.json (2)"]
    assert labels == ["Qwen.json", "Qwen.json (2)", "Qwen.json"]  # added again: the same run
    store.close()


def test_the_device_of_a_run_says_cpu_only_without_gpu_activity(tmp_path: Path) -> None:
    """The Runs row and the Overview card: the GPU's name; "GPU unknown" for GPU work whose trace
    does not name the GPU; "CPU only" for a trace without GPU activity (the sample)."""
    from _llm_tracegen import llm_trace
    from plotly.utils import PlotlyJSONEncoder

    from whatif.dashboard.pages import overview
    from whatif.dashboard.state import set_store

    named = llm_trace(tmp_path / "named.json", layers=1)
    unnamed = llm_trace(tmp_path / "unnamed.json", layers=1, gpu_name="")
    store = RunStore([SAMPLE, named, unnamed], upload_dir=tmp_path / "up")
    set_store(store)
    devices = {r.label: (r.device, r.summary()["device"]) for r in store.runs.values()}
    assert devices == {"sample_traces/llm_serve": ("CPU only", "CPU only"),
                       f"{tmp_path.name}/named.json": ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"),
                       f"{tmp_path.name}/unnamed.json": ("GPU unknown", "GPU unknown")}
    page = json.dumps(overview.body(next(iter(store.runs))), cls=PlotlyJSONEncoder)
    assert '{"children": "CPU only", "id": "ov-device"' in page and "GPU unknown" not in page
    store.close()


def test_discover_runs(tmp_path: Path) -> None:
    assert discover(SAMPLE) == [SAMPLE]
    assert discover(REPO / "sample_traces") == [REPO / "sample_traces" / "dit_serve", SAMPLE]
    folder = tmp_path / "ranks"
    folder.mkdir()
    for k in range(2):
        (folder / f"rank{k}.json").write_text("{}")
    assert discover(folder) == [folder]                    # per-rank files: one run
    (tmp_path / "a.json").write_text("{}")
    assert discover(tmp_path) == [tmp_path / "a.json", folder]


def _data_url(data: bytes) -> str:
    return "data:application/octet-stream;base64," + base64.b64encode(data).decode()


def test_upload_checks(tmp_path: Path) -> None:
    raw = json.dumps({"traceEvents": []}).encode()
    p = save_trace(tmp_path, "../../evil name.json", _data_url(raw), 1 << 20)
    assert p.parent.parent == tmp_path and p.name == "evil_name.json" and p.read_bytes() == raw
    assert save_trace(tmp_path, "t.json.gz", _data_url(gzip.compress(raw)), 1 << 20).suffix == ".gz"
    with pytest.raises(UploadError, match="limit"):
        save_trace(tmp_path, "big.json", _data_url(b"{" + b" " * 2000 + b"}"), 1000)
    with pytest.raises(UploadError, match="only trace files"):
        save_trace(tmp_path, "model.pkl", _data_url(b"\x80\x04"), 1 << 20)
    with pytest.raises(UploadError, match="not gzip"):
        save_trace(tmp_path, "t.json.gz", _data_url(raw), 1 << 20)
    with pytest.raises(UploadError, match="not JSON"):
        save_trace(tmp_path, "t.json", _data_url(b"\x80\x04pickle"), 1 << 20)


def _bomb(inflated_mib: int, member_mib: int = 64) -> bytes:
    """A gzip trace that inflates to ``inflated_mib`` MiB: a JSON object with one long string,
    as gzip members of ``member_mib`` MiB of spaces (each compresses ~1000x)."""
    member = gzip.compress(b" " * (member_mib << 20), compresslevel=9, mtime=0)
    return (gzip.compress(b'{"traceEvents": [], "pad": "', mtime=0) + member * (inflated_mib // member_mib)
            + gzip.compress(b'"}', mtime=0))


def test_upload_route_streams_to_disk_and_refuses_in_one_line(tmp_path: Path) -> None:
    from whatif.dashboard.app import create_app
    from whatif.dashboard.uploads import UPLOAD_ROUTE

    store = RunStore([], upload_dir=tmp_path / "up", max_upload_bytes=4 << 20)
    client = create_app(store=store).server.test_client()
    good = gzip.compress(json.dumps({"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2, "pid": 1,
                                                      "tid": 1}]}).encode())
    r = client.post(f"{UPLOAD_ROUTE}?name=../x/t.json.gz", data=good)
    assert r.status_code == 200 and r.json["run"] in store.runs and r.json["label"] == "t.json.gz"
    refusals = {"model.pkl": (b"\x80\x04", 400, "only trace files"),
                "notpy.txt": (b"hello", 400, "only trace files"),
                "t.json": (b"\x80pickle", 400, "not JSON"),
                "big.json": (b"{" + b" " * (5 << 20) + b"}", 413, "limit of 4 MiB"),
                "bomb.json.gz": (_bomb(64, member_mib=16), 413, "inflates to more than"),
                "cut.json.gz": (good[:-12], 400, "truncated gzip"),
                "empty.json": (b"", 400, "empty upload")}
    for name, (body, status, message) in refusals.items():
        r = client.post(f"{UPLOAD_ROUTE}?name={name}", data=body)
        assert (r.status_code, message in r.json["error"], "\n" in r.json["error"]) == (status, True, False), name
    stored = sorted(str(p.relative_to(store.upload_dir)) for p in store.upload_dir.rglob("*") if p.is_file())
    assert len(stored) == 1 and stored[0].endswith("/t.json.gz")     # no temp file left by a refusal
    r = client.post("/_dash-update-component", data=b"{" + b" " * (5 << 20) + b"}",
                    content_type="application/json")
    assert r.status_code == 413      # a callback body is capped far below the upload limit


def test_the_upload_folder_the_store_made_is_removed_on_close(tmp_path: Path) -> None:
    made = RunStore([])
    given = RunStore([], upload_dir=tmp_path / "mine")
    (made.upload_dir / "x").write_text("upload")
    made.close()
    given.close()
    assert not made.upload_dir.exists() and given.upload_dir.exists()


def test_scale_form_round_trip(tmp_path: Path) -> None:
    ids = json.dumps([c.to_plotly_json() for c in transform_form("scale")], default=str)
    assert "'select.kind'" in ids and "'factor'" in ids
    params = params_from_form("scale", {"factor": 0.5, "select.kind": "kernel", "select.name": "gemm",
                                        "select.step": "1, 2", "select.layer": ""})
    assert params == {"factor": 0.5, "select": {"kind": "kernel", "name": "gemm", "step": [1, 2]}}
    spec = {"name": "faster gemm", "transform": [{"name": "scale", **params}]}
    path = tmp_path / "s.toml"
    path.write_text(spec_to_toml(spec))
    scenario = load_scenario(path)                          # the CLI's reader accepts what we write
    assert scenario.name == "faster gemm" and scenario.transforms[0].factor == 0.5
    assert spec_from_toml(path.read_text()) == spec


def test_number_boxes_send_what_was_typed() -> None:
    """A number the browser finds out of range or off-step (its min, max, step) reaches Dash as
    empty, and an empty field takes the default: scale with factor -1 was added as a x1.0 no-op.
    The boxes carry no bounds, so the value typed reaches the scenario loader, which refuses it
    naming the field; a box left empty takes the default."""
    for name in ("tensor_parallel", "gpu", "scale"):
        boxes = [c for c in _controls(transform_form(name)) if getattr(c, "type", None) == "number"]
        assert boxes and all((getattr(c, "min", None), getattr(c, "max", None), c.step) == (None, None, "any")
                             for c in boxes), name
    degree = params_from_form("tensor_parallel", {"degree": 2.5})
    assert degree == {"degree": 2.5}                        # not truncated to 2
    with pytest.raises(ScenarioError, match=r"tensor_parallel\.degree: expected int, got float 2\.5"):
        build_transform("tensor_parallel", degree)
    with pytest.raises(ScenarioError, match=r"scale\.factor: must be a finite number >= 0, got -1\.0"):
        build_transform("scale", params_from_form("scale", {"factor": -1}))
    assert params_from_form("scale", {"factor": None}) == {}   # left empty: the default applies


def _controls(tree: list) -> list:
    out = []
    for node in tree:
        out.append(node)
        kids = getattr(node, "children", None)
        out.extend(_controls(kids if isinstance(kids, list) else [kids] if kids is not None else []))
    return out


def _timeline(n: int = 20000) -> tuple[list[tl.Timeline], tl.Lanes]:
    rng = np.random.default_rng(0)
    start = np.arange(n) * 500               # lane i % 3: one task every 1.5 us, none overlapping
    dur = rng.integers(100, 1400, n)
    line = tl.Timeline(name="measured", graph=None, ids=np.arange(n), lane=np.arange(n) % 3, start=start,
                       end=start + dur, category=rng.integers(0, 3, n).astype(np.int8))
    lanes = tl.Lanes(resources=np.arange(3), labels=["a", "b", "c"], lane_of=np.arange(3))
    return [line], lanes


def test_timeline_bins_conserve_busy_time() -> None:
    lines, lanes = _timeline()
    v = tl.view(lines, lanes, (0, 10_005_000), bins=100)
    p = v["panels"][0]
    assert p["mode"] == "bins" and len(p["z"]) == 3 and len(p["z"][0]) == 100
    width = 10_005_000 / 100
    busy = np.asarray(p["z"]).sum() * width
    total = (lines[0].end - lines[0].start).sum()
    assert abs(busy - total) / total < 1e-3   # z is rounded to 0.1 %
    fig = figures.timeline_figure(v)
    assert [type(t).__name__ for t in fig.data] == ["Heatmap"]


def test_timeline_exact_when_zoomed_in() -> None:
    lines, lanes = _timeline()
    lines[0].graph = type("G", (), {"tasks": pd.DataFrame({"name": [f"k{i}" for i in range(20000)]})})()
    v = tl.view(lines, lanes, (1_000_000, 1_100_000))
    p = v["panels"][0]
    assert p["mode"] == "exact" and 0 < p["tasks"] < tl.MAX_EXACT
    fig = figures.timeline_figure(v)
    assert all(type(t).__name__ == "Scattergl" for t in fig.data)
    assert sum(len(t.x) for t in fig.data) == 4 * p["tasks"]
    assert tl.window_from_relayout({"xaxis2.range[0]": 1.0, "xaxis2.range[1]": 2.5}, None) == (1_000_000, 2_500_000)
    assert tl.window_from_relayout({"xaxis.autorange": True}, (1, 2)) is None


def test_sample_run_views() -> None:
    from whatif.dashboard.app import create_app
    from whatif.dashboard.pages import compare, overview, timeline
    from whatif.dashboard.state import get_store

    create_app([SAMPLE])
    run = next(iter(get_store().runs.values()))
    assert "ov-fidelity" in json.dumps(overview.body(run.id).to_plotly_json(), default=str)
    lines, _lanes, _ = timeline.timelines(run, None)
    assert len(lines[0].ids) == len(lines[1].ids) > 20000
    spec = {"name": "half cpu", "transform": [{"name": "scale", "factor": 0.5, "select": {"kind": "cpu"}}]}
    quick = run.quick_document(spec)
    full = run.prediction([spec]).scenarios[0]
    assert quick.speedup == full.speedup > 1.2
    assert quick.waterfall == full.waterfall and quick.changes == full.changes
    run.scenarios["half cpu"] = spec
    assert "cmp-table" in json.dumps(compare.body(run.id, ["half cpu"]).to_plotly_json(), default=str)
    # serving: the sample run carries its log; the recorded workload (20 req/s x 8) is the default
    assert compare.default_workload(run).rate == 20.0 and compare.default_workload(run).num_requests == 8
    serving = compare.serving_body(run.id, ["half cpu"], 10.0)
    rows = serving.children[1].data
    assert [r["scenario"] for r in rows] == ["baseline", "half cpu"]
    assert rows[1]["TTFT mean ms"] < rows[0]["TTFT mean ms"] and rows[1]["TPOT mean ms"] < rows[0]["TPOT mean ms"]
    assert len(serving.children[2].figure.data) == 4  # mean and p99 curve per scenario
    with pytest.raises(ValueError, match="rate"):
        compare.serving_body(run.id, ["half cpu"], 0)


def test_overview_shows_the_ops_on_the_roofline() -> None:
    """A GPU run's Overview holds the Ops page's top rows by GPU time; a CPU-only run says it has none."""
    from whatif.dashboard.app import create_app
    from whatif.dashboard.pages import overview
    from whatif.dashboard.state import get_store
    from whatif.ops import ops_table

    gpu_run = Path(__file__).resolve().parents[1] / "sample_traces" / "gpu" / "pairs" / "p1_precision-before-r1"
    create_app([gpu_run, SAMPLE])
    runs = {Path(r.path).name: r for r in get_store().runs.values()}
    page = overview.body(runs[gpu_run.name].id).to_plotly_json()
    found = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if node.get("props", {}).get("id") == "ov-roofline":
                found.append(node["props"]["data"])
            for v in node.values():
                walk(v)
        elif isinstance(node, (list, tuple)):
            for v in node:
                walk(v)
        elif hasattr(node, "to_plotly_json"):
            walk(node.to_plotly_json())
    walk(page)
    expected = ops_table(runs[gpu_run.name].analysis.trace).rows[:overview.ROOFLINE_ROWS]
    assert found and [r["count"] for r in found[0]] == [r.count for r in expected]
    assert expected[0].achieved_tflops is not None  # recorded with shapes
    assert found[0][0]["TFLOP/s"] == round(expected[0].achieved_tflops, 2)
    cpu = json.dumps(overview.body(runs[SAMPLE.name].id).to_plotly_json(), default=str)
    assert "no ops to price" in cpu and "ov-roofline" not in cpu


def test_app_serves_no_file_outside(tmp_path: Path) -> None:
    """Through HTTP: static routes do not leak files, and adding a path outside is refused in the page."""
    from whatif.dashboard.app import create_app

    app = create_app([SAMPLE])
    client = app.server.test_client()
    for url in ("/assets/../../README.md", "/assets/%2e%2e/%2e%2e/README.md", "/_dash-component-suites/../README.md",
                "/../README.md", "/assets//etc/passwd"):
        r = client.get(url)
        assert r.status_code == 404 or b"whatif" not in r.data[:2000] or b"<!DOCTYPE html>" in r.data[:50], url
        assert b"A profiler and what-if analyzer" not in r.data and b"root:" not in r.data, url
    outputs = (("runs-table", "data"), ("runs-table", "tooltip_data"), ("run", "options"), ("run", "value"),
               ("runs-poll", "disabled"), ("runs-message", "children"), ("runs-error", "children"))
    body = {"output": ".." + "...".join(f"{i}.{p}" for i, p in outputs) + "..",
            "outputs": [{"id": i, "property": p} for i, p in outputs],
            "inputs": [{"id": "runs-add", "property": "n_clicks", "value": 1},
                       {"id": "runs-analyze", "property": "n_clicks", "value": None}],
            "state": [{"id": "runs-path", "property": "value", "value": "/etc"},
                      {"id": "run", "property": "value", "value": None}],
            "changedPropIds": ["runs-add.n_clicks"]}
    r = client.post("/_dash-update-component", json=body)
    assert r.status_code == 200
    shown = r.json["response"]["runs-error"]["children"]["props"]["children"]
    assert shown.startswith("/etc: outside the folders") and "AccessDenied" not in shown  # no exception class
    assert len(app.server.view_functions) > 0
    assert os.path.exists("/etc")  # the refusal was the guard's, not a missing folder


def test_compare_serving_without_a_log_says_so(tmp_path: Path) -> None:
    import shutil

    from whatif.dashboard.app import create_app
    from whatif.dashboard.pages import compare
    from whatif.dashboard.state import get_store

    trace = tmp_path / "rank0.pt.trace.json.gz"
    shutil.copy(SAMPLE / "rank0.pt.trace.json.gz", trace)
    create_app([trace])
    run = next(iter(get_store().runs.values()))
    assert run.serving_log is None and compare.default_workload(run) is None
    assert "meta.json" in compare.NO_LOG and compare.serving_body(run.id, [], None).children is None


def test_documents_are_keyed_by_the_steps_counted() -> None:
    """The "count warm-up and partial steps" box: each cached document is the one of its options."""
    from whatif.core.steps import COUNT_DEFAULT, StepOptions
    from whatif.dashboard.app import create_app
    from whatif.dashboard.pages import overview
    from whatif.dashboard.state import get_store, step_options

    every = StepOptions(include_warmup=True, include_partial=True)
    assert step_options(["all"]) == every and step_options([]) == step_options(None) == COUNT_DEFAULT
    create_app([SAMPLE])
    run = next(iter(get_store().runs.values()))
    steady, all_steps = run.document(), run.document(every)
    assert run.doc is steady and run.document(COUNT_DEFAULT) is steady and run.document(every) is all_steps
    assert all_steps.mean_measured_step_ns > steady.mean_measured_step_ns  # the 68.7 ms warm-up step counts
    assert [s.step for s in steady.steps if s.excluded] == [0, 160] and not any(s.excluded for s in all_steps.steps)
    page = json.dumps(overview.body(run.id, ["all"]).to_plotly_json(), default=str)
    assert f"{all_steps.mean_measured_step_ns / 1e6:,.3f}" in page and "excluded from means" not in page
    assert "excluded from means" in json.dumps(overview.body(run.id, []).to_plotly_json(), default=str)
    spec = {"name": "half cpu", "transform": [{"name": "scale", "factor": 0.5, "select": {"kind": "cpu"}}]}
    a, b = run.prediction([spec]), run.prediction([spec], every)
    assert a.scenarios[0].speedup != b.scenarios[0].speedup
    assert run.result(spec, every).graph is run.result(spec).graph  # one prediction, counted two ways
    assert run.quick_document(spec, every).speedup == b.scenarios[0].speedup
    steady_fit, all_fit = (run.serving([], Workload(rate=10.0, num_requests=4), [10.0], o)[0] for o in (COUNT_DEFAULT,
                                                                                                        every))
    assert steady_fit.scenarios[0].iteration_model.phases["prefill"].n == 7
    assert all_fit.scenarios[0].iteration_model.phases["prefill"].n == 8


def test_suggest_page_ranks_what_the_cli_ranks(tmp_path: Path) -> None:
    import sys
    sys.path.insert(0, str(REPO / "tests"))
    from _llm_tracegen import llm_trace

    from whatif.dashboard.app import create_app
    from whatif.dashboard.pages import suggest as page
    from whatif.dashboard.state import get_store
    from whatif.suggest import suggest

    trace = llm_trace(tmp_path / "t.json.gz", layers=2, steps=3, batch=8, kv_tokens=512)
    create_app([trace])
    run = next(iter(get_store().runs.values()))
    doc = page.document(run.id)
    assert page.document(run.id) is doc                       # cached per run and step options
    assert doc.suggestions == suggest(trace).suggestions
    rows = page.rows(doc)
    assert [r["optimization"] for r in rows] == [s.setting for s in doc.suggestions]
    assert rows[0]["speedup"] == round(doc.suggestions[0].headline.speedup, 4)
    html_text = json.dumps(page.body(run.id).to_plotly_json(), default=str)
    assert "sg-table" in html_text and "needs collective kernels" in html_text


def test_wsgi_entry_point_serves_the_paths_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setenv("WHATIF_DASHBOARD_PATHS", str(SAMPLE))
    monkeypatch.setenv("WHATIF_DASHBOARD_MAX_UPLOAD_MB", "5")
    sys.modules.pop("whatif.dashboard.wsgi", None)
    wsgi = importlib.import_module("whatif.dashboard.wsgi")
    from whatif.dashboard.state import get_store

    assert wsgi.server is wsgi.app.server and wsgi.server.test_client().get("/").status_code == 200
    store = get_store()
    assert [r.label for r in store.runs.values()] == ["sample_traces/llm_serve"] and store.max_upload_bytes == 5 << 20
    monkeypatch.setenv("WHATIF_DASHBOARD_MAX_UPLOAD_MB", "lots")
    sys.modules.pop("whatif.dashboard.wsgi", None)
    from whatif.core.errors import WhatifError

    with pytest.raises(WhatifError, match="WHATIF_DASHBOARD_MAX_UPLOAD_MB='lots'"):
        importlib.import_module("whatif.dashboard.wsgi")
    sys.modules.pop("whatif.dashboard.wsgi", None)
