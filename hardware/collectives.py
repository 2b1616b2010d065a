"""Collective cost models: alpha-beta with algorithm factors, calibrated from measurements.

Each algorithm is a sum of phases; a phase takes ``steps · latency + bytes_per_rank / (bw · eff)``
on one fabric (NVLink/NVSwitch/IF/PCIe inside a machine, the NIC network between machines).
Per-rank bytes follow the NCCL performance notes (``busbw`` factors): ring all-reduce moves
2(P−1)/P of the message, all-gather and reduce-scatter (P−1)/P, send/recv and broadcast 1.

>>> from whatif.hardware.topology import preset
>>> dgx = preset("dgx_a100")
>>> bus_bytes("all_reduce", 1000, 4)                 # ring: 2(P-1)/P of the bytes
1500.0
>>> round(collective_time_ns("all_reduce", 256 << 20, 8, dgx, algorithm="ring") / 1e6, 3)  # ms
1.971
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from whatif.core.kernels import CollectiveKind

from .topology import Link, Topology

DEFAULT_EFFICIENCY = 0.8   # fraction of link bandwidth NCCL/RCCL reach on large messages


class Algorithm(str, Enum):
    AUTO = "auto"
    RING = "ring"
    TREE = "tree"
    HIERARCHICAL = "hierarchical"
    DIRECT = "direct"


_BUS_FACTOR = {
    CollectiveKind.ALL_REDUCE: lambda p: 2 * (p - 1) / p,
    CollectiveKind.ALL_GATHER: lambda p: (p - 1) / p,
    CollectiveKind.REDUCE_SCATTER: lambda p: (p - 1) / p,
    CollectiveKind.ALL_TO_ALL: lambda p: (p - 1) / p,
    CollectiveKind.SEND_RECV: lambda p: 1.0,
    CollectiveKind.BROADCAST: lambda p: 1.0,
    CollectiveKind.REDUCE: lambda p: 1.0,
}


def bus_bytes(kind: CollectiveKind | str, message_bytes: float, ranks: int) -> float:
    """Bytes each rank sends over its link (NCCL's busbw factor × message bytes)."""
    return _BUS_FACTOR[CollectiveKind(kind)](ranks) * message_bytes


@dataclass(frozen=True)
class Phase:
    """``steps`` latency hops and ``nbytes`` per rank on ``link``."""

    link: Link
    steps: float
    nbytes: float

    def latency_ns(self) -> float:
        return self.steps * self.link.latency_ns

    def transfer_ns(self, efficiency: float = 1.0) -> float:
        return self.nbytes / (self.link.bw_bytes_per_s * efficiency) * 1e9


def _ring_link(topo: Topology, nodes: int) -> Link:
    if nodes > 1:
        if topo.inter is None:
            raise ValueError(f"{topo.name} has no inter-machine network")
        return topo.inter
    return topo.intra


def phases(kind: CollectiveKind | str, message_bytes: float, ranks: int, topology: Topology,
           algorithm: Algorithm | str = Algorithm.RING,
           ranks_per_machine: int | None = None) -> list[Phase]:
    """The phases of one collective; ``message_bytes`` is the full (unsharded) message."""
    kind, algo = CollectiveKind(kind), Algorithm(algorithm)
    nodes, per = topology.placement(ranks, ranks_per_machine)
    p, s = ranks, float(message_bytes)
    if p == 1:
        return []
    link = _ring_link(topology, nodes)
    if kind is CollectiveKind.SEND_RECV:
        return [Phase(link, 1, s)]
    if kind in (CollectiveKind.BROADCAST, CollectiveKind.REDUCE):
        return [Phase(link, p - 1, s)]                       # pipelined chain
    if kind is CollectiveKind.ALL_TO_ALL:
        out = [Phase(topology.intra, per - 1, (per - 1) / p * s)]
        if nodes > 1:
            out.append(Phase(link, nodes - 1, (p - per) / p * s))
        return out
    if kind in (CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER):
        if algo is Algorithm.HIERARCHICAL and nodes > 1:
            return [Phase(topology.intra, per - 1, (per - 1) / per * s / nodes),
                    Phase(link, nodes - 1, (nodes - 1) / nodes * s)]
        return [Phase(link, p - 1, bus_bytes(kind, s, p))]
    # all-reduce
    if algo is Algorithm.TREE:
        return [Phase(link, 2 * math.ceil(math.log2(p)), bus_bytes(kind, s, p))]
    if algo is Algorithm.HIERARCHICAL and nodes > 1:
        intra = Phase(topology.intra, per - 1, (per - 1) / per * s)
        inter = Phase(link, 2 * (nodes - 1), 2 * (nodes - 1) / nodes * s / per)
        return [intra, inter, intra]
    return [Phase(link, 2 * (p - 1), bus_bytes(kind, s, p))]


def _candidates(kind: CollectiveKind, nodes: int) -> list[Algorithm]:
    if kind is CollectiveKind.ALL_REDUCE:
        return [Algorithm.RING, Algorithm.TREE] + ([Algorithm.HIERARCHICAL] if nodes > 1 else [])
    if kind in (CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER) and nodes > 1:
        return [Algorithm.RING, Algorithm.HIERARCHICAL]
    return [Algorithm.RING]


def _model_ns(ph: list[Phase], efficiency: float) -> float:
    return sum(x.latency_ns() + x.transfer_ns(efficiency) for x in ph)


def choose_algorithm(kind: CollectiveKind | str, message_bytes: float, ranks: int,
                     topology: Topology, ranks_per_machine: int | None = None) -> Algorithm:
    """The fastest algorithm under the uncalibrated model (what NCCL's tuner approximates)."""
    kind = CollectiveKind(kind)
    nodes, _ = topology.placement(ranks, ranks_per_machine)
    return min(_candidates(kind, nodes), key=lambda a: _model_ns(
        phases(kind, message_bytes, ranks, topology, a, ranks_per_machine), DEFAULT_EFFICIENCY))


@dataclass(frozen=True)
class CollectiveFit:
    """Latency and bandwidth multipliers plus a residual curve over log10(bytes)."""

    latency_scale: float
    transfer_scale: float           # 1 / achieved efficiency relative to the link's bandwidth
    knots: tuple[float, ...] = ()
    log_residual: tuple[float, ...] = ()
    algorithm: Algorithm = Algorithm.RING

    @property
    def efficiency(self) -> float:
        return 1.0 / self.transfer_scale if self.transfer_scale > 0 else float("inf")

    def time_ns(self, ph: list[Phase], message_bytes: float) -> float:
        t = sum(self.latency_scale * x.latency_ns() + self.transfer_scale * x.transfer_ns()
                for x in ph)
        if self.knots and message_bytes > 0:
            t *= 10.0 ** float(np.interp(math.log10(message_bytes), self.knots,
                                         self.log_residual))
        return t


@dataclass(frozen=True)
class CollectiveCalibration:
    """Fits per (kind, ranks, ranks per machine), with pooled fits per (kind, spans machines)
    as fallback for unmeasured rank counts (intra- and inter-machine fabrics differ)."""

    entries: dict[tuple[CollectiveKind, int, int], CollectiveFit] = field(default_factory=dict)
    pooled: dict[tuple[CollectiveKind, bool], CollectiveFit] = field(default_factory=dict)

    def lookup(self, kind: CollectiveKind, ranks: int, per: int) -> CollectiveFit | None:
        return self.entries.get((kind, ranks, per)) or self.pooled.get((kind, ranks > per)) \
            or self.pooled.get((kind, ranks <= per))


def collective_time_ns(kind: CollectiveKind | str, message_bytes: float, ranks: int,
                       topology: Topology, *, algorithm: Algorithm | str = Algorithm.AUTO,
                       ranks_per_machine: int | None = None,
                       calibration: CollectiveCalibration | None = None,
                       efficiency: float = DEFAULT_EFFICIENCY) -> float:
    """Predicted ns of one collective of ``message_bytes`` (the full buffer) over ``ranks``.

    >>> from whatif.hardware.topology import preset
    >>> collective_time_ns("send_recv", 0, 2, preset("dgx_h100"))      # latency only
    1000.0
    """
    kind = CollectiveKind(kind)
    _nodes, per = topology.placement(ranks, ranks_per_machine)
    if ranks == 1:
        return 0.0
    fit = calibration.lookup(kind, ranks, per) if calibration is not None else None
    algo = Algorithm(algorithm)
    if algo is Algorithm.AUTO:
        algo = fit.algorithm if fit is not None else choose_algorithm(
            kind, message_bytes, ranks, topology, ranks_per_machine)
    ph = phases(kind, message_bytes, ranks, topology, algo, per)
    if fit is not None:
        return fit.time_ns(ph, message_bytes)
    return _model_ns(ph, efficiency)


def _fit_scales(lat: np.ndarray, xfer: np.ndarray, t: np.ndarray) -> tuple[float, float]:
    """Non-negative (a, b) minimising the relative error of a·lat + b·xfer against t."""
    a_mat = np.column_stack([lat / t, xfer / t])
    (a, b), *_ = np.linalg.lstsq(a_mat, np.ones_like(t), rcond=None)
    if a < 0 or b <= 0:
        if b <= 0 or not np.any(xfer):
            a, b = float(np.median(t / np.maximum(lat, 1e-9))), 0.0
        else:
            a, b = 0.0, float(np.median(t / xfer))
    return float(a), float(b)


def calibrate(points: Iterable[tuple], topology: Topology, *, residual: bool = True,
              algorithm: Algorithm | str = Algorithm.RING,
              points_per_knot: int = 16) -> CollectiveCalibration:
    """Fit from measured ``(kind, message_bytes, ranks, dur_ns[, ranks_per_machine])`` points.

    Per (kind, ranks, ranks per machine): latency and bandwidth multipliers of the alpha-beta
    model (relative least squares), then, with ``residual``, a curve of the remaining ratio over
    log10(bytes) — it captures protocol switches (NCCL LL → LL128 → Simple) that a two-parameter
    model cannot. Pooled fits per (kind, spans machines), without curve, price rank counts that
    were not measured.

    >>> from whatif.hardware.topology import preset
    >>> dgx = preset("dgx_a100")
    >>> pts = [("all_reduce", b, 8, 20_000 + b / 100.0) for b in (1e6, 1e7, 1e8)]
    >>> cal = calibrate(pts, dgx, residual=False)
    >>> round(collective_time_ns("all_reduce", 5e7, 8, dgx, calibration=cal))
    520000
    """
    algo = Algorithm(algorithm)
    groups: dict[tuple[CollectiveKind, int, int], list[tuple[float, float]]] = {}
    for pt in points:
        kind, nbytes, ranks, dur = CollectiveKind(pt[0]), float(pt[1]), int(pt[2]), float(pt[3])
        per = topology.placement(ranks, pt[4] if len(pt) > 4 else None)[1]
        if dur > 0:
            groups.setdefault((kind, ranks, per), []).append((nbytes, dur))
    entries: dict[tuple[CollectiveKind, int, int], CollectiveFit] = {}
    pooled_rows: dict[tuple[CollectiveKind, bool], list[tuple[float, float, float]]] = {}
    for (kind, ranks, per), pts in groups.items():
        pts.sort()
        sizes = np.array([p[0] for p in pts])
        t = np.array([p[1] for p in pts])
        ph = [phases(kind, b, ranks, topology, algo, per) for b in sizes]
        lat = np.array([sum(x.latency_ns() for x in q) for q in ph])
        xfer = np.array([sum(x.transfer_ns() for x in q) for q in ph])
        pooled_rows.setdefault((kind, ranks > per), []).extend(zip(lat, xfer, t))
        a, b = _fit_scales(lat, xfer, t)
        knots: tuple[float, ...] = ()
        resid: tuple[float, ...] = ()
        if residual and len(t) >= 2 * points_per_knot:
            r = np.log10(t / np.maximum(a * lat + b * xfer, 1e-9))
            x = np.log10(np.maximum(sizes, 1.0))
            chunks = np.array_split(np.arange(len(t)), max(1, len(t) // points_per_knot))
            knots = tuple(float(np.median(x[c])) for c in chunks)
            resid = tuple(float(np.median(r[c])) for c in chunks)
        entries[(kind, ranks, per)] = CollectiveFit(a, b, knots, resid, algo)
    pooled = {}
    for key, rows in pooled_rows.items():
        arr = np.array(rows)
        a, b = _fit_scales(arr[:, 0], arr[:, 1], arr[:, 2])
        pooled[key] = CollectiveFit(a, b, algorithm=algo)
    return CollectiveCalibration(entries, pooled)
