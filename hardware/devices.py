"""Device catalog: peak FLOP/s per dtype, memory bandwidth, SM count, clocks, interconnect, and
what each GPU achieves (:class:`Achievable`), plus the devices registered from spec files.

Datasheet figures are dense (no structured sparsity) vendor datasheet/whitepaper numbers; every
one has its source in ``docs/cost-models.md``. Matrix-engine (tensor core / MFMA) peaks are used
where the dtype runs on them. fp16/bf16 peaks are with fp32 accumulation, which is what PyTorch
uses. Achievable figures carry their own source (``Achievable.sources``): measured by a named
public source, or derived from a sibling GPU's measured share by a stated rule.

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
>>> h100, mi300x = get_device("H100_SXM").achievable, get_device("MI300X").achievable
>>> round(h100.gemm_flops[DType.BF16] / 1e12), round(mi300x.gemm_flops[DType.BF16] / 1e12)
(794, 668)
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from enum import Enum
from functools import cache

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
        """FLOP/s a GEMM of ``flops`` reaches: the small figure at and below 2^31 FLOPs, the large
        one at and above 2^40, and between them a time affine in the FLOPs through both measured
        points, ``t(F) = t0 + F / R`` (a fixed ramp-up and tail cost plus a per-FLOP cost; see
        :func:`gemm_time_law`); None when there is no figure for ``dtype``.

        >>> a = Achievable({DType.BF16: 800e12}, {DType.BF16: 160e12}, 3e12, 10e12, 1500.0, 4e11, 5e10, {})
        >>> [round(a.matrix_flops(DType.BF16, f) / 1e12) for f in (1e9, 2e10, 5e10, 2e12)]
        [160, 562, 687, 800]
        """
        large, small = self.gemm_flops.get(dtype), self.small_gemm_flops.get(dtype)
        if not large:
            return None
        if not small or flops >= LARGE_GEMM_FLOPS:
            return large
        if flops <= SMALL_GEMM_FLOPS:
            return small
        fixed_s, per_flop_s = gemm_time_law(small, large)
        return flops / (fixed_s + flops * per_flop_s)


def gemm_time_law(small_flops_per_s: float, large_flops_per_s: float) -> tuple[float, float]:
    """``(t0, 1/R)`` of the line ``t(F) = t0 + F/R`` through the small GEMM's time (2^31 FLOPs at
    ``small_flops_per_s``) and the large one's (2^40 FLOPs at ``large_flops_per_s``).

    A GEMM's ramp-up, its partly filled last wave and its epilogue cost about the same time at any
    size the library tiles well, so the rate rises as ``F / (t0 + F/R)`` (Hockney's latency and
    bandwidth form), not log-linearly: on Vidur's 36,516 A100 GEMMs the log-linear curve put 68 %
    of those of 16-64 GFLOP above the achievable roof, this line 0.4 % (``bench/device_achievable.py``).

    >>> t0, inv = gemm_time_law(160e12, 800e12)
    >>> round(t0 * 1e6, 2), round(1 / inv / 1e12, 1)
    (10.76, 806.3)
    """
    small_s = SMALL_GEMM_FLOPS / small_flops_per_s
    large_s = LARGE_GEMM_FLOPS / large_flops_per_s
    per_flop_s = (large_s - small_s) / (LARGE_GEMM_FLOPS - SMALL_GEMM_FLOPS)
    return small_s - SMALL_GEMM_FLOPS * per_flop_s, per_flop_s


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
    trace_names: tuple[str, ...] = ()
    """Lower-case names (substrings) a trace's ``deviceProperties`` gives this GPU, for devices
    from a spec file; the catalog's own rules are ``_NAME_RULES``."""

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

    def _reached(self, achieved: float, datasheet: float) -> float:
        return achieved if self.achievable is not None and achieved > 0 else datasheet

    @property
    def stream_bw_bytes_per_s(self) -> float:
        """Device-memory bandwidth a streaming kernel reaches (achievable, else the datasheet's)."""
        ach = self.achievable
        return self._reached(ach.stream_bw_bytes_per_s if ach else 0.0, self.mem_bw_bytes_per_s)

    @property
    def host_copy_bw_bytes_per_s(self) -> float:
        """Host-link bandwidth per direction a pinned copy reaches (achievable, else the datasheet's)."""
        ach = self.achievable
        return self._reached(ach.pcie_bw_bytes_per_s if ach else 0.0, self.pcie_bw_bytes_per_s)

    @property
    def peer_copy_bw_bytes_per_s(self) -> float:
        """Peer-to-peer bandwidth per direction: its links (achievable, else the datasheet's), or the
        host link when it has none."""
        if not self.link_bw_bytes_per_s:
            return self.host_copy_bw_bytes_per_s
        ach = self.achievable
        return self._reached(ach.link_bw_bytes_per_s if ach else 0.0, self.link_bw_bytes_per_s)

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
    _d("H100_NVL",         NV,  60,    417.5, 835.5,  835.5,  1670.5, 1670.5, 3900, 132, 1785, 94,  50,  300, "nvlink4-bridge", 64),
    _d("H200",             NV,  67,    494.7, 989.4,  989.4,  1978.9, 1978.9, 4800, 132, 1980, 141, 50,  450, "nvlink4",  64),
    _d("B200",             NV,  74.4,  1100,  2250,   2250,   4500,   4500,   8000, 148, 1965, 180, 126, 900, "nvlink5",  64),
    _d("GB200",            NV,  80,    1250,  2500,   2500,   5000,   5000,   8000, 148, 1965, 186, 126, 900, "nvlink5",  450),
    _d("L4",               NV,  30.3,  60,    121,    121,    242.5,  242.5,  300,  58,  2040, 24,  48,  0,   "",         32),
    _d("MI210",            AMD, 45.3,  0,     181,    181,    0,      181,    1638, 104, 1700, 64,  8,   150, "infinity-fabric", 32),
    _d("MI250X",           AMD, 47.85, 0,     191.5,  191.5,  0,      191.5,  1638, 110, 1700, 64,  8,   200, "infinity-fabric", 32),
    _d("MI300X",           AMD, 163.4, 653.7, 1307.4, 1307.4, 2614.9, 2614.9, 5300, 304, 2100, 192, 32,  448, "infinity-fabric", 64),
    _d("MI325X",           AMD, 163.4, 653.7, 1307.4, 1307.4, 2614.9, 2614.9, 6000, 304, 2100, 256, 32,  448, "infinity-fabric", 64),
    _d("MI355X",           AMD, 157.3, 0,     2500,   2500,   5000,   5000,   8000, 256, 2400, 288, 32,  537.6, "infinity-fabric", 64),
]


