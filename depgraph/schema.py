"""The declared schema of a :class:`~whatif.depgraph.graph.TaskGraph`'s tables, and its check.

Each table (``tasks``, ``edges``, ``resources``, ``steps``) declares its columns: the dtype family,
whether missing values are allowed, the smallest value, the enum whose codes a column holds, and
the table whose row ids it points into. :func:`validate` raises :class:`GraphSchemaError` naming
the table and column at fault. Extra columns (a plugin's own state) are allowed; the declared
optional ones (``cost_precision``, ``cost_device``, ``cost_follows``, ``cost_follows_group``,
``overlap``'s ``cost_beside_*``: :mod:`whatif.transforms.beside`, and the replay's ``share_ref``
and ``share_interference``: :mod:`whatif.transforms.sharing`) are checked when present.

The check runs after :func:`~whatif.depgraph.build.build_graph` and after every transform's
``apply`` when ``WHATIF_CHECK_SCHEMA=1`` (the test suite sets it, ``tests/conftest.py``);
otherwise :func:`check_schema` costs one environment lookup.

>>> import pandas as pd
>>> g = TaskGraph(tasks=pd.DataFrame({"dur_ns": [1.5]}), edges=pd.DataFrame(), resources=pd.DataFrame(),
...               steps=pd.DataFrame())
>>> try:
...     validate(g)
... except GraphSchemaError as exc:
...     print(exc)
tasks.event: missing column (the graph's tasks table has dur_ns)
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum, IntEnum

import numpy as np
import pandas as pd

from .graph import EdgeKind, GraphError, ResourceKind, TaskGraph, TaskKind

ENV_VAR = "WHATIF_CHECK_SCHEMA"


class GraphSchemaError(GraphError):
    """A graph table lacks a declared column, or a column has the wrong dtype or values."""


class DType(Enum):
    """Dtype families of graph columns."""

    INT = "integer"
    FLOAT = "floating point"
    BOOL = "boolean"
    TEXT = "text (object, string or categorical)"


@dataclass(frozen=True)
class Column:
    """One declared column: ``minimum`` bounds every value, ``codes`` names the enum of its values,
    ``refers_to`` the table whose row ids it holds (``-1`` allowed when ``minimum`` is -1)."""

    name: str
    dtype: DType
    nullable: bool = False
    minimum: int | None = None
    codes: type[IntEnum] | None = None
    refers_to: str | None = None
    required: bool = True


PRECISION_COLUMN = "cost_precision"   # the precision specs applied to a task, "+"-joined (precision)
DEVICE_COLUMN = "cost_device"         # the GPU a task is priced on now (gpu; inserted collectives: their preset's)
FOLLOWS_COLUMN = "cost_follows"       # a derived task's duration as this factor x the kernels it follows
FOLLOWS_GROUP_COLUMN = "cost_follows_group"   # which kernels: those of its group; NaN: its rank and step's
BESIDE_REGION_COLUMN = "cost_beside_region"   # the overlap region of a nano-batch kernel, follower or collective part
BESIDE_AFTER_COLUMN = "cost_beside_after"     # a nano-batch 1 kernel's: the region whose last part it runs beside
BESIDE_PHI_COLUMN = "cost_beside_phi"         # a nano-batch 1 kernel's interference factor at full overlap
BESIDE_SLOWED_COLUMN = "cost_beside_slowed"   # the slowdown its duration holds now (1: lifted)

TASKS = (
    Column("event", DType.INT, minimum=-1),
    Column("kind", DType.INT, codes=TaskKind),
    Column("resource", DType.INT, minimum=0, refers_to="resources"),
    Column("rank", DType.INT, minimum=0),
    Column("dur_ns", DType.INT, minimum=0),
    Column("measured_start_ns", DType.INT, minimum=-1),
    Column("measured_end_ns", DType.INT, minimum=-1),
    Column("step", DType.INT, minimum=-1),
    Column("phase", DType.TEXT, nullable=True),
    Column("layer", DType.TEXT, nullable=True),
    Column("op", DType.TEXT, nullable=True),
    Column("name", DType.TEXT),
    Column(PRECISION_COLUMN, DType.TEXT, nullable=True, required=False),
    Column(DEVICE_COLUMN, DType.TEXT, nullable=True, required=False),
    Column(FOLLOWS_COLUMN, DType.FLOAT, nullable=True, required=False),
    Column(FOLLOWS_GROUP_COLUMN, DType.FLOAT, nullable=True, required=False),
    Column(BESIDE_REGION_COLUMN, DType.FLOAT, nullable=True, required=False),
    Column(BESIDE_AFTER_COLUMN, DType.FLOAT, nullable=True, required=False),
    Column(BESIDE_PHI_COLUMN, DType.FLOAT, nullable=True, required=False),
    Column(BESIDE_SLOWED_COLUMN, DType.FLOAT, nullable=True, required=False),
    Column("share_ref", DType.FLOAT, nullable=True, required=False),
    Column("share_interference", DType.FLOAT, nullable=True, required=False),
)
EDGES = (
    Column("src", DType.INT, minimum=0, refers_to="tasks"),
    Column("dst", DType.INT, minimum=0, refers_to="tasks"),
    Column("lat_ns", DType.INT),
    Column("kind", DType.INT, codes=EdgeKind),
)
RESOURCES = (
    Column("rank", DType.INT, minimum=0),
    Column("kind", DType.INT, codes=ResourceKind),
    Column("device", DType.INT, minimum=-1),
    Column("key", DType.INT),
    Column("name", DType.TEXT),
    Column("ordered", DType.BOOL),
)
STEPS = (
    Column("rank", DType.INT, minimum=0),
    Column("step", DType.INT, minimum=0),
    Column("begin_task", DType.INT, minimum=-1, refers_to="tasks"),
    Column("end_task", DType.INT, minimum=-1, refers_to="tasks"),
    Column("measured_begin_ns", DType.INT),
    Column("measured_end_ns", DType.INT),
)
SCHEMA: dict[str, tuple[Column, ...]] = {"tasks": TASKS, "edges": EDGES, "resources": RESOURCES, "steps": STEPS}
"""Columns per table, in the builder's order."""


