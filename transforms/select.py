"""Select tasks of a graph (Daydream's *Select*): by kind, name, layer, op, phase, step, rank,
resource, kernel class, or any predicate over the tasks table. Returns sorted task ids.

>>> import pandas as pd
>>> from whatif.depgraph.graph import TaskGraph
>>> tasks = pd.DataFrame({"kind": [2, 4, 4], "name": ["cudaLaunchKernel", "gemm_a", "relu"],
...                       "rank": 0, "step": [0, 0, 1], "phase": ["decode"] * 3, "layer": None, "op": None,
...                       "resource": [0, 1, 1]})
>>> g = TaskGraph(tasks=tasks, edges=pd.DataFrame(), resources=pd.DataFrame(), steps=pd.DataFrame())
>>> select(g, kind="kernel", name="gemm").tolist()
[1]
>>> select(g, step=1, phase="decode").tolist()
[2]
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from whatif.core.errors import WhatifError
from whatif.core.kernels import KernelClass, classify_kernel
from whatif.depgraph.graph import CPU_KINDS, GPU_WORK_KINDS, TaskGraph, TaskKind

KIND_ALIASES: dict[str, tuple[TaskKind, ...]] = {
    "kernel": (TaskKind.KERNEL,),
    "gpu": tuple(sorted(GPU_WORK_KINDS)),
    "memcpy": (TaskKind.MEMCPY,),
    "memset": (TaskKind.MEMSET,),
    "comm": (TaskKind.COMM,),
    "collective": (TaskKind.COMM,),
    "cpu": tuple(sorted(CPU_KINDS)),
    "call": (TaskKind.CPU_CALL,),
    "cpu_work": (TaskKind.CPU_WORK,),
}


class SelectionError(WhatifError):
    """A selection names something that does not exist (a kind, a class, a bad pattern)."""


_TEXT_KEYS = frozenset({"name", "layer", "op", "resource"})   # one regular expression each
_NUMBER_KEYS = frozenset({"step", "rank"})


@dataclass(frozen=True)
class Selector:
    """A reusable selection, as written in scenario files (every field optional, all must hold).

    ``name``, ``layer`` and ``op`` are regular expressions searched in the task's value;
    ``kind`` is a task kind (``kernel``, ``gpu``, ``cpu``, ``call``, ``comm``…) and
    ``kernel_class`` a :class:`~whatif.core.kernels.KernelClass` name (``gemm``,
    ``elementwise``…); ``step``, ``rank`` accept a number or a list.
    """

    kind: str | list[str] | None = None
    name: str | None = None
    layer: str | None = None
    op: str | None = None
    phase: str | list[str] | None = None
    step: int | list[int] | None = None
    rank: int | list[int] | None = None
    resource: str | None = None
    kernel_class: str | list[str] | None = None

    def __post_init__(self) -> None:
        for key in self.__dataclass_fields__:
            value = getattr(self, key)
            if value is None:
                continue
            text_only = key in _TEXT_KEYS
            item = int if key in _NUMBER_KEYS else str
            values = value if isinstance(value, list) and not text_only else [value]
            if not values or not all(type(v) is item for v in values):
                expected = "text" if item is str else "an integer"
                shape = expected if text_only else f"{expected} or a non-empty list of them"
                raise SelectionError(f"selection key {key!r} must be {shape} (got {value!r})")
            if key in _TEXT_KEYS:
                _compiled(str(value))
        for k in _as_list(self.kind) if self.kind is not None else []:
            _kind_codes(str(k))
        if self.kernel_class is not None:
            _class_names(self.kernel_class)

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items())
        return f"Selector({shown})"

    def as_dict(self) -> dict[str, Any]:
        """The fields that are set (what a scenario file would write)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if getattr(self, k) is not None}

    @classmethod
    def from_mapping(cls, data: dict[str, Any] | None) -> Selector:
        data = dict(data or {})
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise SelectionError(f"unknown selection key {unknown[0]!r} (known: {', '.join(sorted(known))})")
        return cls(**data)

    def why_empty(self, graph: TaskGraph) -> str:
        """Why this selection matches no task of ``graph``: which of its keys matches nothing on
        its own, and for a text key the closest values the graph holds (``op`` is the innermost
        aten op under a task, so ``aten::linear`` shows up as ``aten::addmm``/``aten::mm`` where
        linear decomposes)."""
        head = f"the selection matches no task ({self})"
        if not len(graph.tasks):
            return f"{head}: the graph has no task"
        alone = {k: v for k, v in self.as_dict().items() if not len(Selector(**{k: v})(graph))}
        if not alone:
            return f"{head}: each key matches on its own, not all together"
        hints = []
        for key, value in alone.items():
            if key in _TEXT_KEYS:
                column = graph.resources["name"] if key == "resource" else graph.tasks[key]
                hints.append(f"{key} {value!r} matches nothing; {_closest(column, str(value), key)}"
                             + (_enclosing_only(graph, str(value)) if key == "op" else ""))
            else:
                hints.append(f"{key} {value!r} matches nothing")
        return f"{head}: " + "; ".join(hints)

    def __call__(self, graph: TaskGraph) -> np.ndarray:
        return select(graph, kind=self.kind, name=self.name, layer=self.layer, op=self.op, phase=self.phase,
                      step=self.step, rank=self.rank, resource=self.resource, kernel_class=self.kernel_class)


