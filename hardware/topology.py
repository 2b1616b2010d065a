"""Cluster topology: machines x GPUs per machine, the intra-machine fabric and the network.

Bandwidths are per GPU per direction in bytes/s (what one GPU can push into its fabric);
latencies are per message hop in ns. Sources for the presets are in docs/cost-models.md.

>>> t = preset(TopologyName.DGX_A100, machines=2)
>>> t.world_size, t.intra.kind.value, t.inter.bw_bytes_per_s / 1e9
(16, 'nvswitch', 25.0)
>>> t.placement(16)
(2, 8)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum

G = 1e9


class LinkKind(str, Enum):
    NVLINK = "nvlink"              # point-to-point NVLink (bridges, pairs)
    NVSWITCH = "nvswitch"          # all-to-all NVLink through NVSwitch
    INFINITY_FABRIC = "infinity_fabric"
    PCIE = "pcie"
    INFINIBAND = "infiniband"
    ROCE = "roce"
    ETHERNET = "ethernet"


@dataclass(frozen=True)
class Link:
    """One GPU's attachment to a fabric: per-direction bandwidth (bytes/s) and hop latency (ns)."""

    kind: LinkKind
    bw_bytes_per_s: float
    latency_ns: float


@dataclass(frozen=True)
class Topology:
    """``machines`` x ``gpus_per_machine`` GPUs; ``inter`` is None for a single machine."""

    name: str
    machines: int
    gpus_per_machine: int
    intra: Link
    inter: Link | None = None
    device: str | None = None

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

    def with_machines(self, machines: int) -> Topology:
        return replace(self, machines=machines)


class TopologyName(str, Enum):
    DGX_A100 = "dgx_a100"          # 8x A100 SXM4, 6 NVSwitch, 8x HDR 200 Gb/s IB
    HGX_A100 = "hgx_a100"
    DGX_H100 = "dgx_h100"          # 8x H100 SXM5, NVSwitch gen3, 8x NDR 400 Gb/s IB
    HGX_H100 = "hgx_h100"
    MI300X_8 = "mi300x_8"          # 8x MI300X fully connected Infinity Fabric, 8x 400 Gb/s
    PCIE_A100_8 = "pcie_a100_8"    # 8x A100 PCIe Gen4 behind PCIe switches, 100 Gb/s Ethernet
    PCIE_L40S_8 = "pcie_l40s_8"
    A100_PAIRWISE_NVLINK = "a100_pairwise_nvlink"   # Vidur's cluster: NVLink-bridged A100 pairs
    A40_PAIRWISE_NVLINK = "a40_pairwise_nvlink"     # Vidur's cluster: NVLink-bridged A40 pairs


_HDR_IB = Link(LinkKind.INFINIBAND, 25 * G, 5_000)     # 200 Gb/s per GPU
_NDR_IB = Link(LinkKind.INFINIBAND, 50 * G, 5_000)     # 400 Gb/s per GPU
_ETH_100 = Link(LinkKind.ETHERNET, 12.5 * G, 10_000)   # 100 Gb/s per machine share

_PRESETS: dict[TopologyName, Topology] = {
    TopologyName.DGX_A100: Topology("DGX A100", 1, 8, Link(LinkKind.NVSWITCH, 300 * G, 1_000),
                                    _HDR_IB, "A100_SXM_80GB"),
    TopologyName.HGX_A100: Topology("HGX A100", 1, 8, Link(LinkKind.NVSWITCH, 300 * G, 1_000),
                                    _HDR_IB, "A100_SXM_80GB"),
    TopologyName.DGX_H100: Topology("DGX H100", 1, 8, Link(LinkKind.NVSWITCH, 450 * G, 1_000),
                                    _NDR_IB, "H100_SXM"),
    TopologyName.HGX_H100: Topology("HGX H100", 1, 8, Link(LinkKind.NVSWITCH, 450 * G, 1_000),
                                    _NDR_IB, "H100_SXM"),
    TopologyName.MI300X_8: Topology("8x MI300X", 1, 8,
                                    Link(LinkKind.INFINITY_FABRIC, 448 * G, 1_500),
                                    Link(LinkKind.ROCE, 50 * G, 5_000), "MI300X"),
    TopologyName.PCIE_A100_8: Topology("8x A100 PCIe", 1, 8, Link(LinkKind.PCIE, 32 * G, 2_000),
                                       _ETH_100, "A100_PCIE_80GB"),
    TopologyName.PCIE_L40S_8: Topology("8x L40S PCIe", 1, 8, Link(LinkKind.PCIE, 32 * G, 2_000),
                                       _ETH_100, "L40S"),
    TopologyName.A100_PAIRWISE_NVLINK: Topology(
        "A100 pairwise NVLink", 1, 4, Link(LinkKind.NVLINK, 300 * G, 1_000), _ETH_100,
        "A100_SXM_80GB"),
    TopologyName.A40_PAIRWISE_NVLINK: Topology(
        "A40 pairwise NVLink", 1, 8, Link(LinkKind.NVLINK, 56.25 * G, 1_000), _ETH_100,
        "A40"),
}


def preset(name: TopologyName | str, machines: int = 1) -> Topology:
    """A preset topology with ``machines`` machines."""
    topo = _PRESETS[TopologyName(name)]
    if machines < 1:
        raise ValueError("machines must be >= 1")
    return topo.with_machines(machines)


def presets() -> dict[TopologyName, Topology]:
    return dict(_PRESETS)
