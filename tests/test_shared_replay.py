"""Replay fidelity on the real third-party traces in ../shared/traces (skipped when absent).

Goal from the spine issue: per trace, median step error <= 1 % and worst step <= 3 %.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from whatif.api import analyze
from whatif.depgraph.graph import check_acyclic
from whatif.tracer import TraceError
from whatif.tracer.readers import is_trace_name

pytestmark = [pytest.mark.shared, pytest.mark.slow]  # the whole corpus: the full suite, not the fast lane

REFUSED = {"zoology/mqar_a100_no_gpu_activity.json.gz", "hta/cupti_range_profiler_a100.json.gz",
           "hta/mtia_inference_rank0.json.gz"}
MULTI_RANK = ("hta/sampled_world128",)


def shared_inputs(root: Path) -> list[str]:
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if is_trace_name(p.name)
                   and not any(str(p.relative_to(root)).startswith(m) for m in MULTI_RANK))
    return files + list(MULTI_RANK)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "shared_input" in metafunc.fixturenames:
        root = Path(__file__).resolve().parents[2] / "shared" / "traces"
        names = shared_inputs(root) if root.is_dir() else ["<absent>"]
        metafunc.parametrize("shared_input", names)


def test_replay_reproduces_measured_steps(shared_traces: Path, shared_input: str) -> None:
    path = shared_traces / shared_input
    if shared_input in REFUSED:
        with pytest.raises(TraceError) as exc:
            analyze(path)
        assert "\n" not in str(exc.value) and str(path) in str(exc.value)
        return
    a = analyze(path)
    check_acyclic(a.graph)
    assert np.all(a.replay.end_ns >= a.replay.start_ns)
    err = a.steps["error"].abs()
    assert err.median() <= 0.01, a.steps
    assert err.max() <= 0.03, a.steps
    for row in range(len(a.steps)):
        assert a.critical_path(row).length_ns == a.steps["predicted_ns"].iat[row]


def test_multi_rank_collectives_are_linked(shared_traces: Path) -> None:
    a = analyze(shared_traces / "hta" / "sampled_world128")
    assert sorted(a.steps["rank"].unique().tolist()) == [0, 1]
    assert a.graph.report["collectives_matched"] > 0


def test_export_of_a_real_trace_reloads(shared_traces: Path, tmp_path: Path) -> None:
    a = analyze(shared_traces / "hta" / "nccl_data_a100_rank0of2.json.gz")
    out = a.export(tmp_path / "predicted.pt.trace.json.gz")
    again = analyze(out)
    assert again.steps["step"].tolist() == a.steps["step"].tolist()
    assert np.allclose(again.steps["measured_ns"], a.steps["predicted_ns"], rtol=1e-3)
