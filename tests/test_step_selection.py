"""Steps a user means (issue 13): the warm-up step and a trailing partial step are left out of
means, speedups and charts by default, listed with the reason, and counted back on request; and
every prediction says what caps its speedup."""
from __future__ import annotations

from pathlib import Path

import pytest
from test_report import gpu_trace

from whatif.api import analyze, predict
from whatif.cli import main
from whatif.documents import UNSET, PredictionDocument, from_json
from whatif.predictors.steps import Exclusion, StepOptions
from whatif.summary import analysis_document, prediction_document
from whatif.transforms.generic import Scale
from whatif.transforms.select import Selector

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "llm_serve"


@pytest.fixture(scope="module")
def sample():  # type: ignore[no-untyped-def]
    return analyze(SAMPLE)


def test_warmup_and_partial_of_the_sample(sample) -> None:  # type: ignore[no-untyped-def]
    s = sample.steps
    out = s[~s["included"]]
    assert out["step"].tolist() == [0, int(s["step"].max())]
    assert out["excluded_reason"].tolist() == [Exclusion.WARMUP, Exclusion.PARTIAL]
    assert s["included"].sum() == len(s) - 2


def test_include_options_bring_them_back(sample) -> None:  # type: ignore[no-untyped-def]
    both = sample.with_options(StepOptions(include_warmup=True, include_partial=True)).steps
    assert both["included"].all()
    warm = sample.with_options(StepOptions(include_warmup=True)).steps
    assert warm[~warm["included"]]["excluded_reason"].tolist() == [Exclusion.PARTIAL]


def test_single_step_trace_kept(tmp_path: Path) -> None:
    s = analyze(gpu_trace(tmp_path / "one.json.gz", steps=1)).steps
    assert s["included"].tolist() == [True] and s["excluded_reason"].tolist() == [None]


def test_first_step_numbered_above_zero_is_kept() -> None:
    # a recording made after the profiler's own schedule skipped steps: nothing to leave out
    traces = Path(__file__).resolve().parents[2] / "shared" / "traces"
    path = traces / "hta" / "nccl_data_a100_rank0of2.json.gz"
    if not path.exists():
        pytest.skip("shared traces not present")
    assert analyze(path).steps["included"].all()


def test_documents_mark_excluded_steps_and_means_leave_them_out(sample) -> None:  # type: ignore[no-untyped-def]
    doc = analysis_document(sample)
    marks = [s.excluded for s in doc.steps]
    assert marks[0] == "warm-up" and marks[-1] == "partial" and all(m is UNSET for m in marks[1:-1])
    assert doc.critical_path[0].excluded == "warm-up"
    counted = sample.steps[sample.steps["included"]]
    assert doc.mean_measured_step_ns == pytest.approx(counted["measured_ns"].mean())


def test_speedup_over_counted_steps(sample) -> None:  # type: ignore[no-untyped-def]
    pred = predict(sample, [Scale(select=Selector(op="^aten::linear$"), factor=0.5)])
    doc = prediction_document(pred)
    rows = sample.steps["included"].to_numpy()
    base = sample.steps["predicted_ns"].to_numpy()[rows].sum()
    new = pred.scenarios[0].steps["predicted_ns"].to_numpy()[rows].sum()
    assert doc.scenarios[0].speedup == pytest.approx(base / new, rel=1e-6)
    assert doc.baseline.steps[0].excluded == "warm-up" and doc.scenarios[0].steps[0].excluded == "warm-up"


def test_gpu_only_scenario_is_capped_by_cpu_own_work(tmp_path: Path) -> None:
    a = analyze(gpu_trace(tmp_path / "g.json.gz"))
    doc = prediction_document(predict(a, [Scale(select=Selector(kind="gpu"), factor=0.0)]))
    cap = doc.scenarios[0].cap
    assert cap is not None and cap.part == "CPU own work" and cap.speedup_cap > 1
    assert doc.scenarios[0].speedup <= cap.speedup_cap * 1.0001
    head = "capped at" if doc.scenarios[0].speedup >= 0.9 * cap.speedup_cap else "bound"
    assert cap.binding == (head == "capped at") and cap.reason.startswith(f"{head} {cap.speedup_cap:.2f}x")


def test_cli_prints_excluded_and_cap_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = gpu_trace(tmp_path / "g.json.gz")
    scenario = tmp_path / "gpu.toml"
    scenario.write_text('name = "gpu 2x"\n[[transform]]\nname = "scale"\nselect = { kind = "gpu" }\nfactor = 0.5\n')
    out_json = tmp_path / "p.json"
    assert main(["predict", str(trace), "-s", str(scenario), "--json", str(out_json)]) == 0
    text = capsys.readouterr().out
    assert "excluded from means: step 0 (warm-up" in text
    assert "of CPU own work per step" in text
    doc = from_json(out_json.read_text(), PredictionDocument)
    assert doc.scenarios[0].cap is not None and len(doc.baseline.steps) == 3
    assert main(["predict", str(trace), "-s", str(scenario), "--include-warmup"]) == 0
    assert "excluded from means" not in capsys.readouterr().out


def test_record_summary_applies_the_same_rule(sample) -> None:  # type: ignore[no-untyped-def]
    import gzip

    import orjson

    from whatif.tracer.record.summary import format_summary, summarize

    summary = summarize(orjson.loads(gzip.open(SAMPLE / "rank0.pt.trace.json.gz").read()))
    s = sample.steps
    left_out = s[~s["included"]]["step"].tolist()
    lines = format_summary(summary, gpu_note=None)
    assert lines[1].startswith("excluded from the step time: ")
    assert [f"step {n} (" in lines[1] for n in left_out] == [True, True]
    assert "warm-up" in lines[1] and "partial" in lines[1] and "--include-warmup" in lines[1]
    assert "max 68.70 ms" not in lines[0]  # the warm-up step's time is not among the step times
    both = format_summary(summary, gpu_note=None, options=StepOptions(include_warmup=True,
                                                                        include_partial=True))
    assert "max 68.70 ms" in both[0] and not both[1].startswith("excluded")


def test_the_rule_on_plain_arrays() -> None:
    from whatif.core.steps import rank_exclusions

    w, p = Exclusion.WARMUP, Exclusion.PARTIAL
    assert rank_exclusions([0, 1, 2, 3], [50, 10, 10, 4]) == [w, None, None, p]
    assert rank_exclusions([0, 1, 2], [50, 10, 4]) == [w, None, p]
    assert rank_exclusions([0, 1], [50, 4]) == [None, p]  # step 0 is the only whole step: kept
    assert rank_exclusions([3, 4, 5], [10, 10, 10]) == [None, None, None]
    assert rank_exclusions([0], [10]) == [None]
