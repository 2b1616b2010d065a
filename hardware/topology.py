"""Cluster topology: machines x GPUs per machine, the intra-machine fabric and the network.

Bandwidths are per GPU per direction in bytes/s (what one GPU can push into its fabric, from the
datasheet); ``Link.nccl_fraction`` is the share of it that NCCL's topology search credits the
link with (its per-link figures in ``src/graph/topo.h``), which is what the collective model
(:mod:`whatif.hardware.collectives`) builds on. Sources for every preset are in
docs/cost-models.md.

A machine whose GPUs are NVLink-bridged in pairs (``island=2``) reaches the other pairs over
``bridge`` (PCIe): a ring over more GPUs than one island crosses it, so that is its bottleneck.

>>> t = preset(TopologyName.DGX_A100, machines=2)
>>> t.world_size, t.intra.kind.value, t.inter.bw_bytes_per_s / 1e9
(16, 'nvswitch', 25.0)
>>> t.placement(16)
(2, 8)
>>> pair = preset(TopologyName.A100_PAIRWISE_NVLINK)
>>> pair.ring_link(2).kind.value, pair.ring_link(4).kind.value
('nvlink', 'pcie')
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum

G = 1e9


class NcclHw(str, Enum):
    """The hardware classes NCCL's tuner prices hops by (``hwLat`` in ``src/graph/tuning.cc``)."""

    NVLINK = "nvlink"
    PCI = "pci"
    NET = "net"


class LinkKind(str, Enum):
    NVLINK = "nvlink"              # point-to-point NVLink (bridges, pairs)
    NVSWITCH = "nvswitch"          # all-to-all NVLink through NVSwitch
    INFINITY_FABRIC = "infinity_fabric"
    PCIE = "pcie"
    INFINIBAND = "infiniband"
    ROCE = "roce"
    ETHERNET = "ethernet"

    @property
    def hw(self) -> NcclHw:
        """NCCL's hop class: NVLink for NVLink/NVSwitch/xGMI, PCI for PCIe, NET for a NIC."""
        if self in (LinkKind.NVLINK, LinkKind.NVSWITCH, LinkKind.INFINITY_FABRIC):
            return NcclHw.NVLINK
        if self is LinkKind.PCIE:
            return NcclHw.PCI
        return NcclHw.NET


class Arch(str, Enum):
    """GPU generation: selects the rows of NCCL's per-generation bandwidth caps."""

    VOLTA = "volta"
    AMPERE = "ampere"
    HOPPER = "hopper"
    BLACKWELL = "blackwell"
    CDNA3 = "cdna3"


@dataclass(frozen=True)
class Link:
    """One GPU's attachment to a fabric (or one NIC): datasheet bandwidth per direction (bytes/s),
    the fraction of it NCCL credits, and any latency per hop beyond NCCL's for its class (ns)."""

    kind: LinkKind
    bw_bytes_per_s: float
    latency_ns: float = 0.0
    nccl_fraction: float = 0.8

    @property
    def nccl_bw_bytes_per_s(self) -> float:
        return self.bw_bytes_per_s * self.nccl_fraction


