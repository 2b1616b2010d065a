"""Heavy dashboard work runs off the request threads (dashboard/jobs.py): a callback that needs an
analysis answers at once with a "working" message and a poller switched on, and shows the page
once the job is done; a failed job shows its error once and stops the polling. No timing: the
analysis is held on an event the test releases."""
from __future__ import annotations

import json
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("dash", reason="the dashboard needs the ui extra (pip install -e '.[ui]')")

from whatif.core.steps import COUNT_DEFAULT
from whatif.dashboard import state
from whatif.dashboard.app import create_app
from whatif.dashboard.jobs import Jobs, Pending
from whatif.dashboard.state import RunStore

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "llm_serve"


def test_a_job_runs_once_and_keeps_its_result_or_error() -> None:
    jobs, gate, calls = Jobs(workers=1), threading.Event(), []

    def work() -> int:
        calls.append(1)
        gate.wait()
        return 42

    assert jobs.result("k", work) == Pending("'k'") and jobs.running("k") and not jobs.done("'k'")
    assert jobs.result("k", work) == Pending("'k'")     # asked again while it runs: not started again
    gate.set()
    assert jobs.wait("k") == 42 and jobs.result("k", work) == 42 and calls == [1] and not jobs.running("k")
    assert jobs.done("'k'") and jobs.done("'no such job'")

    def fail() -> int:
        calls.append(2)
        raise ValueError("bad trace")

    jobs.start("bad", fail)
    with pytest.raises(ValueError, match="bad trace"):
        jobs.wait("bad")
    with pytest.raises(ValueError, match="bad trace"):
        jobs.result("bad", fail)
    assert calls == [1, 2]
    jobs.close()


def _overview(client: Any, run_id: str) -> dict[str, Any]:
    outputs = (("ov-body", "children"), ("ov-poll", "disabled"), ("ov-waiting", "data"), ("ov-error", "children"))
    body = {"output": ".." + "...".join(f"{i}.{p}" for i, p in outputs) + "..",
            "outputs": [{"id": i, "property": p} for i, p in outputs],
            "inputs": [{"id": "run", "property": "value", "value": run_id},
                       {"id": "count-all", "property": "value", "value": []},
                       {"id": "ov-ready", "property": "data", "value": None}],
            "changedPropIds": ["run.value"]}
    r = client.post("/_dash-update-component", json=body)
    assert r.status_code == 200
    return json.loads(r.data)["response"]  # type: ignore[no-any-return]


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Analyses wait for this event before they start (opened at the end whatever happened)."""
    opened, analyze = threading.Event(), state.analyze

    def held(path: Any) -> Any:
        opened.wait()
        return analyze(path)

    monkeypatch.setattr(state, "analyze", held)
    yield opened
    opened.set()


def _ready(app: Any, token: str, ticks: int) -> dict[str, Any] | None:
    """The poll callback after ``ticks`` ticks: its response, or None when it made no update (204)."""
    output = next(k for k in app.callback_map if k.startswith("..ov-ready.data..."))  # ov-poll.disabled@<hash>
    body = {"output": output,
            "outputs": [{"id": "ov-ready", "property": "data"},
                        {"id": "ov-poll", "property": output.split("...")[1].split(".", 1)[1].rstrip(".")}],
            "inputs": [{"id": "ov-poll", "property": "n_intervals", "value": ticks}],
            "state": [{"id": "ov-waiting", "property": "data", "value": token}],
            "changedPropIds": ["ov-poll.n_intervals"]}
    r = app.server.test_client().post("/_dash-update-component", json=body)
    assert r.status_code in (200, 204)
    return json.loads(r.data)["response"] if r.status_code == 200 else None


def test_overview_answers_working_then_the_page(gate: threading.Event) -> None:
    store = RunStore([SAMPLE])
    app = create_app(store=store)
    client = app.server.test_client()
    run = next(iter(store.runs.values()))
    first = _overview(client, run.id)          # answered while the analysis is held
    assert "working: analysing sample_traces/llm_serve" in json.dumps(first["ov-body"])
    assert first["ov-poll"]["disabled"] is False and not run.loaded
    token = first["ov-waiting"]["data"]
    assert token == Jobs.token(("document", run.id, COUNT_DEFAULT))
    assert _ready(app, token, 1) is None            # a tick while the job runs changes nothing
    gate.set()
    store.jobs.wait(("document", run.id, COUNT_DEFAULT))
    ready = _ready(app, token, 2)                    # the tick after: ready changes, polling stops
    assert ready is not None and ready["ov-poll"]["disabled"] is True and ready["ov-ready"]["data"]
    done = _overview(client, run.id)
    assert "ov-fidelity" in json.dumps(done["ov-body"]) and done["ov-poll"]["disabled"] is True
    store.close()


def test_a_failed_analysis_is_shown_and_stops_polling(gate: threading.Event, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": "not a list"}')
    store = RunStore([bad])
    client = create_app(store=store).server.test_client()
    run = next(iter(store.runs.values()))
    assert _overview(client, run.id)["ov-poll"]["disabled"] is False
    gate.set()
    with pytest.raises(Exception):  # noqa: B017 - whichever error the reader raises, the page shows it
        store.jobs.wait(("document", run.id, COUNT_DEFAULT))
    after = _overview(client, run.id)
    assert after["ov-poll"]["disabled"] is True and "bad.json" in json.dumps(after["ov-error"])
    store.close()


def test_a_kept_error_is_raised_again_without_growing() -> None:
    """Each ask of a failed job raises its error again: the traceback is the ask's, not the sum
    of every earlier one (the Runs page asked 4 times a second, logging 38 more lines each time)."""
    jobs = Jobs(workers=1)

    def fail() -> int:
        raise ValueError("bad trace")

    jobs.start("bad", fail)
    with pytest.raises(ValueError):
        jobs.wait("bad")
    lengths = []
    for _ in range(5):
        with pytest.raises(ValueError, match="bad trace") as raised:
            jobs.result("bad", fail)
        lengths.append(len(traceback.extract_tb(raised.value.__traceback__)))
    assert len(set(lengths)) == 1 and lengths[0] <= 3, lengths
    jobs.close()
