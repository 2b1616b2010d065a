"""How Megatron-LM tensor parallelism changes one kernel's work (Shoeybi et al., "Megatron-LM",
2019; Korthikanti et al., "Reducing Activation Recomputation", 2022 for sequence parallelism).

With degree ``t`` a GEMM ``[M, K] x [K, N]`` is either *column*-parallel (N/t per rank: QKV, MLP
up/gate) or *row*-parallel (K/t per rank: attention output, MLP down); attention keeps H/t heads;
elementwise work on a sharded activation (RoPE, the MLP activation) shrinks by t; norms and
residual adds see the full hidden size (replicated) unless sequence parallelism shards them along
the sequence (then 1/t too).

>>> shard_work(Role.COLUMN, 2e9, 1e6, 8e6, 3e6, 4)      # FLOPs/t, input + (weight + output)/t
(500000000.0, 3750000.0)
>>> shard_work(Role.ROW, 2e9, 1e6, 8e6, 3e6, 4)         # FLOPs/t, (input + weight)/t + output
(500000000.0, 5250000.0)
>>> shard_work(Role.REPLICATED, 1e6, 1e6, 0, 1e6, 8)
(1000000.0, 2000000.0)
"""
from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np

from whatif.core.work import WORK_COLUMN, WorkShare, current_shares, split_further

from ..edit import set_state

if TYPE_CHECKING:
    from whatif.depgraph.graph import TaskGraph

    from ..base import CostModel


class Role(str, Enum):
    COLUMN = "column"          # QKV, MLP up/gate: output features split
    ROW = "row"                # attention out-proj, MLP down: input features split
    HEADS = "heads"            # attention core: heads split
    SHARDED = "sharded"        # elementwise on a feature-sharded activation (RoPE, activation)
    SEQUENCE = "sequence"      # norm / residual: split along the sequence only with sequence parallelism
    REPLICATED = "replicated"  # everything else (embedding, lm head, sampling): unchanged


def shard_work(role: Role | str, flops: float, in_bytes: float, weight_bytes: float, out_bytes: float,
               t: int, sequence_parallel: bool = False) -> tuple[float, float]:
    """(FLOPs, DRAM bytes) per rank of one kernel under tensor-parallel degree ``t``."""
    role = Role(role)
    if role is Role.COLUMN:
        return flops / t, in_bytes + (weight_bytes + out_bytes) / t
    if role is Role.ROW:
        return flops / t, (in_bytes + weight_bytes) / t + out_bytes
    if role in (Role.HEADS, Role.SHARDED) or (role is Role.SEQUENCE and sequence_parallel):
        return flops / t, (in_bytes + weight_bytes + out_bytes) / t
    return flops, in_bytes + weight_bytes + out_bytes


def shard_arrays(roles: np.ndarray, flops: np.ndarray, in_bytes: np.ndarray, weight_bytes: np.ndarray,
                 out_bytes: np.ndarray, t: int, sequence_parallel: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """:func:`shard_work` over arrays."""
    out = [shard_work(r, f, i, w, o, t, sequence_parallel)
           for r, f, i, w, o in zip(roles, flops, in_bytes, weight_bytes, out_bytes)]
    if not out:
        return np.zeros(0), np.zeros(0)
    arr = np.asarray(out, dtype=float)
    return arr[:, 0], arr[:, 1]


def batch_part_ns(cost: CostModel, graph: TaskGraph, tasks: np.ndarray, parts: int,
                  wave_tail: bool = True) -> np.ndarray:
    """Per kernel: its time on 1/``parts`` of its activations — a micro- or nano-batch: FLOPs/n,
    bytes ``(B − W)/n + W`` (every part reads the weights), a GEMM's waves /n (each part pays a
    partly empty last wave; ``CostModel.kernel_time_ns``). ``wave_tail=False`` leaves the waves
    out, where the parts' kernels are priced on a measured share of the GPU that includes them
    (``search_nanoflow``)."""
    f = cost.kernel_facts(graph, tasks)
    w = np.nan_to_num(f["weight_bytes"])
    return np.asarray(cost.kernel_time_ns(graph, tasks, np.nan_to_num(f["flops"]) / parts,
                                          (np.nan_to_num(f["bytes"]) - w) / parts + w,
                                          rows=1 / parts if wave_tail else None), dtype=float)


def record_split(graph: TaskGraph, tasks: np.ndarray, shares: WorkShare | Sequence[WorkShare], *,
                 reason: str) -> TaskGraph:
    """``graph`` with ``tasks`` (sorted ids) split further by ``shares`` (one, or one per task) in
    their ``cost_work`` state (:mod:`whatif.core.work`), so later transforms price their work now."""
    tasks = np.asarray(tasks, dtype=np.int64)
    each = [shares] * len(tasks) if isinstance(shares, WorkShare) else list(shares)
    return set_state(graph, tasks, WORK_COLUMN, split_further(current_shares(graph.tasks, tasks), each),
                     reason=reason)
