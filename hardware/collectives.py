"""Collective cost model: NCCL's own tuning model, on a topology, calibrated from measurements.

Every (algorithm, protocol) NCCL could run a collective with is priced the way NCCL's tuner
prices it (``src/graph/tuning.cc``, NVIDIA/nccl commit 5067397c): a per-call base latency per
(algorithm, protocol), a latency per hop by the hop's hardware class (NVLink, PCI, network), and
the bytes over the bus bandwidth the topology gives NCCL's channels, reduced by the protocol's
efficiency (LL moves 4 data bytes per 8, LL128 120 per 128) and capped per channel, converted to
algorithm bandwidth (ring and NVLS: ``P/nsteps``; tree and CollNet: 1/2). The fastest one is
what NCCL runs, as its tuner picks it; a call smaller than NCCL's per-thread thresholds runs on
fewer channels and threads. Intra- and inter-machine parts of ring and tree are one pipelined
kernel in NCCL: the slower fabric bounds the bandwidth, they are not summed. Per-rank bytes for
busbw follow nccl-tests' ``doc/PERFORMANCE.md``: all-reduce 2(P−1)/P, all-gather, reduce-scatter
and all-to-all (P−1)/P, the others 1.

>>> from whatif.hardware.topology import preset
>>> dgx = preset("dgx_a100")
>>> bus_bytes("all_reduce", 1000, 4)                 # ring: 2(P-1)/P of the bytes
1500.0
>>> e = estimate("all_reduce", 2048, 8, dgx)             # small: low-latency protocol
>>> e.algorithm.value, e.protocol.value
('tree', 'll')
>>> e = estimate("all_reduce", 256 << 20, 8, dgx)
>>> e.algorithm.value, e.protocol.value, round(e.time_ns / 1e6, 3)   # ms
('ring', 'simple', 2.013)
"""
from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from whatif.core.kernels import CollectiveKind

from .topology import Arch, Link, NcclHw, Topology


class Algorithm(str, Enum):
    AUTO = "auto"
    RING = "ring"
    TREE = "tree"
    PAT = "pat"                        # parallel aggregated trees: all-gather/reduce-scatter, 1 GPU/machine
    NVLS = "nvls"                      # NVSwitch multicast (SHARP in the switch), one machine
    NVLS_TREE = "nvls_tree"            # NVLS inside machines, tree between them
    COLLNET_DIRECT = "collnet_direct"  # in-network reduction (SHARP on the NICs' switches)
    COLLNET_CHAIN = "collnet_chain"
    DIRECT = "direct"                  # point to point: send/recv, all-to-all


class Protocol(str, Enum):
    LL = "ll"            # 8-byte stores with a flag: lowest latency, 1/2 of the bytes are data
    LL128 = "ll128"      # 128-byte lines with 8 bytes of flag
    SIMPLE = "simple"    # bulk copies with fences: highest bandwidth, highest latency


_A, _P = Algorithm, Protocol
US = 1_000.0             # ns per µs: NCCL's tables are in µs and GB/s

# baseLatencies[algorithm][protocol], µs (tuning.cc)
_BASE_US: dict[tuple[Algorithm, Protocol], float] = {
    (_A.TREE, _P.LL): 6.8, (_A.TREE, _P.LL128): 14.0, (_A.TREE, _P.SIMPLE): 8.4,
    (_A.RING, _P.LL): 6.6, (_A.RING, _P.LL128): 14.0, (_A.RING, _P.SIMPLE): 8.4,
    (_A.PAT, _P.SIMPLE): 8.0,
}