@dataclass(frozen=True)
class Topology:
    """``machines`` x ``gpus_per_machine`` GPUs; ``inter`` (one NIC) is None for a single machine.

    ``island``: GPUs per NVLink island (0: the whole machine is one fabric); ``bridge``: the link
    between islands. ``nvls``: NVSwitch multicast (NCCL's NVLS algorithms); ``collnet``: in-network
    reduction on the NICs' switches (SHARP, NCCL's CollNet). ``channels``: NCCL's channels on the
    fabric (only the per-channel caps of LL128 and Tree read it).
    """

    name: str
    machines: int
    gpus_per_machine: int
    intra: Link
    inter: Link | None = None
    device: str | None = None
    arch: Arch = Arch.AMPERE
    nics_per_machine: int = 8
    island: int = 0
    bridge: Link | None = None
    nvls: bool = False
    collnet: bool = False
    channels: int = 16

    @property
    def world_size(self) -> int:
        return self.machines * self.gpus_per_machine

    def placement(self, ranks: int, ranks_per_machine: int | None = None) -> tuple[int, int]:
        """(machines used, ranks per machine) for ``ranks`` packed onto machines (or spread
        ``ranks_per_machine`` per machine when given)."""
        if ranks < 1:
            raise ValueError("ranks must be >= 1")
        per = ranks_per_machine or min(ranks, self.gpus_per_machine)
        if per > self.gpus_per_machine:
            raise ValueError(f"{per} ranks per machine > {self.gpus_per_machine} GPUs per machine")
        nodes = math.ceil(ranks / per)
        if nodes > self.machines:
            raise ValueError(f"{ranks} ranks need {nodes} machines, topology has {self.machines}")
        return nodes, per

    def ring_link(self, per: int) -> Link:
        """The slowest link a ring over ``per`` GPUs of one machine crosses: the island's fabric,
        or the bridge between islands when the ring spans more than one."""
        if self.island and per > self.island and self.bridge is not None:
            return self.bridge
        return self.intra

    def with_machines(self, machines: int) -> Topology:
        return replace(self, machines=machines)


class TopologyName(str, Enum):
    DGX_A100 = "dgx_a100"          # 8x A100 SXM4, 6 NVSwitch, 8x HDR 200 Gb/s IB
    HGX_A100 = "hgx_a100"
    DGX_H100 = "dgx_h100"          # 8x H100 SXM5, NVSwitch gen3, 8x NDR 400 Gb/s IB
    HGX_H100 = "hgx_h100"
    DGX_H200 = "dgx_h200"          # 8x H200, same fabric as DGX H100
    HGX_B200 = "hgx_b200"          # 8x B200, NVLink5 NVSwitch, 8x 400 Gb/s
    GB200_NVL72 = "gb200_nvl72"    # 72 Blackwell GPUs in one NVLink domain
    MI300X_8 = "mi300x_8"          # 8x MI300X fully connected Infinity Fabric, 8x 400 Gb/s
    PCIE_A100_8 = "pcie_a100_8"    # 8x A100 PCIe Gen4 behind PCIe switches, 100 Gb/s Ethernet
    PCIE_L40S_8 = "pcie_l40s_8"
    A100_PAIRWISE_NVLINK = "a100_pairwise_nvlink"   # 4x A100 PCIe, NVLink-bridged pairs
    H100_PAIRWISE_NVLINK = "h100_pairwise_nvlink"   # 8x H100 NVL (PCIe Gen5), NVLink-bridged pairs
    A40_PAIRWISE_NVLINK = "a40_pairwise_nvlink"     # 8x A40, NVLink-bridged pairs


# NCCL credits an NVLink (topo.h SM80/SM90/SM86/SM100_NVLINK_BW) 20 / 20.6 / 12 / 40.1 GB/s of a
# link's 25 / 25 / 14.0625 / 50 GB/s per direction; PCIe Gen4/Gen5 x16 24 / 48 GB/s of 32 / 64;
# a NIC its line rate.
_NVLINK3 = 20.0 / 25.0
_NVLINK4 = 20.6 / 25.0
_NVLINK3_A40 = 12.0 / 14.0625
_NVLINK5 = 40.1 / 50.0
_PCIE = 24.0 / 32.0

_HDR_IB = Link(LinkKind.INFINIBAND, 25 * G, nccl_fraction=1.0)     # 200 Gb/s per GPU
_NDR_IB = Link(LinkKind.INFINIBAND, 50 * G, nccl_fraction=1.0)     # 400 Gb/s per GPU
_ROCE_400 = Link(LinkKind.ROCE, 50 * G, nccl_fraction=1.0)
_ETH_100 = Link(LinkKind.ETHERNET, 12.5 * G, nccl_fraction=1.0)    # 100 Gb/s per machine
_PCIE4 = Link(LinkKind.PCIE, 32 * G, nccl_fraction=_PCIE)
_PCIE5 = Link(LinkKind.PCIE, 64 * G, nccl_fraction=_PCIE)

