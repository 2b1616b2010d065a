"""``whatif suggest`` (issue 16): every optimization whose needs the trace meets is tried alone and
ranked by predicted speedup; the top entry, written as a scenario and predicted on its own, gives
the same number; transforms not tried are listed with the reason."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from _llm_tracegen import llm_trace

from whatif.api import analyze, predict
from whatif.cli import main
from whatif.suggest import suggest
from whatif.summary import scenario_headline
from whatif.transforms import registry
from whatif.transforms.needs import Need
from whatif.transforms.scenario import scenario_from_dict

ROOT = Path(__file__).resolve().parents[1]
SHARED = ["tracelens/hf_h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
          "kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz",
          "hta/critical_path_alexnet_a100.json.gz"]


def _alone(base, suggestion) -> float:
    """The suggestion's setting written as a scenario file's table, predicted on its own."""
    scenario = scenario_from_dict({"name": "alone", "transform": [{"name": suggestion.transform,
                                                                    **suggestion.params}]}, source="<test>")
    return scenario_headline(base, predict(base, [scenario]).scenarios[0]).speedup


def test_a_cpu_only_trace_gets_no_gpu_suggestion_and_says_why() -> None:
    doc = suggest(ROOT / "sample_traces" / "llm_serve")
    reasons = {k.transform: k.reason for k in doc.skipped}
    assert not doc.suggestions
    for name in ("fuse", "cuda_graph", "precision"):
        assert reasons[name] == f"needs {Need.GPU_KERNELS.value}"
    assert reasons["overlap"] == f"needs {Need.COLLECTIVES.value}"
    assert "choice only you can make" in reasons["tensor_parallel"]
    assert set(reasons) | {s.transform for s in doc.suggestions} == set(registry.names())


def test_suggestions_are_ranked_and_each_equals_its_scenario_alone(tmp_path: Path) -> None:
    base = analyze(llm_trace(tmp_path / "t.json.gz", layers=2, steps=3, batch=8, kv_tokens=512))
    doc = suggest(base)
    speedups = [s.headline.speedup for s in doc.suggestions]
    assert len(speedups) >= 2 and speedups == sorted(speedups, reverse=True)
    assert [s.rank for s in doc.suggestions] == list(range(1, len(speedups) + 1))
    assert {s.headline.baseline_mean_step_ns for s in doc.suggestions} == {doc.baseline_mean_step_ns}
    for s in doc.suggestions:
        assert _alone(base, s) == s.headline.speedup
        assert s.saved_ns_per_step == s.headline.baseline_mean_step_ns - s.headline.mean_step_ns
        assert all(v <= s.headline.speedup for v in s.others.values())   # the best setting is the one shown
    tried = {s.transform for s in doc.suggestions} | {k.transform for k in doc.skipped}
    assert tried == set(registry.names())


def test_an_extra_scenario_is_ranked_with_the_suggestions(tmp_path: Path) -> None:
    base = analyze(llm_trace(tmp_path / "t.json.gz", layers=1, steps=2))
    extra = tmp_path / "x.toml"
    extra.write_text('name = "all kernels 5x"\n[[transform]]\nname = "scale"\nfactor = 0.2\n'
                     '[transform.select]\nkind = "kernel"\n')
    doc = suggest(base, [extra])
    top = doc.suggestions[0]
    assert top.transform == "all kernels 5x" and top.headline.speedup > 1.9


@pytest.mark.slow
@pytest.mark.parametrize("name", SHARED)
def test_suggest_on_shared_traces_top_entry_verified_alone(shared_traces: Path, name: str) -> None:
    base = analyze(shared_traces / name)
    doc = suggest(base)
    assert doc.suggestions, [k.reason for k in doc.skipped]
    top = doc.suggestions[0]
    assert top.headline.speedup > 1.0 and top.headline.baseline_mean_step_ns == doc.baseline_mean_step_ns
    assert _alone(base, top) == top.headline.speedup


def test_cli_table_json_and_top(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = llm_trace(tmp_path / "t.json.gz", layers=1, steps=2)
    assert main(["suggest", str(trace), "--top", "1", "--json", str(tmp_path / "s.json")]) == 0
    out = capsys.readouterr().out
    doc = json.loads((tmp_path / "s.json").read_text())
    assert (doc["schema"], doc["version"]) == ("whatif.suggest", 1)
    first = doc["suggestions"][0]
    assert first["setting"] in out and f"{first['headline']['speedup']:.3f}x" in out
    assert doc["suggestions"][1]["setting"] not in out.split("not tried")[0]   # --top 1 shows one row
    assert "more; --top" in out and "not tried:" in out


def test_a_refusal_reason_does_not_repeat_the_transform_name() -> None:
    """``not tried: dataloader: dataloader: no data-loading task ...`` read twice (CLI audit, 2026-11-28)."""
    doc = suggest(Path(__file__).resolve().parents[1] / "sample_traces" / "llm_serve")
    loader = [k for k in doc.skipped if k.transform == "dataloader"]
    assert loader and loader[0].reason.startswith("no data-loading task")
    assert not any(k.reason.startswith(f"{k.transform}:") for k in doc.skipped)
