"""Literal and Enum transform parameters: scenario files (TOML) take a Literal's values and an
Enum's member names or values, refuse anything else in one line naming the file and line;
`whatif transforms` lists the choices; the dashboard's form offers them and writes TOML the
scenario reader takes. A toy transform is registered for these tests and unregistered after."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
from tracegen import KinetoTrace

from whatif.api import predict
from whatif.cli import main
from whatif.depgraph.graph import TaskGraph, TaskKind
from whatif.transforms import edit, registry
from whatif.transforms.base import Transform, TransformContext
from whatif.transforms.scenario import ScenarioError, build_transform, load_scenario
from whatif.transforms.select import Selector

HOW = {"half": 0.5, "quarter": 0.25}


class Speed(Enum):
    FAST = "fast"
    SLOW = "slow"


@dataclass
class ToyChoices(Transform):
    name = "toy_choices"
    description = "Scale every kernel by a named factor, once (fast) or half as much (slow)"

    how: Literal["half", "quarter"] = field(default="half", metadata={"help": "how much shorter"})
    speed: Speed = field(default=Speed.FAST, metadata={"help": "slow: the factor's square root"})
    level: Literal[1, 2] | None = field(default=None, metadata={"help": "unused: an optional Literal of ints"})

    def match(self, graph: TaskGraph, ctx: TransformContext) -> np.ndarray:
        return Selector(kind="kernel")(graph)

    def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
        factor = HOW[self.how] if self.speed is Speed.FAST else HOW[self.how] ** 0.5
        return edit.scale(graph, self.match(graph, ctx), factor, reason=self.label(), transform=self.name)


@pytest.fixture
def toy() -> Iterator[None]:
    registry.names()  # the built-ins are loaded before the snapshot
    saved = dict(registry._REGISTRY)
    registry.register(ToyChoices)
    try:
        yield
    finally:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(saved)
    assert "toy_choices" not in registry.names() and "scale" in registry.names()


def trace(path: Path) -> Path:
    tr = KinetoTrace()
    for n in range(2):
        t0 = n * 100
        tr.step(n, t0, 90)
        tr.runtime("cudaLaunchKernel", t0 + 5, 5, corr=n + 1)
        tr.gpu("gemm", t0 + 12, 64, corr=n + 1)
    return tr.write(path)


def kernel_ns(graph: TaskGraph) -> int:
    t = graph.tasks
    return int(t.loc[t["kind"] == TaskKind.KERNEL, "dur_ns"].sum())


def scenario(tmp_path: Path, body: str, name: str = "s.toml") -> Path:
    path = tmp_path / name
    path.write_text(f'name = "toy {Path(name).stem}"\n\n[[transform]]\nname = "toy_choices"\n{body}\n')
    return path


@pytest.mark.parametrize("body,how,speed,level", [
    ('how = "quarter"', "quarter", Speed.FAST, None),
    ('how = "quarter"\nspeed = "SLOW"', "quarter", Speed.SLOW, None),    # a member's name
    ('speed = "slow"\nlevel = 2', "half", Speed.SLOW, 2),                # a member's value
])
def test_scenario_files_take_literal_and_enum_values(tmp_path: Path, toy: None, body: str, how: str,
                                                     speed: Speed, level: int | None) -> None:
    (t,) = load_scenario(scenario(tmp_path, body)).transforms
    assert (t.how, t.speed, t.level) == (how, speed, level)


def test_the_parameters_change_the_prediction(tmp_path: Path, toy: None) -> None:
    path = trace(tmp_path / "t.json.gz")
    p = predict(path, [scenario(tmp_path, 'how = "quarter"', "q.toml"),
                       scenario(tmp_path, 'how = "quarter"\nspeed = "SLOW"', "qs.toml")])
    base = kernel_ns(p.baseline.graph)
    assert base == 2 * 64_000
    assert [kernel_ns(s.graph) for s in p.scenarios] == [base // 4, base // 2]


@pytest.mark.parametrize("body,line,message", [
    ('how = "third"', 3, "toy_choices.how: must be one of half, quarter (got 'third')"),
    ('speed = "medium"', 3, "toy_choices.speed: must be one of fast, slow (got 'medium')"),
    ('how = "half"\nlevel = true', 3, "toy_choices.level: must be one of 1, 2 (got True)"),
    ('level = 3', 3, "toy_choices.level: must be one of 1, 2 (got 3)"),
    ('how = 1', 3, "toy_choices.how: must be one of half, quarter (got 1)"),
])
def test_values_outside_the_choices_are_one_line(tmp_path: Path, toy: None, body: str, line: int,
                                                 message: str) -> None:
    path = scenario(tmp_path, body)
    with pytest.raises(ScenarioError) as exc:
        load_scenario(path)
    assert str(exc.value) == f"{path}:{line}: {message}"


def test_the_cli_lists_the_choices_and_refuses_others(tmp_path: Path, toy: None, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")  # one table row per line
    assert main(["transforms", "toy_choices"]) == 0
    out = capsys.readouterr().out
    assert "how: one of half, quarter; default: 'half'" in out and "speed: one of fast, slow; default: 'fast'" in out
    assert "level: one of 1, 2 or None; default: None" in out
    bad = scenario(tmp_path, 'speed = "medium"')
    assert main(["predict", str(trace(tmp_path / "t.json.gz")), "-s", str(bad)]) == 2
    assert capsys.readouterr().err == \
        f"whatif: {bad}:3: toy_choices.speed: must be one of fast, slow (got 'medium')\n"


def test_the_dashboard_form_offers_the_choices(tmp_path: Path, toy: None) -> None:
    pytest.importorskip("dash", reason="the dashboard needs the ui extra (pip install -e '.[ui]')")
    from whatif.dashboard.forms import params_from_form, spec_to_toml, transform_form

    dropdowns = {c.children[-1].id["name"]: c.children[-1] for c in transform_form("toy_choices")[1:]}
    assert [o["value"] for o in dropdowns["how"].options] == ["half", "quarter"]
    assert [o["value"] for o in dropdowns["speed"].options] == ["fast", "slow"] and dropdowns["speed"].value == "fast"
    assert [o["value"] for o in dropdowns["level"].options] == [1, 2] and dropdowns["level"].value is None
    params = params_from_form("toy_choices", {"how": "quarter", "speed": "slow", "level": 2})
    assert params == {"how": "quarter", "speed": "slow", "level": 2}
    t = build_transform("toy_choices", params)
    assert (t.how, t.speed, t.level) == ("quarter", Speed.SLOW, 2)
    path = tmp_path / "form.toml"
    path.write_text(spec_to_toml({"name": "from the form", "transform": [{"name": "toy_choices", **params}]}))
    (again,) = load_scenario(path).transforms
    assert again == t
    assert spec_to_toml({"name": "x", "transform": [{"name": "toy_choices", "speed": Speed.SLOW}]}).count(
        'speed = "slow"') == 1
