"""What a transform is: a small dataclass with typed parameters, ``apply()`` (a new graph, built
with the primitives of :mod:`whatif.transforms.edit`) and, optionally, ``match()`` (the tasks it
would change, like a torch.profiler pattern).

Cost models live in ``predictors/`` (right of ``transforms/`` in the data flow), so a transform
receives them through :class:`TransformContext` instead of importing them: the front door builds
the context from the trace (recorded GPU, calibrations) and passes it in.
"""
from __future__ import annotations

import dataclasses
import functools
from abc import abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np
import pandas as pd

from whatif.core.bounds import check_fields
from whatif.core.errors import WhatifError
from whatif.depgraph.graph import TaskGraph
from whatif.depgraph.schema import check_schema
from whatif.tracer.memory import RecordEdit
from whatif.tracer.trace import Trace

from .beside import lift_beside, slow_beside
from .edit import applying, follow_kernels, outermost
from .needs import Need
from .placement import Placement


class TransformError(WhatifError):
    """A transform cannot apply (bad parameter, nothing to change where something must)."""


class CostModel(Protocol):
    """Prices of GPU work that optimizations need, calibrated on the trace where it can tell;
    implemented by the cost models of ``whatif.predictors`` (chosen by name: ``--cost-model``,
    a scenario's ``cost_model`` key; see docs/extending.md)."""

    @abstractmethod
    def kernel_facts(self, graph: TaskGraph, tasks: np.ndarray) -> dict[str, np.ndarray]:
        """Per task: ``kernel_class`` (str), ``flops``, ``bytes`` (estimated where shapes are missing),
        ``dtype`` (str)."""

    @abstractmethod
    def memory_bandwidth_bytes_per_s(self, graph: TaskGraph) -> float:
        """Achieved DRAM bandwidth of memory-bound kernels (calibrated on the trace's own kernels,
        or taken from the datasheet)."""

    @abstractmethod
    def precision_factor(self, graph: TaskGraph, tasks: np.ndarray, to_dtype: str) -> np.ndarray:
        """Per task: time multiplier when its math and data move to ``to_dtype``."""

    @abstractmethod
    def move_to_device(self, graph: TaskGraph, tasks: np.ndarray, device: str,
                       fit_from: Sequence[tuple[Trace, Trace]] = ()) -> np.ndarray:
        """Per task: its duration (ns) on GPU ``device`` instead of the recorded one; ``fit_from``:
        pairs of traces of one program on the recorded GPU and on ``device`` to fit the move on."""

    @abstractmethod
    def collective_time_ns(self, kind: str, message_bytes: float, ranks: int, topology_name: str,
                           ranks_per_machine: int | None = None) -> float:
        """ns of one collective (``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``,
        ``send_recv``, ``broadcast``) of ``message_bytes`` (the full buffer) over ``ranks`` GPUs of a
        preset topology, calibrated on the trace's own collective kernels when the model does that."""

    @abstractmethod
    def measure_collectives(self, points: Iterable[tuple]) -> None:
        """Calibrate collectives on measured ``(kind, message_bytes, ranks, dur_ns[,
        ranks_per_machine])`` points of the cluster as well (an nccl-tests run), where the model
        calibrates at all."""

    @abstractmethod
    def kernel_time_ns(self, graph: TaskGraph, tasks: np.ndarray, flops: np.ndarray,
                       nbytes: np.ndarray, max_slowdown: float | None = None,
                       rows: float | np.ndarray | None = None) -> np.ndarray:
        """Per task: its duration (ns) if it did ``flops`` FLOPs and moved ``nbytes`` DRAM bytes
        instead (its class's roofline, anchored on its current time; ``max_slowdown``: at most that
        many times its roofline time counts as work, the rest as latency; ``rows``: the new work is
        its rows × ``rows``, so a GEMM's waves move with them)."""


StepTimes = Callable[[TaskGraph], pd.Series]
"""Replays a graph and returns each step's predicted time (ns; max over ranks), indexed by step."""


@dataclass
class TransformContext:
    """What transforms may use besides the graph: the recorded device, the cost model, and a
    replay of candidate graphs (``step_times_ns``, for transforms that search over plans)."""

    device: str | None = None
    cost: CostModel | None = None
    step_times_ns: StepTimes | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def require_cost(self, transform: str) -> CostModel:
        if self.cost is None:
            raise TransformError(f"{transform} needs cost models; run it through whatif.api.predict or pass "
                                 f"whatif.api.make_context(trace)")
        return self.cost

    def require_step_times(self, transform: str) -> StepTimes:
        if self.step_times_ns is None:
            raise TransformError(f"{transform} replays candidate plans; run it through whatif.api.predict or pass "
                                 f"whatif.api.make_context(trace)")
        return self.step_times_ns


