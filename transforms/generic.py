"""The generic transforms, usable from a scenario file with any selection: ``scale``,
``set_duration``, ``remove``.

>>> t = Scale(select=Selector(kind="kernel", name="gemm"), factor=0.5)
>>> t.label()
"scale(select=Selector(kind='kernel', name='gemm'), factor=0.5)"
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from whatif.depgraph.graph import TaskGraph

from .base import Transform, TransformContext, TransformError
from .edit import remove, scale, set_duration
from .registry import register
from .select import Selector


def _selected(t: Transform, select: Selector, graph: TaskGraph) -> np.ndarray:
    ids = select(graph)
    if len(ids) == 0:
        raise TransformError(f"{t.name}: {select.why_empty(graph)}")
    return ids


@register
@dataclass
class Scale(Transform):
    name = "scale"
    description = "Multiply the duration of the selected tasks by a factor (0.5 = twice as fast)"

    select: Selector = field(default_factory=Selector, metadata={"help": "which tasks"})
    factor: float = field(default=1.0, metadata={"help": "duration multiplier, >= 0"})

    def match(self, graph: TaskGraph, ctx: TransformContext) -> np.ndarray:
        return self.select(graph)

    def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
        if self.factor < 0:
            raise TransformError("scale: factor must be >= 0")
        return scale(graph, _selected(self, self.select, graph), self.factor, reason=self.label())


@register
@dataclass
class SetDuration(Transform):
    name = "set_duration"
    description = "Set the duration of the selected tasks (microseconds)"

    select: Selector = field(default_factory=Selector, metadata={"help": "which tasks"})
    dur_us: float = field(default=0.0, metadata={"help": "new duration of each task, microseconds"})

    def match(self, graph: TaskGraph, ctx: TransformContext) -> np.ndarray:
        return self.select(graph)

    def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
        if self.dur_us < 0:
            raise TransformError("set_duration: dur_us must be >= 0")
        return set_duration(graph, _selected(self, self.select, graph), self.dur_us * 1000.0,
                            reason=self.label())


@register
@dataclass
class Remove(Transform):
    name = "remove"
    description = "Remove the selected tasks, keeping the order they enforced (CPU gaps stay)"

    select: Selector = field(default_factory=Selector, metadata={"help": "which tasks"})

    def match(self, graph: TaskGraph, ctx: TransformContext) -> np.ndarray:
        return self.select(graph)

    def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
        return remove(graph, _selected(self, self.select, graph), reason=self.label())