# ---------------------------------------------------------------------------------------------
# Achievable figures. Each is measured by a named public source (``Measured``) or derived from a
# sibling's measured share of its datasheet figure (``Like``); ``_derive`` states the rule in the
# figure's source. ``bench/device_achievable.py`` prints the figures read from Vidur's tables
# and the shared traces.

@dataclass(frozen=True)
class Measured:
    """A figure as a public source measured it (TFLOP/s, GB/s or us, as its field says)."""

    value: float
    source: str


@dataclass(frozen=True)
class Like:
    """A figure derived from a sibling device's figure by the rule of its field (``_derive``)."""

    sibling: str


@dataclass(frozen=True)
class Share:
    """A figure as a share of the device's own datasheet figure, with how the share was found."""

    share: float
    source: str


Figure = Measured | Like | Share


@dataclass(frozen=True)
class Evidence:
    """Where each achievable figure of one device comes from: ``gemm`` holds the measured large-GEMM
    rates (TFLOP/s, M=N=K=8192 or the best shape), other dtypes scale with the device's own
    bf16 (else fp16) share of peak; ``small`` the 2^31-FLOP GEMM rate; ``stream``/``l2``/``link``/
    ``pcie`` GB/s; ``launch`` us."""

    gemm: dict[DType, Measured] | Like
    small: Measured | Like
    stream: Figure
    l2: Figure
    launch: Measured | Like
    link: Figure
    pcie: Figure


