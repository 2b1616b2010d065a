"""Cost models by name: the registry, ``--cost-model``, a scenario's ``cost_model`` key, the one-line
error for an unknown name, and what the ``datasheet`` model drops from the ``trace`` one."""
from __future__ import annotations

from collections.abc import Iterator
from enum import Enum
from pathlib import Path

import orjson
import pytest
from tracegen import KinetoTrace

from whatif.api import analyze, make_context, predict
from whatif.cli import main
from whatif.core.errors import WhatifError
from whatif.hardware.devices import get_device
from whatif.predictors.cost_models import (
    COST_MODELS,
    CostConfig,
    CostModelBase,
    CostModelError,
    CostModelName,
)
from whatif.predictors.costs import TraceCostModel
from whatif.predictors.datasheet import DatasheetCostModel
from whatif.transforms.scenario import load_scenario

ELEMENTS = 4 * 2**20
KERNEL_US = 50
A100_BW_BYTES_PER_S = 2039e9


def adds_trace(path: Path) -> Path:
    """Six fp32 adds of 4 Mi elements with recorded shapes, 50 us each, back to back on the GPU:
    50 MB in 50 us is about 1.0 TB/s, below the datasheet model's 0.7 x 2039 GB/s."""
    tr = KinetoTrace()
    t_gpu = 20
    for i in range(6):
        ext = i + 1
        tr.op("aten::add", 3 + 8 * i, 7, args={"External id": ext, "Input Dims": [[ELEMENTS], [ELEMENTS]],
                                              "Input type": ["float", "float"]})
        tr.runtime("cudaLaunchKernel", 5 + 8 * i, 3, corr=ext)
        tr.gpu("vectorized_elementwise_kernel<add>", t_gpu, KERNEL_US, corr=ext, **{"External id": ext})
        t_gpu += KERNEL_US + 1
    tr.runtime("cudaDeviceSynchronize", 53, t_gpu - 53, corr=99)
    tr.step(0, 0, t_gpu + 2)
    return tr.write(path)


def scenario_file(path: Path, cost_model: str | None = None) -> Path:
    key = f'cost_model = "{cost_model}"\n' if cost_model else ""
    path.write_text(f'name = "{path.stem}"\n{key}\n[[transform]]\nname = "fuse"\n')
    return path


@pytest.fixture(scope="module")
def adds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return adds_trace(tmp_path_factory.mktemp("cost") / "adds.json")


def speedups(out: Path) -> dict[str, float]:
    return {s["name"]: s["speedup"] for s in orjson.loads(out.read_bytes())["scenarios"]}


def test_registry_lists_the_built_ins_in_order() -> None:
    assert COST_MODELS.names() == ("trace", "datasheet")
    assert COST_MODELS.get("trace") is TraceCostModel and COST_MODELS.get(CostModelName.DATASHEET) is \
        DatasheetCostModel
    assert CostConfig().cost_model is CostModelName.TRACE
    with pytest.raises(CostModelError, match=r"^unknown cost model 'roofline' \(cost models: trace, datasheet\)$"):
        CostConfig("roofline")


def test_datasheet_drops_the_calibrations(adds: Path) -> None:
    a = analyze(adds)
    trace, sheet = make_context(a.trace).cost, make_context(a.trace, "datasheet").cost
    assert isinstance(trace, TraceCostModel) and isinstance(sheet, DatasheetCostModel)
    measured = 3 * ELEMENTS * 4 / (KERNEL_US * 1e-6)
    assert trace.memory_bandwidth_bytes_per_s(a.graph) == pytest.approx(measured)
    # the datasheet model takes the catalog's achievable streaming bandwidth (below the datasheet peak)
    a100 = get_device("A100_SXM_80GB")
    assert sheet.memory_bandwidth_bytes_per_s(a.graph) == pytest.approx(a100.stream_bw_bytes_per_s)
    assert a100.stream_bw_bytes_per_s < A100_BW_BYTES_PER_S
    # one graph priced by both: each keeps its own facts
    assert trace.memory_bandwidth_bytes_per_s(a.graph) == pytest.approx(measured)
    ids = a.graph.tasks.index.to_numpy()[:3]
    assert (trace.precision_factor(a.graph, ids, "bf16") == sheet.precision_factor(a.graph, ids, "bf16")).all()


