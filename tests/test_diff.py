"""whatif diff: kernel and step changes on hand-made pairs (exact), prediction vs actual, and the
real before/after pairs of ../shared/traces."""
from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from test_report import SCENARIO, gpu_trace, write

from whatif.api import analyze, predict
from whatif.cli import main
from whatif.report import build_report
from whatif.report.diff import diff_document
from whatif.transforms.generic import Scale
from whatif.transforms.select import Selector


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    d = tmp_path_factory.mktemp("diff")
    return (gpu_trace(d / "before.json.gz"), gpu_trace(d / "after.json.gz", gemm_us=30),
            gpu_trace(d / "after_extra.json.gz", gemm_us=30, relu_us=12, extra_kernel="add_kernel"))


def test_kernels_and_steps(pair: tuple[Path, Path, Path]) -> None:
    before, _, after = pair
    doc = diff_document(analyze(before), analyze(after))
    # step 0 (warm-up) is left out: the means are over steps 1 and 2
    assert (doc["before"]["mean_ns"], doc["after"]["mean_ns"]) == (84_000, 61_000)
    assert [s.get("excluded") for s in doc["before"]["steps"]] == ["warm-up", None, None]
    assert doc["speedup"] == round(84_000 / 61_000, 6)
    k = doc["kernels"]
    assert [r["name"] for r in k["faster"]["top"]] == ["gemm"] and k["faster"]["delta_ns"] == -30_000
    assert [r["name"] for r in k["slower"]["top"]] == ["relu"] and k["slower"]["top"][0]["delta_ns"] == 2_000
    assert [(r["name"], r["count_before"], r["count_after"]) for r in k["added"]["top"]] == [("add_kernel", 0, 1)]
    assert k["removed"]["names"] == 0 and k["same"]["names"] == 0
    gpu = {r["category"]: r for r in doc["critical_path"]}["gpu"]
    assert gpu["before_ns"] == 70_000 and gpu["after_ns"] == 47_000
    assert doc["gpu_ns_per_step"] == {"before": 70_000, "after": 47_000}


def test_prediction_vs_actual(pair: tuple[Path, Path, Path]) -> None:
    before, exact, extra = pair
    report = build_report(predict(before, [Scale(select=Selector(name="gemm"), factor=0.5)]))
    (hit,) = diff_document(analyze(before), analyze(exact), report)["prediction"]["scenarios"]
    # the scenario is the change
    assert hit["error"] == 0 and hit["actual_speedup"] == pytest.approx(hit["predicted_speedup"], abs=1e-5)
    doc = diff_document(analyze(before), analyze(extra), report)
    (miss,) = doc["prediction"]["scenarios"]
    assert doc["prediction"]["same_trace_as_before"]
    assert miss["predicted_step_ns"] == 54_000 and miss["actual_step_ns"] == 61_000
    assert miss["error"] == round(54_000 / 61_000 - 1, 6)  # promised more than delivered: the extra kernel


def test_cli_with_report_json(pair: tuple[Path, Path, Path], tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    before, _, after = pair
    sc = write(tmp_path / "fuse.toml", SCENARIO)
    assert main(["report", str(before), "-s", str(sc), "-o", str(tmp_path / "r"), "--format", "json", "-q"]) == 0
    out = tmp_path / "diff.json"
    assert main(["diff", str(before), str(after), "-p", str(tmp_path / "r" / "report.json"), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Prediction vs actual" in text and "fuse" in text and "added kernels" in text
    doc = orjson.loads(out.read_bytes())
    assert (doc["schema"], doc["version"]) == ("whatif.diff", 1)
    assert list(doc) == ["schema", "version", "whatif_version", "before", "after", "speedup", "median_speedup",
                         "gpu_ns_per_step", "kernels", "kernel_classes", "critical_path", "prediction"]
    assert main(["diff", str(before), str(after), "-p", str(sc)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fuse.toml: not a JSON report" in err[0]
    assert main(["diff", str(before), str(tmp_path / "nope.json")]) == 2


def test_cli_include_warmup_counts_step_0(pair: tuple[Path, Path, Path], tmp_path: Path) -> None:
    before, _, after = pair
    default, wide = tmp_path / "d.json", tmp_path / "w.json"
    assert main(["diff", str(before), str(after), "--json", str(default), "-q"]) == 0
    assert main(["diff", str(before), str(after), "--include-warmup", "--json", str(wide), "-q"]) == 0
    d, w = orjson.loads(default.read_bytes()), orjson.loads(wide.read_bytes())
    assert d["before"]["count"] == 2 and w["before"]["count"] == 3
    assert [s.get("excluded") for s in w["before"]["steps"]] == [None, None, None]
    assert w["before"]["mean_ns"] == sum(s["measured_ns"] for s in w["before"]["steps"]) // 3


KINETO = "kineto/resnet50_num_workers_{}__worker0.{}.pt.trace.json.gz"


@pytest.mark.shared
def test_resnet_num_workers_pair(shared_traces: Path) -> None:
    """DataLoader num_workers 0 -> 4 on a V100: CPU time on the critical path drops, steps get faster."""
    doc = diff_document(analyze(shared_traces / KINETO.format(0, 1623143089861)),
                        analyze(shared_traces / KINETO.format(4, 1623212756351)))
    assert doc["before"]["count"] == doc["after"]["count"] == 6
    assert 1.2 < doc["speedup"] < 1.3 and 1.35 < doc["median_speedup"] < 1.45
    path = {r["category"]: r["delta_ns"] for r in doc["critical_path"]}
    assert path["cpu"] < -20e6 and path["gpu"] < -20e6 and path["launch"] > 10e6
    assert abs(doc["gpu_ns_per_step"]["after"] / doc["gpu_ns_per_step"]["before"] - 1) < 0.05  # same GPU work


@pytest.mark.shared
def test_h100_vs_mi300x_pair(shared_traces: Path) -> None:
    """The same HF model on two vendors: kernel names barely overlap, kernel classes do."""
    name = "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
    doc = diff_document(analyze(shared_traces / "tracelens/hf_h100" / name),
                        analyze(shared_traces / "tracelens/hf_mi300" / name))
    assert "H100" in doc["before"]["device"] and "MI300X" in doc["after"]["device"]
    k = doc["kernels"]
    assert k["added"]["names"] > 10 and k["removed"]["names"] > 10
    classes = {r["class"] for r in doc["kernel_classes"] if r["ns_before"] and r["ns_after"]}
    assert {"gemm", "elementwise"} <= classes


@pytest.mark.shared
def test_hta_trace_compare_pair(shared_traces: Path, tmp_path: Path) -> None:
    out = tmp_path / "d.json"
    assert main(["diff", str(shared_traces / "hta/trace_compare/base.json.gz"),
                 str(shared_traces / "hta/trace_compare/test.json.gz"), "--json", str(out), "-q"]) == 0
    doc = orjson.loads(out.read_bytes())
    assert doc["before"]["count"] == doc["after"]["count"] == 2 and doc["speedup"] > 1
