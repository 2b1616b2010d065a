"""``whatif nanoflow`` and ``whatif.api.nanoflow``: NanoFlow's schedule of a trace after a
scenario, through the CLI and the API — the document says what the search found, the collectives
are priced on the scenario's topology unless told otherwise, more capable curves never predict
less, and the same input writes the same bytes."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from _llm_tracegen import llm_trace

from whatif.api import NanoFlowOptions, analyze, nanoflow
from whatif.cli import main
from whatif.core.errors import WhatifError
from whatif.predictors.steps import StepOptions

TP8 = 'name = "tp8"\n[[transform]]\nname = "tensor_parallel"\ndegree = 8\ntopology = "dgx_a100"\n'


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("nanoflow")
    trace = llm_trace(tmp / "dense.json.gz", batch=1024, new_tokens=1, kv_tokens=1024, layers=4, steps=2,
                      hidden=8192, heads=64, kv_heads=8, ffn=28672, device="A100_SXM_80GB",
                      gpu_name="NVIDIA A100-SXM4-80GB")
    scenario = tmp / "tp8.toml"
    scenario.write_text(TP8)
    return trace, scenario


def test_cli_writes_the_document_and_the_partitions(dense, tmp_path: Path, capsys) -> None:
    trace, scenario = dense
    js, table = tmp_path / "nf.json", tmp_path / "partitions.csv"
    args = ["nanoflow", str(trace), "-s", str(scenario), "--json", str(js), "-o", str(table)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "after tp8" in out and "dgx_a100" in out and "NanoFlow" in out and "assumption:" in out
    doc = json.loads(js.read_text())
    assert doc["schema"] == "whatif.nanoflow" and doc["scenario"] == "tp8"
    assert doc["topology"] == "dgx_a100"                      # the scenario's, not the default
    assert doc["comm_ns"] > 0 and doc["layers"] == 4          # tensor_parallel inserted the all-reduces
    assert abs(doc["gemm_ns"] + doc["memory_ns"] + doc["comm_ns"] - doc["sequential_ns"]) <= 2
    p = doc["partition"]
    assert p is not None and p["gemm_share"] + p["memory_share"] + p["comm_share"] == pytest.approx(1.0)
    assert doc["speedup"] > 1.0 and doc["nano_batches"] > 1
    assert doc["speedup"] == pytest.approx(doc["sequential_ns"] / doc["iteration_ns"], rel=1e-5)
    rows = pd.read_csv(table)
    assert {"nano_batches", "gemm_share", "memory_share", "comm_share", "iteration_ns"} <= set(rows.columns)
    assert rows["iteration_ns"].min() == pytest.approx(doc["iteration_ns"], abs=1)
    first = js.read_bytes()
    assert main([*args, "-f", "-q"]) == 0 and js.read_bytes() == first        # same input, same bytes
    assert main(["nanoflow", str(trace), "-s", str(scenario), "--topology", "pcie_a100_8", "-q", "--json",
                 str(tmp_path / "pcie.json")]) == 0
    pcie = json.loads((tmp_path / "pcie.json").read_text())
    assert pcie["topology"] == "pcie_a100_8" and pcie["comm_ns"] == doc["comm_ns"]   # only the parts move


def test_api_more_capable_curves_never_predict_less(dense) -> None:
    trace, scenario = dense
    base = analyze(trace)
    measured, _ = nanoflow(base, scenario)
    ideal, search = nanoflow(base, scenario, NanoFlowOptions(memory_saturation=0.1, comm_saturation=0.05))
    assert ideal.memory_curve.startswith("saturates HBM on 10%") and measured.memory_curve.startswith("NanoFlow")
    assert ideal.speedup > measured.speedup > 1.0
    assert ideal.iteration_ns >= ideal.gemm_ns               # GEMMs on the whole GPU bound every schedule
    assert search.best["iteration_ns"] == pytest.approx(ideal.iteration_ns, abs=1)
    alone, _ = nanoflow(base)                                 # one GPU, no collectives: GEMMs beside memory-bound work
    assert alone.comm_ns == 0 and alone.scenario == "" and alone.topology == "dgx_h100"
    assert alone.partition is None or alone.partition.comm_share == 0


def test_a_scenario_naming_two_topologies_needs_one_chosen(dense, tmp_path: Path, capsys) -> None:
    trace, _ = dense
    two = tmp_path / "two.toml"
    two.write_text('name = "two"\n[[transform]]\nname = "tensor_parallel"\ndegree = 2\ntopology = "dgx_a100"\n'
                   '[[transform]]\nname = "pipeline_parallel"\ndegree = 2\ntopology = "dgx_h100"\n')
    with pytest.raises(WhatifError, match="topologies dgx_a100, dgx_h100: choose"):
        nanoflow(trace, two)
    assert main(["nanoflow", str(trace), "-s", str(two)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--topology" in err


def test_every_transform_with_a_topology_reports_it() -> None:
    """The transforms that price collectives on a topology preset say which one
    (``collective_topology``), the scenario's topology comes from that, and no other transform
    claims one."""
    import dataclasses

    from whatif.transforms import registry
    from whatif.transforms.parallel.comm import OnTopology

    priced = []
    for name in registry.names():
        cls = registry.get(name)
        fields = {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
        if "topology" in fields:
            assert issubclass(cls, OnTopology), name
            t = cls(topology="hgx_b200")
            assert t.collective_topology() == "hgx_b200"
            priced.append(name)
        else:
            assert not issubclass(cls, OnTopology), name
    assert {"tensor_parallel", "pipeline_parallel", "data_parallel", "sequence_parallel", "overlap",
            "reshard"} <= set(priced)


def test_the_warm_up_step_is_left_out_unless_counted(tmp_path: Path, capsys) -> None:
    """Like every mean in whatif, the iteration NanoFlow is searched on leaves out the warm-up step
    (here a prefill of 1,024 tokens before two decode steps) unless --include-warmup counts it."""
    trace = llm_trace(tmp_path / "warm.json.gz", batch=64, kv_tokens=1024, layers=2, steps=3,
                      phases=("prefill", "decode", "decode"), device="A100_SXM_80GB",
                      gpu_name="NVIDIA A100-SXM4-80GB")
    scenario = tmp_path / "tp8.toml"
    scenario.write_text(TP8)
    default, _ = nanoflow(trace, scenario)
    counted, _ = nanoflow(analyze(trace), scenario, steps=StepOptions(include_warmup=True))
    decode_only = 2 * default.gemm_ns
    assert counted.gemm_ns > decode_only                  # the prefill's GEMMs now in the mean of three
    assert any("left out: step 0 (warm-up)" in a for a in default.assumptions)
    assert not any("left out" in a for a in counted.assumptions)
    js = tmp_path / "warm.json"
    assert main(["nanoflow", str(trace), "-s", str(scenario), "--include-warmup", "-q", "--json", str(js)]) == 0
    assert json.loads(js.read_text())["gemm_ns"] == counted.gemm_ns