class Transform:
    """Base of every transform. Subclasses are dataclasses whose fields are the parameters.

    Set ``name`` (the registry and scenario-file key) and ``description`` (one line), implement
    ``apply`` (and ``match`` where the transform can tell which tasks it changes); register with
    :func:`whatif.transforms.registry.register`. An optimization ``whatif suggest`` should try
    declares ``requires`` (:class:`~whatif.transforms.needs.Need`) and ``candidates``.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    requires: ClassVar[tuple[Need, ...]] = ()   # what a trace must hold for it to be worth trying

    @classmethod
    def candidates(cls, graph: TaskGraph, ctx: TransformContext) -> list[Transform]:
        """The settings ``whatif suggest`` tries on ``graph`` (its needs met): sensible defaults,
        several where a parameter matters. Empty (the default): the transform needs a choice only
        the user can make (a device, a degree, a factor) and is not suggested on its own. Raises
        TransformError, saying why, when the trace is not one the transform is for."""
        return []

    def __post_init__(self) -> None:
        """Refuse a parameter outside the bounds its field declares (:mod:`whatif.core.bounds`),
        whoever builds the transform; a scenario file reports it with its file and line."""
        try:
            check_fields(self, TransformError)
        except TransformError as exc:
            raise TransformError(f"{self.name}: {exc}") from None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Run every subclass's ``apply`` inside :func:`~whatif.transforms.edit.applying` its name,
        so each change the primitives log names the transform without the transform passing it
        (a transform applied inside another, e.g. ``reshard`` applying ``tensor_parallel``, logs
        under the outer one); then derived tasks (a pipeline bubble, an overlap's later
        nano-batches: :func:`~whatif.transforms.edit.set_follows`) follow what the transform did to
        the kernels they derive from. The outermost ``apply`` sees an overlap's nano-batch kernels
        without the interference of the collective beside them and puts it back at the durations it
        leaves (:mod:`whatif.transforms.beside`)."""
        super().__init_subclass__(**kwargs)
        inner = cls.__dict__.get("apply")
        if inner is None:
            return

        @functools.wraps(inner)
        def apply(self: Transform, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
            outer = outermost()
            with applying(self.name, outer_wins=True):
                out = inner(self, lift_beside(graph) if outer else graph, ctx)
                return check_schema(follow_kernels(slow_beside(out) if outer else out))

        cls.apply = apply  # type: ignore[method-assign]

    def match(self, graph: TaskGraph, ctx: TransformContext) -> np.ndarray:
        """Ids of the tasks this transform would change; every task unless a transform that can
        tell says which."""
        return np.arange(graph.num_tasks, dtype=np.int64)

    def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
        """A new graph with the optimization applied (the input graph is left unchanged)."""
        raise NotImplementedError

    def collective_topology(self) -> str | None:
        """The topology preset this transform prices the collectives it inserts or splits on; None
        for a transform that prices none (:class:`~whatif.transforms.parallel.comm.OnTopology`)."""
        return None

    def placement(self, placement: Placement, graph: TaskGraph, ctx: TransformContext) -> Placement:
        """Where a replica's bytes live after this transform, given where they lived before
        (``graph``: the graph it is applied to). Unchanged unless the transform spreads the model
        over more GPUs or moves bytes out of HBM (:mod:`whatif.transforms.placement`)."""
        return placement

    def memory_edit(self, graph: TaskGraph) -> RecordEdit | None:
        """What this transform changes in the allocator records of ``graph``'s trace (the memory
        timeline ``whatif memory -s`` predicts: :class:`~whatif.tracer.memory.RecordEdit`); None
        where it does not model memory, the default."""
        return None

    def recorded_trace(self, graph: TaskGraph) -> Trace:
        """``graph``'s trace, whose allocator records a :meth:`memory_edit` reads.

        Raises
        ------
        TransformError : the graph has none.
        """
        if graph.trace is None:
            raise TransformError(f"{self.name}: the graph has no trace to read allocator records from")
        return graph.trace

    def params(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)} if dataclasses.is_dataclass(self) \
            else {}

    def label(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in self.params().items() if v not in (None, {}, []))
        return f"{self.name}({shown})"

    def changed_params(self) -> dict[str, Any]:
        """The parameters that differ from their defaults (what a scenario file must say)."""
        if not dataclasses.is_dataclass(self):
            return {}
        defaults = {f.name: f.default if f.default is not dataclasses.MISSING else
                    f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING
                    for f in dataclasses.fields(self)}
        return {k: v for k, v in self.params().items() if v != defaults[k]}

    def setting(self) -> str:
        """The name and the parameters that differ from their defaults: ``precision(dtype=fp8)``."""
        shown = ", ".join(f"{k}={v}" for k, v in self.changed_params().items())
        return f"{self.name}({shown})"