def test_cli_option_and_scenario_key(adds: Path, tmp_path: Path) -> None:
    plain = scenario_file(tmp_path / "plain.toml")
    sheet = scenario_file(tmp_path / "sheet.toml", "datasheet")
    out = tmp_path / "p.json"
    assert main(["predict", str(adds), "-s", str(plain), "-s", str(sheet), "--json", str(out), "-q"]) == 0
    by_key = speedups(out)
    assert by_key["plain"] != by_key["sheet"]
    assert main(["predict", str(adds), "-s", str(plain), "--cost-model", "datasheet", "--json", str(out), "-q"]) == 0
    assert speedups(out)["plain"] == by_key["sheet"]
    trace_key = scenario_file(tmp_path / "trace_key.toml", "trace")  # a scenario's own key wins over the option
    assert main(["predict", str(adds), "-s", str(trace_key), "--cost-model", "datasheet", "--json", str(out),
                 "-q"]) == 0
    assert speedups(out)["trace_key"] == by_key["plain"]
    assert predict(adds, [load_scenario(plain)], cost_model="datasheet").scenarios[0].steps["predicted_ns"].sum() \
        == predict(adds, [load_scenario(sheet)]).scenarios[0].steps["predicted_ns"].sum()


@pytest.mark.parametrize("command", ["predict", "report", "serve", "sweep"])
def test_the_commands_that_predict_take_the_option(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert "--cost-model {trace,datasheet}" in capsys.readouterr().out


def test_unknown_names_are_one_line_exit_2(adds: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = scenario_file(tmp_path / "bad.toml", "roofline")
    assert main(["predict", str(adds), "-s", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err == f"whatif: {bad}: cost_model: unknown cost model 'roofline' (cost models: trace, datasheet)\n"
    with pytest.raises(SystemExit) as exc:
        main(["predict", str(adds), "-s", str(scenario_file(tmp_path / "ok.toml")), "--cost-model", "roofline"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--cost-model" in err and "'trace', 'datasheet'" in err
    (tmp_path / "typed.toml").write_text('cost_model = 3\n[[transform]]\nname = "fuse"\n')
    with pytest.raises(WhatifError, match=r"typed.toml: cost_model must be a name"):
        load_scenario(tmp_path / "typed.toml")


class _FakeName(str, Enum):
    SLOWER = "slower_than_measured"


class _Slower(TraceCostModel):
    key = _FakeName.SLOWER


class _EntryPoint:
    name, value = "slower", "tests:_Slower"

    def load(self) -> type:
        return _Slower


@pytest.fixture
def fresh_cost_models(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    COST_MODELS.names()
    saved = dict(COST_MODELS._classes)
    monkeypatch.setattr(COST_MODELS, "_loaded", False)
    yield
    COST_MODELS._classes.clear()
    COST_MODELS._classes.update(saved)


def test_entry_points_add_cost_models(monkeypatch: pytest.MonkeyPatch, fresh_cost_models: None) -> None:
    import whatif.core.plugins as plugins

    def entry_points(group: str) -> list[_EntryPoint]:
        return [_EntryPoint()] if group == "whatif.cost_models" else []

    monkeypatch.setattr(plugins, "entry_points", entry_points)
    assert COST_MODELS.names() == ("trace", "datasheet", "slower_than_measured")
    assert COST_MODELS.get("slower_than_measured") is _Slower


def test_a_cost_model_must_implement_the_protocol() -> None:
    class Partial(CostModelBase):
        def __init__(self, trace: object) -> None:
            self.trace = trace

    with pytest.raises(TypeError, match="abstract"):
        Partial(None)


def test_dashboard_prices_a_spec_by_its_cost_model(adds: Path) -> None:
    pytest.importorskip("dash", reason="the dashboard needs the ui extra (pip install -e '.[ui]')")
    from whatif.dashboard.forms import spec_from_toml, spec_to_toml
    from whatif.dashboard.state import Run

    run = Run(id="adds", path=adds, label="adds")
    spec = {"name": "fused", "transform": [{"name": "fuse"}]}
    trace = run.quick_document(spec).speedup
    sheet_spec = {**spec, "cost_model": "datasheet"}
    assert spec_from_toml(spec_to_toml(sheet_spec)) == sheet_spec
    assert run.quick_document(sheet_spec).speedup != trace
    assert run.quick_document({**spec, "cost_model": "trace"}).speedup == trace
    assert {model for model, _points in run._contexts} == {CostModelName.TRACE, CostModelName.DATASHEET}


def test_a_broken_cost_model_plugin_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import EntryPoint

    from whatif.cli import main
    from whatif.core import plugins
    from whatif.predictors.cost_models import COST_MODELS

    broken = EntryPoint(name="broken", value="no_such_module_xyz:Model", group="whatif.cost_models")
    real = plugins.entry_points
    monkeypatch.setattr(plugins, "entry_points",
                        lambda group: [broken] if group == "whatif.cost_models" else real(group=group))
    monkeypatch.setattr(COST_MODELS, "_loaded", False)
    assert main(["devices"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "plugin 'broken'" in err[0] and "no_such_module_xyz" in err[0]
    monkeypatch.setattr(plugins, "entry_points", real)
    assert COST_MODELS.names()[:2] == ("trace", "datasheet")   # it loads once the plugin is gone