# hwLatencies[hw][algorithm][protocol], µs per hop (tuning.cc)
_HOP_US: dict[tuple[NcclHw, Algorithm, Protocol], float] = {
    (NcclHw.NVLINK, _A.TREE, _P.LL): 0.6, (NcclHw.NVLINK, _A.TREE, _P.LL128): 1.25,
    (NcclHw.NVLINK, _A.TREE, _P.SIMPLE): 4.0,
    (NcclHw.NVLINK, _A.RING, _P.LL): 0.6, (NcclHw.NVLINK, _A.RING, _P.LL128): 1.9,
    (NcclHw.NVLINK, _A.RING, _P.SIMPLE): 3.4,
    (NcclHw.NVLINK, _A.COLLNET_DIRECT, _P.SIMPLE): 3.7,
    (NcclHw.NVLINK, _A.COLLNET_CHAIN, _P.SIMPLE): 2.8,
    (NcclHw.NVLINK, _A.NVLS, _P.SIMPLE): 25.0, (NcclHw.NVLINK, _A.NVLS_TREE, _P.SIMPLE): 25.0,
    (NcclHw.NVLINK, _A.PAT, _P.SIMPLE): 4.0,
    (NcclHw.PCI, _A.TREE, _P.LL): 1.0, (NcclHw.PCI, _A.TREE, _P.LL128): 1.9,
    (NcclHw.PCI, _A.TREE, _P.SIMPLE): 4.0,
    (NcclHw.PCI, _A.RING, _P.LL): 1.0, (NcclHw.PCI, _A.RING, _P.LL128): 2.5,
    (NcclHw.PCI, _A.RING, _P.SIMPLE): 5.7,
    (NcclHw.PCI, _A.COLLNET_DIRECT, _P.SIMPLE): 3.7,
    (NcclHw.PCI, _A.COLLNET_CHAIN, _P.SIMPLE): 2.8,
    (NcclHw.PCI, _A.PAT, _P.SIMPLE): 4.0,
    (NcclHw.NET, _A.TREE, _P.LL): 5.0, (NcclHw.NET, _A.TREE, _P.LL128): 8.5,
    (NcclHw.NET, _A.TREE, _P.SIMPLE): 14.0,
    (NcclHw.NET, _A.RING, _P.LL): 2.7, (NcclHw.NET, _A.RING, _P.LL128): 4.0,
    (NcclHw.NET, _A.RING, _P.SIMPLE): 14.0,
    (NcclHw.NET, _A.COLLNET_DIRECT, _P.SIMPLE): 31.0,
    (NcclHw.NET, _A.COLLNET_CHAIN, _P.SIMPLE): 30.0,
    (NcclHw.NET, _A.NVLS, _P.SIMPLE): 18.0, (NcclHw.NET, _A.NVLS_TREE, _P.SIMPLE): 20.9,
    (NcclHw.NET, _A.PAT, _P.SIMPLE): 14.0,
}


@dataclass(frozen=True)
class _ArchCaps:
    """NCCL's per-generation tuner constants (tuning.cc), GB/s, indexed by machines (1, 2, more):
    ``llMaxBws`` (one machine; several machines use the Intel-host row), ``perChMaxRingLL128Bws``,
    ``perChMaxTreeLL128Bws``, ``perChMaxTreeBws``, ``perChMaxNVLSTreeBws``; ``nvlsEfficiency``;
    and the per-channel speeds NCCL's graph search tries (``src/graph/search.cc``)."""

    ll_max: tuple[float, float, float]
    ring_ll128_per_channel: tuple[float, float, float]
    tree_ll128_per_channel: tuple[float, float, float]
    tree_per_channel: tuple[float, float, float]
    nvls_tree_per_channel: tuple[float, float, float]
    nvls_efficiency: float
    speeds: tuple[float, ...]


