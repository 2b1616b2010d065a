"""``data_parallel``: d replicas of the traced program; gradient all-reduce buckets for training.

**Training** (PyTorch DDP, Li et al., VLDB 2020): gradients are grouped into buckets of
``bucket_mb`` (DDP's default 25 MB) in reverse parameter order; a bucket's all-reduce starts as
soon as its last gradient is produced, overlapping the rest of the backward, and the optimizer
waits for all of them. Here: gradient bytes = the weight bytes of the step's forward GEMM/conv
kernels (``CostModel.kernel_facts``; or ``grad_bytes``), split into ``ceil(G/bucket)`` buckets;
the gradients are taken as produced uniformly over the backward's GPU time, so bucket k's
all-reduce (``CostModel.collective_time_ns``, d ranks) follows the backward kernel where
``(k+1)/n`` of that time has elapsed, on a ``dp comm`` stream, and the first kernel after the
backward (the optimizer) waits for the last bucket. Backward kernels: launched by an op whose
name contains ``backward``. **Serving**: replicas do not change a replica's step; throughput ×d.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from whatif.core import limits
from whatif.core.kernels import KernelClass
from whatif.depgraph.graph import TaskGraph, TaskKind

from ..base import Transform, TransformContext, TransformError
from ..edit import note
from ..registry import register
from .comm import Collective, OnTopology, comm_stream, insert_tasks
from .pipeline import backward_mask

MB = 1 << 20


def bucket_sizes(grad_bytes: float, bucket_bytes: float) -> list[float]:
    """Bucket sizes (bytes): full buckets, the remainder last."""
    n = max(1, math.ceil(grad_bytes / bucket_bytes))
    return [min(bucket_bytes, grad_bytes - i * bucket_bytes) for i in range(n)]


@register
@dataclass
class DataParallel(OnTopology, Transform):
    name = "data_parallel"
    description = "data parallelism: d replicas; DDP gradient all-reduce buckets overlapped with backward"

    degree: int = field(default=2, metadata={"minimum": 1, "help": "replicas d", "maximum": limits.MAX_GPUS})
    bucket_mb: float = field(default=25.0, metadata={
        "exclusive_minimum": 0, "help": "gradient bucket size in MiB (PyTorch DDP: 25)"})
    grad_bytes: int = field(default=0, metadata={
        "minimum": 0, "help": "gradient bytes per step; 0 = forward GEMM/conv weight bytes"})
    topology: str = field(default="dgx_h100", metadata={"help": "topology preset for the all-reduces"})
    mode: str = field(default="training", metadata={"help": "training | serving"})

    def match(self, graph: TaskGraph, ctx: TransformContext) -> np.ndarray:
        return np.flatnonzero(backward_mask(graph) & (graph.tasks["kind"].to_numpy() == int(TaskKind.KERNEL)))

    def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
        if self.degree < 1 or self.bucket_mb <= 0 or self.mode not in ("training", "serving"):
            raise TransformError(f"{self.name}: degree >= 1, bucket_mb > 0 and mode training|serving are required")
        if self.degree == 1:
            return graph
        if self.mode == "serving":
            return note(graph, "replicate", reason=f"{self.label()}: {self.degree} independent replicas: each "
                                                    f"replica's step is unchanged, throughput x{self.degree}")
        t = graph.tasks
        kern = t["kind"].to_numpy() == int(TaskKind.KERNEL)
        bw = backward_mask(graph) & kern
        if not bw.any():
            raise TransformError(f"{self.name}: training mode needs backward kernels (ops named *backward*); this "
                                 f"trace has none — use mode=serving for inference replicas")
        cost = ctx.require_cost(self.name)
        g = graph
        bucket_ns: dict[float, int] = {}   # all-reduce time per bucket size: every bucket but the last is full
        for rank in np.unique(t["rank"].to_numpy()[bw]).tolist():
            plan = []
            steps = np.unique(t["step"].to_numpy()[bw & (t["rank"].to_numpy() == rank)])
            # backward kernels outside every step window (before the first, after the last) are no
            # step's: bucketing them as one "step" would chain all-reduces across the whole trace
            for step in (steps[steps >= 0] if (steps >= 0).any() else steps).tolist():
                plan += self._plan(graph, cost, ctx, rank, step, bucket_ns)
            g, res = comm_stream(g, rank, "dp comm")
            g, _ = insert_tasks(g, resource=res, after=[p[0] for p in plan], before=[p[1] for p in plan],
                                dur_ns=[p[2] for p in plan], names=[p[3] for p in plan],
                                reason=f"{self.label()}: {len(plan)} gradient all-reduce buckets",
                                priced_on=self.topology_gpu(), ctx=ctx)
        return g

    def _plan(self, graph: TaskGraph, cost, ctx: TransformContext, rank: int, step: int,
              bucket_ns: dict[float, int]) -> list[tuple]:
        t = graph.tasks
        sel = (t["kind"].to_numpy() == int(TaskKind.KERNEL)) & (t["rank"].to_numpy() == rank) \
            & (t["step"].to_numpy() == step)
        k = np.flatnonzero(sel)
        k = k[np.argsort(t["measured_start_ns"].to_numpy()[k], kind="stable")]
        bw = backward_mask(graph)[k]
        if not bw.any():
            return []
        grads = float(self.grad_bytes)
        if grads <= 0:
            fwd = k[~bw]
            f = cost.kernel_facts(graph, fwd)
            heavy = np.isin(f["kernel_class"], [KernelClass.GEMM.value, KernelClass.CONV.value])
            grads = float(np.nan_to_num(f["weight_bytes"])[heavy].sum())
        if grads <= 0:
            raise TransformError(f"{self.name}: no weight bytes found in step {step}'s forward GEMM/conv kernels "
                                 f"(record with record_shapes=True) — pass grad_bytes")
        bk = k[bw]
        last_bw = int(np.flatnonzero(bw)[-1])
        opt = int(k[last_bw + 1]) if last_bw + 1 < len(k) else -1
        dur = t["dur_ns"].to_numpy()[bk].astype(float)
        cum = np.cumsum(dur) / max(dur.sum(), 1.0)
        sizes = bucket_sizes(grads, self.bucket_mb * MB)
        done = np.cumsum(sizes) / grads
        out = []
        for i, (size, frac) in enumerate(zip(sizes, done)):
            after = int(bk[min(int(np.searchsorted(cum, frac - 1e-9)), len(bk) - 1)])
            if size not in bucket_ns:
                bucket_ns[size] = Collective("all_reduce", size, self.degree, self.topology).time_ns(ctx, self.name)
            ns = bucket_ns[size]
            out.append((after, opt if i == len(sizes) - 1 else -1, ns,
                        f"dp all_reduce bucket {i + 1}/{len(sizes)} ({size / MB:.1f} MiB x{self.degree})"))
        return out