_MAMF = "Bekman, ml-engineering, 'Maximum Achievable Matmul FLOPS' table (torch.matmul, best shape)"
_GPUB = "te42kyfo/gpu-benches @1c36d50"
_VIDUR = "Vidur profiling data (shared/perfdata/vidur; bench/device_achievable.py)"
_TRACES = "shared public traces (bench/device_achievable.py)"
_PCIE = Share(0.8, "derived: 0.8 x the host link's rate (an assumed pinned-copy efficiency, not measured)")


def _stream(file: str, gbs: float, note: str = "") -> Measured:
    return Measured(gbs, f"{_GPUB} gpu-stream/{file} (best triad){note}")


def _l2(file: str, gbs: float, note: str = "") -> Measured:
    return Measured(gbs, f"{_GPUB} gpu-l2-cache/{file} (8 MB data set){note}")


def _graph_launch(file: str, us: float, note: str = "") -> Measured:
    return Measured(us, f"{_GPUB} gpu-small-kernels/{file} (64 kB SCALE kernels back to back in a CUDA graph){note}")


def _trace_launch(us: float) -> Measured:
    return Measured(us, f"1st percentile of kernel durations in the {_TRACES}")


def _mamf(bf16: float, fp8: float = 0.0, note: str = "") -> dict[DType, Measured]:
    gemm = {DType.BF16: Measured(bf16, f"{_MAMF}{note}")}
    if fp8:
        gemm[DType.FP8] = Measured(fp8, f"{_MAMF}{note}")
    return gemm


_A100_LINK = Measured(228.3, f"{_VIDUR}: send_recv of 64 MB between two GPUs of a DGX A100 (NVSwitch)")
_SMALL_TRACE = f"bf16 GEMMs of 0.5-8 GFLOP in the {_TRACES}, log-linear fit read at 2^31 FLOPs"

