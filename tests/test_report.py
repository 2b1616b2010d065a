"""whatif report: every format written and parsed back, the JSON against its schema, thresholds
and regression checks with their exit codes, the step summary, serving columns."""
from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import msgspec
import numpy as np
import orjson
import pytest
from msgspec import UNSET
from tracegen import KinetoTrace

from whatif.api import Prediction, predict
from whatif.cli import main
from whatif.report import (
    REPORT_SCHEMA,
    ReportError,
    ThresholdError,
    build_report,
    evaluate,
    parse,
    render,
    validate,
    write_report,
)
from whatif.report.schema import errors
from whatif.transforms.generic import Scale
from whatif.transforms.scenario import Scenario
from whatif.transforms.select import Selector

SCENARIO = '[[transform]]\nname = "scale"\nfactor = 0.5\nselect = { name = "gemm" }\n'


def gpu_trace(path: Path, gemm_us: float = 60, relu_us: float = 10, extra_kernel: str | None = None,
              steps: int = 3) -> Path:
    """A small GPU-bound trace: per step aten::mm -> gemm, aten::relu -> relu (and an optional extra
    kernel), then cudaDeviceSynchronize until the GPU is done."""
    tr = KinetoTrace()
    corr, t0 = 0, 0.0
    kernels = [("aten::mm", "gemm", gemm_us), ("aten::relu", "relu", relu_us)] + \
        ([("aten::add", extra_kernel, 5.0)] if extra_kernel else [])
    for n in range(steps):
        gpu_t = t0 + 10
        for i, (op, kernel, dur) in enumerate(kernels):
            corr += 1
            tr.op(op, t0 + 2 + 10 * i, 8)
            tr.runtime("cudaLaunchKernel", t0 + 4 + 10 * i, 4, corr=corr)
            tr.gpu(kernel, gpu_t, dur, corr=corr)
            gpu_t += dur
        corr += 1
        t0 = tr.synced_step(n, t0, t0 + 2 + 10 * len(kernels), gpu_t, corr)
    return tr.write(path)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gpu_trace(tmp_path_factory.mktemp("report") / "t.json.gz")


@pytest.fixture(scope="module")
def prediction(trace: Path, tmp_path_factory: pytest.TempPathFactory) -> Prediction:
    from_file = write(tmp_path_factory.mktemp("sc") / "fuse.toml", SCENARIO)
    in_code = Scenario(name="relu x0.5", transforms=[Scale(select=Selector(name="relu"), factor=0.5)])
    return predict(trace, [from_file, in_code])


def test_json_follows_the_schema_and_is_stable(prediction: Prediction, tmp_path: Path) -> None:
    a = write_report(prediction, tmp_path / "a", ["json"], fail_if=["speedup(fuse) < 1.01"], step_summary=False)
    b = write_report(prediction, tmp_path / "b", ["json"], fail_if=["speedup(fuse) < 1.01"], step_summary=False)
    raw = a.files["json"].read_bytes()
    assert raw == b.files["json"].read_bytes()  # byte-identical: CI can diff reports
    doc = orjson.loads(raw)
    validate(doc)
    assert (doc["schema"], doc["version"], doc["status"]) == ("whatif.report", 1, "passed")
    assert [r["name"] for r in doc["rows"]] == ["baseline", "fuse", "relu x0.5"]
    fuse = doc["rows"][1]
    assert fuse["speedup"] > 1 and fuse["contributors"][0]["delta_ns"] < 0
    assert fuse["critical_path_shift"][0]["category"] == "gpu" and fuse["critical_path_shift"][0]["delta_ns"] < 0
    assert doc["top_kernels"][0]["name"] == "gemm" and doc["prediction"]["schema"] == "whatif.prediction"
    assert list(doc) == REPORT_SCHEMA["required"]  # documented key order; "suggestions" only with --suggest


def test_schema_catches_broken_documents(prediction: Prediction) -> None:
    doc = msgspec.to_builtins(build_report(prediction))
    doc["rows"][0]["speedup"] = "fast"
    del doc["checks"]
    problems = errors(REPORT_SCHEMA, doc)
    assert "$: missing key 'checks'" in problems and "$.rows[0].speedup: expected number, got str" in problems
    with pytest.raises(ValueError, match=r"not a valid whatif\.report"):
        validate(doc)