_INTEL_LL = (39.0, 20.4)     # llMaxBws' Intel-host row for two and more machines
_SPEEDS = (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0)
_VOLTA = _ArchCaps((39.0, *_INTEL_LL), (20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (26.5, 18.5, 10.0),
                   (26.5, 18.5, 10.0), 0.0, _SPEEDS)
_AMPERE = _ArchCaps((87.7, *_INTEL_LL), (20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (24.0, 23.6, 17.8),
                    (24.0, 23.6, 17.8), 0.0, _SPEEDS)
_HOPPER = _ArchCaps((141.0, *_INTEL_LL), (36.7, 36.7, 36.7), (36.7, 36.7, 29.0),
                    (38.7, 41.4, 36.0), (0.0, 57.7, 45.5), 0.85,
                    (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0))
_BLACKWELL = _ArchCaps((282.0, *_INTEL_LL), (40.0, 40.0, 40.0), (55.6, 31.67, 20.0),
                       (70.0, 42.8, 24.0), (0.0, 96.0, 80.0), 0.74,
                       (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0))
# MI300X (RCCL has its own tuning tables) takes the Hopper row: an assumption (docs/cost-models.md)
_CAPS = {Arch.VOLTA: _VOLTA, Arch.AMPERE: _AMPERE, Arch.HOPPER: _HOPPER,
         Arch.BLACKWELL: _BLACKWELL, Arch.CDNA3: _HOPPER}

# treeCorrectionFactor[protocol][log2(bytes / 64)] (tuning.cc), interpolated between powers of 2
_TREE_CORRECTION: dict[Protocol, tuple[float, ...]] = {
    _P.LL: (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0,
            1.0, 1.0, 1.0, 1.0),
    _P.LL128: (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9,
               .9, .9, 1.0, 1.0, 1.0),
    _P.SIMPLE: (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7,
                .8, .9, .9, .9),
}

NET_OVERHEAD_US = 1.0       # getNetOverhead on an Intel x86 host (×3 for Simple)
RING_PLATEAU = 1.4          # "plateau effect of ring": inter-machine Simple all-reduce latency ×1.4
P2P_LL_THRESHOLD_BYTES = 16384   # NCCL_P2P_LL_THRESHOLD: send/recv below it use LL
# threads per channel (NCCL_LL_MAX_NTHREADS, NCCL_LL128_MAX_NTHREADS, NCCL_SIMPLE_MAX_NTHREADS)
# and bytes per thread before NCCL adds threads and channels (NCCL_*_THREAD_THRESHOLD)
_THREADS = {_P.LL: 512, _P.LL128: 640, _P.SIMPLE: 512}
_MIN_THREADS = {_P.LL: 64, _P.LL128: 320, _P.SIMPLE: 64}   # halved while a multiple of 128
_THREAD_BYTES = {_P.LL: 8, _P.LL128: 8, _P.SIMPLE: 64}


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
class Estimate:
    """One way NCCL could run a collective: its latency and transfer parts (ns)."""

    algorithm: Algorithm
    protocol: Protocol
    latency_ns: float
    transfer_ns: float

    @property
    def time_ns(self) -> float:
        return self.latency_ns + self.transfer_ns


@dataclass(frozen=True)
class _Call:
    """The facts of one call that every (algorithm, protocol) is priced from."""

    kind: CollectiveKind
    nbytes: float
    ranks: int
    nodes: int
    per: int
    topo: Topology

    @property
    def node_index(self) -> int:
        return min(self.nodes, 3) - 1

    @property
    def nsteps(self) -> int:
        if self.kind is CollectiveKind.ALL_REDUCE:
            return 2 * (self.ranks - 1)
        if self.kind in (CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER):
            return self.ranks - 1
        return self.ranks

    @property
    def inter_steps(self) -> int:
        if self.nodes == 1:
            return 0
        return 2 * (self.nodes - 1) if self.kind is CollectiveKind.ALL_REDUCE else self.nodes - 1

    @property
    def caps(self) -> _ArchCaps:
        return _CAPS[self.topo.arch]

    def intra_link(self) -> Link:
        return self.topo.ring_link(self.per)

    def net(self) -> Link:
        if self.topo.inter is None:
            raise ValueError(f"{self.topo.name} has no inter-machine network")
        return self.topo.inter

    def net_bw(self) -> float:
        """Bytes/s one machine's ranks push into the network (one NIC per rank up to the NICs)."""
        return min(self.per, self.topo.nics_per_machine) * self.net().nccl_bw_bytes_per_s

    def graph_bw(self) -> float:
        """NCCL's ``nChannels · bw`` of the ring/tree graph: the fabric, or the network when the
        ring leaves the machine (the graph search fits the channels to the slower)."""
        intra = self.intra_link().nccl_bw_bytes_per_s if self.per > 1 else math.inf
        return intra if self.nodes == 1 else min(intra, self.net_bw())

    def nvls_channel_bw(self) -> float:
        """Bytes/s of one NVLS channel: NCCL's graph search gives each of the machine's GPUs a
        channel at the fastest speed of its list that the GPUs' NVLink bandwidth holds."""
        fit = self.intra_link().nccl_bw_bytes_per_s / 1e9 / self.per
        return next((v for v in self.caps.speeds if v <= fit), self.caps.speeds[-1]) * 1e9

    def intra_hop_us(self, algo: Algorithm, proto: Protocol) -> float:
        link = self.intra_link()
        return _HOP_US.get((link.kind.hw, algo, proto), 0.0) + link.latency_ns / US

    def inter_hop_us(self, algo: Algorithm, proto: Protocol) -> float:
        # with one rank per machine every network latency is exposed: NCCL takes the tree's
        hop = _HOP_US.get((NcclHw.NET, _A.TREE if self.per == 1 else algo, proto), 0.0)
        extra = self.net().latency_ns / US
        # NCCL adds the network's latency once more for Simple's flush
        return hop + extra * (2 if proto is _P.SIMPLE else 1)


_GATHERS = (CollectiveKind.ALL_GATHER, CollectiveKind.REDUCE_SCATTER)


def _candidates(call: _Call) -> list[tuple[Algorithm, Protocol]]:
    kind, topo = call.kind, call.topo
    if kind is CollectiveKind.SEND_RECV:            # NCCL picks by size, not by its tuner
        return [(_A.DIRECT, _P.LL if call.nbytes <= P2P_LL_THRESHOLD_BYTES else _P.SIMPLE)]
    if kind is CollectiveKind.ALL_TO_ALL:
        return [(_A.DIRECT, _P.LL), (_A.DIRECT, _P.SIMPLE)]
    ll128 = call.intra_link().kind.hw is NcclHw.NVLINK and topo.arch is not Arch.CDNA3
    protos = [_P.LL, _P.LL128, _P.SIMPLE] if ll128 else [_P.LL, _P.SIMPLE]
    algos = [_A.RING]
    if kind is CollectiveKind.ALL_REDUCE:
        algos.append(_A.TREE)
        if topo.collnet and call.nodes > 1:
            algos += [_A.COLLNET_DIRECT, _A.COLLNET_CHAIN]
    if kind in _GATHERS and call.per == 1:
        algos.append(_A.PAT)
    if topo.nvls and call.caps.nvls_efficiency > 0 and call.per > 1 \
            and (kind is CollectiveKind.ALL_REDUCE or kind in _GATHERS):
        if call.nodes == 1:
            algos.append(_A.NVLS)
        elif kind is CollectiveKind.ALL_REDUCE:
            algos.append(_A.NVLS_TREE)
    out = []
    for a in algos:
        simple_only = a not in (_A.RING, _A.TREE)
        out += [(a, p) for p in protos if not simple_only or p is _P.SIMPLE]
    return out


def _nvls_bus_bw(call: _Call, algo: Algorithm) -> float:
    """NVLS: each GPU's channel pulls through the switch at ``nvlsEfficiency`` of its speed, all-reduce
    running its two halves at once; NVLS-tree also bounded by the NICs (×2 on two machines) and
    NCCL's per-channel cap."""
    ch_bw, per = call.nvls_channel_bw(), call.per
    intra = ch_bw * call.caps.nvls_efficiency * (per - 1) / per
    intra *= 2 if call.kind is CollectiveKind.ALL_REDUCE else (per - 1) / per
    if algo is _A.NVLS:
        return per * intra
    nic = call.net().nccl_bw_bytes_per_s * (2 if call.nodes <= 2 else 1)
    return per * min(intra, nic, call.caps.nvls_tree_per_channel[call.node_index] * 1e9)


def _bus_bw(call: _Call, algo: Algorithm, proto: Protocol) -> float:
    """Bus bandwidth (bytes/s) of one (algorithm, protocol) after NCCL's refinements."""
    caps, n, ch = call.caps, call.node_index, call.topo.channels
    g = 1e9
    if algo in (_A.NVLS, _A.NVLS_TREE):
        return _nvls_bus_bw(call, algo)
    bw = call.graph_bw()
    if algo is _A.RING:
        if proto is _P.LL:
            return min(caps.ll_max[n] * g, bw * 0.5)
        if proto is _P.LL128:
            return min(bw * 0.92, ch * caps.ring_ll128_per_channel[n] * g)
        return bw
    if algo is _A.TREE:
        bw = min(bw * 0.92, ch * caps.tree_per_channel[n] * g)
        if proto is _P.LL:
            return min(bw / 3.8, caps.ll_max[n] * g)
        if proto is _P.LL128:
            return min(bw * (7 / 9 if call.nodes == 1 else 120 / 128),
                       ch * caps.tree_ll128_per_channel[n] * g)
        return bw
    if algo is _A.PAT:
        return bw * 0.75
    nics = min(call.per, call.topo.nics_per_machine)
    bw = min(call.intra_link().nccl_bw_bytes_per_s, call.net_bw())
    if algo is _A.COLLNET_DIRECT:
        ratio = call.per / nics                   # GPUs per NIC
        bw /= ratio - (ratio - 1) / 2
        if call.topo.arch in (Arch.HOPPER, Arch.BLACKWELL):
            bw *= 0.85
    return bw


def _alg_bw(call: _Call, algo: Algorithm, proto: Protocol) -> float:
    bw = _bus_bw(call, algo, proto)
    if algo in (_A.RING, _A.NVLS, _A.NVLS_TREE):
        return bw * call.ranks / call.nsteps
    if algo is _A.PAT:
        return bw                                  # tuning.cc converts no gather but the ring's
    return bw / 2


def _latency_us(call: _Call, algo: Algorithm, proto: Protocol) -> float:
    lat = _BASE_US.get((algo, proto), 0.0)
    intra = call.intra_hop_us(algo, proto)
    inter = call.inter_hop_us(algo, proto) if call.nodes > 1 else 0.0
    per, nodes = call.per, call.nodes
    log_nodes = int(math.log2(nodes))
    if algo is _A.RING:
        if call.kind in (CollectiveKind.BROADCAST, CollectiveKind.REDUCE):
            hw = _A.TREE if proto is _P.SIMPLE else _A.RING    # NCCL's chunk latency stand-in
            hop = call.intra_hop_us(hw, proto) if nodes == 1 else call.inter_hop_us(hw, proto)
            return lat + call.nsteps * hop
        if nodes > 1:
            intra = max(intra, NET_OVERHEAD_US * (3 if proto is _P.SIMPLE else 1))
        return lat + (call.nsteps - call.inter_steps) * intra + call.inter_steps * inter
    if algo is _A.TREE:
        return lat + 2 * ((per - 1) * intra + log_nodes * inter)
    if algo is _A.PAT:
        return lat + log_nodes * inter / 3.5 + call.ranks * 2.8
    if algo is _A.COLLNET_DIRECT:
        return lat + 2 * (min(1, per - 1) * intra + (per - 1) * 0.4) + inter
    if algo is _A.COLLNET_CHAIN:
        return lat + 2 * (per - 1) * intra + inter
    if algo is _A.NVLS:
        return intra + inter
    return lat + intra + 2 * log_nodes * inter           # NVLS_TREE


def _channel_share(call: _Call, algo: Algorithm, proto: Protocol) -> float:
    """Fraction of the channels × threads NCCL gives a call this small (continuous in bytes)."""
    per_thread = _THREAD_BYTES[proto] * (call.ranks if algo is _A.RING and proto is _P.LL else 1)
    full = call.topo.channels * _THREADS[proto] * per_thread
    floor = _MIN_THREADS[proto] / (_THREADS[proto] * call.topo.channels)
    return float(min(1.0, max(call.nbytes / full, floor)))


def _tree_correction(proto: Protocol, nbytes: float) -> float:
    table = _TREE_CORRECTION[proto]
    x = math.log2(max(nbytes, 64.0) / 64.0)
    return float(np.interp(x, np.arange(len(table)), table))


def _collective(call: _Call, algo: Algorithm, proto: Protocol) -> Estimate:
    bw = _alg_bw(call, algo, proto) * _channel_share(call, algo, proto)
    if algo is _A.TREE or (algo is _A.NVLS_TREE and call.topo.arch is Arch.BLACKWELL):
        bw *= _tree_correction(proto, call.nbytes)
    lat = _latency_us(call, algo, proto)
    if (algo is _A.RING and proto is _P.SIMPLE and call.nodes > 1
            and call.kind is CollectiveKind.ALL_REDUCE
            and call.nbytes / (call.topo.channels * call.ranks) >= 64):
        lat *= RING_PLATEAU if call.topo.arch is not Arch.VOLTA else 1.9
    return Estimate(algo, proto, lat * US, call.nbytes / bw * 1e9)


def _direct(call: _Call, proto: Protocol) -> Estimate:
    """Send/recv and all-to-all: NCCL's grouped point-to-point transfers, all peers at once; the
    bytes that stay in the machine and those that leave it move concurrently."""
    p, per, s = call.ranks, call.per, call.nbytes
    lat = _BASE_US[(_A.RING, proto)]
    if call.kind is CollectiveKind.SEND_RECV:
        intra_bytes, inter_bytes = (s, 0.0) if call.nodes == 1 else (0.0, s)
    else:
        intra_bytes, inter_bytes = (per - 1) / p * s, (p - per) / p * s
    share = 0.5 if proto is _P.LL else 1.0          # LL: 4 data bytes in every 8
    times = []
    if intra_bytes:
        link = call.topo.intra if call.kind is CollectiveKind.SEND_RECV else call.intra_link()
        hop = _HOP_US[(link.kind.hw, _A.RING, proto)] + link.latency_ns / US
        times.append((hop, intra_bytes / (link.nccl_bw_bytes_per_s * share)))
    if inter_bytes:
        bw = call.net_bw() / per if call.kind is CollectiveKind.ALL_TO_ALL else call.net().nccl_bw_bytes_per_s
        times.append((call.inter_hop_us(_A.RING, proto), inter_bytes / (bw * share)))
    hop_us = max((t[0] for t in times), default=0.0)
    return Estimate(_A.DIRECT, proto, (lat + hop_us) * US, max((t[1] for t in times), default=0.0) * 1e9)


@functools.lru_cache(maxsize=65536)
def _estimates(kind: CollectiveKind, nbytes: float, ranks: int, topo: Topology,
               per: int) -> tuple[Estimate, ...]:
    nodes = math.ceil(ranks / per)
    call = _Call(kind, max(nbytes, 1.0), ranks, nodes, per, topo)
    return tuple(_direct(call, proto) if algo is _A.DIRECT else _collective(call, algo, proto)
                 for algo, proto in _candidates(call))


def estimates(kind: CollectiveKind | str, message_bytes: float, ranks: int, topology: Topology,
              ranks_per_machine: int | None = None) -> list[Estimate]:
    """Every (algorithm, protocol) NCCL could run the call with, priced; ``message_bytes`` is the
    full buffer (the output of an all-gather, the input of a reduce-scatter).

    >>> from whatif.hardware.topology import preset
    >>> [(e.algorithm.value, e.protocol.value) for e in estimates("all_reduce", 1e6, 8,
    ...                                                           preset("pcie_a100_8"))]
    [('ring', 'll'), ('ring', 'simple'), ('tree', 'll'), ('tree', 'simple')]
    """
    _nodes, per = topology.placement(ranks, ranks_per_machine)
    if ranks == 1:
        return []
    return list(_estimates(CollectiveKind(kind), float(message_bytes), ranks, topology, per))


def estimate(kind: CollectiveKind | str, message_bytes: float, ranks: int, topology: Topology,
             algorithm: Algorithm | str = Algorithm.AUTO, protocol: Protocol | str | None = None,
             ranks_per_machine: int | None = None) -> Estimate:
    """The (algorithm, protocol) NCCL's tuner picks (the fastest), or the fastest protocol of the
    given ``algorithm``, or exactly ``algorithm`` with ``protocol``.

    Raises:
        ValueError: the algorithm/protocol cannot run this collective on this topology, or the
            ranks do not fit on it.
    """
    algo = Algorithm(algorithm)
    proto = Protocol(protocol) if protocol is not None else None
    options = [e for e in estimates(kind, message_bytes, ranks, topology, ranks_per_machine)
               if (algo is Algorithm.AUTO or e.algorithm is algo)
               and (proto is None or e.protocol is proto)]
    if ranks == 1:
        return Estimate(algo, proto or Protocol.SIMPLE, 0.0, 0.0)
    if not options:
        raise ValueError(f"NCCL has no {algo.value}/{proto.value if proto else 'any'} "
                         f"{CollectiveKind(kind).value} on {topology.name}")
    return min(options, key=lambda e: e.time_ns)


def choose_algorithm(kind: CollectiveKind | str, message_bytes: float, ranks: int,
                     topology: Topology, ranks_per_machine: int | None = None) -> Algorithm:
    """The algorithm NCCL's tuner picks for the call."""
    return estimate(kind, message_bytes, ranks, topology,
                    ranks_per_machine=ranks_per_machine).algorithm


@dataclass(frozen=True)
class CollectiveFit:
    """Latency and bandwidth multipliers of the model's two parts, plus a residual curve over
    log10(bytes)."""

    latency_scale: float
    transfer_scale: float           # 1 / achieved fraction of the model's bandwidth
    knots: tuple[float, ...] = ()
    log_residual: tuple[float, ...] = ()
    algorithm: Algorithm = Algorithm.AUTO

    @property
    def efficiency(self) -> float:
        return 1.0 / self.transfer_scale if self.transfer_scale > 0 else float("inf")

    def time_ns(self, est: Estimate, message_bytes: float) -> float:
        t = self.latency_scale * est.latency_ns + self.transfer_scale * est.transfer_ns
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
                       protocol: Protocol | str | None = None,
                       ranks_per_machine: int | None = None,
                       calibration: CollectiveCalibration | None = None) -> float:
    """Predicted ns of one collective of ``message_bytes`` (the full buffer) over ``ranks``.

    >>> from whatif.hardware.topology import preset
    >>> round(collective_time_ns("send_recv", 0, 2, preset("dgx_h100")))   # latency only
    7200
    """
    kind = CollectiveKind(kind)
    if ranks == 1:
        return 0.0
    _nodes, per = topology.placement(ranks, ranks_per_machine)
    fit = calibration.lookup(kind, ranks, per) if calibration is not None else None
    algo = Algorithm(algorithm)
    if algo is Algorithm.AUTO and fit is not None:
        algo = fit.algorithm
    est = estimate(kind, message_bytes, ranks, topology, algo, protocol, per)
    return fit.time_ns(est, message_bytes) if fit is not None else est.time_ns


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
              algorithm: Algorithm | str = Algorithm.AUTO,
              points_per_knot: int = 16) -> CollectiveCalibration:
    """Fit from measured ``(kind, message_bytes, ranks, dur_ns[, ranks_per_machine])`` points.

    Per (kind, ranks, ranks per machine): multipliers of the latency and transfer parts of the
    (algorithm, protocol) the model picks at each size (relative least squares), then, with
    ``residual``, a curve of the remaining ratio over log10(bytes), one knot per
    ``points_per_knot`` sizes: it absorbs what NCCL's tuning model leaves out (switch points that
    differ on the measured machine, pipeline fill at mid sizes). Pooled fits per (kind, spans
    machines), without curve, price rank counts that were not measured.

    >>> from whatif.hardware.topology import preset
    >>> dgx = preset("dgx_a100")
    >>> pts = [("all_reduce", b, 8, 20_000 + b / 100.0) for b in (1e7, 1e8, 1e9)]
    >>> cal = calibrate(pts, dgx, residual=False)
    >>> round(collective_time_ns("all_reduce", 5e7, 8, dgx, calibration=cal) / 1e3)   # µs; the points' line: 520
    516
    """
    algo = Algorithm(algorithm)
    groups: dict[tuple[CollectiveKind, int, int], list[tuple[float, float]]] = {}
    for pt in points:
        kind, nbytes, ranks, dur = CollectiveKind(pt[0]), float(pt[1]), int(pt[2]), float(pt[3])
        per = topology.placement(ranks, pt[4] if len(pt) > 4 else None)[1]
        if dur > 0 and ranks > 1:
            groups.setdefault((kind, ranks, per), []).append((nbytes, dur))
    entries: dict[tuple[CollectiveKind, int, int], CollectiveFit] = {}
    pooled_rows: dict[tuple[CollectiveKind, bool], list[tuple[float, float, float]]] = {}
    for (kind, ranks, per), pts in groups.items():
        pts.sort()
        sizes = np.array([p[0] for p in pts])
        t = np.array([p[1] for p in pts])
        est = [estimate(kind, b, ranks, topology, algo, ranks_per_machine=per) for b in sizes]
        lat = np.array([e.latency_ns for e in est])
        xfer = np.array([e.transfer_ns for e in est])
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
