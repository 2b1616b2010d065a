"""Device catalog: peak FLOP/s per dtype, memory bandwidth, SM count, clocks, interconnect.

Figures are dense (no structured sparsity) vendor datasheet/whitepaper numbers; every one has its
source in ``docs/cost-models.md``. Matrix-engine (tensor core / MFMA) peaks are used where the
dtype runs on them. fp16/bf16 peaks are with fp32 accumulation, which is what PyTorch uses.

>>> a100 = get_device("A100_SXM_80GB")
>>> a100.peak_flops(DType.BF16) / 1e12
312.0
>>> round(a100.ridge_point(DType.BF16), 1)        # FLOP per byte
153.0
>>> find_device("NVIDIA A100-SXM4-80GB").name
'A100_SXM_80GB'
>>> find_device("AMD Instinct MI300X VF").name
'MI300X'
>>> find_device("a toaster") is None
True
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import Enum

from whatif.core.dtypes import DType

T = 1e12
G = 1e9
GIB = 1 << 30
MIB = 1 << 20


# When a device has no native rate for a dtype, frameworks run it on the next type in this chain.
_FALLBACK: dict[DType, tuple[DType, ...]] = {
    DType.FP32: (),
    DType.TF32: (DType.FP32,),
    DType.BF16: (DType.FP16, DType.FP32),
    DType.FP16: (DType.BF16, DType.FP32),
    DType.FP8: (DType.FP16, DType.BF16, DType.FP32),
    DType.INT8: (DType.FP16, DType.FP32),
}

class Vendor(str, Enum):
    NVIDIA = "nvidia"
    AMD = "amd"


SMALL_GEMM_FLOPS = 2.0 * 1024 ** 3   # the GEMM at which ``Achievable.small_gemm_flops`` is measured
LARGE_GEMM_FLOPS = 2.0 * 8192 ** 3   # the GEMM at which ``Achievable.gemm_flops`` is measured


@dataclass(frozen=True)
class Achievable:
    """What a device reaches in practice, as measured by others (``sources``: field -> source).

    ``gemm_flops``: dense FLOP/s of an M=N=K=8192 GEMM through the vendor BLAS, per dtype;
    ``small_gemm_flops`` the same at M=N=K=1024 (a GEMM of 2^31 FLOPs fills few waves);
    ``stream_bw_bytes_per_s`` a large device-memory copy or STREAM triad (read + write bytes);
    ``l2_bw_bytes_per_s`` the L2 cache's; ``launch_ns`` the shortest kernel's time on the GPU
    (launch, ramp-up and drain of an empty kernel); ``link_bw_bytes_per_s`` a peer copy over the
    GPU's links per direction, ``pcie_bw_bytes_per_s`` a pinned host copy per direction.
    """

    gemm_flops: dict[DType, float]
    small_gemm_flops: dict[DType, float]
    stream_bw_bytes_per_s: float
    l2_bw_bytes_per_s: float
    launch_ns: float
    link_bw_bytes_per_s: float
    pcie_bw_bytes_per_s: float
    sources: dict[str, str]

    def matrix_flops(self, dtype: DType, flops: float) -> float | None:
        """FLOP/s a GEMM of ``flops`` reaches: log-linear in log(FLOPs) between the small and the
        large figure, clamped at both ends; None when there is no figure for ``dtype``."""
        large, small = self.gemm_flops.get(dtype), self.small_gemm_flops.get(dtype)
        if not large:
            return None
        if not small or flops >= LARGE_GEMM_FLOPS:
            return large
        if flops <= SMALL_GEMM_FLOPS:
            return small
        w = math.log(flops / SMALL_GEMM_FLOPS) / math.log(LARGE_GEMM_FLOPS / SMALL_GEMM_FLOPS)
        return small * (large / small) ** w


@dataclass(frozen=True)
class Device:
    """One GPU as PyTorch sees it (for MI250X: one GCD).

    ``peak`` maps dtype -> FLOP/s (int8: OP/s); bandwidths are bytes/s; ``link_bw`` is the GPU's
    aggregate peer-link bandwidth per direction (NVLink/Infinity Fabric; 0 when it has none),
    ``pcie_bw`` the host link per direction.
    """

    name: str
    vendor: Vendor
    peak: dict[DType, float]
    mem_bw_bytes_per_s: float
    sm_count: int
    clock_hz: float
    mem_bytes: int
    l2_bytes: int
    link_bw_bytes_per_s: float
    link_kind: str
    pcie_bw_bytes_per_s: float
    achievable: Achievable | None = None

    def __hash__(self) -> int:  # dict field: hash by name
        return hash(self.name)

    def native_dtype(self, dtype: DType | str) -> DType:
        """The dtype ``dtype`` runs in here: itself when native, else the first native one along
        bf16->fp16->fp32 (what frameworks fall back to)."""
        dtype = DType(dtype)
        for d in (dtype, *_FALLBACK[dtype]):
            if self.peak.get(d):
                return d
        raise KeyError(f"{self.name} has no rate for {dtype.value}")

    def peak_flops(self, dtype: DType | str) -> float:
        """Peak FLOP/s for ``dtype``, falling back along bf16->fp16->fp32 when not native."""
        return self.peak[self.native_dtype(dtype)]

    def achievable_matrix_flops(self, dtype: DType | str, flops: float) -> float:
        """FLOP/s a GEMM of ``flops`` FLOPs reaches in ``dtype`` (its native fallback): the
        achievable figures where the device has them, else the datasheet peak."""
        native = self.native_dtype(dtype)
        if self.achievable is not None:
            rate = self.achievable.matrix_flops(native, flops)
            if rate:
                return rate
        return self.peak[native]

    @property
    def stream_bw_bytes_per_s(self) -> float:
        """Device-memory bandwidth a streaming kernel reaches (achievable, else the datasheet's)."""
        if self.achievable is not None and self.achievable.stream_bw_bytes_per_s > 0:
            return self.achievable.stream_bw_bytes_per_s
        return self.mem_bw_bytes_per_s

    def ridge_point(self, dtype: DType | str) -> float:
        """Roofline ridge point in FLOP/byte: peak FLOP/s over memory bytes/s."""
        return self.peak_flops(dtype) / self.mem_bw_bytes_per_s

    @property
    def peak_sm_clock(self) -> float:
        """SM count x clock (Hz): Habitat's compute-scaling term."""
        return self.sm_count * self.clock_hz


def _d(name, vendor, fp32, tf32, bf16, fp16, fp8, int8, bw, sms, mhz, mem_gb, l2_mb, link, kind,
       pcie) -> Device:
    peak = {DType.FP32: fp32 * T, DType.TF32: tf32 * T, DType.BF16: bf16 * T, DType.FP16: fp16 * T,
            DType.FP8: fp8 * T, DType.INT8: int8 * T}
    return Device(name, vendor, {k: v for k, v in peak.items() if v}, bw * G, sms,
                  mhz * 1e6, int(mem_gb * GIB), int(l2_mb * MIB), link * G, kind, pcie * G)


NV, AMD = Vendor.NVIDIA, Vendor.AMD
#        name              vendor fp32   tf32   bf16    fp16    fp8     int8    GB/s  SMs  MHz  GB   L2MB link kind        pcie
_ROWS = [
    _d("V100_SXM2_16GB",   NV,  15.7,  0,     0,      125,    0,      62,     900,  80,  1530, 16,  6,   150, "nvlink2",  16),
    _d("V100_SXM2_32GB",   NV,  15.7,  0,     0,      125,    0,      62,     900,  80,  1530, 32,  6,   150, "nvlink2",  16),
    _d("V100_PCIE_32GB",   NV,  14.0,  0,     0,      112,    0,      56,     900,  80,  1380, 32,  6,   0,   "",         16),
    _d("A100_SXM_40GB",    NV,  19.5,  156,   312,    312,    0,      624,    1555, 108, 1410, 40,  40,  300, "nvlink3",  32),
    _d("A100_SXM_80GB",    NV,  19.5,  156,   312,    312,    0,      624,    2039, 108, 1410, 80,  40,  300, "nvlink3",  32),
    _d("A100_PCIE_40GB",   NV,  19.5,  156,   312,    312,    0,      624,    1555, 108, 1410, 40,  40,  300, "nvlink3-bridge", 32),
    _d("A100_PCIE_80GB",   NV,  19.5,  156,   312,    312,    0,      624,    1935, 108, 1410, 80,  40,  300, "nvlink3-bridge", 32),
    _d("A40",              NV,  37.4,  74.8,  149.7,  149.7,  0,      299.3,  696,  84,  1740, 48,  6,   56.25, "nvlink3-bridge", 32),
    _d("L40S",             NV,  91.6,  183,   362.05, 362.05, 733,    733,    864,  142, 2520, 48,  96,  0,   "",         32),
    _d("RTX_4090",         NV,  82.6,  82.6,  165.2,  165.2,  330.3,  660.6,  1008, 128, 2520, 24,  72,  0,   "",         32),
    _d("RTX_2080_TI",      NV,  13.4,  0,     0,      53.8,   0,      215.2,  616,  68,  1545, 11,  5.5, 50,  "nvlink2-bridge", 16),
    _d("GP100",            NV,  10.3,  0,     0,      20.7,   0,      0,      717,  56,  1442, 16,  4,   40,  "nvlink1-bridge", 16),
    _d("H100_SXM",         NV,  67,    494.7, 989.4,  989.4,  1978.9, 1978.9, 3350, 132, 1980, 80,  50,  450, "nvlink4",  64),
    _d("H100_PCIE",        NV,  51,    378,   756,    756,    1513,   1513,   2000, 114, 1755, 80,  50,  300, "nvlink4-bridge", 64),
    _d("H200",             NV,  67,    494.7, 989.4,  989.4,  1978.9, 1978.9, 4800, 132, 1980, 141, 50,  450, "nvlink4",  64),
    _d("B200",             NV,  74.4,  1100,  2250,   2250,   4500,   4500,   8000, 148, 1965, 180, 126, 900, "nvlink5",  64),
    _d("MI210",            AMD, 45.3,  0,     181,    181,    0,      181,    1638, 104, 1700, 64,  8,   150, "infinity-fabric", 32),
    _d("MI250X",           AMD, 47.85, 0,     191.5,  191.5,  0,      191.5,  1638, 110, 1700, 64,  8,   200, "infinity-fabric", 32),
    _d("MI300X",           AMD, 163.4, 653.7, 1307.4, 1307.4, 2614.9, 2614.9, 5300, 304, 2100, 192, 32,  448, "infinity-fabric", 64),
]

DEVICES: dict[str, Device] = {d.name: d for d in _ROWS}


def get_device(name: str) -> Device:
    """Catalog entry by its name (case-insensitive) or by a name as traces write it.

    Raises
    ------
    KeyError
        When neither the catalog nor the trace-name rules know ``name``.
    """
    got = DEVICES.get(str(name).upper())
    if got is not None:
        return got
    found = find_device(str(name))
    if found is None:
        raise KeyError(f"unknown device {name!r}; known: {', '.join(DEVICES)}")
    return found


# (pattern on the lower-cased trace name, catalog entry); first match wins.
_NAME_RULES: list[tuple[str, str]] = [
    (r"a100.*pg509-2[1-9]0", "A100_SXM_80GB"),   # Meta OAM boards: -200 is 40 GB
    (r"a100.*pg509", "A100_SXM_40GB"),
    (r"a100.*(pcie.*80|80.*pcie)", "A100_PCIE_80GB"),
    (r"a100.*pcie", "A100_PCIE_40GB"),
    (r"a100.*80", "A100_SXM_80GB"),
    (r"a100", "A100_SXM_40GB"),
    (r"h100.*pcie", "H100_PCIE"),
    (r"h100|h800", "H100_SXM"),
    (r"h200", "H200"),
    (r"b200", "B200"),
    (r"l40s", "L40S"),
    (r"\ba40\b", "A40"),
    (r"4090", "RTX_4090"),
    (r"2080 ?ti", "RTX_2080_TI"),
    (r"gp100", "GP100"),
    (r"v100.*pcie", "V100_PCIE_32GB"),
    (r"v100.*16gb", "V100_SXM2_16GB"),
    (r"v100", "V100_SXM2_32GB"),
    (r"mi300x", "MI300X"),
    (r"mi250", "MI250X"),
    (r"mi210", "MI210"),
]


def find_device(name_from_trace: str | None) -> Device | None:
    """Catalog entry for a trace's ``deviceProperties`` name, or None when unknown.

    >>> find_device("Tesla V100-SXM2-16GB").name
    'V100_SXM2_16GB'
    >>> find_device("NVIDIA H100 80GB HBM3").name
    'H100_SXM'
    """
    if not name_from_trace:
        return None
    low = name_from_trace.lower()
    for pattern, dev in _NAME_RULES:
        if re.search(pattern, low):
            return DEVICES[dev]
    return None
