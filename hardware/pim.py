"""Processing-in-memory (PIM) device models for ``pim_offload`` (docs/multi-gpu.md).

A PIM device is a set of HBM stacks whose DRAM holds compute units at one level of the memory
hierarchy. The numbers follow DCC (arXiv 2511.15503, its public backend configuration) and
AttAcc (Park et al., ASPLOS 2024):

* ``stacks`` HBM stacks of ``stack_bw`` ≈ 650 GB/s external bandwidth each (5 stacks);
* the *internal* bandwidth a level's units see is the external one times a multiplier: within
  HBM's power budget ×9 at bank level and ×3 at bank-group level (AttAcc's power-constrained
  configuration, its headline), ×16 / ×8 without the limit (``power_limited=False``: DCC's backend
  and AttAcc's unconstrained design), ×1 at the buffer (base) die;
* PIM FLOP/s = internal bandwidth × ``ops_per_byte`` (the units' MACs per byte streamed);
* achieved rates are capped at 0.85 of peak compute and 0.81 of peak bandwidth (DCC);
* the GPU reaches the PIM stacks over a full-duplex link, **per direction**: NVLink3 300 GB/s,
  NVLink4 450 GB/s, PCIe Gen4 ×16 32 GB/s, Gen5 64 GB/s (NVIDIA's 600/900 GB/s and PCIe's 64/128
  GB/s are both directions together; AttAcc and DCC move data one way at half of them);
* capacity: ``stacks × stack_gb`` (HBM3, 16 GB per stack: 80 GB in 5 stacks) holds what is
  offloaded — weights and KV cache.

Unit counts per stack follow the HBM3 organization (JEDEC JESD238: 32 pseudo-channels of 4 bank
groups × 4 banks): 512 banks, 128 bank groups, 1 buffer die. They decide how many partial sums a
reduction-split kernel leaves and what share of the data already sits in the right unit.

>>> d = get_pim("attacc")
>>> round(d.internal_bw("bank") / 1e12, 2), round(d.internal_bw("buffer_die") / 1e12, 2)   # TB/s
(29.25, 3.25)
>>> round(d.with_power_limit(False).internal_bw("bank") / 1e12, 1)
52.0
>>> round(d.kernel_time_ns(2e6, 2e6, "bank"))   # batch-1 fp16 GEMV, 1 M weights: 84 ns + 1 us command
1084
>>> d.units("bank_group"), d.capacity_bytes() / 1e9
(640, 80.0)
"""
from __future__ import annotations

from dataclasses import dataclass, replace

G = 1e9
LEVELS = ("bank", "bank_group", "buffer_die")          # finest to coarsest
BW_MULTIPLIER = {"bank": 9.0, "bank_group": 3.0, "buffer_die": 1.0}         # AttAcc within HBM's power budget
BW_MULTIPLIER_UNLIMITED = {"bank": 16.0, "bank_group": 8.0, "buffer_die": 1.0}   # DCC backends, no power limit
UNITS_PER_STACK = {"bank": 512, "bank_group": 128, "buffer_die": 1}        # HBM3, JESD238
COMPUTE_UTIL = 0.85        # DCC: achieved fraction of peak PIM FLOP/s
MEMORY_UTIL = 0.81         # DCC: achieved fraction of peak bandwidth
LINKS = {"nvlink3": 300 * G, "nvlink4": 450 * G, "pcie4": 32 * G, "pcie5": 64 * G}   # per direction
LINK_LATENCY_NS = 1_000.0  # per GPU<->PIM transfer (an NVLink hop, as in predictors/topology.py)
COMMAND_NS = 1_000.0       # per offloaded kernel: the host issuing the PIM command sequence (assumed)


