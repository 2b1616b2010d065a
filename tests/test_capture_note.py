"""A DiT denoising step that records a CUDA/HIP graph (torch.compile's cudagraph trees, the shared
xDiT FLUX.1 traces) is a one-off capture pass: `whatif serve` times the graph's replay, and
`analyze`, `predict` and `diff`, whose step times hold the capture, print the same one-line note
(:func:`whatif.predictors.serving.engines.xdit.capture_notes`). Skipped without ../shared."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from whatif.analysis import analyze
from whatif.cli import main
from whatif.predictors.serving.engines import find_iterations
from whatif.predictors.serving.engines.xdit import capture_notes

BASELINE = "tracelens/xdit_flux1_baseline_mi300x.json.gz"
AFTER = "tracelens/xdit_flux1_aiter_sage_mi300x.json.gz"
NO_GRAPH = "hta/critical_path_simple_add_a100.json.gz"
SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "xdit_aiter_sage_oracle.toml"


def _text(out: str) -> str:
    """Printed output with the console's line wrapping undone."""
    return re.sub(r"\s+", " ", out)


def _trace(shared_traces: Path, name: str) -> Path:
    path = shared_traces / name
    if not path.exists():
        pytest.skip(f"{path} not found")
    return path


@pytest.fixture(scope="module")
def notes(shared_traces: Path) -> dict[str, list[str]]:
    """The capture notes of each xDiT trace, checked against the adapter's step windows: one note
    per trace, giving the denoiser forward (the capture pass) and the replay window serve fits on."""
    out = {}
    for name in (BASELINE, AFTER):
        a = analyze(_trace(shared_traces, name))
        found = find_iterations(a.graph)
        (step,) = found.iterations
        got = capture_notes(a.trace)
        assert len(got) == 1
        assert f"the graph's replay ({(step.end_ns - step.start_ns) / 1e6:.3f} ms)" in got[0]
        assert got[0] in found.notes   # serve's note is the same line
        out[name] = got
    return out


def test_the_note_names_the_capture_pass_and_its_replay(notes: dict[str, list[str]]) -> None:
    (note,) = notes[BASELINE]
    capture_ms, replay_ms = (float(x) for x in re.findall(r"([\d.]+) ms", note))
    assert note.startswith("denoising step 0 recorded a CUDA/HIP graph")
    assert "one-off capture pass" in note and capture_ms > 5 * replay_ms


def test_analyze_and_predict_print_the_note(shared_traces: Path, notes: dict[str, list[str]],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(_trace(shared_traces, BASELINE))
    (note,) = notes[BASELINE]
    assert main(["analyze", trace]) == 0
    assert f"note: {note}" in _text(capsys.readouterr().out)
    assert main(["predict", trace, "-s", str(SCENARIO)]) == 0
    assert f"note: {note}" in _text(capsys.readouterr().out)


def test_diff_prints_the_note_of_each_side(shared_traces: Path, notes: dict[str, list[str]],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(_trace(shared_traces, BASELINE)), str(_trace(shared_traces, AFTER))]) == 0
    text = _text(capsys.readouterr().out)
    assert f"note: before: {notes[BASELINE][0]}" in text and f"note: after: {notes[AFTER][0]}" in text
    assert text.index("measured speedup") < text.index("note: before:")


def test_a_trace_without_a_graph_capture_has_no_note(shared_traces: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _trace(shared_traces, NO_GRAPH)
    assert capture_notes(analyze(trace).trace) == []
    assert main(["analyze", str(trace)]) == 0
    assert "note:" not in capsys.readouterr().out