def _closest(column: pd.Series, pattern: str, key: str, n: int = 3) -> str:
    """The values of ``column`` a user probably meant: those sharing the pattern's last word, else
    the most common ones (with their task counts)."""
    counts = column.dropna().astype(str).value_counts()
    word = re.sub(r"[^A-Za-z0-9_]", " ", pattern.split("::")[-1]).split()
    near = counts[[any(w.lower() in v.lower() for w in word[-1:]) for v in counts.index]] if word else counts[:0]
    shown = near if len(near) else counts
    listed = ", ".join(f"{v} ({c:,})" for v, c in shown.head(n).items())
    return (f"{key}s containing {word[-1]!r}: {listed}" if len(near) else f"most common {key}s: {listed}") \
        if len(shown) else f"no task has a {key}"


def _enclosing_only(graph: TaskGraph, pattern: str) -> str:
    """A note when ``pattern`` names ops the trace records that are no task's innermost op: they
    only enclose other ops (``aten::linear`` around ``aten::addmm``/``aten::mm`` on a GPU), so
    their work is selected by the ops they call, or by ``layer``."""
    if graph.trace is None:
        return ""
    try:
        found = graph.trace.events["name"].astype(str).str.contains(pattern, regex=True)
    except re.error:
        return ""
    n = int(found.sum())
    if not n:
        return ""
    return (f" ({n:,} trace events match {pattern!r}, none as a task's innermost op: they enclose other ops, "
            f"whose names select their work; or select by layer)")


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple, set)) else [value]


def _kind_codes(kind: str) -> list[int]:
    """The task kinds a selection's ``kind`` names (an alias such as ``gpu``, or a kind)."""
    key = kind.lower()
    if key in KIND_ALIASES:
        return [int(x) for x in KIND_ALIASES[key]]
    if key.upper() in TaskKind.__members__:
        return [int(TaskKind[key.upper()])]
    raise SelectionError(f"unknown task kind {kind!r} (known: {', '.join(sorted(KIND_ALIASES))})")


def _class_names(kernel_class: str | Iterable[str]) -> list[str]:
    """The kernel classes a selection's ``kernel_class`` names, lower-cased."""
    wanted = [str(c).lower() for c in _as_list(kernel_class)]
    valid = sorted(c.value for c in KernelClass)
    bad = [c for c in wanted if c not in valid]
    if bad:
        raise SelectionError(f"unknown kernel class {bad[0]!r} (known: {', '.join(valid)})")
    return wanted


def _compiled(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise SelectionError(f"bad pattern {pattern!r}: {exc}") from None


def _regex(column: pd.Series, pattern: str) -> np.ndarray:
    rx = _compiled(pattern)
    if isinstance(column.dtype, pd.CategoricalDtype):
        cats = column.cat.categories
        if not len(cats):
            return np.zeros(len(column), dtype=bool)
        hit = np.fromiter((bool(rx.search(str(c))) for c in cats), dtype=bool, count=len(cats))
        codes = column.cat.codes.to_numpy()
        return np.where(codes >= 0, hit[np.maximum(codes, 0)], False)
    return column.map(lambda v: v is not None and v == v and bool(rx.search(str(v)))).to_numpy(bool)


def kernel_classes(graph: TaskGraph) -> np.ndarray:
    """The :class:`KernelClass` value of every task (``other`` for CPU tasks), per distinct
    (name, op) pair, cached on the graph."""
    return graph.memo("kernel_class", lambda: _classify(graph))


def _classify(graph: TaskGraph) -> np.ndarray:
    t = graph.tasks
    gpu = t["kind"].isin([int(k) for k in KIND_ALIASES["gpu"]]).to_numpy()
    out = np.full(len(t), KernelClass.OTHER.value, dtype=object)
    pairs = pd.DataFrame({"name": t["name"].astype(str).to_numpy()[gpu],
                          "op": t["op"].astype(object).to_numpy()[gpu]})
    codes, uniques = pd.MultiIndex.from_frame(pairs.fillna("")).factorize() if len(pairs) else (np.empty(0, int), [])
    values = np.asarray([classify_kernel(n, o or None).value for n, o in uniques], dtype=object)
    out[gpu] = values[codes] if len(values) else out[gpu]
    return out


def select(graph: TaskGraph, *, kind: str | Iterable[str] | None = None, name: str | None = None,
           layer: str | None = None, op: str | None = None, phase: str | Iterable[str] | None = None,
           step: int | Iterable[int] | None = None, rank: int | Iterable[int] | None = None,
           resource: str | None = None, kernel_class: str | Iterable[str] | None = None,
           where: Callable[[pd.DataFrame], np.ndarray] | None = None) -> np.ndarray:
    """Ids of the tasks that satisfy every given condition (all tasks when none is given)."""
    t = graph.tasks
    mask = np.ones(len(t), dtype=bool)
    if kind is not None:
        kinds = [code for k in _as_list(kind) for code in _kind_codes(str(k))]
        mask &= t["kind"].isin(kinds).to_numpy()
    for column, pattern in (("name", name), ("layer", layer), ("op", op)):
        if pattern is not None:
            mask &= _regex(t[column], pattern)
    if phase is not None:
        mask &= t["phase"].astype(object).isin(_as_list(phase)).to_numpy()
    if step is not None:
        mask &= t["step"].isin(_as_list(step)).to_numpy()
    if rank is not None:
        mask &= t["rank"].isin(_as_list(rank)).to_numpy()
    if resource is not None:
        names = graph.resources["name"].astype(str)
        hit = _regex(names, resource)
        mask &= hit[t["resource"].to_numpy()]
    if kernel_class is not None:
        mask &= np.isin(kernel_classes(graph), _class_names(kernel_class))
    if where is not None:
        mask &= np.asarray(where(t), dtype=bool)
    return np.flatnonzero(mask).astype(np.int64)
