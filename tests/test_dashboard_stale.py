"""A result is shown only with the state that produced it (fast, no browser: each callback is
called through the app's HTTP endpoint as the browser would). A change of run empties the
Compare, Suggest and What-if results; an error empties the result it invalidates; an edit of the
scenario clears the builder's old error and saved note; the Graph says a missing task once; the
Runs page drops "analysing every run" once nothing is pending; Suggest says when nothing applies."""
from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

dash = pytest.importorskip("dash", reason="the dashboard needs the ui extra (pip install -e '.[ui]')")
pytest.importorskip("dash_cytoscape", reason="the dashboard needs the ui extra (pip install -e '.[ui]')")

from whatif.core.steps import COUNT_DEFAULT  # noqa: E402
from whatif.dashboard.app import create_app  # noqa: E402
from whatif.dashboard.pages import builder, suggest  # noqa: E402
from whatif.dashboard.pages.compare import NO_SCENARIO  # noqa: E402
from whatif.dashboard.state import RunStore, set_store  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "llm_serve"
HALF_CPU = {"name": "half cpu", "transform": [{"name": "scale", "factor": 0.5, "select": {"kind": "cpu"}}]}
NO_UPDATE = object()
"""What :func:`call` reads for an output the callback left as it was."""


class App:
    """The dashboard on a store's runs (the fixture's: the sample and a copy of its trace; ``a``, the
    first, ``b``, the last), called as the browser would."""

    def __init__(self, store: RunStore) -> None:
        self.store = store
        self.dash = create_app(store=store)
        self.client = self.dash.server.test_client()
        ids = list(store.runs)
        self.a, self.b = ids[0], ids[-1]  # one run: both the same

    def call(self, first_output: str, values: dict[str, Any], changed: str) -> dict[str, Any]:
        """The outputs (``"id.property"``: value) of the callback whose first output is
        ``first_output`` and that ``changed`` fires, with its inputs and states from ``values``
        (absent: None); :data:`NO_UPDATE` for the outputs it left as they were."""
        found = [(k, v) for k, v in self.dash.callback_map.items()
                 if k.strip(".").split("...")[0].split("@")[0] == first_output
                 and changed in (f"{d['id']}.{d['property']}" for d in v["inputs"])]
        assert found, f"no callback of {first_output} listens to {changed}"
        set_store(self.store)  # the dashboard's store is one global: another test's App may have replaced it
        key, cb = found[0]
        outputs = [dict(zip(("id", "property"), o.split(".", 1))) for o in key.strip(".").split("...")]
        body = {"output": key, "outputs": outputs if key.startswith("..") else outputs[0],
                "inputs": [_value(d, values) for d in cb["inputs"]],
                "state": [_value(d, values) for d in cb["state"]], "changedPropIds": [changed]}
        r = self.client.post("/_dash-update-component", json=body)
        assert r.status_code in (200, 204), r.get_data(as_text=True)
        response = json.loads(r.data)["response"] if r.status_code == 200 else {}
        return {f"{o['id']}.{o['property'].split('@')[0]}":
                response.get(o["id"], {}).get(o["property"].split("@")[0], NO_UPDATE) for o in outputs}