def _dtype_ok(series: pd.Series, dtype: DType) -> bool:
    if dtype is DType.INT:
        return pd.api.types.is_integer_dtype(series.dtype) and not pd.api.types.is_bool_dtype(series.dtype)
    if dtype is DType.BOOL:
        return pd.api.types.is_bool_dtype(series.dtype)
    if dtype is DType.FLOAT:
        return pd.api.types.is_float_dtype(series.dtype)
    return isinstance(series.dtype, pd.CategoricalDtype) or pd.api.types.is_string_dtype(series.dtype) \
        or pd.api.types.is_object_dtype(series.dtype)


def _problem(table: str, frame: pd.DataFrame, col: Column, sizes: dict[str, int]) -> str | None:
    """What is wrong with ``col`` of ``frame`` (None when nothing is)."""
    if col.name not in frame:
        if not col.required:
            return None
        have = ", ".join(map(str, frame.columns)) or "no columns"
        return f"missing column (the graph's {table} table has {have})"
    series = frame[col.name]
    if not _dtype_ok(series, col.dtype):
        return f"dtype {series.dtype} is not {col.dtype.value}"
    missing = series.isna().to_numpy()
    if missing.any() and not col.nullable:
        return f"{int(missing.sum()):,} missing values (first at row {int(np.flatnonzero(missing)[0])})"
    if col.dtype is not DType.INT:
        return None
    values = series.to_numpy(dtype=np.int64)
    if col.minimum is not None and len(values) and values.min() < col.minimum:
        return f"value {values.min()} below the minimum {col.minimum} (row {int(values.argmin())})"
    if col.codes is not None:
        known = np.fromiter((int(k) for k in col.codes), dtype=np.int64)
        bad = ~np.isin(values, known)
        if bad.any():
            return f"value {values[bad][0]} is not a {col.codes.__name__} (row {int(np.flatnonzero(bad)[0])})"
    if col.refers_to is not None and len(values) and values.max() >= sizes[col.refers_to]:
        return (f"value {values.max()} is not a row of {col.refers_to} ({sizes[col.refers_to]:,} rows; "
                f"row {int(values.argmax())})")
    return None


def validate(graph: TaskGraph) -> None:
    """Raise :class:`GraphSchemaError` at the first column that breaks :data:`SCHEMA`, naming the
    table and column (``tasks.dur_ns: dtype float64 is not integer``). An empty ``steps`` table
    (a graph mid-build, or a hand-made one) is not checked."""
    tables = {"tasks": graph.tasks, "edges": graph.edges, "resources": graph.resources, "steps": graph.steps}
    sizes = {name: len(frame) for name, frame in tables.items()}
    for table, columns in SCHEMA.items():
        frame = tables[table]
        if table == "steps" and frame.empty:
            continue
        for col in columns:
            problem = _problem(table, frame, col, sizes)
            if problem is not None:
                raise GraphSchemaError(f"{table}.{col.name}: {problem}")


def enabled() -> bool:
    """Whether ``WHATIF_CHECK_SCHEMA`` asks for the check (``1``, ``true``, ``yes``)."""
    return os.environ.get(ENV_VAR, "").strip().lower() in ("1", "true", "yes")


def check_schema(graph: TaskGraph) -> TaskGraph:
    """:func:`validate` ``graph`` when :func:`enabled`; returns ``graph``."""
    if enabled():
        validate(graph)
    return graph
