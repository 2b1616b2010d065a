"""``whatif nanoflow`` and ``whatif.api.nanoflow``: NanoFlow's schedules of a trace after a
scenario, through the CLI and the API — the document says what the search found, more capable
curves never predict less, and the same input writes the same bytes."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from _llm_tracegen import llm_trace

from whatif.api import NanoFlowOptions, analyze, nanoflow
from whatif.cli import main

TP8 = 'name = "tp8"\n[[transform]]\nname = "tensor_parallel"\ndegree = 8\ntopology = "dgx_a100"\n'


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("nanoflow")
    trace = llm_trace(tmp / "dense.json.gz", batch=256, new_tokens=1, kv_tokens=512, layers=4, steps=2,
                      hidden=4096, heads=32, kv_heads=8, ffn=14336, device="A100_SXM_80GB",
                      gpu_name="NVIDIA A100-SXM4-80GB")
    scenario = tmp / "tp8.toml"
    scenario.write_text(TP8)
    return trace, scenario


def test_cli_writes_the_document_and_the_partitions(dense, tmp_path: Path, capsys) -> None:
    trace, scenario = dense
    js, table = tmp_path / "nf.json", tmp_path / "partitions.csv"
    args = ["nanoflow", str(trace), "-s", str(scenario), "--topology", "dgx_a100", "--json", str(js), "-o", str(table)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "after tp8" in out and "per-operation shares" in out and "assumption:" in out
    doc = json.loads(js.read_text())
    assert doc["schema"] == "whatif.nanoflow" and doc["scenario"] == "tp8" and doc["topology"] == "dgx_a100"
    assert doc["comm_ns"] > 0                                   # tensor_parallel inserted the all-reduces
    assert abs(doc["gemm_ns"] + doc["memory_ns"] + doc["comm_ns"] - doc["sequential_ns"]) <= 2
    assert 1.0 <= doc["static_speedup"] <= doc["speedup"]
    assert doc["speedup"] == pytest.approx(doc["sequential_ns"] / doc["iteration_ns"], rel=1e-5)
    assert sum(p["time_ns"] for p in doc["phases"]) <= doc["iteration_ns"]
    for p in doc["phases"]:
        assert p["gemm_share"] + p["memory_share"] + p["comm_share"] == pytest.approx(1.0)
    rows = pd.read_csv(table)
    assert {"nano_batches", "gemm_share", "memory_share", "comm_share", "iteration_ns"} <= set(rows.columns)
    assert rows["iteration_ns"].min() == pytest.approx(doc["static_ns"], abs=1)
    first = js.read_bytes()
    assert main([*args, "-f", "-q"]) == 0 and js.read_bytes() == first        # same input, same bytes


def test_api_more_capable_curves_never_predict_less(dense) -> None:
    trace, scenario = dense
    base = analyze(trace)
    measured, _ = nanoflow(base, scenario, NanoFlowOptions(topology="dgx_a100"))
    ideal, search = nanoflow(base, scenario, NanoFlowOptions(topology="dgx_a100", memory_saturation=0.1,
                                                            comm_saturation=0.05))
    assert ideal.memory_curve.startswith("saturates HBM on 10%") and measured.memory_curve.startswith("NanoFlow")
    assert ideal.speedup > measured.speedup > 1.0
    assert ideal.iteration_ns >= ideal.gemm_ns               # GEMMs on the whole GPU bound every schedule
    assert search.mix.iteration_ns == pytest.approx(ideal.iteration_ns, abs=1)
    alone, _ = nanoflow(base)                                 # one GPU, no collectives: GEMMs beside memory-bound work
    assert alone.comm_ns == 0 and alone.scenario == "" and all(p.comm_share == 0 for p in alone.phases)
