"""What a transform is: a small dataclass with typed parameters, ``match()`` (the tasks it would
change, like a torch.profiler pattern) and ``apply()`` (a new graph, built with the primitives
of :mod:`whatif.transforms.edit`).

Cost models live in ``predictors/`` (right of ``transforms/`` in the data flow), so a transform
receives them through :class:`TransformContext` instead of importing them: the front door builds
the context from the trace (recorded GPU, calibrations) and passes it in.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np
import pandas as pd

from whatif.core.errors import WhatifError
from whatif.depgraph.graph import TaskGraph
from whatif.depgraph.schema import check_schema

from .edit import applying


class TransformError(WhatifError):
    """A transform cannot apply (bad parameter, nothing to change where something must)."""


class CostModel(Protocol):
    """Prices of GPU work that optimizations need; implemented by ``whatif.predictors``."""

    def kernel_facts(self, graph: TaskGraph, tasks: np.ndarray) -> dict[str, np.ndarray]:
        """Per task: ``kernel_class`` (str), ``flops``, ``bytes`` (estimated where shapes are missing),
        ``dtype`` (str)."""
        ...

    def memory_bandwidth_bytes_per_s(self, graph: TaskGraph) -> float:
        """Achieved DRAM bandwidth of memory-bound kernels, calibrated on the trace's own kernels."""
        ...

    def precision_factor(self, graph: TaskGraph, tasks: np.ndarray, to_dtype: str) -> np.ndarray:
        """Per task: time multiplier when its math and data move to ``to_dtype``."""
        ...

    def move_to_device(self, graph: TaskGraph, tasks: np.ndarray, device: str) -> np.ndarray:
        """Per task: its duration (ns) on GPU ``device`` instead of the recorded one."""
        ...

    def collective_time_ns(self, kind: str, message_bytes: float, ranks: int, topology_name: str,
                           ranks_per_machine: int | None = None) -> float:
        """ns of one collective (``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``,
        ``send_recv``, ``broadcast``) of ``message_bytes`` (the full buffer) over ``ranks`` GPUs of a
        preset topology, calibrated on the trace's own collective kernels when it has some."""
        ...

    def kernel_time_ns(self, graph: TaskGraph, tasks: np.ndarray, flops: np.ndarray,
                       nbytes: np.ndarray) -> np.ndarray:
        """Per task: its duration (ns) if it did ``flops`` FLOPs and moved ``nbytes`` DRAM bytes
        instead (its class's roofline calibrated on the trace, anchored on its current time)."""
        ...

    def step_times_ns(self, graph: TaskGraph) -> pd.Series:
        """Replay ``graph`` and return each step's predicted time (ns; max over ranks), indexed by step:
        for transforms that search over plans and must compare them."""
        ...



@dataclass
class TransformContext:
    """What transforms may use besides the graph: the recorded device and the cost models."""

    device: str | None = None
    cost: CostModel | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def require_cost(self, transform: str) -> CostModel:
        if self.cost is None:
            raise TransformError(f"{transform} needs cost models; run it through whatif.api.predict or pass "
                                 f"TransformContext(cost=whatif.predictors.costs.TraceCostModel(trace))")
        return self.cost


class Transform:
    """Base of every transform. Subclasses are dataclasses whose fields are the parameters.

    Set ``name`` (the registry and scenario-file key) and ``description`` (one line), implement
    ``match`` and ``apply``; register with :func:`whatif.transforms.registry.register`.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Run every subclass's ``apply`` inside :func:`~whatif.transforms.edit.applying` its name,
        so each change the primitives log names the transform without the transform passing it
        (a transform applied inside another, e.g. ``reshard`` applying ``tensor_parallel``, logs
        under the outer one)."""
        super().__init_subclass__(**kwargs)
        inner = cls.__dict__.get("apply")
        if inner is None:
            return

        @functools.wraps(inner)
        def apply(self: Transform, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
            with applying(self.name, outer_wins=True):
                return check_schema(inner(self, graph, ctx))

        cls.apply = apply  # type: ignore[method-assign]

    def match(self, graph: TaskGraph, ctx: TransformContext) -> np.ndarray:
        """Ids of the tasks this transform would change."""
        raise NotImplementedError

    def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
        """A new graph with the optimization applied (the input graph is left unchanged)."""
        raise NotImplementedError

    def params(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)} if dataclasses.is_dataclass(self) \
            else {}

    def label(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in self.params().items() if v not in (None, {}, []))
        return f"{self.name}({shown})"