_EVIDENCE: dict[str, Evidence] = {
    "H100_SXM": Evidence(_mamf(794.5, 1402.6), Measured(159.0, _SMALL_TRACE), Like("H100_PCIE"), Like("H200"),
                         _trace_launch(1.57), Like("A100_SXM_80GB"), _PCIE),
    "MI300X": Evidence(_mamf(668.4, note=", PYTORCH_TUNABLEOP_ENABLED=1"), Measured(120.6, _SMALL_TRACE),
                       Like("MI210"), Like("MI210"), _trace_launch(1.60), Like("A100_SXM_80GB"), _PCIE),
    "A100_SXM_80GB": Evidence(_mamf(271.2, note="; Vidur's best GEMM: 271.0"),
                              Measured(146.4, f"{_VIDUR}: 90th percentile of GEMMs of 1-4.3 GFLOP"),
                              _stream("a100_80.txt", 1759), _l2("a100_80.txt", 5437), Like("A100_SXM_40GB"),
                              _A100_LINK, _PCIE),
    "A40": Evidence({DType.BF16: Measured(127.6, f"{_VIDUR}: best GEMM of at least 0.5 TFLOP")},
                    Measured(81.3, f"{_VIDUR}: 90th percentile of GEMMs of 1-4.3 GFLOP"),
                    _stream("a40.txt", 663), Like("L40S"), _graph_launch("a40_graph.txt", 1.09),
                    Like("A100_SXM_80GB"), _PCIE),
}
_EVIDENCE |= {
    "A100_SXM_40GB": Evidence(Like("A100_SXM_80GB"), Like("A100_SXM_80GB"), _stream("a100_40.txt", 1375),
                              Like("A100_SXM_80GB"), _trace_launch(1.86), Like("A100_SXM_80GB"), _PCIE),
    "A100_PCIE_40GB": Evidence(_mamf(252.9, note=" (A100 PCIe)"), Like("A100_SXM_80GB"), Like("A100_SXM_40GB"),
                               Like("A100_SXM_80GB"), Like("A100_SXM_80GB"), Like("A100_SXM_80GB"), _PCIE),
    "A100_PCIE_80GB": Evidence(_mamf(252.9, note=" (A100 PCIe)"), Like("A100_SXM_80GB"), Like("A100_SXM_80GB"),
                               Like("A100_SXM_80GB"), Like("A100_SXM_80GB"), Like("A100_SXM_80GB"), _PCIE),
    "V100_SXM2_16GB": Evidence(Like("A100_SXM_80GB"), Like("A100_SXM_80GB"), _stream("v100.txt", 814),
                               Like("L40S"), Like("A100_SXM_80GB"), Like("A100_SXM_80GB"), _PCIE),
    "V100_SXM2_32GB": Evidence(Like("A100_SXM_80GB"), Like("A100_SXM_80GB"), _stream("v100.txt", 814),
                               Like("L40S"), Like("A100_SXM_80GB"), Like("A100_SXM_80GB"), _PCIE),
    "V100_PCIE_32GB": Evidence(Like("A100_SXM_80GB"), Like("A100_SXM_80GB"), _stream("v100.txt", 814),
                               Like("L40S"), Like("A100_SXM_80GB"), Like("A100_SXM_80GB"), _PCIE),
    "L40S": Evidence(Like("A40"), Like("A40"), _stream("l40.txt", 803, ": the L40, same AD102 and 864 GB/s GDDR6"),
                     _l2("l40.txt", 5332, ": the L40, same AD102"),
                     _graph_launch("l40_graph.txt", 0.94, ": the L40"), Like("A100_SXM_80GB"), _PCIE),
    "L4": Evidence(Like("A40"), Like("A40"), Like("L40S"), Like("L40S"), Like("L40S"), Like("A100_SXM_80GB"), _PCIE),
    "RTX_4090": Evidence(Like("A40"), Like("A40"), Like("L40S"), Like("L40S"), Like("L40S"), Like("A100_SXM_80GB"),
                         _PCIE),
    "RTX_2080_TI": Evidence(Like("A100_SXM_80GB"), Like("A100_SXM_80GB"), Like("A40"), Like("L40S"),
                            Like("A40"), Like("A100_SXM_80GB"), _PCIE),
    "GP100": Evidence(Like("A100_SXM_80GB"), Like("A100_SXM_80GB"), Like("V100_SXM2_32GB"), Like("L40S"),
                      _trace_launch(2.00), Like("A100_SXM_80GB"), _PCIE),
    "H100_PCIE": Evidence(Like("H100_SXM"), Like("H100_SXM"), _stream("h100_pcie.txt", 1832),
                          _l2("h100_pcie.txt", 7034), Like("H100_SXM"), Like("A100_SXM_80GB"), _PCIE),
    "H100_NVL": Evidence(Like("H100_SXM"), Like("H100_SXM"), Like("H100_PCIE"), Like("H100_PCIE"), Like("H100_SXM"),
                         Like("A100_SXM_80GB"), _PCIE),
    "H200": Evidence(_mamf(794.5, 1453.4, note=" (bf16: 'H200 is the same' as H100)"), Like("H100_SXM"),
                     _stream("h200.txt", 3534), _l2("h200.txt", 10252), _graph_launch("h200_graph.txt", 1.26),
                     Like("A100_SXM_80GB"), _PCIE),
    "B200": Evidence(_mamf(1745.0, 3432.5), Measured(306.3, _SMALL_TRACE), Like("H200"), Like("H200"),
                     _trace_launch(2.62), Like("A100_SXM_80GB"), _PCIE),
    "GB200": Evidence(_mamf(1822.0, 3615.6), Like("B200"), Like("H200"), Like("H200"), Like("B200"),
                      Like("A100_SXM_80GB"), _PCIE),
    "MI210": Evidence(Like("MI300X"), Like("MI300X"), _stream("mi210.txt", 1305),
                      Measured(5064, f"{_GPUB} gpu-l2-cache/mi210.txt (4 MB data set, half its L2)"),
                      _graph_launch("mi210_graph.txt", 2.05, " (hipGraph)"), Like("A100_SXM_80GB"), _PCIE),
    "MI250X": Evidence(Like("MI300X"), Like("MI300X"), Like("MI210"), Like("MI210"), Like("MI210"),
                       Like("A100_SXM_80GB"), _PCIE),
    "MI325X": Evidence(_mamf(784.9, note=", PYTORCH_TUNABLEOP_ENABLED=1, 1000 W"), Like("MI300X"), Like("MI300X"),
                       Like("MI300X"), Like("MI300X"), Like("A100_SXM_80GB"), _PCIE),
    "MI355X": Evidence(_mamf(1565.0, note=", PYTORCH_TUNABLEOP_ENABLED=0"), Like("MI300X"), Like("MI300X"),
                       Like("MI300X"), Like("MI300X"), Like("A100_SXM_80GB"), _PCIE),
}