def test_markdown_table_details_and_step_summary(prediction: Prediction, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    summary = write(tmp_path / "summary.md", "previous step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    rep = write_report(prediction, tmp_path / "out", "md", fail_if=["speedup(relu x0.5) < 2"])
    md = rep.files["md"].read_text()
    assert md.startswith("## whatif report:") and "| scenario | predicted step ms | speedup |" in md
    assert "TTFT" not in md  # no serving metrics: no serving columns
    assert "<details>" in md and "<summary><b>fuse</b>" in md and "`scale(name='gemm', factor=0.5)`" in md
    assert "❌ | `speedup(relu x0.5) < 2`" in md
    # a kernel is GPU work: no CPU column (always 0) in its table, as an op has
    kernels, ops = md.split("top kernels (measured)")[1].split("top ops (measured)")
    assert "| name | count | GPU ms |\n" in kernels and "| name | count | GPU ms | CPU ms |" in ops
    assert summary.read_text() == "previous step\n" + md + "\n"
    assert not rep.passed and rep.failures[0].startswith("speedup(relu x0.5) < 2 (speedup(relu x0.5) = ")


def test_junit_has_one_case_per_check_and_scenario(prediction: Prediction, tmp_path: Path) -> None:
    rep = write_report(prediction, tmp_path, ["junit"], fail_if=["speedup(fuse) < 1.01", "step_ms > 0.001"],
                       step_summary=False)
    root = ET.parse(rep.files["junit"]).getroot()
    assert root.tag == "testsuites" and (root.get("tests"), root.get("failures")) == ("4", "1")
    cases = root.findall("./testsuite/testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases] == [
        ("whatif.threshold", "speedup(fuse) < 1.01"), ("whatif.threshold", "step_ms > 0.001"),
        ("whatif.scenario", "fuse"), ("whatif.scenario", "relu x0.5")]
    assert cases[0].find("failure") is None and cases[1].find("failure").get("message").startswith("step_ms = ")


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.external: list[str] = []
        self.scripts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.scripts += tag == "script"
        self.external += [v or "" for k, v in attrs if k in ("src", "href") and tag in ("script", "link", "img")]


def test_html_is_self_contained(prediction: Prediction, tmp_path: Path) -> None:
    html = write_report(prediction, tmp_path, ["html"], step_summary=False).files["html"].read_text()
    tags = _Tags()
    tags.feed(html)
    assert tags.external == [] and tags.scripts >= 2  # plotly.js inlined, nothing fetched
    assert html.count("Plotly.newPlot(") == 2 * 2 + 4  # scenarios, steps, baseline path, top kernels + 2 per scenario
    assert 'id="fig-waterfall-1"' in html and "relu x0.5" in html


@pytest.mark.parametrize("expr, failed", [
    ("speedup(fuse) < 1.01", False), ("speedup(fuse) > 1.01", True), ("1 < speedup(fuse) < 2", True),
    ("step_ms(fuse) >= 0.999 * step_ms", False), ("speedup(relu x0.5) >= 1 and step_ms > 1000", False),
    ("not replay_error < 0.1%", False), ("speedup(baseline) == 1", True), ("mean_step_ms(fuse) < step_ms", True),
    ("max_step_ms > p50_step_ms - 1", True), ("measured_step_ms > 0", True),
])
def test_threshold_values(prediction: Prediction, expr: str, failed: bool) -> None:
    assert evaluate(expr, build_report(prediction).prediction).failed is failed


@pytest.mark.parametrize("expr, message", [
    ("__import__('os').system('true') > 0", "this call is not allowed"),
    ("step_ms.__class__ > 1", "Attribute is not allowed"),
    ("[1][0] < 2", "Subscript is not allowed"),
    ("(lambda: 1)() > 0", "this call is not allowed"),
    ("speedup", "must be a comparison"),
    ("spedup(fuse) < 1", "spedup is not a metric"),
    ("step_ms > 'a'", "the constant 'a' is not allowed"),
    ("step_ms >", "not a valid expression"),
    ("step_ms ** 2 > 1", "operator Pow is not allowed"),
    ("replay_error(fuse) > 0", "write it without a scenario"),
])
def test_unsafe_or_bad_thresholds_are_refused(expr: str, message: str) -> None:
    with pytest.raises(ThresholdError, match=message.replace("(", r"\(").replace("*", r"\*")):
        parse(expr)


def test_threshold_errors_at_evaluation(prediction: Prediction) -> None:
    doc = build_report(prediction).prediction
    with pytest.raises(ThresholdError, match=r"unknown scenario 'nope' \(scenarios: fuse, relu x0.5; a scenario "
                                              r"file's stem works too\)"):
        evaluate("speedup(nope) < 1", doc)
    with pytest.raises(ThresholdError, match="speedup needs a scenario name"):
        evaluate("speedup < 1", doc)
    with pytest.raises(ThresholdError, match="no serving metrics"):
        evaluate("ttft_ms > 1", doc)


def test_serving_columns_and_thresholds_when_present(prediction: Prediction) -> None:
    serving = {"baseline": {"ttft_ms": {"mean": 80.0, "p99": 120.0}, "tpot_ms": {"mean": 20.0, "p99": 25.0}},
               "fuse": {"ttft_ms": {"mean": 60.0, "p99": 90.0}, "tpot_ms": {"mean": 15.0, "p99": 19.0}}}
    doc = build_report(prediction, fail_if=["p99_ttft_ms(fuse) > 100", "tpot_ms > 19"], serving=serving)
    validate(doc)
    assert [c.status for c in doc.checks] == ["passed", "failed"]
    md = render(doc, "md")
    assert "| TTFT ms | TPOT ms |" in md and "| 60.00 | 15.00 |" in md
    with pytest.raises(ReportError, match="name none of the report's rows"):
        build_report(prediction, serving={"fsue": {}})


def test_suggestions_are_whatif_suggest_on_the_baseline(trace: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """``report --suggest`` embeds the ``whatif suggest`` document of the same trace, the Markdown and
    HTML show its ranking, and the JSON follows the schema with the key last."""
    from whatif.api import analyze
    from whatif.documents import SuggestDocument, from_json, to_json
    from whatif.suggest import suggest

    sc = write(tmp_path / "fuse.toml", SCENARIO)
    assert main(["report", str(trace), "-s", str(sc), "-o", str(tmp_path / "out"), "--no-step-summary", "-q",
                 "--suggest"]) == 0
    doc = orjson.loads((tmp_path / "out" / "report.json").read_bytes())
    validate(doc)
    assert list(doc) == [*REPORT_SCHEMA["required"], "suggestions"]
    expected = suggest(analyze(trace))
    assert from_json(orjson.dumps(doc["suggestions"]), SuggestDocument) == expected and expected.suggestions
    best = expected.suggestions[0]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "### What to try next" in md and f"| `{best.setting}` | {best.headline.speedup:.3f}x |" in md
    assert md.index("What to try next") < md.index("<summary><b>fuse</b>")
    assert f"<td>{best.setting}</td>" in (tmp_path / "out" / "report.html").read_text()
    bad = orjson.loads(to_json(expected))
    bad["suggestions"][0]["saved_ns_per_step"] = "lots"
    assert any("saved_ns_per_step" in e for e in errors(REPORT_SCHEMA, {**doc, "suggestions": bad}))


def test_ops_table_is_whatif_ops_on_the_baseline(tmp_path: Path) -> None:
    """``report --ops`` embeds the ``whatif ops`` document of the baseline (here our own H200
    recording, with shapes), and the Markdown and HTML show its top rows by GPU time."""
    from whatif.api import load_trace
    from whatif.documents import OpsDocument, from_json, to_json
    from whatif.ops import ops_table
    from whatif.report.markdown import OPS_ROWS

    run = Path(__file__).resolve().parents[1] / "sample_traces" / "gpu" / "pairs" / "p1_precision-before-r1"
    sc = write(tmp_path / "fuse.toml", SCENARIO)
    assert main(["report", str(run), "-s", str(sc), "-o", str(tmp_path / "out"), "--no-step-summary", "-q",
                 "--ops", "--suggest"]) == 0
    doc = orjson.loads((tmp_path / "out" / "report.json").read_bytes())
    validate(doc)
    assert list(doc) == [*REPORT_SCHEMA["required"], "suggestions", "ops"]
    expected = ops_table(load_trace(run))
    assert from_json(orjson.dumps(doc["ops"]), OpsDocument) == expected and len(expected.rows) > OPS_ROWS
    top = expected.rows[0]
    assert top.op == "aten::mm" and top.dtype == "fp32" and top.achieved_tflops is not None
    md = (tmp_path / "out" / "report.md").read_text()
    section = md.split("### Where the GPU time goes, per op", 1)[1].split("\n\n")[2]  # heading, caption, table
    assert section.count("\n| `aten::") == OPS_ROWS and f"| {top.achieved_tflops:.1f} |" in section
    assert md.index("What to try next") < md.index("Where the GPU time goes")
    html_text = (tmp_path / "out" / "report.html").read_text()
    assert "Where the GPU time goes" in html_text and f"<td class=num>{top.achieved_tflops:.1f}</td>" in html_text
    bad = orjson.loads(to_json(expected))
    bad["rows"][0]["total_ns"] = "long"
    assert any("total_ns" in e for e in errors(REPORT_SCHEMA, {**doc, "ops": bad}))


def test_cli_exit_codes(trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sc = write(tmp_path / "fuse.toml", SCENARIO)
    base = ["report", str(trace), "-s", str(sc), "-o", str(tmp_path / "out"), "--no-step-summary", "--force"]
    assert main([*base, "--fail-if", "speedup(fuse) < 1.01", "--fail-if", "step_ms > 10"]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["junit.xml", "report.html", "report.json",
                                                                   "report.md"]
    capsys.readouterr()
    assert main([*base, "-q", "--fail-if", "speedup(fuse) > 1.01", "--fail-if", "step_ms > 0.01",
                 "--fail-if", "step_ms > 10"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("whatif: check failed: speedup(fuse) > 1.01 (speedup(fuse) = ")
    for bad, message in [(["--fail-if", "speedup(fuse) <"], "not a valid expression"),
                         (["--format", "md,pdf"], "unknown report format 'pdf'"),
                         (["--max-regression", "5%"], "--max-regression needs --baseline"),
                         (["--baseline", str(sc), "--max-regression", "5%"], "fuse.toml: not a JSON report"),
                         (["--fail-if", "speedup(fsue) < 1"], "unknown scenario 'fsue'")]:
        assert main(base + bad) == 2, bad
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], (bad, err)


def test_max_regression_against_a_baseline_report(trace: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    sc = write(tmp_path / "fuse.toml", SCENARIO)
    assert main(["report", str(trace), "-s", str(sc), "-o", str(tmp_path / "old"), "--format", "json", "-q"]) == 0
    old = tmp_path / "old" / "report.json"
    slower = gpu_trace(tmp_path / "slower.json.gz", gemm_us=90)
    args = ["-o", str(tmp_path / "new"), "--format", "json,md", "--baseline", str(old), "-q", "--no-step-summary",
            "--force"]
    assert main(["report", str(trace), "-s", str(sc), "--max-regression", "5%", *args]) == 0
    capsys.readouterr()
    assert main(["report", str(slower), "-s", str(sc), "--max-regression", "5%", *args]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "step_ms(baseline) regression <= 5%" in err[0] and "limit +5%" in err[0]
    doc = orjson.loads((tmp_path / "new" / "report.json").read_bytes())
    validate(doc)
    assert doc["baseline_report"]["path"] == str(old) and doc["rows"][0]["baseline_report_step_ns"] > 0
    assert "| vs baseline report |" in (tmp_path / "new" / "report.md").read_text()
    # a scenario the baseline report does not have is skipped, not failed
    other = write(tmp_path / "other.toml", SCENARIO)
    assert main(["report", str(trace), "-s", str(other), "--max-regression", "0.05", *args]) == 0
    doc = orjson.loads((tmp_path / "new" / "report.json").read_bytes())
    assert [c["status"] for c in doc["checks"]] == ["passed", "skipped"]


@pytest.mark.slow
def test_report_runs_as_a_subprocess_with_one_line_errors(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "whatif.cli", "report", str(tmp_path / "missing.json.gz"),
                           "-o", str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "missing.json.gz" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_serving_file(trace: Path, tmp_path: Path) -> None:
    sc = write(tmp_path / "fuse.toml", SCENARIO)
    stats = {"mean": 50.0, "p50": 45.0, "p90": 70.0, "p99": 90.0}
    serving = tmp_path / "serve.json"
    serving.write_bytes(orjson.dumps({"schema": "whatif.serving/1", "scenarios": [
        {"name": "baseline", "ttft_ms": stats, "tpot_ms": stats},
        {"name": "fuse", "ttft_ms": stats, "tpot_ms": None}]}))
    args = ["report", str(trace), "-s", str(sc), "-o", str(tmp_path / "o"), "--format", "json", "-q", "--force",
            "--serving", str(serving)]
    assert main([*args, "--fail-if", "p99_ttft_ms(fuse) > 100"]) == 0
    assert main([*args, "--fail-if", "ttft_ms > 40"]) == 1
    assert main([*args, "--fail-if", "tpot_ms(fuse) > 40"]) == 2  # no TPOT for fuse: a usage error
    assert main([*args[:-1], str(sc)]) == 2


def test_cli_serving_file_of_another_trace_is_refused(trace: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A serving document names the trace it was served from: one of another trace is one line,
    exit 2 (it had been shown as this trace's TTFT); one of this trace (its file or folder) is read."""
    stats = {"mean": 50.0, "p50": 45.0, "p90": 70.0, "p99": 90.0}
    serving = tmp_path / "serve.json"
    args = ["report", str(trace), "-o", str(tmp_path / "o"), "--format", "json", "-q", "--force",
            "--serving", str(serving), "--fail-if", "ttft_ms > 40"]
    # the trace as given from another folder (relative: its name) is this trace too
    for source, code in (("sample_traces/llm_serve", 2), (str(trace), 1), (str(trace.parent), 1),
                         (f"elsewhere/{trace.name}", 1)):
        serving.write_bytes(orjson.dumps({"schema": "whatif.serving/1", "source": source, "scenarios": [
            {"name": "baseline", "ttft_ms": stats, "tpot_ms": stats}]}))
        assert main(args) == code, source
        err = capsys.readouterr().err.strip().splitlines()
        if code == 2:
            assert len(err) == 1 and "serving metrics of sample_traces/llm_serve, not of the report's trace" in err[0]


def test_fail_if_accepts_a_scenario_files_stem(tmp_path: Path) -> None:
    from whatif.documents import PredictionDocument, from_json
    from whatif.report.thresholds import evaluate as check

    sample = Path(__file__).resolve().parents[1] / "sample_traces" / "llm_serve"
    scenario = Path(__file__).resolve().parents[1] / "scenarios" / "faster_linear.toml"
    assert main(["predict", str(sample), "-s", str(scenario), "-q", "--json", str(tmp_path / "p.json")]) == 0
    doc = from_json((tmp_path / "p.json").read_text(), PredictionDocument)
    by_name, by_stem = check("speedup(linear 2x faster) < 1", doc), check("speedup(faster_linear) < 1", doc)
    assert list(by_name.values.values()) == list(by_stem.values.values()) and not by_stem.failed


def test_step_metrics_leave_out_the_steps_the_mean_leaves_out() -> None:
    """The bundled vLLM sample's first step is a 68.7 ms warm-up among ~2.7 ms steps: every step
    statistic of a gate (max, percentiles, measured) reads the steps the mean reads, so
    ``max_step_ms`` is not the warm-up and ``measured_step_ms`` sits beside ``step_ms``; the
    baseline row's measured step is that same figure."""
    sample = Path(__file__).resolve().parents[1] / "sample_traces" / "llm_serve"
    report = build_report(predict(sample, []))
    doc = report.prediction
    steps = doc.baseline.steps
    counted = [s for s in steps if s.excluded is UNSET]
    assert 0 < len(counted) < len(steps)                                  # the sample has a warm-up step
    value = {m: evaluate(f"{m} > 0", doc).values[m] for m in
             ("step_ms", "max_step_ms", "p50_step_ms", "measured_step_ms", "replay_error")}
    assert value["max_step_ms"] == pytest.approx(max(s.predicted_ns for s in counted) / 1e6)
    assert value["max_step_ms"] < max(s.predicted_ns for s in steps) / 1e6
    assert value["p50_step_ms"] == pytest.approx(float(np.median([s.predicted_ns for s in counted])) / 1e6)
    assert value["measured_step_ms"] == pytest.approx(float(np.mean([s.measured_ns for s in counted])) / 1e6)
    assert value["step_ms"] == pytest.approx(doc.baseline.mean_step_ns / 1e6)
    # replay fidelity reads every step, the warm-up too (as the analysis document's fidelity)
    assert value["replay_error"] == pytest.approx(max(abs(s.predicted_ns / s.measured_ns - 1) for s in steps))
    assert abs(value["measured_step_ms"] / value["step_ms"] - 1) < 0.05
    row = report.rows[0].measured_step_ns
    assert row is not None and row / 1e6 == pytest.approx(value["measured_step_ms"], abs=1e-6)
    every = float(np.mean([s.measured_ns for s in steps])) / 1e6
    assert abs(every / value["measured_step_ms"] - 1) > 0.05                # the warm-up would move it
    assert f"measured {row / 1e6:,.3f} ms" in render(report, "md")
