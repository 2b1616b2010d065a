"""Heavy dashboard work runs off the request threads (dashboard/jobs.py): a callback that needs an
analysis answers at once with a "working" message and a poller switched on, and shows the page
once the job is done; a failed job shows its error once and stops the polling. No timing: the
analysis is held on an event the test releases."""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("dash", reason="the dashboard needs the ui extra (pip install -e '.[ui]')")

from whatif.core.steps import COUNT_DEFAULT
from whatif.dashboard import state
from whatif.dashboard.app import create_app
from whatif.dashboard.jobs import PENDING, Jobs
from whatif.dashboard.state import RunStore

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "llm_serve"


def test_a_job_runs_once_and_keeps_its_result_or_error() -> None:
    jobs, gate, calls = Jobs(workers=1), threading.Event(), []

    def work() -> int:
        calls.append(1)
        gate.wait()
        return 42

    assert jobs.result("k", work) is PENDING and jobs.running("k")
    assert jobs.result("k", work) is PENDING           # asked again while it runs: not started again
    gate.set()
    assert jobs.wait("k") == 42 and jobs.result("k", work) == 42 and calls == [1] and not jobs.running("k")

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
    outputs = (("ov-body", "children"), ("ov-poll", "disabled"), ("ov-error", "children"))
    body = {"output": ".." + "...".join(f"{i}.{p}" for i, p in outputs) + "..",
            "outputs": [{"id": i, "property": p} for i, p in outputs],
            "inputs": [{"id": "run", "property": "value", "value": run_id},
                       {"id": "count-all", "property": "value", "value": []},
                       {"id": "ov-poll", "property": "n_intervals", "value": None}],
            "changedPropIds": ["run.value"]}
    r = client.post("/_dash-update-component", json=body)
    assert r.status_code == 200
    return json.loads(r.data)["response"]  # type: ignore[no-any-return]


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Analyses wait for this event before they start."""
    opened, analyze = threading.Event(), state.analyze

    def held(path: Any) -> Any:
        opened.wait()
        return analyze(path)

    monkeypatch.setattr(state, "analyze", held)
    return opened


def test_overview_answers_working_then_the_page(gate: threading.Event) -> None:
    store = RunStore([SAMPLE])
    client = create_app(store=store).server.test_client()
    run = next(iter(store.runs.values()))
    first = _overview(client, run.id)          # answered while the analysis is held
    assert "working: analysing sample_traces/llm_serve" in json.dumps(first["ov-body"])
    assert first["ov-poll"]["disabled"] is False and not run.loaded
    gate.set()
    store.jobs.wait(("document", run.id, COUNT_DEFAULT))
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