@dataclass(frozen=True)
class PimDevice:
    """HBM-PIM stacks attached to a GPU: ``finest`` is the finest level that has compute units
    (data can also be partitioned at any coarser level); bandwidths in bytes/s."""

    name: str
    finest: str
    stacks: int = 5
    stack_bw: float = 650 * G
    ops_per_byte: float = 1.0
    link: str = "nvlink4"
    source: str = ""
    power_limited: bool = True
    stack_gb: float = 16.0

    def __post_init__(self) -> None:
        if self.finest not in LEVELS:
            raise ValueError(f"unknown PIM level {self.finest!r} (levels: {', '.join(LEVELS)})")
        if self.link not in LINKS:
            raise ValueError(f"unknown GPU-PIM link {self.link!r} (links: {', '.join(LINKS)})")

    def levels(self) -> tuple[str, ...]:
        """Partitioning levels this device supports: its finest and every coarser one."""
        return LEVELS[LEVELS.index(self.finest):]

    def check_level(self, level: str) -> None:
        if level not in self.levels():
            raise ValueError(f"{self.name} has compute units down to {self.finest}; level {level!r} is not one "
                             f"of {', '.join(self.levels())}")

    def external_bw(self) -> float:
        """Bytes/s through the stacks' external interfaces (all stacks)."""
        return self.stacks * self.stack_bw

    def internal_bw(self, level: str) -> float:
        """Peak bytes/s the units of ``level`` stream: external × the level's multiplier (power
        limited or not)."""
        self.check_level(level)
        return self.external_bw() * (BW_MULTIPLIER if self.power_limited else BW_MULTIPLIER_UNLIMITED)[level]

    def capacity_bytes(self) -> float:
        """Bytes the stacks hold: ``stacks × stack_gb``."""
        return self.stacks * self.stack_gb * G

    def peak_flops(self, level: str) -> float:
        """Peak FLOP/s at ``level``: internal bandwidth × ops per byte (DCC)."""
        return self.internal_bw(level) * self.ops_per_byte

    def units(self, level: str) -> int:
        """Compute units (data partitions) at ``level`` over all stacks."""
        self.check_level(level)
        return self.stacks * UNITS_PER_STACK[level]

    def link_bw(self) -> float:
        """Bytes/s of the GPU<->PIM link in one direction."""
        return LINKS[self.link]

    def kernel_time_ns(self, flops: float, resident_bytes: float, level: str) -> float:
        """ns of a kernel on the PIM units of ``level``: roofline with DCC's utilization caps,
        ``max(F / (0.85·P_L), R / (0.81·BW_L))`` + the command overhead."""
        t = max(flops / (COMPUTE_UTIL * self.peak_flops(level)),
                resident_bytes / (MEMORY_UTIL * self.internal_bw(level)))
        return t * 1e9 + COMMAND_NS

    def transfer_ns(self, nbytes: float) -> float:
        """ns of moving ``nbytes`` between the GPU and the PIM stacks over the link."""
        return LINK_LATENCY_NS + nbytes / self.link_bw() * 1e9 if nbytes > 0 else 0.0

    def rearrange_ns(self, nbytes: float) -> float:
        """ns of rearranging ``nbytes`` between the host layout and a PIM layout: each byte is read
        and written once through the buffer die at the external bandwidth (×1, 0.81 achieved)."""
        return 2.0 * nbytes / (MEMORY_UTIL * self.external_bw()) * 1e9 if nbytes > 0 else 0.0

    def reduce_ns(self, partial_bytes: float) -> float:
        """ns of reducing partial sums: each unit's ``partial_bytes`` share read once by the adders
        on the buffer die at the external bandwidth (0.81 achieved)."""
        return partial_bytes / (MEMORY_UTIL * self.external_bw()) * 1e9 if partial_bytes > 0 else 0.0

    def with_link(self, link: str) -> PimDevice:
        return replace(self, link=link)

    def with_power_limit(self, limited: bool) -> PimDevice:
        return replace(self, power_limited=limited)


PIM_DEVICES: dict[str, PimDevice] = {
    "attacc": PimDevice("attacc", "bank", link="nvlink4",
                        source="AttAcc (ASPLOS 2024): bank-level GEMV units in HBM; DCC backend config"),
    "hbm_pim": PimDevice("hbm_pim", "bank_group", link="nvlink3",
                         source="Samsung HBM-PIM (ISCA 2021) as modeled by DCC: units shared per bank group"),
    "buffer_die": PimDevice("buffer_die", "buffer_die", link="nvlink4",
                            source="near-memory logic on the HBM base die (DCC's x1 level)"),
}


def get_pim(name: str | PimDevice) -> PimDevice:
    """A PIM device by name (``attacc``, ``hbm_pim``, ``buffer_die``)."""
    if isinstance(name, PimDevice):
        return name
    try:
        return PIM_DEVICES[str(name).lower()]
    except KeyError:
        raise KeyError(f"unknown PIM device {name!r}; known: {', '.join(PIM_DEVICES)}") from None
