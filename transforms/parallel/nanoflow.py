"""NanoFlow's intra-device parallelism (OSDI 2025), priced on a trace: one iteration's GEMMs
(compute-bound), attention and other memory-bound kernels, and collectives run as n nano-batches
on a partition of the GPU's SMs, so the three resources work at once instead of in turn.

**Resource share** (:func:`shared_time_ns`): a kernel given a share ``s`` of the SMs takes
``T_c/s`` for its compute-bound part, and a memory-bound kernel keeps the full bandwidth while
``s ≥ σ`` (the SM share that saturates HBM) and slows by ``σ/s`` below it:
``max(T_c / s, T_m · max(1, σ / s))`` on the achievable roofline, with ``T_c``/``T_m`` the kernel's
time split by its roofline class. Collectives run on ``s_c`` of the SMs (NCCL's channels, one SM
each) at their own speed.

**Iteration** for a partition ``s_g + s_a + s_c = 1`` and n nano-batches: each kernel re-priced at
1/n of its activations (FLOPs/n, bytes ``(B − W)/n + W``: every nano-batch reads the weights;
``CostModel.kernel_time_ns``), n times; each collective ``n`` parts, each paying the latency again;
the three resources busy ``X = (T_gemm/s_g, T_mem·max(1, σ/s_a), T_comm)`` in all, pipelined over n
nano-batches and L layers as :func:`pipelined_ns`: ``max(max X + (ΣX − max X)/(n·L), ΣX/n)``. The
sequential iteration is ``ΣT`` (one kernel at a time, as the trace ran). :func:`search_nanoflow`
searches n and s_g as NanoFlow's auto-search does.

Assumptions, stated in every result: σ = 0.4 (memory-bound kernels reach HBM bandwidth on 40 % of
the SMs; NanoFlow profiles this curve per kernel), s_c = 0.1 (NCCL's channels). Left out: the
bandwidth GEMMs take from attention when both stream from HBM, L2 interference, and CPU launch
cost (NanoFlow and its baseline launch through CUDA graphs).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from whatif.core.kernels import KernelClass
from whatif.depgraph.graph import TaskGraph, TaskKind

from ..base import TransformContext, TransformError
from ..select import kernel_classes
from .layers import find_blocks
from .sharding import batch_part_ns

SATURATING_SM_SHARE = 0.4
COMM_SM_SHARE = 0.10
NANO_BATCHES = (1, 2, 4, 8)
NAME = "nanoflow"


def shared_time_ns(compute_ns: float, memory_ns: float, sm_share: float,
                   saturating_share: float = SATURATING_SM_SHARE) -> float:
    """Time of work of ``compute_ns`` compute-bound and ``memory_ns`` memory-bound time (at the whole
    GPU) on a share ``sm_share`` of the SMs.

    >>> shared_time_ns(100.0, 0.0, 0.5), shared_time_ns(0.0, 100.0, 0.5), shared_time_ns(0.0, 100.0, 0.2)
    (200.0, 100.0, 200.0)
    """
    if not 0 < sm_share <= 1:
        raise TransformError(f"{NAME}: an SM share must be in (0, 1], got {sm_share}")
    return max(compute_ns / sm_share, memory_ns * max(1.0, saturating_share / sm_share))


def pipelined_ns(stages: list[float], nano_batches: int, layers: int = 1) -> float:
    """One iteration of n nano-batches through ``layers`` layers on resources busy ``stages`` in all:
    ``max(max + (Σ − max)/(n·L), Σ/n)``. The busiest resource bounds it, plus the fill and drain of
    one nano-batch's share of one layer on the others (nano-batch i of layer l+1 waits only for
    nano-batch i of layer l, so the pipeline fills once per iteration, not once per layer); and
    one nano-batch's own chain through every layer, ``Σ/n``, bounds it too.

    >>> pipelined_ns([30.0, 20.0, 10.0], 1), pipelined_ns([30.0, 20.0, 10.0], 4)
    (60.0, 37.5)
    >>> pipelined_ns([30.0, 20.0, 10.0], 4, layers=10), pipelined_ns([30.0, 20.0, 10.0], 2, layers=10)
    (30.75, 31.5)
    """
    top, total = max(stages), sum(stages)
    return max(top + (total - top) / (nano_batches * layers), total / nano_batches)


@dataclass
class NanoFlowSearch:
    """Per step: the sequential GPU time and its parts; ``table``: one row per (n, s_g) tried, best
    first; ``best``: its row; ``assumptions``."""

    parts: pd.DataFrame
    table: pd.DataFrame
    best: dict[str, float]
    assumptions: list[str] = field(default_factory=list)

    @property
    def speedup(self) -> float:
        return float(self.best["sequential_ns"] / self.best["iteration_ns"])


def _parts(graph: TaskGraph, ctx: TransformContext, n: int) -> pd.DataFrame:
    """Per step: GEMM, memory-bound kernel and collective time (ns) at n nano-batches."""
    t = graph.tasks
    kinds = t["kind"].to_numpy()
    kern = np.flatnonzero(kinds == int(TaskKind.KERNEL))
    comm = np.flatnonzero(kinds == int(TaskKind.COMM))
    cls = kernel_classes(graph)[kern]
    dur = t["dur_ns"].to_numpy().astype(float)
    k_dur = dur[kern]
    if n > 1:
        k_dur = n * batch_part_ns(ctx.require_cost(NAME), graph, kern, n)
    gemm = np.isin(cls, [KernelClass.GEMM.value, KernelClass.CONV.value])
    steps = t["step"].to_numpy()
    frame = pd.DataFrame({"step": np.r_[steps[kern], steps[comm]],
                          "gemm_ns": np.r_[np.where(gemm, k_dur, 0.0), np.zeros(len(comm))],
                          "memory_ns": np.r_[np.where(gemm, 0.0, k_dur), np.zeros(len(comm))],
                          "comm_ns": np.r_[np.zeros(len(kern)), dur[comm]],
                          "comm_count": np.r_[np.zeros(len(kern)), np.ones(len(comm))]})
    return frame[frame["step"] >= 0].groupby("step").sum()


def layers_per_step(graph: TaskGraph) -> int:
    """Transformer blocks per step and rank, the median over steps (:func:`~.layers.find_blocks`;
    1 when none is found inside a step)."""
    blocks = find_blocks(graph)
    if blocks.empty:
        return 1
    steps = graph.tasks["step"].to_numpy()[blocks["task"].to_numpy()]
    counted = blocks.assign(step=steps)[steps >= 0]
    if counted.empty:
        return 1
    return max(1, int(counted.groupby(["rank", "step"])["block"].nunique().median()))


def search_nanoflow(graph: TaskGraph, ctx: TransformContext, *, comm_latency_ns: float = 0.0,
                    saturating_share: float = SATURATING_SM_SHARE, comm_share: float = COMM_SM_SHARE,
                    nano_batches: tuple[int, ...] = NANO_BATCHES) -> NanoFlowSearch:
    """Best nano-batch count and SM partition for ``graph``'s iterations (see the module docstring).
    ``comm_latency_ns``: what each extra collective part pays again (a collective's fixed cost)."""
    if not 0 <= comm_share < 1 or not 0 < saturating_share <= 1:
        raise TransformError(f"{NAME}: comm_share must be in [0, 1) and saturating_share in (0, 1]")
    base = _parts(graph, ctx, 1)
    if base.empty or not (base["gemm_ns"] > 0).any():
        raise TransformError(f"{NAME}: the trace's steps have no GEMM kernels to overlap")
    layers = layers_per_step(graph)
    rows = []
    for n in nano_batches:
        p = base if n == 1 else _parts(graph, ctx, n)
        gemm, mem = float(p["gemm_ns"].mean()), float(p["memory_ns"].mean())
        comm = float(p["comm_ns"].mean()) + (n - 1) * comm_latency_ns * float(p["comm_count"].mean())
        usable = 1.0 - (comm_share if comm > 0 else 0.0)
        for s_g in np.round(np.arange(0.05, usable, 0.05), 2):
            s_a = usable - s_g
            if s_a <= 0:
                continue
            x = [shared_time_ns(gemm, 0.0, s_g, saturating_share), shared_time_ns(0.0, mem, s_a, saturating_share),
                 comm]
            rows.append({"nano_batches": n, "gemm_share": float(s_g), "memory_share": round(float(s_a), 2),
                         "gemm_ns": x[0], "memory_ns": x[1], "comm_ns": x[2],
                         "iteration_ns": pipelined_ns(x, n, layers)})
    seq = float((base["gemm_ns"] + base["memory_ns"] + base["comm_ns"]).mean())
    rows.append({"nano_batches": 1, "gemm_share": 1.0, "memory_share": 1.0, "gemm_ns": float(base["gemm_ns"].mean()),
                 "memory_ns": float(base["memory_ns"].mean()), "comm_ns": float(base["comm_ns"].mean()),
                 "iteration_ns": seq})   # one kernel at a time on the whole GPU: the trace's way
    table = pd.DataFrame(rows).assign(sequential_ns=seq).sort_values(
        ["iteration_ns", "nano_batches", "gemm_share"], ignore_index=True)
    best = {k: float(v) for k, v in table.iloc[0].items()}
    assumptions = [f"memory-bound kernels reach full HBM bandwidth on {saturating_share:.0%} of the SMs",
                   f"collectives run on {comm_share:.0%} of the SMs",
                   "GEMMs and attention do not contend for HBM bandwidth; CPU launches are not on the path"]
    return NanoFlowSearch(parts=base, table=table, best=best, assumptions=assumptions)
