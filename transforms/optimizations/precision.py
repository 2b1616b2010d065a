"""``precision``: run the selected kernels in a lower precision — a model converted to bf16/fp16
(``model.to(dtype)``; mixed precision, fp32 weights under ``torch.autocast``, is ``autocast``), tf32, fp8,
int8 (W8A8), or weight-only quantization (``int4_weight``, or ``weight_only=true`` with int8/fp8).

Each selected kernel's duration ``T`` becomes ``F' + (T − F')·A'/A`` with ``F' = min(T, L)`` a
fixed latency that never scales (``L``: the device's, ``fixed_latency_ns``) and ``A``, ``A'`` the
kernel's time on the recorded device's achievable roofline before and after
(``achievable_time_ns``: ``max(FLOPs/P, bytes/BW)``, ``P`` the achievable GEMM rate of the dtype at
the recorded kernel's size; vector-unit kernels compute in fp32 whatever they store): the kernel
keeps its share of the roofline, as under every plan and a GPU move, so the order of
``precision`` and ``gpu`` does not matter. A memory-bound kernel scales by the byte ratio, a
compute-bound GEMM by the rate ratio, a decode GEMV by its weight-byte ratio (weight-only:
activations and math stay 16-bit, only GEMM/conv weight bytes shrink, so a compute-bound GEMM
does not change). fp8/int8 keep vector kernels (norms, activations, residuals) in 16-bit; a
kernel already at or below the target is unchanged. bf16/fp16 on every kernel is an fp32 program
converted, so a program whose GEMM, convolution or attention kernels already run in 16 bits (a
converted model, or autocast) is refused, as its memory is: its fp32 kernels are ones it computes in
fp32 on purpose (a norm after ``.float()``); ``select=`` prices chosen kernels. The model and its sources:
:mod:`whatif.predictors.costs`. Reference point: Daydream's AMP (Zhu et al., ATC 2020) ×1/3
compute-bound, ×1/2 memory-bound on V100 fp32→fp16 (compared in ``bench/whatif_precision.py``).

The recorded GPU must be in the catalog and have a native rate for the dtype (fp8 on a V100 or
A100 is refused). The graph remembers what was applied (tasks column ``cost_precision``), so a
later ``gpu`` or ``precision`` transform prices the kernels in their new dtype.

**Memory** (``whatif memory -s``): bf16/fp16 on every kernel is a model converted to the dtype
(``model.to(dtype)``): :meth:`Precision.memory_edit` edits the allocator records as it allocates
(:mod:`.autocast_memory`: every floating-point block in the dtype but SDPA math's fp32 insides and
what follows a ``.float()``; docs/memory.md). tf32 leaves them as recorded; fp8, int8 and
weight-only quantization are not modelled.

>>> Precision(dtype="int4_weight").label()
"precision(dtype=int4_weight, select=Selector(kind='kernel'), weight_only=False)"
>>> Precision(dtype="int8", weight_only=True).spec()
'int8_weight'
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from whatif.core.autocast import AUTOCAST_DTYPES
from whatif.core.dtypes import DType
from whatif.core.kernels import KernelClass
from whatif.depgraph.graph import GPU_WORK_KINDS, TaskGraph, kind_codes
from whatif.depgraph.schema import PRECISION_COLUMN
from whatif.tracer.memory import RecordEdit, RecordEditor

from ..base import Transform, TransformContext, TransformError
from ..edit import scale, set_state
from ..needs import Need
from ..placement import Placement
from ..registry import register
from ..select import Selector
from .autocast_memory import autocast_memory_edit

COLUMN = PRECISION_COLUMN   # read by whatif.predictors.costs
DTYPES = ("tf32", "bf16", "fp16", "fp8", "int8", "int4_weight")
LOW_PRECISION = frozenset(d.value for d in DType if d.bytes <= 2)
"""Compute dtypes of 16 bits or fewer (a kernel's, :meth:`~whatif.predictors.costs.CostModel.kernel_facts`)."""


def record_spec(graph: TaskGraph, tasks: np.ndarray, spec: str) -> TaskGraph:
    """Append ``spec`` to the ``cost_precision`` state of ``tasks`` (sorted ids)."""
    t = graph.tasks
    cur = t[COLUMN].to_numpy(dtype=object)[tasks] if COLUMN in t else np.full(len(tasks), None, dtype=object)
    joined = {old: spec if pd.isna(old) else f"{old}+{spec}" for old in pd.unique(cur)}
    return set_state(graph, tasks, COLUMN, [joined[c] for c in cur], reason=f"kernels now priced at {spec}")


@register
@dataclass
class Precision(Transform):
    name = "precision"
    description = ("Lower precision: a model converted to bf16/fp16, tf32, fp8, int8 (W8A8), int4 weight-only "
                   "(by peak and byte ratios)")
    requires = (Need.GPU_KERNELS, Need.KNOWN_GPU)

    @classmethod
    def candidates(cls, graph: TaskGraph, ctx: TransformContext) -> list[Transform]:
        """bf16 (the model converted), fp8 and int4 weight-only: a GPU without fp8 refuses that one, and
        suggest says so."""
        return [cls(dtype="bf16"), cls(dtype="fp8"), cls(dtype="int4_weight")]

    dtype: str = field(default="bf16", metadata={"help": "tf32, bf16, fp16, fp8, int8 (W8A8) or int4_weight"})
    select: Selector = field(default_factory=lambda: Selector(kind="kernel"),
                             metadata={"help": "which kernels (default: all GPU kernels)"})
    weight_only: bool = field(default=False, metadata={"help": "quantize only GEMM/conv weights (int8, fp8; "
                                                               "int4 is always weight-only)"})

    def __post_init__(self) -> None:
        """The field bounds, and a dtype the transform knows (so a scenario file names its line)."""
        super().__post_init__()
        self.spec()

    def spec(self) -> str:
        """The cost model's spec: ``bf16``…, or ``<dtype>_weight`` for weight-only."""
        d = str(self.dtype).lower().strip()
        if d not in DTYPES:
            raise TransformError(f"precision: unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        if d == "int4_weight":
            return d
        if self.weight_only:
            if d not in ("int8", "fp8"):
                raise TransformError(f"precision: weight_only needs dtype int8 or fp8 (or dtype='int4_weight'), "
                                     f"not {d!r}")
            return f"{d}_weight"
        return d

    def memory_edit(self, graph: TaskGraph) -> RecordEdit | None:
        """A model converted to bf16/fp16 (every kernel selected): the allocator records as it makes
        them (:func:`~.autocast_memory.autocast_memory_edit` with ``converted``); tf32 stores
        fp32, so the records stay; other dtypes and a selection of kernels are not modelled (None)."""
        spec = self.spec()
        trace = self.recorded_trace(graph)
        if spec == "tf32":
            return RecordEditor(trace.memory).edit("precision(dtype=tf32): tf32 is stored as fp32; the allocations "
                                                   "stay as recorded")
        if not self.converts_model():
            return None
        return autocast_memory_edit(trace, spec, converted=True)

    def converts_model(self) -> bool:
        """Whether this is a model converted to bf16/fp16: the dtype on every kernel."""
        return self.spec() in AUTOCAST_DTYPES and self.select == Selector(kind="kernel")

    def match(self, graph: TaskGraph, ctx: TransformContext) -> np.ndarray:
        ids = self.select(graph)
        if not len(ids):
            return ids
        self._check_converts(graph, ids, ctx)
        factor = ctx.require_cost(self.name).precision_factor(graph, ids, self.spec())
        return ids[factor != 1.0]

    def _check_converts(self, graph: TaskGraph, ids: np.ndarray, ctx: TransformContext) -> None:
        """bf16/fp16 on every kernel is an fp32 model converted: refused, as its memory is, when the
        program's GEMMs, convolutions or attention already run in 16 bits (a converted model, or
        autocast): the fp32 kernels left are ones it computes in fp32 on purpose (a norm after
        ``.float()``), which converting it again would not change."""
        spec = self.spec()
        if not self.converts_model():
            return
        facts = ctx.require_cost(self.name).kernel_facts(graph, ids)
        matrix = np.isin(facts["kernel_class"], [c.value for c in KernelClass if c.compute_bound])
        low = np.asarray([str(d) in LOW_PRECISION for d in facts["dtype"]], dtype=bool)
        already = int((matrix & low).sum())
        if already:
            raise TransformError(f"precision: {already:,} of the {int(matrix.sum()):,} GEMM, convolution and attention "
                                 f"kernels already run in 16 bits or fewer: the program is not an fp32 one, and "
                                 f"converting it to {spec} is predicted from an fp32 program (its fp32 kernels are "
                                 f"ones it computes in fp32 on purpose); pass select= to price chosen kernels "
                                 f"in {spec}")

    def placement(self, placement: Placement, graph: TaskGraph, ctx: TransformContext) -> Placement:
        """The weights stored as the spec stores them: the model's GEMM/conv weight bytes after over
        before (the kernel facts; fp8/int8 halve bf16 weights, int4 weight-only quarters them)."""
        ids = self.select(graph)
        if not len(ids):
            return placement
        cost = ctx.require_cost(self.name)
        kernels = np.flatnonzero(np.isin(graph.tasks["kind"].to_numpy(), kind_codes(GPU_WORK_KINDS)))
        before = float(np.nansum(cost.kernel_facts(graph, kernels)["weight_bytes"]))
        if before <= 0:
            return placement
        after = float(np.nansum(cost.kernel_facts(record_spec(graph, ids, self.spec()), kernels)["weight_bytes"]))
        return placement.weights_scaled(after / before)

    def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
        spec = self.spec()
        cost = ctx.require_cost(self.name)
        ids = self.select(graph)
        if not len(ids):
            raise TransformError(f"precision: {self.select.why_empty(graph)}")
        self._check_converts(graph, ids, ctx)
        factor = cost.precision_factor(graph, ids, spec)
        changed = factor != 1.0
        out = scale(record_spec(graph, ids, spec), ids[changed], factor[changed],
                    reason=f"{spec}: {int(changed.sum()):,} of {len(ids):,} selected kernels change "
                           f"(each keeps its share of the achievable roofline); the rest are already at or below "
                           f"{spec} or are fixed latency")
        return out
