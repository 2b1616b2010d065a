"""NanoFlow's intra-device parallelism (OSDI 2025), priced on a trace: one iteration's GEMMs
(compute-bound), attention and other memory-bound kernels, and collectives run as n nano-batches
on a partition of the GPU, so the three resources work at once instead of in turn.

**Resource share** (:class:`ShareCurve`): NanoFlow's own measure. A kernel that runs beside the
GEMMs takes a share ``R`` of the GPU — R is the fraction of its speed the GEMM loses, so a GEMM
on share ``R`` runs at ``P = R`` of its speed alone (:data:`GEMM_CURVE`) — and runs at a
fraction ``P(R)`` of its own speed alone. NanoFlow measured ``P(R)`` on an A100 for its decode
attention (GEMV) and network kernels co-running with a GEMM (efeslab/Nanoflow,
``autosearch/trace/gemv_interference.csv`` and ``net_interference.csv``): memory-bound kernels
keep 60 % of their speed on 40 % of the GPU (:data:`NANOFLOW_GEMV`), collectives 40 % on 10 %
(:data:`NANOFLOW_NETWORK`). The curves include the HBM bandwidth the GEMM takes from the
memory-bound kernel. :func:`saturating_curve` is the idealized alternative (full speed from a
share σ on, linear below it). A kernel of time ``T`` alone takes ``T / P(R)``.

**Iteration** for a partition ``r_g + r_a + r_c = 1`` and n nano-batches: each kernel re-priced at
1/n of its activations (FLOPs/n, bytes ``(B − W)/n + W``: every nano-batch reads the weights;
``CostModel.kernel_time_ns``), n times; each collective ``n`` parts priced on the topology, each
paying the latency again;
the three resources busy ``X = (T_gemm/r_g, T_mem/P_a(r_a), T_comm/P_c(r_c))`` in all, pipelined
over n nano-batches and L layers as :func:`pipelined_ns`:
``max(max X + (ΣX − max X)/(n·L), ΣX/n)``. The sequential iteration is ``ΣT`` (one kernel at a
time on the whole GPU, as the trace ran). :func:`search_nanoflow` searches n, r_g and r_c in steps
of 0.01, as NanoFlow's auto-search does over its profiled shares.

**Why one partition** (and not NanoFlow's per-operation shares): the curves are concave (each
extra share of the GPU buys less speed), so for any schedule that changes the partition over the
iteration, the single partition at its time-averaged shares does at least as much of every kind's
work per unit time (Jensen's inequality: ``Σ w_k·P(r_k) ≤ P(Σ w_k·r_k)``). Without dependencies
between the kernels — what this pricing leaves out — one partition is the optimum; per-operation
shares matter in NanoFlow where an operation's inputs are not ready, which the pipeline term
only approximates. The grid step, 0.01, is about one SM of an A100's 108.

A GEMM's nano-batches are priced without the wave term of ``batch_part_ns``: the curves were
measured on NanoFlow's nano-batch kernels sharing the GPU, tails included, and the SMs a GEMM's
last wave leaves idle run the co-scheduled kernels.

Left out: the curves are NanoFlow's A100 measurements, used for every GPU and kernel shape (no
per-kernel profile of the trace's own kernels); L2 interference beyond what they measured; CPU
launch cost (NanoFlow and its baseline launch through CUDA graphs); the operations' dependencies
beyond the pipeline term. An analysis, not a transform: the graph is not rewritten into the
overlapped schedule.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from whatif.core.kernels import KernelClass
from whatif.depgraph.graph import TaskGraph, TaskKind

from ..base import TransformContext, TransformError
from ..select import kernel_classes
from .comm import collective_messages, collective_part_ns
from .layers import find_blocks
from .sharding import batch_part_ns

NANO_BATCHES = (1, 2, 4, 8)
SHARE_STEP = 0.01
NAME = "nanoflow"


@dataclass(frozen=True)
class ShareCurve:
    """Normalized speed ``P`` of a kernel given a share ``R`` of the GPU, piecewise linear through
    ``points`` (``(R, P)`` pairs), with ``P(0) = 0`` and ``P(1) = 1``.

    >>> NANOFLOW_GEMV.performance(0.4), NANOFLOW_GEMV.time_ns(60.0, 0.4)
    (0.6, 100.0)
    >>> GEMM_CURVE.time_ns(100.0, 0.5), saturating_curve(0.4).performance(0.2)
    (200.0, 0.5)
    """

    name: str
    points: tuple[tuple[float, float], ...]
    source: str

    def performance(self, share: float) -> float:
        return float(self.performances(np.array([share]))[0])

    def performances(self, shares: np.ndarray) -> np.ndarray:
        """:meth:`performance` of each share (all in (0, 1])."""
        shares = np.asarray(shares, dtype=float)
        bad = shares[(shares <= 0) | (shares > 1)]
        if len(bad):
            raise TransformError(f"{NAME}: a GPU share must be in (0, 1], got {bad[0]:g}")
        return np.interp(shares, [0.0, *(r for r, _ in self.points), 1.0], [0.0, *(p for _, p in self.points), 1.0])

    def time_ns(self, alone_ns: float, share: float) -> float:
        """Time of work that takes ``alone_ns`` on the whole GPU, on ``share`` of it."""
        return alone_ns / self.performance(share) if alone_ns > 0 else 0.0


GEMM_CURVE = ShareCurve("GEMM", (), "NanoFlow's definition of the share: the GEMM's own speed")
NANOFLOW_GEMV = ShareCurve(
    "NanoFlow decode attention (GEMV), A100",
    ((0.1, 0.25), (0.2, 0.4), (0.3, 0.5), (0.4, 0.6), (0.5, 0.7), (0.6, 0.8), (0.7, 0.85), (0.8, 0.9), (0.9, 0.95)),
    "efeslab/Nanoflow autosearch/trace/gemv_interference.csv")
NANOFLOW_NETWORK = ShareCurve(
    "NanoFlow network kernels, A100", ((0.1, 0.4), (0.2, 0.6), (0.3, 0.7), (0.4, 0.8), (0.5, 0.9)),
    "efeslab/Nanoflow autosearch/trace/net_interference.csv")


def saturating_curve(sigma: float) -> ShareCurve:
    """Memory-bound work at full speed from a share ``sigma`` on and in proportion below it (an
    idealization: no bandwidth taken by the co-running GEMM)."""
    if not 0 < sigma <= 1:
        raise TransformError(f"{NAME}: the saturating share must be in (0, 1], got {sigma}")
    return ShareCurve(f"saturates HBM on {sigma:.0%} of the GPU", ((sigma, 1.0),), "assumption")


def pipelined_ns(stages: np.ndarray | list[float], nano_batches: int, layers: int = 1) -> np.ndarray:
    """One iteration of n nano-batches through ``layers`` layers on resources busy ``stages`` in all:
    ``max(max + (Σ − max)/(n·L), Σ/n)``. The busiest resource bounds it, plus the fill and drain of
    one nano-batch's share of one layer on the others (nano-batch i of layer l+1 waits only for
    nano-batch i of layer l, so the pipeline fills once per iteration, not once per layer); and
    one nano-batch's own chain through every layer, ``Σ/n``, bounds it too.

    ``stages``: one row per schedule (the last axis the resources).

    >>> float(pipelined_ns([30.0, 20.0, 10.0], 1)), float(pipelined_ns([30.0, 20.0, 10.0], 4))
    (60.0, 37.5)
    >>> pipelined_ns([[30.0, 20.0, 10.0], [30.0, 20.0, 10.0]], 4, layers=10).tolist()
    [30.75, 30.75]
    >>> float(pipelined_ns([30.0, 20.0, 10.0], 2, layers=10))
    31.5
    """
    x = np.asarray(stages, dtype=float)
    top, total = x.max(axis=-1), x.sum(axis=-1)
    return np.maximum(top + (total - top) / (nano_batches * layers), total / nano_batches)


SHARE_COLUMNS = ("gemm_share", "memory_share", "comm_share")


@dataclass
class NanoFlowSearch:
    """Per step: the sequential GPU time and its parts; ``table``: one row per partition (n, r_g,
    r_c) tried and the sequential iteration (shares 1 / 1 / 1), best first; ``best``: its row;
    ``layers``: blocks per step; ``assumptions``."""

    parts: pd.DataFrame
    table: pd.DataFrame
    best: dict[str, float]
    layers: int
    assumptions: list[str] = field(default_factory=list)

    @property
    def sequential_ns(self) -> float:
        return self.best["sequential_ns"]

    @property
    def overlapped(self) -> bool:
        """Whether a partition beats one kernel at a time."""
        return self.best["gemm_share"] < 1.0

    @property
    def speedup(self) -> float:
        return self.sequential_ns / self.best["iteration_ns"]


def _parts(graph: TaskGraph, ctx: TransformContext, n: int, topology: str,
           steps: Sequence[int] | None = None) -> pd.DataFrame:
    """Per step (those of ``steps``; None: all): GEMM, memory-bound kernel and collective time (ns)
    at n nano-batches, each collective as n parts priced on ``topology`` (each pays the latency
    again)."""
    t = graph.tasks
    kinds = t["kind"].to_numpy()
    kern = np.flatnonzero(kinds == int(TaskKind.KERNEL))
    comm = np.flatnonzero(kinds == int(TaskKind.COMM))
    cls = kernel_classes(graph)[kern]
    dur = t["dur_ns"].to_numpy().astype(float)
    k_dur, c_dur = dur[kern], dur[comm]
    if n > 1:
        k_dur = n * batch_part_ns(ctx.require_cost(NAME), graph, kern, n, wave_tail=False)
        c_dur = np.array([n * collective_part_ns(ctx, NAME, int(d), m, n, topology)
                          for d, m in zip(c_dur.tolist(), collective_messages(graph, comm))], dtype=float)
    gemm = np.isin(cls, [KernelClass.GEMM.value, KernelClass.CONV.value])
    step = t["step"].to_numpy()
    frame = pd.DataFrame({"step": np.r_[step[kern], step[comm]],
                          "gemm_ns": np.r_[np.where(gemm, k_dur, 0.0), np.zeros(len(comm))],
                          "memory_ns": np.r_[np.where(gemm, 0.0, k_dur), np.zeros(len(comm))],
                          "comm_ns": np.r_[np.zeros(len(kern)), c_dur]})
    kept = frame["step"] >= 0 if steps is None else frame["step"].isin(list(steps))
    return frame[kept].groupby("step").sum()


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


def _shares(with_comm: bool) -> np.ndarray:
    """Every partition (r_g, r_a, r_c) of the GPU in steps of :data:`SHARE_STEP`, each share > 0
    (r_c = 0 when there is no collective): one row per partition."""
    steps = round(1 / SHARE_STEP)
    grid = np.array([(g, c) for g in range(1, steps) for c in (range(1, steps - g) if with_comm else (0,))])
    return np.column_stack([grid[:, 0], steps - grid.sum(axis=1), grid[:, 1]]) / steps


def search_nanoflow(graph: TaskGraph, ctx: TransformContext, *, topology: str = "dgx_h100",
                    memory_curve: ShareCurve = NANOFLOW_GEMV, comm_curve: ShareCurve = NANOFLOW_NETWORK,
                    nano_batches: tuple[int, ...] = NANO_BATCHES,
                    steps: Sequence[int] | None = None) -> NanoFlowSearch:
    """Best nano-batch count and GPU partition for ``graph``'s iterations (see the module docstring).

    Parameters
    ----------
    topology : the collectives' topology preset (:mod:`whatif.hardware.topology`): each of a
        collective's n parts is priced on it and pays its latency again.
    memory_curve, comm_curve : speed of memory-bound kernels and of collectives on a share of the
        GPU beside the GEMMs (default: NanoFlow's A100 measurements).
    steps : the step numbers whose mean iteration is searched (None: every step; ``whatif
        nanoflow`` leaves out the warm-up and a partial last step, :mod:`whatif.core.steps`).

    Raises
    ------
    TransformError
        When the trace's steps (those of ``steps``) have no GEMM kernels, or ``nano_batches`` is
        empty.
    """
    if not nano_batches:
        raise TransformError(f"{NAME}: no nano-batch count to try")
    base = _parts(graph, ctx, 1, topology, steps)
    if base.empty or not (base["gemm_ns"] > 0).any():
        raise TransformError(f"{NAME}: the trace's steps{'' if steps is None else ' that count'} have no GEMM "
                             f"kernels to overlap")
    layers = layers_per_step(graph)
    frames = []
    for n in nano_batches:
        p = base if n == 1 else _parts(graph, ctx, n, topology, steps)
        gemm, mem, comm = (float(p[c].mean()) for c in ("gemm_ns", "memory_ns", "comm_ns"))
        shares = _shares(comm > 0)
        comm_x = np.zeros(len(shares))
        on = shares[:, 2] > 0
        comm_x[on] = comm / comm_curve.performances(shares[on, 2])
        x = np.column_stack([gemm / GEMM_CURVE.performances(shares[:, 0]),
                             mem / memory_curve.performances(shares[:, 1]), comm_x])
        frames.append(pd.DataFrame({"nano_batches": n, "gemm_share": shares[:, 0], "memory_share": shares[:, 1],
                                    "comm_share": shares[:, 2], "gemm_ns": x[:, 0], "memory_ns": x[:, 1],
                                    "comm_ns": x[:, 2],
                                    "iteration_ns": pipelined_ns(x, n, layers)}))
    seq = float((base["gemm_ns"] + base["memory_ns"] + base["comm_ns"]).mean())
    # one kernel at a time on the whole GPU, the trace's way
    frames.append(pd.DataFrame([{"nano_batches": 1, "gemm_share": 1.0, "memory_share": 1.0, "comm_share": 1.0,
                                 "gemm_ns": float(base["gemm_ns"].mean()),
                                 "memory_ns": float(base["memory_ns"].mean()),
                                 "comm_ns": float(base["comm_ns"].mean()), "iteration_ns": seq}]))
    table = pd.concat(frames, ignore_index=True).assign(sequential_ns=seq).sort_values(
        ["iteration_ns", "nano_batches", "gemm_share", "comm_share"], ignore_index=True)
    best = {k: float(v) for k, v in table.iloc[0].items()}
    assumptions = [f"memory-bound kernels beside GEMMs: {memory_curve.name} ({memory_curve.source})",
                   f"collectives beside GEMMs: {comm_curve.name} ({comm_curve.source})",
                   "the curves hold for every kernel shape; CPU launches are not on the path"]
    return NanoFlowSearch(parts=base, table=table, best=best, layers=layers, assumptions=assumptions)
