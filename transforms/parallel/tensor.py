"""``tensor_parallel``: Megatron-LM tensor parallelism of degree t from a one-GPU trace.

Per transformer block (:func:`~whatif.transforms.parallel.layers.find_blocks`): QKV and MLP
up/gate GEMMs become column-parallel, the attention output and MLP down GEMMs row-parallel,
attention keeps H/t heads, elementwise work on sharded activations shrinks by t
(:mod:`~whatif.transforms.parallel.sharding`); each changed kernel is re-priced by the trace's
calibrated roofline at its sharded FLOPs and bytes (``CostModel.kernel_time_ns``). In the forward
pass one all-reduce of the block output follows the attention output GEMM and one the MLP down
GEMM (Shoeybi et al. 2019, §3); with ``sequence_parallel`` each becomes a reduce-scatter and an
all-gather precedes the next column-parallel GEMM, and norms/residual adds run on 1/t of the
sequence (Korthikanti et al. 2022). In a training step the backward is sharded too
(:func:`~.layers.backward_blocks`: each forward GEMM's two gradient GEMMs take its role, the
attention backward its heads) with the conjugate collectives: an all-reduce of the input gradient
after each column-parallel group's gradients (QKV, MLP up/gate); a backward that cannot be mapped is
refused. Heads must divide by t (:func:`check_heads`). Collectives are COMM tasks on a ``tp comm``
stream (:mod:`~whatif.transforms.parallel.comm`); the rank modeled is one representative rank. Its
memory (``whatif memory -s``): one rank's allocator records (:mod:`~.tp_memory`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import numpy as np
import pandas as pd

from whatif.core import limits
from whatif.core.kernels import KernelClass
from whatif.core.work import WorkShare
from whatif.depgraph.graph import EdgeKind, TaskGraph
from whatif.tracer.memory import RecordEdit

from ..base import CostModel, Transform, TransformContext, TransformError
from ..edit import set_duration
from ..placement import Placement
from ..registry import register
from .comm import Collective, OnTopology, comm_stream, insert_tasks, next_on_resource
from .layers import backward_blocks, find_blocks, gemm_io_bytes
from .memory import HeadSplit, block_heads_now, head_split
from .sharding import Role, record_split, shard_arrays
from .tp_memory import tensor_parallel_memory_edit


def prev_on_resource(graph: TaskGraph, tasks: np.ndarray) -> np.ndarray:
    """Per task: the task before it on its ordered resource, -1 when first."""
    e = graph.edges
    order = e[e["kind"].isin([int(EdgeKind.STREAM), int(EdgeKind.THREAD)])]
    pred = np.full(len(graph.tasks), -1, dtype=np.int64)
    pred[order["dst"].to_numpy()] = order["src"].to_numpy()
    return pred[np.asarray(tasks, dtype=np.int64)]


def sharded_durations(graph: TaskGraph, ctx: TransformContext, name: str, tasks: np.ndarray, roles: np.ndarray,
                      degree: int, sequence_parallel: bool) -> tuple[np.ndarray, np.ndarray, list[WorkShare]]:
    """(new durations in ns, output activation bytes, each task's :class:`WorkShare` of its work
    before) of ``tasks`` under degree ``degree``."""
    cost = ctx.require_cost(name)
    facts = cost.kernel_facts(graph, tasks)
    nbytes = np.nan_to_num(np.asarray(facts["bytes"], dtype=float))
    weight = np.nan_to_num(np.asarray(facts.get("weight_bytes", np.zeros(len(tasks))), dtype=float))
    gemm = facts["kernel_class"] == KernelClass.GEMM.value
    weight = np.where(gemm, weight, 0.0)
    inp, w, out = gemm_io_bytes(graph, tasks, nbytes, weight)
    flops = np.nan_to_num(np.asarray(facts["flops"], dtype=float))
    f1, b1 = shard_arrays(roles, flops, inp, w, out, degree, sequence_parallel)
    zero = np.zeros(len(w))
    _, w1 = shard_arrays(roles, flops, zero, w, zero, degree, sequence_parallel)
    _, o1 = shard_arrays(roles, flops, zero, zero, out, degree, sequence_parallel)
    with np.errstate(divide="ignore", invalid="ignore"):
        shares = np.nan_to_num(np.c_[f1 / flops, (b1 - w1) / (inp + out), w1 / w, o1 / out], nan=1.0, posinf=1.0)
    heads = np.where(np.asarray(roles, dtype=object) == Role.HEADS.value, 1.0 / degree, 1.0)
    shares = np.c_[shares, heads]
    return (np.rint(cost.kernel_time_ns(graph, tasks, f1, b1)).astype(np.int64), out,
            [WorkShare(flops=float(f), activation_bytes=float(a), weight_bytes=float(w), output_bytes=float(o),
                       heads=float(h)) for f, a, w, o, h in shares])


@register
@dataclass
class TensorParallel(OnTopology, Transform):
    name = "tensor_parallel"
    description = "Megatron tensor parallelism of degree t: sharded GEMMs/attention, all-reduces per block"

    degree: int = field(default=2, metadata={"minimum": 1, "help": "tensor-parallel degree t (GPUs per model replica)",
                                               "maximum": limits.MAX_GPUS})
    topology: str = field(default="dgx_h100", metadata={"help": "topology preset (whatif.hardware.topology)"})
    sequence_parallel: bool = field(default=False, metadata={
        "help": "reduce-scatter + all-gather instead of all-reduce; norms/residuals split along the sequence"})
    activation_bytes: int = field(default=0, metadata={"minimum": 0,
        "help": "bytes of one block output (tokens x hidden x element size); 0 = from the GEMM shapes"})

    def match(self, graph: TaskGraph, ctx: TransformContext) -> np.ndarray:
        return find_blocks(graph)["task"].to_numpy(np.int64)

    def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
        blocks = find_blocks(graph)
        if blocks.empty:
            raise TransformError(f"{self.name}: found no transformer block (an attention kernel followed by a "
                                 f"GEMM) in the trace's kernels; see docs/multi-gpu.md for the heuristic")
        if self.degree == 1:
            return graph
        check_heads(graph, blocks, self.name, self.degree)
        cost = ctx.require_cost(self.name)
        bwd = backward_blocks(graph, blocks, partial(_recorded_flops, cost, graph))
        if bwd is None:
            raise TransformError(f"{self.name}: the trace has a backward pass whose GEMMs cannot be mapped to the "
                                 f"forward's blocks (two GEMMs of its FLOPs per forward block GEMM, one attention "
                                 f"backward per block); "
                                 f"refusing rather than leaving the backward unsharded")
        both = pd.concat([blocks, bwd], ignore_index=True).sort_values("task", ignore_index=True)
        tasks = both["task"].to_numpy(np.int64)
        dur, out_bytes, shares = sharded_durations(graph, ctx, self.name, tasks, both["role"].to_numpy(),
                                                   self.degree, self.sequence_parallel)
        what = "sharded GEMMs/attention re-priced" + (", backward too" if len(bwd) else "")
        g = set_duration(graph, tasks, dur, reason=f"{self.label()}: {what}")
        g = record_split(g, tasks, shares, reason=f"{self.label()}: each rank's share of the sharded kernels' work")
        both = both.assign(out_bytes=out_bytes)
        return self._insert_collectives(g, ctx, both)

    def placement(self, placement: Placement, graph: TaskGraph, ctx: TransformContext) -> Placement:
        return placement.spread(tensor=self.degree)

    def memory_edit(self, graph: TaskGraph) -> RecordEdit | None:
        """The allocator records of one rank (:func:`~.tp_memory.tensor_parallel_memory_edit`)."""
        return tensor_parallel_memory_edit(self.recorded_trace(graph), self.degree, self.sequence_parallel)

    def _message(self, row_bytes: float) -> float:
        return float(self.activation_bytes) if self.activation_bytes > 0 else float(row_bytes)

    def _insert_collectives(self, g: TaskGraph, ctx: TransformContext, parts_table: pd.DataFrame) -> TaskGraph:
        """Forward: an all-reduce (or reduce-scatter) after each row-parallel GEMM, with sequence
        parallelism an all-gather before each column-parallel group. Backward, the conjugates
        (Megatron's f/g): an all-reduce (reduce-scatter) of the input gradient after each
        column-parallel group's gradient GEMMs, an all-gather before each row-parallel group's."""
        measured = g.tasks["measured_start_ns"].to_numpy()
        every = np.arange(len(g.tasks))
        succ, pred = next_on_resource(g, every), prev_on_resource(g, every)
        reduce = "reduce_scatter" if self.sequence_parallel else "all_reduce"
        for rank_key, rb in parts_table.groupby("rank"):
            rank = int(rank_key)  # type: ignore[arg-type]  # pandas types group keys as any scalar
            plan: list[tuple[int, int, int, str, float]] = []   # (order key, after, before, kind, bytes)
            for _, blk in rb.groupby("block"):
                groups = {part: grp.sort_values("task") for part, grp in blk.groupby("part")}
                if "attn_out" not in groups:
                    continue
                msg = self._message(float(groups["attn_out"]["out_bytes"].iat[0]))
                for row in ("attn_out", "mlp_down"):
                    if row in groups:
                        task = int(groups[row]["task"].iat[-1])
                        plan.append((int(measured[task]), task, int(succ[task]), reduce,
                                     self._message(float(groups[row]["out_bytes"].iat[-1]))))
                for col in ("bwd_qkv", "bwd_mlp_in"):
                    if col in groups:
                        task = int(groups[col]["task"].iat[-1])
                        plan.append((int(measured[task]), task, int(succ[task]), reduce, msg))
                if self.sequence_parallel:
                    for first_of in ("qkv", "mlp_in", "bwd_attn_out", "bwd_mlp_down"):
                        if first_of in groups:
                            first = int(groups[first_of]["task"].iat[0])
                            plan.append((int(measured[first]) - 1, int(pred[first]), first, "all_gather", msg))
            plan.sort()
            g, res = comm_stream(g, rank, "tp comm")
            durs = [Collective(k, b, self.degree, self.topology).time_ns(ctx, self.name) for _, _, _, k, b in plan]
            g, _ = insert_tasks(g, resource=res, after=[p[1] for p in plan], before=[p[2] for p in plan],
                                dur_ns=durs, names=[f"tp {p[3]} ({p[4] / 2**20:.2f} MiB x{self.degree})"
                                                    for p in plan],
                                reason=f"{self.label()}: {len(plan)} collectives",
                                priced_on=self.topology_gpu(), ctx=ctx)
        return g


def _recorded_flops(cost: CostModel, graph: TaskGraph, tasks: np.ndarray) -> np.ndarray:
    """FLOPs of ``tasks`` from their recorded shapes, NaN where they were estimated."""
    facts = cost.kernel_facts(graph, tasks)
    return np.where(facts["estimated"], np.nan, np.asarray(facts["flops"], dtype=float))


def check_heads(graph: TaskGraph, blocks: pd.DataFrame, who: str, degree: int) -> None:
    """Splitting the heads one rank computes (:func:`~.memory.block_heads_now`: after a head split
    before) ``degree`` ways (:func:`~.memory.head_split`); checked when the trace records the
    attention shapes."""
    found = block_heads_now(graph, blocks)
    if found is None:
        return
    heads, kv_heads, _ = found
    split = head_split(heads, kv_heads, degree)
    if split is HeadSplit.HEADS:
        raise TransformError(f"{who}: degree {degree} does not divide the {heads} attention heads")
    if split is HeadSplit.KV_HEADS:
        raise TransformError(f"{who}: degree {degree} neither divides the {kv_heads} KV heads nor is a multiple "
                             f"of them")