def _sixteen_bit(rates: dict[DType, float]) -> float:
    """The bf16 rate, else the fp16 one (the dtype every catalog GPU has a GEMM figure for)."""
    return rates[DType.BF16] if DType.BF16 in rates else rates[DType.FP16]


def _reference(rates: dict[DType, float]) -> DType:
    """The dtype a share is taken from: bf16, else fp16, else the first measured one."""
    return next(d for d in (DType.BF16, DType.FP16, *DType) if d in rates)


def gemm_at_peak_share(peak: dict[DType, float], measured: dict[DType, float]) -> dict[DType, float]:
    """Large-GEMM FLOP/s for every dtype of ``peak``: the measured ones, the others at the measured
    16-bit (else first measured) rate's share of its peak.

    >>> gemm_at_peak_share({DType.BF16: 100.0, DType.FP8: 200.0}, {DType.BF16: 80.0})[DType.FP8]
    160.0
    """
    ref = _reference(measured)
    share = measured[ref] / peak[ref]
    return {d: measured.get(d, share * p) for d, p in peak.items()}


def small_at_ratio(gemm: dict[DType, float], small: dict[DType, float]) -> dict[DType, float]:
    """Small-GEMM FLOP/s for every dtype of ``gemm``: the given ones; the others take the extra
    time the given 16-bit (else first) small GEMM spends beyond its large rate (ramp-up, tail
    wave: a time, not a share of the rate, so a slower dtype loses less of its rate to it):
    ``F / (F / large_d + F / small_ref − F / large_ref)`` with ``F`` = ``SMALL_GEMM_FLOPS``.

    >>> round(small_at_ratio({DType.BF16: 100.0, DType.FP8: 200.0, DType.FP32: 10.0},
    ...                      {DType.BF16: 25.0})[DType.FP8], 1)
    28.6
    >>> round(small_at_ratio({DType.BF16: 100.0, DType.FP32: 10.0}, {DType.BF16: 25.0})[DType.FP32], 2)
    7.69
    """
    ref = _reference(small)
    extra_s = SMALL_GEMM_FLOPS / small[ref] - SMALL_GEMM_FLOPS / gemm[ref]
    return {d: small.get(d, SMALL_GEMM_FLOPS / (SMALL_GEMM_FLOPS / g + extra_s)) for d, g in gemm.items()}


