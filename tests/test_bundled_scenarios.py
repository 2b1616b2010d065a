"""The scenario files shipped in scenarios/ parse, and predict a speedup where they apply."""
from __future__ import annotations

from pathlib import Path

import pytest

from whatif.api import analyze, predict
from whatif.transforms.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.toml"))
CPU_SAMPLE = ROOT / "sample_traces" / "llm_serve"


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_scenario_files_parse(path: Path) -> None:
    assert load_scenario(path).transforms


def test_cpu_scenarios_speed_up_the_bundled_sample() -> None:
    p = predict(analyze(CPU_SAMPLE), [ROOT / "scenarios" / "faster_linear.toml",
                                      ROOT / "scenarios" / "no_kv_index_copy.toml"])
    base = p.baseline.steps["predicted_ns"].sum()
    for result in p.scenarios:
        assert result.steps["predicted_ns"].sum() < base, result.scenario.name


def test_gpu_scenarios_speed_up_an_h100_trace(shared_traces: Path) -> None:
    trace = shared_traces / "tracelens" / "hf_h100" / "gaunernst_bert-small-uncased__1016001.json.gz"
    p = predict(trace, [ROOT / "scenarios" / "fuse_and_graph.toml"])
    assert p.scenarios[0].steps["predicted_ns"].sum() < p.baseline.steps["predicted_ns"].sum()
    a100 = shared_traces / "hta" / "negative_queue_a100_rank0of16.json.gz"  # GPU-bound (nccl_data is CPU-bound)
    moved = predict(a100, [ROOT / "scenarios" / "bf16_on_h100.toml"])
    assert moved.scenarios[0].steps["predicted_ns"].sum() < moved.baseline.steps["predicted_ns"].sum()
