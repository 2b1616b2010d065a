"""``batch``: the traced program at ``factor`` × its batch per GPU (2: twice the samples, tokens or
sequences in every step; 0.5: half).

Every GPU kernel does ``factor`` × its FLOPs and moves ``factor`` × its activation bytes, but
reads its weights once whatever the batch: FLOPs ``F·k``, DRAM bytes ``(B − W)·k + W``
(``W``: a GEMM's weight bytes, 0 for other kernels; the kernel facts of
``CostModel.kernel_facts``), priced by ``CostModel.kernel_time_ns`` (the achievable roofline
anchored on the kernel's measured time above the device's fixed latency, its efficiency kept; at
most :data:`MAX_SLOWDOWN` × its roofline time counts as work, the rest as latency; a GEMM's
compute term follows its waves, ``wave_tail_ratio``: blocks that fit in the last, partly empty wave
come for free). So a large GEMM takes about ``k`` × as long, a decode GEMV that reads its weights
barely moves, and a kernel that is all launch latency does not move. The graph remembers the new work
(``cost_work``, :mod:`whatif.core.work`), so a transform applied after this one (``tensor_parallel``,
``precision``, ``gpu``) prices the larger kernels.

Left unchanged: CPU work (the same operators are launched), copies and memsets (an input batch
copied from the host grows with the batch; the trace does not say which copies are input),
and collectives (a data-parallel gradient all-reduce moves the weights' gradients whatever the
batch; a tensor-parallel activation all-reduce would grow with it). Memory (``whatif memory -s``):
the blocks that hold activations grow ``factor`` ×, those made from parameters do not
(:mod:`.batch_memory`). Measured against Vidur's operator profiles at 2× and 4× the
tokens: ``bench/batch_scaling.py``, docs/accuracy.md.

>>> Batch(factor=2).label()
'batch(factor=2)'
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from whatif.core import limits
from whatif.core.kernels import KernelClass
from whatif.core.work import WorkShare
from whatif.depgraph.graph import TaskGraph, TaskKind
from whatif.hardware.devices import find_device
from whatif.tracer.memory import RecordEdit

from ..base import Transform, TransformContext
from ..edit import set_duration
from ..needs import Need
from ..parallel.sharding import record_split
from ..registry import register
from .batch_memory import batch_memory_edit

MAX_SLOWDOWN = 4.0
"""At most this many times a kernel's achievable roofline time counts as work that grows with the
batch; the rest of its time above the fixed latency is latency (a 3 us layer norm of 45 KB on an
H100 is ~200x its roofline time, and four times the rows leave it at 3.2 us: the harvest's decode
pair p6). The achievable roofline is what good kernels reach, and a kernel that does real work
runs at a quarter of it or better; ``bench/batch_scaling.py`` shows the rule with and without the
cap on Vidur's operators (small memory-bound operators at 4x the tokens: 160 % -> 19 % median error,
the rest unchanged)."""


def batch_work(facts: dict[str, np.ndarray], factor: float) -> tuple[np.ndarray, np.ndarray]:
    """(FLOPs, DRAM bytes) of kernels at ``factor`` × their batch, from their kernel facts:
    ``F·k`` and ``(B − W)·k + W``, ``W`` the weight bytes of GEMMs (weights are read once).

    >>> f = {"flops": np.array([8e9, 0.0]), "bytes": np.array([3e6, 4e6]), "weight_bytes": np.array([2e6, 0.0]),
    ...      "kernel_class": np.array(["gemm", "elementwise"], dtype=object)}
    >>> [x.tolist() for x in batch_work(f, 2)]
    [[16000000000.0, 0.0], [4000000.0, 8000000.0]]
    """
    flops = np.nan_to_num(np.asarray(facts["flops"], dtype=float))
    nbytes = np.nan_to_num(np.asarray(facts["bytes"], dtype=float))
    weight = np.nan_to_num(np.asarray(facts.get("weight_bytes", np.zeros(len(nbytes))), dtype=float))
    weight = np.minimum(np.where(facts["kernel_class"] == KernelClass.GEMM.value, weight, 0.0), nbytes)
    return flops * factor, (nbytes - weight) * factor + weight


@register
@dataclass
class Batch(Transform):
    name = "batch"
    description = "the batch per GPU x factor: kernels at factor x their FLOPs and activation bytes, weights read once"
    requires = (Need.GPU_KERNELS,)

    factor: float = field(default=2.0, metadata={
        "exclusive_minimum": 0, "help": "the batch per GPU, as a multiple of the traced one (> 0)",
        "maximum": limits.MAX_PARTS})

    def memory_edit(self, graph: TaskGraph) -> RecordEdit | None:
        """The allocator records at ``factor`` × the batch (:func:`~.batch_memory.batch_memory_edit`),
        with the largest batch that fits the recorded GPU when the catalog knows its memory."""
        trace = self.recorded_trace(graph)
        device = find_device(trace.gpu_name)
        capacity = (device.name, float(device.mem_bytes)) if device is not None and device.mem_bytes else None
        return batch_memory_edit(trace, float(self.factor), capacity)

    def _kernels(self, graph: TaskGraph) -> np.ndarray:
        return np.flatnonzero(graph.tasks["kind"].to_numpy() == int(TaskKind.KERNEL))

    def match(self, graph: TaskGraph, ctx: TransformContext) -> np.ndarray:
        return self._kernels(graph) if self.factor != 1 else np.empty(0, dtype=np.int64)

    def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
        k = float(self.factor)
        ids = self._kernels(graph)
        if k == 1 or not len(ids):
            return graph
        cost = ctx.require_cost(self.name)
        flops, nbytes = batch_work(cost.kernel_facts(graph, ids), k)
        dur = np.rint(cost.kernel_time_ns(graph, ids, flops, nbytes, max_slowdown=MAX_SLOWDOWN,
                                          rows=k)).astype(np.int64)
        out = set_duration(graph, ids, dur, reason=f"{len(ids):,} kernels at {k:g}x their batch: FLOPs and activation "
                                                   f"bytes x{k:g}, weights read once (achievable roofline, "
                                                   f"anchored on each kernel's time)")
        return record_split(out, ids, WorkShare(flops=k, activation_bytes=k, weight_bytes=1.0, output_bytes=k, rows=k),
                            reason=f"kernels now do {k:g}x their recorded work")