_A100_NVSWITCH = Link(LinkKind.NVSWITCH, 300 * G, nccl_fraction=_NVLINK3)
_H100_NVSWITCH = Link(LinkKind.NVSWITCH, 450 * G, nccl_fraction=_NVLINK4)
_B200_NVSWITCH = Link(LinkKind.NVSWITCH, 900 * G, nccl_fraction=_NVLINK5)

_PRESETS: dict[TopologyName, Topology] = {
    TopologyName.DGX_A100: Topology("DGX A100", 1, 8, _A100_NVSWITCH, _HDR_IB, "A100_SXM_80GB",
                                    channels=24),
    TopologyName.HGX_A100: Topology("HGX A100", 1, 8, _A100_NVSWITCH, _HDR_IB, "A100_SXM_80GB",
                                    channels=24),
    TopologyName.DGX_H100: Topology("DGX H100", 1, 8, _H100_NVSWITCH, _NDR_IB, "H100_SXM",
                                    Arch.HOPPER, nvls=True, channels=32),
    TopologyName.HGX_H100: Topology("HGX H100", 1, 8, _H100_NVSWITCH, _NDR_IB, "H100_SXM",
                                    Arch.HOPPER, nvls=True, channels=32),
    TopologyName.DGX_H200: Topology("DGX H200", 1, 8, _H100_NVSWITCH, _NDR_IB, "H200",
                                    Arch.HOPPER, nvls=True, channels=32),
    TopologyName.HGX_B200: Topology("HGX B200", 1, 8, _B200_NVSWITCH, _NDR_IB, "B200",
                                    Arch.BLACKWELL, nvls=True, channels=32),
    TopologyName.GB200_NVL72: Topology("GB200 NVL72", 1, 72, _B200_NVSWITCH, _NDR_IB, "B200",
                                       Arch.BLACKWELL, nics_per_machine=72, nvls=True,
                                       channels=32),
    TopologyName.MI300X_8: Topology("8x MI300X", 1, 8,
                                    Link(LinkKind.INFINITY_FABRIC, 448 * G, nccl_fraction=0.8),
                                    _ROCE_400, "MI300X", Arch.CDNA3, channels=32),
    TopologyName.PCIE_A100_8: Topology("8x A100 PCIe", 1, 8, _PCIE4, _ETH_100, "A100_PCIE_80GB",
                                       nics_per_machine=1, channels=4),
    TopologyName.PCIE_L40S_8: Topology("8x L40S PCIe", 1, 8, _PCIE4, _ETH_100, "L40S",
                                       nics_per_machine=1, channels=4),
    TopologyName.A100_PAIRWISE_NVLINK: Topology(
        "A100 PCIe pairwise NVLink", 1, 4, Link(LinkKind.NVLINK, 300 * G, nccl_fraction=_NVLINK3),
        _ETH_100, "A100_PCIE_80GB", nics_per_machine=1, island=2, bridge=_PCIE4, channels=12),
    TopologyName.H100_PAIRWISE_NVLINK: Topology(
        "H100 NVL pairwise NVLink", 1, 8, Link(LinkKind.NVLINK, 300 * G, nccl_fraction=_NVLINK4),
        _NDR_IB, "H100_PCIE", Arch.HOPPER, island=2, bridge=_PCIE5, channels=12),
    TopologyName.A40_PAIRWISE_NVLINK: Topology(
        "A40 pairwise NVLink", 1, 8, Link(LinkKind.NVLINK, 56.25 * G, nccl_fraction=_NVLINK3_A40),
        _ETH_100, "A40", nics_per_machine=1, island=2, bridge=_PCIE4, channels=4),
}


def preset(name: TopologyName | str, machines: int = 1) -> Topology:
    """A preset topology with ``machines`` machines."""
    topo = _PRESETS[TopologyName(name)]
    if machines < 1:
        raise ValueError("machines must be >= 1")
    return topo.with_machines(machines)


def presets() -> dict[TopologyName, Topology]:
    return dict(_PRESETS)