class _Bandwidth(Enum):
    """The bandwidth-like figures: how each is read from evidence, datasheet and Achievable."""

    STREAM = "stream_bw_bytes_per_s"
    L2 = "l2_bw_bytes_per_s"
    LINK = "link_bw_bytes_per_s"
    PCIE = "pcie_bw_bytes_per_s"

    def evidence(self, ev: Evidence) -> Figure:
        return {_Bandwidth.STREAM: ev.stream, _Bandwidth.L2: ev.l2, _Bandwidth.LINK: ev.link,
                _Bandwidth.PCIE: ev.pcie}[self]

    def datasheet(self, d: Device) -> float:
        """The datasheet figure the achieved one is a share of (L2: SMs x clock, no datasheet rate)."""
        return {_Bandwidth.STREAM: d.mem_bw_bytes_per_s, _Bandwidth.L2: d.sm_count * d.clock_hz,
                _Bandwidth.LINK: d.link_bw_bytes_per_s, _Bandwidth.PCIE: d.pcie_bw_bytes_per_s}[self]


@cache
def _gemm(name: str) -> tuple[dict[DType, float], str]:
    """Large-GEMM FLOP/s per dtype: measured ones, the rest at the 16-bit share of their peak; a
    ``Like`` device takes its sibling's 16-bit share."""
    device, figure = _DATASHEET[name], _EVIDENCE[name].gemm
    if isinstance(figure, Like):
        sib = _DATASHEET[figure.sibling]
        share = _sixteen_bit(_gemm(sib.name)[0]) / _sixteen_bit(sib.peak)
        return ({d: share * peak for d, peak in device.peak.items()},
                f"derived: {sib.name}'s 16-bit GEMM share of peak ({share:.2f}) x this device's peaks")
    measured = {d: m.value * T for d, m in figure.items()}
    ref = _reference(measured)
    share = measured[ref] / device.peak[ref]
    by_source: dict[str, list[str]] = {}
    for d, m in figure.items():
        by_source.setdefault(m.source, []).append(d.value)
    source = "; ".join(f"{', '.join(dtypes)}: {src}" for src, dtypes in by_source.items())
    return (gemm_at_peak_share(device.peak, measured),
            f"{source}; other dtypes derived: the 16-bit share of peak ({share:.2f}) x their peak")


@cache
def _small_ratio(name: str) -> tuple[float, str]:
    """The 2^31-FLOP GEMM rate over the large one (the same for every dtype). Derived from a
    sibling: its ratio x sqrt(its large rate / ours), at most 1 -- a wider GPU fills less of itself
    with the same FLOPs; the square root splits "same ratio" and "same time" evenly."""
    figure = _EVIDENCE[name].small
    if isinstance(figure, Like):
        ratio, _ = _small_ratio(figure.sibling)
        width = _sixteen_bit(_gemm(figure.sibling)[0]) / _sixteen_bit(_gemm(name)[0])
        scaled = min(1.0, ratio * math.sqrt(width))
        return scaled, (f"derived: {figure.sibling}'s small/large GEMM ratio ({ratio:.2f}) x sqrt of its large "
                        f"rate over ours ({width:.2f}) = {scaled:.2f} x the large figures")
    return (figure.value * T / _sixteen_bit(_gemm(name)[0]),
            f"16-bit: {figure.source}; other dtypes: their large figure slowed by the same extra time")


@cache
def _bandwidth(kind: _Bandwidth, name: str) -> tuple[float, str]:
    """Bytes/s: measured, a share of this device's datasheet figure, or the sibling's share of its
    own datasheet figure (L2: per SM x clock) times this device's."""
    device, figure = _DATASHEET[name], kind.evidence(_EVIDENCE[name])
    if isinstance(figure, Measured):
        return figure.value * G, figure.source
    if isinstance(figure, Share):
        return figure.share * kind.datasheet(device), figure.source
    sib = _DATASHEET[figure.sibling]
    share = _bandwidth(kind, sib.name)[0] / kind.datasheet(sib) if kind.datasheet(sib) else 0.0
    if kind is _Bandwidth.L2:
        return (share * kind.datasheet(device), f"derived: {sib.name}'s L2 bandwidth per SM per GHz "
                                                f"({share * 1e9 / G:.3g} GB/s) x this device's SMs x GHz")
    return (share * kind.datasheet(device),
            f"derived: {sib.name}'s share of its datasheet figure ({share:.3g}) x this device's")