def _value(dep: dict[str, str], values: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
    if dep["id"].startswith("{"):  # a pattern-matching state: one entry per control
        return list(values.get(dep["id"], []))
    return {**dep, "value": values.get(f"{dep['id']}.{dep['property']}")}


def _text(component: Any) -> str:
    return json.dumps(component, default=str)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    copy = tmp_path_factory.mktemp("other") / "other.pt.trace.json.gz"
    shutil.copy(SAMPLE / "rank0.pt.trace.json.gz", copy)
    store = RunStore([SAMPLE, copy])
    yield App(store)
    store.close()


def test_a_run_switch_empties_the_builder_prediction(app: App) -> None:
    predict = {"run.value": app.a, "wb-spec.data": HALF_CPU, "wb-predict.n_clicks": 1}
    shown = app.call("wb-result.children", predict, "wb-predict.n_clicks")
    assert "wb-speedup" in _text(shown["wb-result.children"]) and shown["wb-last.data"]["transform"]
    switched = app.call("wb-result.children", {**predict, "run.value": app.b, "wb-last.data": shown["wb-last.data"]},
                        "run.value")
    assert switched["wb-result.children"]["props"]["children"] == builder.PROMPT
    assert switched["wb-last.data"] is None and switched["wb-error.children"] is None
    assert app.call("wb-critical.children", {"wb-last.data": None, "run.value": app.b}, "wb-last.data") == {
        "wb-critical.children": None, "wb-critical-error.children": None}


def test_count_all_repredicts_only_a_prediction_shown(app: App) -> None:
    values = {"run.value": app.a, "wb-spec.data": HALF_CPU, "wb-predict.n_clicks": 3, "count-all.value": ["all"]}
    assert app.call("wb-result.children", values, "count-all.value")["wb-last.data"] is None
    again = app.call("wb-result.children", {**values, "wb-last.data": HALF_CPU}, "count-all.value")
    assert "wb-speedup" in _text(again["wb-result.children"])


def test_a_failed_prediction_empties_the_old_one(app: App) -> None:
    """Clear, then Predict: the error, and neither the old speedup nor its critical path."""
    failed = app.call("wb-result.children", {"run.value": app.a, "wb-spec.data": builder.EMPTY,
                                             "wb-predict.n_clicks": 2, "wb-last.data": HALF_CPU},
                      "wb-predict.n_clicks")
    assert "no transforms" in _text(failed["wb-error.children"])
    assert failed["wb-result.children"] is None and failed["wb-last.data"] is None


def test_an_edit_clears_the_old_error_and_saved_note(app: App) -> None:
    form = [{"id": {"type": "wb-param", "name": "factor"}, "property": "value", "value": 0.5}]
    values = {'{"name":["ALL"],"type":"wb-param"}': form, "wb-transform.value": "scale", "wb-add.n_clicks": 1,
              "wb-spec.data": builder.EMPTY, "run.value": app.a}
    added = app.call("wb-spec.data", values, "wb-add.n_clicks")
    assert added["wb-spec.data"]["transform"] == [{"name": "scale", "factor": 0.5}]
    assert added["wb-saved.children"] is None and added["wb-save-error.children"] is None
    assert added["wb-spec-error.children"] is None


def test_a_refused_edit_changes_nothing(app: App) -> None:
    form = [{"id": {"type": "wb-param", "name": "factor"}, "property": "value", "value": -1}]
    refused = app.call("wb-spec.data", {'{"name":["ALL"],"type":"wb-param"}': form, "wb-transform.value": "scale",
                                        "wb-add.n_clicks": 1, "wb-spec.data": builder.EMPTY}, "wb-add.n_clicks")
    assert "scale.factor: must be a finite number >= 0, got -1.0" in _text(refused["wb-spec-error.children"])
    assert refused["wb-spec.data"] is NO_UPDATE and refused["wb-saved.children"] is NO_UPDATE


def test_a_run_switch_empties_compare(app: App) -> None:
    app.store.runs[app.a].scenarios["half cpu"] = HALF_CPU
    pressed = {"run.value": app.a, "cmp-run.n_clicks": 1, "cmp-scenarios.value": ["half cpu"]}
    shown = app.call("cmp-body.children", pressed, "cmp-run.n_clicks")
    assert "cmp-table" in _text(shown["cmp-body.children"])
    switched = {**pressed, "run.value": app.b, "cmp-scenarios.value": []}
    assert app.call("cmp-body.children", switched, "run.value")["cmp-body.children"] is None
    assert app.call("cmp-serving-body.children", switched, "run.value")["cmp-serving-body.children"] is None
    menu = app.call("cmp-scenarios.options", switched, "run.value")
    assert menu == {"cmp-scenarios.options": [], "cmp-scenarios.value": [], "cmp-run.n_clicks": None,
                    "cmp-none.children": "no scenario saved yet: save one in the What-if builder"}
    rate = {**switched, "cmp-run.n_clicks": None, "cmp-rate.value": 10.0}  # serving_defaults' rate, after
    assert app.call("cmp-serving-body.children", rate, "cmp-rate.value")["cmp-serving-body.children"] is None
    missing = app.call("cmp-body.children", {**pressed, "cmp-scenarios.value": ["gone"]}, "cmp-run.n_clicks")
    assert "no scenario 'gone'" in _text(missing["cmp-error.children"]) and missing["cmp-body.children"] is None


def test_a_run_switch_empties_suggest(app: App) -> None:
    suggest.document(app.a)
    shown = app.call("sg-body.children", {"sg-run.n_clicks": 1, "run.value": app.a}, "sg-run.n_clicks")
    assert "sg-best" in _text(shown["sg-body.children"])
    for changed in ("run.value", "count-all.value"):
        assert app.call("sg-body.children", {"sg-run.n_clicks": 1, "run.value": app.b}, changed) == {
            "sg-body.children": None, "sg-poll.disabled": True, "sg-waiting.data": None, "sg-error.children": None}


def test_suggest_says_when_nothing_applies(app: App) -> None:
    """The CPU-only sample (no GPU kernels, no collectives): a line, as other pages say "No … in
    this run", rather than a table of headers only."""
    assert not suggest.document(app.a).suggestions
    page = _text(suggest.body(app.a).to_plotly_json())
    assert "No optimization applies to this run" in page and "sg-table" not in page
    assert "needs GPU kernels" in page                  # the reasons stay


def test_the_graph_says_a_missing_task_once_and_draws_nothing(app: App) -> None:
    values = {"run.value": app.a, "gr-mode.value": "task", "gr-task.value": 999999, "gr-depth.value": 2}
    drawn = app.call("gr-cyto.elements", values, "gr-task.value")
    assert "task 999999 does not exist" in _text(drawn["gr-error.children"])
    assert drawn["gr-cyto.elements"] == [] and drawn["gr-info.children"] is None
    assert app.call("gr-details.children", values, "gr-task.value") == {"gr-details.children": None}


def test_runs_drops_analysing_every_run_once_nothing_is_pending(app: App) -> None:
    for run in app.store.runs.values():
        run.analysis  # noqa: B018 - analysed: nothing pending
    pressed = app.call("runs-table.data", {"runs-analyze.n_clicks": 1, "run.value": app.a}, "runs-analyze.n_clicks")
    message = pressed["runs-message.children"]
    assert message.startswith("analysing every run")
    tick = {"run.value": app.a, "runs-message.children": message}
    assert app.call("runs-table.data", tick, "runs-poll.n_intervals")["runs-message.children"] is None
    added = {**tick, "runs-message.children": "added other.pt.trace.json.gz"}
    assert app.call("runs-table.data", added, "runs-poll.n_intervals")["runs-message.children"] is NO_UPDATE


def test_a_trace_that_fails_shows_its_error_once_and_stops_polling(tmp_path: Path) -> None:
    """Add a file that is named a trace but is not valid JSON: the Runs table says so in the run's
    status, in one line, and the poll stops (it failed 4 times a second, for ever, each failure
    logging a longer traceback); the Overview shows the reader's line, no exception class."""
    copy, bad = tmp_path / "other.pt.trace.json.gz", tmp_path / "bad3.json"
    shutil.copy(SAMPLE / "rank0.pt.trace.json.gz", copy)
    bad.write_text("{bad\n")
    store = RunStore([SAMPLE, copy])
    app = App(store)
    added = app.call("runs-table.data", {"runs-add.n_clicks": 1, "runs-path.value": str(bad), "run.value": app.a},
                     "runs-add.n_clicks")
    run_id = added["run.value"]
    assert added["runs-poll.disabled"] is False and added["runs-error.children"] is None
    with pytest.raises(Exception, match="not valid JSON"):   # the reader's error, whatever its class
        store.jobs.wait(("analysis", run_id))
    tick = {"run.value": run_id, "runs-message.children": added["runs-message.children"]}
    for _ in range(3):                                        # every tick answers; the first stops the poll
        after = app.call("runs-table.data", tick, "runs-poll.n_intervals")
        assert after["runs-poll.disabled"] is True
    status = next(r["status"] for r in after["runs-table.data"] if r["id"] == run_id)
    assert status.startswith(f"error: {bad}: not valid JSON") and "\n" not in status
    assert after["runs-message.children"] is NO_UPDATE       # "added bad3.json" stays
    again = app.call("runs-table.data", {"runs-analyze.n_clicks": 1, "run.value": run_id}, "runs-analyze.n_clicks")
    assert again["runs-error.children"] is None              # Analyze all with a failed run: no error box
    app.call("ov-body.children", {"run.value": run_id}, "run.value")           # starts the Overview's job
    with pytest.raises(Exception, match="not valid JSON"):
        store.jobs.wait(("document", run_id, COUNT_DEFAULT))
    overview = app.call("ov-body.children", {"run.value": run_id}, "run.value")
    shown = _text(overview["ov-error.children"])
    assert f"{bad}: not valid JSON" in shown and "TraceError" not in shown and overview["ov-poll.disabled"] is True
    store.close()


def test_compare_without_a_scenario_says_so_and_shows_nothing(tmp_path: Path) -> None:
    """Compare pressed on a run with a serving log and no scenario: one plain line (no exception
    class), no tables and no serving numbers of the baseline alone; the empty list says why."""
    store = RunStore([SAMPLE], upload_dir=tmp_path)
    app = App(store)
    menu = app.call("cmp-scenarios.options", {"run.value": app.a}, "run.value")
    assert menu["cmp-scenarios.options"] == [] and menu["cmp-none.children"] == NO_SCENARIO
    pressed = {"run.value": app.a, "cmp-run.n_clicks": 1, "cmp-scenarios.value": [], "cmp-rate.value": 10.0}
    shown = app.call("cmp-body.children", pressed, "cmp-run.n_clicks")
    assert shown["cmp-body.children"] is None
    assert shown["cmp-error.children"]["props"]["children"] == NO_SCENARIO
    assert app.call("cmp-serving-body.children", pressed, "cmp-run.n_clicks") == {
        "cmp-serving-body.children": None, "cmp-serving-error.children": None}
    store.runs[app.a].scenarios["half cpu"] = HALF_CPU   # one saved, none ticked
    assert app.call("cmp-scenarios.options", {"run.value": app.a}, "run.value")["cmp-none.children"] is None
    unticked = app.call("cmp-body.children", pressed, "cmp-run.n_clicks")["cmp-error.children"]
    assert unticked["props"]["children"] == "no scenario selected: tick one above"
    store.close()


def test_add_refuses_a_file_that_is_not_a_trace(app: App) -> None:
    notes = app.store.runs[app.b].path.parent / "notpy.txt"    # inside the allowed folders
    notes.write_text("hello")
    runs = dict(app.store.runs)
    refused = app.call("runs-table.data", {"runs-add.n_clicks": 1, "runs-path.value": str(notes), "run.value": app.a},
                       "runs-add.n_clicks")
    assert refused["runs-error.children"]["props"]["children"] == \
        f"{notes}: not a trace file (accepted: *.json, *.json.gz)"
    assert refused["run.options"] is NO_UPDATE and refused["runs-message.children"] is NO_UPDATE
    assert app.store.runs == runs
