"""HolisticTraceAnalysis 0.5.0 and TraceLens themselves on whatif's run folders and exports (slow:
HTA is pip-installed into a throw-away venv, skipped when it cannot be; TraceLens comes from the
checkout named by $WHATIF_TRACELENS, skipped when absent). The same runs as bench/interop.py."""
from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from _cost_data import bench_module

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def interop() -> ModuleType:
    return bench_module("interop")


@pytest.fixture(scope="module")
def hta_py(interop: ModuleType) -> Path:
    py = bench_module("common.hta").hta_python()
    if py is None:
        pytest.skip("HolisticTraceAnalysis 0.5.0 could not be installed (no network?)")
    return py


def test_hta_loads_every_rank_of_a_two_rank_recording(interop: ModuleType, hta_py: Path, tmp_path: Path) -> None:
    run = interop.record_two_ranks(tmp_path / "run")
    assert interop.hta(hta_py, "ranks", run)["ranks"] == [0, 1]
    assert interop.hta(hta_py, "ranks", interop.as_before(run, tmp_path / "before"))["ranks"] == [0]


def test_hta_loads_every_rank_of_a_two_rank_export(interop: ModuleType, hta_py: Path, shared_traces: Path,
                                                   tmp_path: Path) -> None:
    out = interop.export(shared_traces / "hta" / "sampled_world128", tmp_path / "out")
    assert interop.hta(hta_py, "ranks", out)["ranks"] == [0, 1]


def test_hta_critical_path_runs_on_an_export(interop: ModuleType, hta_py: Path, shared_traces: Path,
                                             tmp_path: Path) -> None:
    trace = shared_traces / "hta" / "critical_path_alexnet_a100.json.gz"
    annotation, instance = interop.CRITICAL_PATH_ANNOTATION
    original = interop.hta(hta_py, "critical-path", interop.alone(trace, tmp_path / "in"), annotation, str(instance))
    out = interop.export(trace, tmp_path / "out" / "exported.pt.trace.json.gz")
    exported = interop.hta(hta_py, "critical-path", out.parent, annotation, str(instance))
    assert original["ok"] and exported["ok"]
    assert exported == original


@pytest.mark.parametrize("name", bench_module("interop").TRACELENS_TRACES)
def test_tracelens_builds_the_same_gemm_and_sdpa_rows_on_an_export(interop: ModuleType, shared_traces: Path,
                                                                  tmp_path: Path, name: str) -> None:
    common = bench_module("common.tracelens")
    source = common.tracelens_source()
    if source is None:
        pytest.skip("no TraceLens checkout: set WHATIF_TRACELENS to an AMD-AGI/TraceLens source folder")
    py = common.tracelens_python(source)
    if py is None:
        pytest.skip("TraceLens's dependencies could not be installed (no network?)")
    trace = shared_traces / name
    original = interop.tracelens(py, source, trace)
    exported = interop.tracelens(py, source, interop.export(trace, tmp_path / "exported.json.gz"))
    for sheet in ("GEMM", "SDPA_fwd"):
        assert original[sheet]["rows"], sheet
        assert exported[sheet]["rows"] == original[sheet]["rows"]
        assert exported[sheet]["kernel_us"] == pytest.approx(original[sheet]["kernel_us"], rel=1e-5)