@cache
def _launch(name: str) -> tuple[float, str]:
    figure = _EVIDENCE[name].launch
    if isinstance(figure, Like):
        return _launch(figure.sibling)[0], f"derived: {figure.sibling}'s"
    return figure.value * 1e3, figure.source


def _achievable(name: str) -> Achievable:
    """``name``'s Achievable from its evidence, each figure with its source."""
    gemm, ratio = _gemm(name), _small_ratio(name)
    bw = {kind: _bandwidth(kind, name) for kind in _Bandwidth}
    launch = _launch(name)
    sources = {"gemm_flops": gemm[1], "small_gemm_flops": ratio[1], "launch_ns": launch[1],
               **{kind.value: bw[kind][1] for kind in _Bandwidth}}
    ref = _reference(gemm[0])
    return Achievable(gemm[0], small_at_ratio(gemm[0], {ref: ratio[0] * gemm[0][ref]}), bw[_Bandwidth.STREAM][0],
                      bw[_Bandwidth.L2][0], launch[0], bw[_Bandwidth.LINK][0], bw[_Bandwidth.PCIE][0], sources)


_DATASHEET: dict[str, Device] = {d.name: d for d in _ROWS}
_CATALOG: dict[str, Device] = {name: replace(d, achievable=_achievable(name)) for name, d in _DATASHEET.items()}

# Devices from spec files, registered for the code running inside ``registered()`` (a context
# variable: a registration ends with its block and never leaks into another test or thread).
_REGISTERED: ContextVar[tuple[Device, ...]] = ContextVar("whatif_registered_devices", default=())


@contextmanager
def registered(*devices: Device) -> Iterator[None]:
    """Make ``devices`` known to :func:`get_device`, :func:`find_device` (by their ``trace_names``)
    and :data:`DEVICES` inside the block; a registered name shadows the catalog entry of that name.

    >>> mine = replace(get_device("L4"), name="MY_L4", trace_names=("rtx 4000 ada",))
    >>> with registered(mine):
    ...     get_device("my_l4").name, find_device("NVIDIA RTX 4000 Ada Generation").name
    ('MY_L4', 'MY_L4')
    >>> "MY_L4" in DEVICES
    False
    """
    token = _REGISTERED.set((*_REGISTERED.get(), *devices))
    try:
        yield
    finally:
        _REGISTERED.reset(token)


class _Devices(Mapping[str, Device]):
    """The catalog and, inside ``registered()``, the registered devices (they come last and win)."""

    def _merged(self) -> dict[str, Device]:
        return _CATALOG | {d.name.upper(): d for d in _REGISTERED.get()}

    def __getitem__(self, name: str) -> Device:
        return self._merged()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._merged())

    def __len__(self) -> int:
        return len(self._merged())


DEVICES: Mapping[str, Device] = _Devices()
"""Every known GPU by catalog name: the catalog plus the devices registered by ``registered()``."""

