"""``tensor_parallel``: Megatron-LM tensor parallelism of degree t from a one-GPU trace.

Per transformer block (:func:`~whatif.transforms.parallel.layers.find_blocks`): QKV and MLP
up/gate GEMMs become column-parallel, the attention output and MLP down GEMMs row-parallel,
attention keeps H/t heads, elementwise work on sharded activations shrinks by t
(:mod:`~whatif.transforms.parallel.sharding`); each changed kernel is re-priced by the trace's
calibrated roofline at its sharded FLOPs and bytes (``CostModel.kernel_time_ns``). In the forward
pass one all-reduce of the block output follows the attention output GEMM and one the MLP down
GEMM (Shoeybi et al. 2019, §3); with ``sequence_parallel`` each becomes a reduce-scatter and an
all-gather precedes the next column-parallel GEMM, and norms/residual adds run on 1/t of the
sequence (Korthikanti et al. 2022). Collectives are COMM tasks on a ``tp comm`` stream
(:mod:`~whatif.transforms.parallel.comm`); the rank modeled is one representative rank.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from whatif.core.kernels import KernelClass
from whatif.depgraph.graph import EdgeKind, TaskGraph

from ..base import Transform, TransformContext, TransformError
from ..edit import set_duration
from ..registry import register
from .comm import Collective, comm_stream, insert_tasks, next_on_resource
from .layers import find_blocks, gemm_io_bytes
from .sharding import shard_arrays


def prev_on_resource(graph: TaskGraph, tasks: np.ndarray) -> np.ndarray:
    """Per task: the task before it on its ordered resource, -1 when first."""
    e = graph.edges
    order = e[e["kind"].isin([int(EdgeKind.STREAM), int(EdgeKind.THREAD)])]
    pred = np.full(len(graph.tasks), -1, dtype=np.int64)
    pred[order["dst"].to_numpy()] = order["src"].to_numpy()
    return pred[np.asarray(tasks, dtype=np.int64)]


def sharded_durations(graph: TaskGraph, ctx: TransformContext, name: str, tasks: np.ndarray, roles: np.ndarray,
                      degree: int, sequence_parallel: bool) -> tuple[np.ndarray, np.ndarray]:
    """(new durations in ns, output activation bytes) of ``tasks`` under degree ``degree``."""
    cost = ctx.require_cost(name)
    facts = cost.kernel_facts(graph, tasks)
    nbytes = np.nan_to_num(np.asarray(facts["bytes"], dtype=float))
    weight = np.nan_to_num(np.asarray(facts.get("weight_bytes", np.zeros(len(tasks))), dtype=float))
    gemm = facts["kernel_class"] == KernelClass.GEMM.value
    weight = np.where(gemm, weight, 0.0)
    inp, w, out = gemm_io_bytes(graph, tasks, nbytes, weight)
    flops = np.nan_to_num(np.asarray(facts["flops"], dtype=float))
    f1, b1 = shard_arrays(roles, flops, inp, w, out, degree, sequence_parallel)
    return np.rint(cost.kernel_time_ns(graph, tasks, f1, b1)).astype(np.int64), out


@register
@dataclass
class TensorParallel(Transform):
    name = "tensor_parallel"
    description = "Megatron tensor parallelism of degree t: sharded GEMMs/attention, all-reduces per block"

    degree: int = field(default=2, metadata={"help": "tensor-parallel degree t (GPUs per model replica)"})
    topology: str = field(default="dgx_h100", metadata={"help": "topology preset (whatif.hardware.topology)"})
    sequence_parallel: bool = field(default=False, metadata={
        "help": "reduce-scatter + all-gather instead of all-reduce; norms/residuals split along the sequence"})
    activation_bytes: int = field(default=0, metadata={
        "help": "bytes of one block output (tokens x hidden x element size); 0 = from the GEMM shapes"})

    def match(self, graph: TaskGraph, ctx: TransformContext) -> np.ndarray:
        return find_blocks(graph)["task"].to_numpy(np.int64)

    def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
        if self.degree < 1:
            raise TransformError(f"{self.name}: degree must be >= 1 (got {self.degree})")
        blocks = find_blocks(graph)
        if blocks.empty:
            raise TransformError(f"{self.name}: found no transformer block (an attention kernel followed by a "
                                 f"GEMM) in the trace's kernels; see docs/multi-gpu.md for the heuristic")
        if self.degree == 1:
            return graph
        tasks = blocks["task"].to_numpy(np.int64)
        dur, out_bytes = sharded_durations(graph, ctx, self.name, tasks, blocks["role"].to_numpy(), self.degree,
                                           self.sequence_parallel)
        g = set_duration(graph, tasks, dur, reason=f"{self.label()}: sharded GEMMs/attention re-priced")
        blocks = blocks.assign(out_bytes=out_bytes)
        return self._insert_collectives(g, ctx, blocks)

    def _message(self, row_bytes: float) -> float:
        return float(self.activation_bytes) if self.activation_bytes > 0 else float(row_bytes)

    def _insert_collectives(self, g: TaskGraph, ctx: TransformContext, blocks) -> TaskGraph:
        measured = g.tasks["measured_start_ns"].to_numpy()
        every = np.arange(len(g.tasks))
        succ, pred = next_on_resource(g, every), prev_on_resource(g, every)
        for rank, rb in blocks.groupby("rank"):
            plan: list[tuple[int, int, int, str, float]] = []   # (order key, after, before, kind, bytes)
            for _, blk in rb.groupby("block"):
                parts = dict(zip(blk["part"], zip(blk["task"], blk["out_bytes"])))
                for row in ("attn_out", "mlp_down"):
                    if row not in parts:
                        continue
                    task, nbytes = parts[row]
                    nxt = int(succ[task])
                    kind = "reduce_scatter" if self.sequence_parallel else "all_reduce"
                    plan.append((int(measured[task]), int(task), nxt, kind, self._message(nbytes)))
                if self.sequence_parallel:
                    msg = self._message(parts.get("attn_out", (0, 0))[1])
                    for first in (blk.loc[blk["part"] == "qkv", "task"].min(),
                                  blk.loc[blk["part"] == "mlp_in", "task"].min()):
                        if first == first:   # not NaN
                            first = int(first)
                            plan.append((int(measured[first]) - 1, int(pred[first]), first,
                                         "all_gather", msg))
            plan.sort()
            g, res = comm_stream(g, int(rank), "tp comm")
            durs = [Collective(k, b, self.degree, self.topology).time_ns(ctx, self.name) for _, _, _, k, b in plan]
            g, _ = insert_tasks(g, resource=res, after=[p[1] for p in plan], before=[p[2] for p in plan],
                                dur_ns=durs, names=[f"tp {p[3]} ({p[4] / 2**20:.2f} MiB x{self.degree})"
                                                    for p in plan],
                                reason=f"{self.label()}: {len(plan)} collectives")
        return g
