"""The generic transforms, usable from a scenario file with any selection: ``scale``,
``set_duration``, ``remove``; and ``interference``, the replay's slowdown of compute kernels
beside collectives (:mod:`whatif.transforms.sharing`).

>>> t = Scale(select=Selector(kind="kernel", name="gemm"), factor=0.5)
>>> t.label()
"scale(select=Selector(kind='kernel', name='gemm'), factor=0.5)"
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from whatif.depgraph.graph import TaskGraph

from .base import Transform, TransformContext, TransformError
from .edit import remove, scale, set_duration, set_state
from .registry import register
from .select import Selector
from .sharing import MAX_INTERFERENCE, SHARE_INTERFERENCE, annotated, interference_of


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
    factor: float = field(default=1.0, metadata={"minimum": 0, "help": "duration multiplier, >= 0"})

    def match(self, graph: TaskGraph, ctx: TransformContext) -> np.ndarray:
        return self.select(graph)

    def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
        return scale(graph, _selected(self, self.select, graph), self.factor, reason=self.label())


@register
@dataclass
class SetDuration(Transform):
    name = "set_duration"
    description = "Set the duration of the selected tasks (microseconds)"

    select: Selector = field(default_factory=Selector, metadata={"help": "which tasks"})
    dur_us: float = field(default=0.0, metadata={"minimum": 0, "help": "new duration of each task, microseconds"})

    def match(self, graph: TaskGraph, ctx: TransformContext) -> np.ndarray:
        return self.select(graph)

    def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
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


@register
@dataclass
class Interference(Transform):
    name = "interference"
    description = ("Set phi, how much slower the replay runs a compute kernel beside a collective "
                   "(1 = not at all; 0 = calibrated on the trace, else 1.15)")

    factor: float = field(default=0.0, metadata={"minimum": 0,
        "help": "phi: a compute kernel beside a collective all its time takes phi x its time alone (1 to 3; "
                "0 = calibrated on the trace, else 1.15)",
        "maximum": MAX_INTERFERENCE})

    def match(self, graph: TaskGraph, ctx: TransformContext) -> np.ndarray:
        return annotated(graph)

    def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
        if self.factor and not 1 <= self.factor <= MAX_INTERFERENCE:
            raise TransformError(f"interference: factor must be 0 (calibrated) or in [1, {MAX_INTERFERENCE:g}] "
                                 f"(got {self.factor})")
        ids = annotated(graph)
        if not len(ids):
            raise TransformError("interference: the graph has no compute kernel the replay re-prices (an analysis "
                                 "of a trace marks them; a graph from build_graph alone has none)")
        phi = float(self.factor) if self.factor else interference_of(graph)
        return set_state(graph, ids, SHARE_INTERFERENCE, phi, reason=f"{self.label()}: phi = {phi:.3f}")