def get_device(name: str) -> Device:
    """Catalog entry (or registered device) by its name, case-insensitive, or by a name as traces
    write it.

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


# (pattern on the lower-cased trace name, catalog entry); first match wins. A model number is
# a whole token: ``_M("a100")`` is not preceded by a letter or digit nor followed by a digit, so an
# RTX A1000 or a typed "H1000" is not an A100 / H100.
def _M(model: str) -> str:
    return rf"(?<![a-z0-9])(?:{model})(?!\d)"


_NAME_RULES: list[tuple[str, str]] = [
    (_M("a100") + r".*pg509-2[1-9]0", "A100_SXM_80GB"),   # Meta OAM boards: -200 is 40 GB
    (_M("a100") + r".*pg509", "A100_SXM_40GB"),
    (_M("a100") + r".*(pcie.*80|80.*pcie)", "A100_PCIE_80GB"),
    (_M("a100") + r".*pcie", "A100_PCIE_40GB"),
    (_M("a100") + r".*80", "A100_SXM_80GB"),
    (_M("a100"), "A100_SXM_40GB"),
    (_M("h100") + r".*pcie", "H100_PCIE"),
    (_M("h100") + r" ?nvl", "H100_NVL"),
    (_M("h100|h800"), "H100_SXM"),
    (_M("h200"), "H200"),
    (_M("gb200"), "GB200"),
    (_M("b200"), "B200"),
    (_M("l40s"), "L40S"),
    (_M("l4") + r"(?![0-9a-z])", "L4"),
    (_M("a40") + r"(?![0-9a-z])", "A40"),
    (_M("4090"), "RTX_4090"),
    (_M("2080") + r" ?ti", "RTX_2080_TI"),
    (_M("gp100"), "GP100"),
    (_M("v100") + r".*pcie", "V100_PCIE_32GB"),
    (_M("v100") + r".*16gb", "V100_SXM2_16GB"),
    (_M("v100"), "V100_SXM2_32GB"),
    (_M("mi300x"), "MI300X"),
    (_M("mi325x"), "MI325X"),
    (_M("mi355x"), "MI355X"),
    (_M("mi250"), "MI250X"),
    (_M("mi210"), "MI210"),
]


def sixteen_bit(device: Device) -> DType:
    """The 16-bit dtype a device computes natively: bf16 when it has bf16 tensor cores, else fp16.

    >>> sixteen_bit(get_device("A100_80GB")).value, sixteen_bit(get_device("V100_SXM2_32GB")).value
    ('bf16', 'fp16')
    """
    return DType.BF16 if device.peak.get(DType.BF16) else DType.FP16


PROPERTIES_MEMORY_TOLERANCE = 0.05
"""How far a trace's ``totalGlobalMem`` may sit from a catalog GPU's memory (the driver reports a
little less than the card's, e.g. an H100 80GB's 79.6 GiB) for :func:`device_of_properties`."""


def device_of_properties(props: Mapping[str, object]) -> Device | None:
    """The catalog GPU an unnamed ``deviceProperties`` entry of a trace describes (ROCm traces
    can leave ``name`` empty): the one built-in device of its vendor (``warpSize`` 64: AMD, 32:
    NVIDIA) with its SM (compute unit) count and, within :data:`PROPERTIES_MEMORY_TOLERANCE`, its
    memory; None when no device or several match (an A100 SXM and PCIe look alike).

    >>> device_of_properties({"name": "", "warpSize": 64, "numSms": 304, "totalGlobalMem": 206141652992}).name
    'MI300X'
    >>> device_of_properties({"warpSize": 32, "numSms": 108, "totalGlobalMem": 85899345920}) is None
    True
    """
    try:
        warp, sms, mem = (int(props[k]) for k in ("warpSize", "numSms", "totalGlobalMem"))   # type: ignore[call-overload]
    except (KeyError, TypeError, ValueError):
        return None
    vendor = {64: Vendor.AMD, 32: Vendor.NVIDIA}.get(warp)
    found = [d for d in _CATALOG.values() if d.vendor is vendor and d.sm_count == sms
             and abs(mem / d.mem_bytes - 1) <= PROPERTIES_MEMORY_TOLERANCE]
    return found[0] if len(found) == 1 else None


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
    for device in reversed(_REGISTERED.get()):
        if device.name.lower() == low or any(n in low for n in device.trace_names):
            return device
    for pattern, dev in _NAME_RULES:
        if re.search(pattern, low):
            return DEVICES[dev]
    return None
