"""The graph tables' declared schema (whatif.depgraph.schema): a built graph and a transformed one
pass; a missing column, a wrong dtype or a bad value fails naming the table and column; the check
runs after the build and after each transform when WHATIF_CHECK_SCHEMA is set."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from whatif.api import analyze, make_context
from whatif.depgraph.graph import TaskGraph
from whatif.depgraph.schema import ENV_VAR, SCHEMA, GraphSchemaError, check_schema, enabled, validate
from whatif.transforms import edit
from whatif.transforms.generic import Scale
from whatif.transforms.select import Selector

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "llm_serve"


@pytest.fixture(scope="module")
def graph() -> TaskGraph:
    return analyze(SAMPLE).graph


def test_the_suite_runs_with_the_check_on() -> None:
    assert enabled()


def test_a_built_graph_passes(graph: TaskGraph) -> None:
    validate(graph)
    for table, columns in SCHEMA.items():
        frame = getattr(graph, table)
        required = [c.name for c in columns if c.required]
        assert required == [c for c in frame.columns if c in required]
    assert {"share_ref", "share_interference"} <= set(graph.tasks.columns)   # the analysis' annotations


def test_the_analysis_annotations_are_checked(graph: TaskGraph) -> None:
    with pytest.raises(GraphSchemaError, match=r"^tasks\.share_ref: dtype object is not floating point"):
        validate(_edited(graph, "tasks", "share_ref", np.full(len(graph.tasks), None, dtype=object)))


def test_a_transformed_graph_passes(graph: TaskGraph) -> None:
    a = analyze(SAMPLE)
    out = Scale(select=Selector(op="aten::linear"), factor=0.5).apply(a.graph, make_context(a.trace))
    validate(out)
    validate(edit.set_state(out, [1, 2], "cost_precision", "bf16", reason="test"))


def _edited(graph: TaskGraph, table: str, column: str, values: object | None) -> TaskGraph:
    out = graph.copy()
    frame = getattr(out, table)
    if values is None:
        setattr(out, table, frame.drop(columns=[column]))
    else:
        frame[column] = values
    return out


@pytest.mark.parametrize(("table", "column", "values", "message"), [
    ("tasks", "dur_ns", None, r"^tasks\.dur_ns: missing column"),
    ("tasks", "dur_ns", "float", r"^tasks\.dur_ns: dtype float64 is not integer"),
    ("tasks", "dur_ns", "negative", r"^tasks\.dur_ns: value -5 below the minimum 0"),
    ("tasks", "kind", "unknown", r"^tasks\.kind: value 99 is not a TaskKind"),
    ("tasks", "resource", "dangling", r"^tasks\.resource: value \d+ is not a row of resources"),
    ("tasks", "name", "missing", r"^tasks\.name: 1 missing values"),
    ("edges", "src", "float", r"^edges\.src: dtype float64 is not integer"),
    ("edges", "dst", None, r"^edges\.dst: missing column"),
    ("resources", "ordered", "int", r"^resources\.ordered: dtype int64 is not boolean"),
    ("steps", "begin_task", "float", r"^steps\.begin_task: dtype float64 is not integer"),
])
def test_a_broken_column_is_named(graph: TaskGraph, table: str, column: str, values: str | None,
                                  message: str) -> None:
    frame = getattr(graph, table)
    col = frame[column] if values is not None else None
    new: object | None = None
    if values == "float":
        new = col.to_numpy(dtype=float)
    elif values == "negative":
        new = np.where(np.arange(len(col)) == 3, -5, col.to_numpy())
    elif values == "unknown":
        new = np.where(np.arange(len(col)) == 0, 99, col.to_numpy()).astype(col.dtype)
    elif values == "dangling":
        new = col.to_numpy() + len(graph.resources)
    elif values == "missing":
        new = col.astype(object).where(np.arange(len(col)) != 2, None)
    elif values == "int":
        new = col.to_numpy().astype(np.int64)
    with pytest.raises(GraphSchemaError, match=message):
        validate(_edited(graph, table, column, new))


def test_extra_columns_are_allowed(graph: TaskGraph) -> None:
    validate(_edited(graph, "tasks", "my_plugin_state", np.zeros(graph.num_tasks)))


def test_check_schema_follows_the_environment(graph: TaskGraph, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = _edited(graph, "tasks", "dur_ns", graph.tasks["dur_ns"].to_numpy(dtype=float))
    monkeypatch.setenv(ENV_VAR, "0")
    assert check_schema(broken) is broken
    monkeypatch.setenv(ENV_VAR, "1")
    with pytest.raises(GraphSchemaError, match=r"tasks\.dur_ns"):
        check_schema(broken)


def test_a_transform_that_breaks_the_schema_fails_at_its_apply(graph: TaskGraph,
                                                               transform_registry: object) -> None:
    from dataclasses import dataclass

    from whatif.transforms.base import Transform, TransformContext

    @dataclass
    class Halve(Transform):
        name = "halve_to_float"

        def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
            out = edit.note(graph, "halve", reason="test")
            out.tasks = out.tasks.assign(dur_ns=out.tasks["dur_ns"] / 2)  # what no primitive would do
            return out

    with pytest.raises(GraphSchemaError, match=r"^tasks\.dur_ns: dtype float64"):
        Halve().apply(graph, TransformContext())
