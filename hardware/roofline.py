"""Roofline kernel times and a roofline calibrated on a trace's own measured kernels.

Plain roofline (Williams, Waterman, Patterson, CACM 2009): ``t = max(flops / peak, bytes / bw)``.
Matrix-engine classes (GEMM, convolution, attention) use the dtype's tensor-core peak; the other
classes run on the vector units and use the fp32 (CUDA-core) peak.

The calibrated roofline learns, per kernel class, how far measured kernels sit above their ideal
roofline time as a function of that ideal time (small kernels reach a lower fraction of peak than
large ones: launch latency, tail waves). A new or changed kernel is then priced like its measured
peers of the same class and size on the same GPU.

>>> from whatif.core.dtypes import DType
>>> from whatif.hardware.devices import get_device
>>> a100 = get_device("A100_SXM_80GB")
>>> roofline_time_ns(312e12, 0, a100, DType.BF16)      # 312 TFLOP at 312 TFLOP/s
1000000000.0
>>> roofline_time_ns(0, 2039e6, a100, DType.BF16)      # 2.039 GB at 2039 GB/s
1000000.0
>>> cal = CalibratedRoofline.fit(a100, ["gemm"] * 3, [1e12, 2e12, 4e12], [1e6] * 3,
...                              [4e6, 8e6, 16e6], DType.BF16)
>>> round(cal.kernel_time_ns("gemm", 3e12, 1e6) / 1e6, 2)   # ms, like its peers: 3.2 ms x 1.25
12.0
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from whatif.core.dtypes import DType
from whatif.core.kernels import KernelClass

from .devices import Device

MIN_PEERS = 3
DEFAULT_FIXED_NS = 2_000.0   # a kernel's fixed time where the device has no launch figure (Habitat's small-kernel rule)


def compute_peak(device: Device, dtype: DType | str, kernel_class: KernelClass | str | None = None
                 ) -> float:
    """FLOP/s a kernel of this class can reach: tensor-core peak for matrix classes, else fp32."""
    cls = KernelClass(kernel_class) if kernel_class is not None else KernelClass.GEMM
    if cls.compute_bound:
        return device.peak_flops(dtype)
    return device.peak_flops(DType.FP32)


def fixed_latency_ns(device: Device | None) -> float:
    """The part of a kernel's time that no change of its work removes (launch, ramp-up, drain):
    the device's achievable launch figure (an empty kernel's time), else ``DEFAULT_FIXED_NS``.

    >>> fixed_latency_ns(None)
    2000.0
    """
    if device is not None and device.achievable is not None and device.achievable.launch_ns > 0:
        return device.achievable.launch_ns
    return DEFAULT_FIXED_NS


def roofline_time_ns(flops: float, nbytes: float, device: Device, dtype: DType | str = DType.BF16,
                     kernel_class: KernelClass | str | None = None) -> float:
    """Ideal time in ns: ``max(flops / peak, bytes / mem_bw)``."""
    peak = compute_peak(device, dtype, kernel_class)
    return max(flops / peak, nbytes / device.mem_bw_bytes_per_s) * 1e9


def achievable_time_ns(flops: float, nbytes: float, device: Device, dtype: DType | str = DType.BF16,
                       kernel_class: KernelClass | str | None = None, size_flops: float | None = None,
                       compute_scale: float = 1.0) -> float:
    """Time in ns at what the device achieves rather than its datasheet:
    ``max(s·flops / P_a, bytes / BW_a)``. ``P_a`` is the achievable rate of a GEMM of that size for
    matrix classes (:meth:`~whatif.hardware.devices.Device.achievable_matrix_flops`; read at
    ``size_flops`` when given: a shard of a measured kernel keeps the rate of the kernel's size), the
    fp32 peak for vector classes (which are memory-bound); ``BW_a`` the streaming bandwidth; ``s``
    (``compute_scale``) stretches the compute term, e.g. by :func:`wave_tail_ratio`. A device
    without achievable figures gives its datasheet roofline.

    >>> from whatif.hardware.devices import get_device
    >>> a100 = get_device("A100_SXM_80GB")
    >>> achievable_time_ns(1e9, 1e6, a100, "bf16", "gemm") >= roofline_time_ns(1e9, 1e6, a100, "bf16", "gemm")
    True
    """
    rate = achievable_rate(device, dtype, kernel_class, flops if size_flops is None else size_flops)
    return max(compute_scale * flops / rate, nbytes / device.stream_bw_bytes_per_s) * 1e9


def achievable_times_ns(device: Device, classes: np.ndarray, dtypes: np.ndarray, flops: np.ndarray,
                        nbytes: np.ndarray, size_flops: np.ndarray | None = None,
                        compute_scale: np.ndarray | None = None) -> np.ndarray:
    """:func:`achievable_time_ns` of each kernel (class and dtype values, work, the GEMM size its
    rate is read at, its compute stretch) on ``device``: the one law the GPU move
    (:func:`~whatif.hardware.retarget.retarget_ns`) and ``precision`` read.

    >>> from whatif.hardware.devices import get_device
    >>> h100 = get_device("H100_SXM")
    >>> t = achievable_times_ns(h100, np.array(["gemm", "elementwise"]), np.array(["bf16", "bf16"]),
    ...                         np.array([1e12, 0.0]), np.array([1e6, 3e9]))
    >>> bool(t[0] == achievable_time_ns(1e12, 1e6, h100, "bf16", "gemm")), bool(t[1] > 0)
    (True, True)
    """
    size = flops if size_flops is None else size_flops
    scale = np.ones(len(flops)) if compute_scale is None else compute_scale
    keys = pd.DataFrame({"c": classes, "t": dtypes}).astype(str)
    out = np.full(len(classes), np.nan)
    for (c, t), idx in keys.groupby(["c", "t"]).indices.items():
        out[idx] = [achievable_time_ns(f, b, device, t, c, size_flops=s, compute_scale=k)
                    for f, b, s, k in zip(flops[idx], nbytes[idx], size[idx], scale[idx])]
    return out


def expected_waves(waves: np.ndarray | float) -> np.ndarray:
    """Waves a GEMM of ``waves`` = thread blocks / SMs takes, in expectation: ``w + 1/2``. Blocks
    run in ``⌈w⌉`` waves (NVIDIA, *Matrix Multiplication Background User's Guide*, "Wave
    quantization"); over the tile shapes and split-K factors a GEMM library picks, the last wave is
    on average half empty — also for a GEMM of less than one wave, which split-K spreads over more
    blocks (no floor of one whole wave). Measured in ``bench/wave_split.py``.

    >>> expected_waves(np.array([0.2, 1.0, 8.0])).tolist()
    [0.7, 1.5, 8.5]
    """
    return np.asarray(waves, dtype=float) + 0.5


GEMM_ROW_TILE = 64   # rows (tokens) of the smallest output tile GEMM libraries pick for a skinny GEMM
LARGE_GEMM_FLOPS = 1e16   # a GEMM this large runs at the device's large-GEMM achievable rate


def large_gemm_rate(device: Device, dtype: DType | str) -> float:
    """FLOP/s of the largest GEMMs in ``dtype`` (achievable, else the datasheet's): the rate a
    weight GEMM's tiles compute at in :func:`weight_gemm_ns`.

    >>> from whatif.hardware.devices import get_device
    >>> round(large_gemm_rate(get_device("A100_SXM_80GB"), "bf16") / 1e12, 1)
    271.2
    """
    return device.achievable_matrix_flops(dtype, LARGE_GEMM_FLOPS)


def gemm_rows_in_tiles(rows: np.ndarray | float) -> np.ndarray:
    """Rows a GEMM computes for ``rows`` rows of activations: whole tiles of ``GEMM_ROW_TILE``
    (tile quantization, NVIDIA's *Matrix Multiplication Background User's Guide*: a partly
    filled tile costs a full one). A weight GEMM of 1-64 tokens does the work of 64, one of 65 that
    of 128; checked against Vidur's A100/A40 layer GEMMs in ``bench/serving_op_laws.py``.

    >>> gemm_rows_in_tiles(np.array([1, 64, 65, 200])).tolist()
    [64.0, 64.0, 128.0, 256.0]
    """
    r = np.maximum(np.asarray(rows, dtype=float), 1.0)
    return np.ceil(r / GEMM_ROW_TILE) * GEMM_ROW_TILE


def overlapped_roofline_ns(compute_ns: np.ndarray | float, memory_ns: np.ndarray | float) -> np.ndarray:
    """A kernel's time when its compute and its memory traffic overlap imperfectly:
    ``√(c² + m²)``, the roofline's ``max(c, m)`` near either roof and up to √2 × it at the ridge,
    where neither unit is kept busy while the other waits (a skinny GEMM's tiles load their weights,
    then compute). Used for weight GEMMs by tokens (:mod:`whatif.predictors.serving.iteration_costs`);
    it is what lets a decode GEMM at 1-64 tokens sit 5-10 % above its weights' streaming time, as
    Vidur's A100 GEMMs do (``bench/serving_op_laws.py``).

    >>> overlapped_roofline_ns(np.array([0.0, 3.0, 1.0]), np.array([5.0, 4.0, 1.0])).round(3).tolist()
    [5.0, 5.0, 1.414]
    """
    return np.hypot(np.asarray(compute_ns, dtype=float), np.asarray(memory_ns, dtype=float))


def weight_gemm_ns(params: np.ndarray | float, rows: float, elem_bytes: float, rate_flops_per_ns: float,
                   bw_bytes_per_ns: float) -> np.ndarray:
    """Time of a GEMM of ``params`` weights over ``rows`` rows of activations (tokens): its padded
    rows' FLOPs at ``rate_flops_per_ns`` (the largest GEMMs' achievable rate: a small GEMM's lower
    measured rate is its weight reads and its padded tile, both counted here) overlapped with its
    weights' reads at ``bw_bytes_per_ns``:
    ``√((2·P·⌈x⌉₆₄ / F)² + (s·P / BW)²)`` (:func:`gemm_rows_in_tiles`, :func:`overlapped_roofline_ns`).

    >>> [round(float(weight_gemm_ns(1e6, x, 2.0, 271.2e3, 1759.0))) for x in (1, 64, 65, 256)]   # A100, ns
    [1231, 1231, 1478, 2204]
    """
    p = np.asarray(params, dtype=float)
    compute = 2.0 * p * gemm_rows_in_tiles(rows) / rate_flops_per_ns
    return overlapped_roofline_ns(compute, elem_bytes * p / bw_bytes_per_ns)


def wave_tail_ratio(waves: np.ndarray | float, new_waves: np.ndarray | float) -> np.ndarray:
    """Factor on the time per FLOP of a GEMM whose blocks go from ``waves`` to ``new_waves`` (its
    rows split or grown): ``(E(w')/w') / (E(w)/w)``, :func:`expected_waves`. Each half of a GEMM
    of a quarter wave takes 5/6 of the whole's time (the factor is 5/3), each half of one of 40
    waves half of it. NaN or non-positive waves give 1 (no wave model).

    >>> wave_tail_ratio(np.array([0.25, 2.0, 40.0, np.nan]), np.array([0.125, 1.0, 20.0, 1.0])).round(3).tolist()
    [1.667, 1.2, 1.012, 1.0]
    """
    w, w2 = np.asarray(waves, dtype=float), np.asarray(new_waves, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        r = (expected_waves(w2) / w2) / (expected_waves(w) / w)
    return np.where(np.isfinite(r) & (w > 0) & (w2 > 0), r, 1.0)


def achievable_rate(device: Device, dtype: DType | str, kernel_class: KernelClass | str | None,
                    flops: float) -> float:
    """FLOP/s of the achievable roofline for a kernel of ``flops`` FLOPs: the achievable GEMM rate
    at that size for matrix classes, the fp32 (vector-unit) peak otherwise."""
    cls = KernelClass(kernel_class) if kernel_class is not None else KernelClass.GEMM
    return device.achievable_matrix_flops(dtype, flops) if cls.compute_bound else device.peak_flops(DType.FP32)


def arithmetic_intensity(flops: float, nbytes: float) -> float:
    """FLOP per byte (inf when no bytes move)."""
    return flops / nbytes if nbytes > 0 else float("inf")


@dataclass(frozen=True)
class ClassEfficiency:
    """measured/ideal ratio of one kernel class as a piecewise-linear curve in log-log space.

    ``knots`` are log10 ideal ns, ``log_ratio`` log10(measured / ideal) at those knots; beyond the
    measured range the end ratios hold. ``floor_ns`` is the shortest kernel measured on the device
    (no kernel is priced below it: launch and ramp-up latency).
    """

    knots: tuple[float, ...]
    log_ratio: tuple[float, ...]
    floor_ns: float
    samples: int
    axis: str = "ideal"

    def time_ns(self, ideal_ns: float, intensity: float | None = None) -> float:
        """Predicted ns from the ideal time (and arithmetic intensity on the intensity axis)."""
        if ideal_ns <= 0:
            return self.floor_ns
        x = ideal_ns if self.axis == "ideal" else intensity
        if x is None or not np.isfinite(x) or x <= 0:
            x = ideal_ns if self.axis == "ideal" else 10.0 ** self.knots[-1]
        r = float(np.interp(np.log10(x), self.knots, self.log_ratio))
        return max(ideal_ns * 10.0 ** r, self.floor_ns)

    @property
    def peak_fraction(self) -> float:
        """Achieved fraction of the roofline reached by the class's largest kernels."""
        return float(10.0 ** -self.log_ratio[-1])


def fit_efficiency(ideal_ns: np.ndarray, dur_ns: np.ndarray, bins: int = 12,
                   floor_ns: float | None = None,
                   intensity: np.ndarray | None = None) -> ClassEfficiency:
    """Fit a :class:`ClassEfficiency` from ideal and measured times of one class's kernels;
    ``floor_ns`` defaults to the shortest of them. With ``intensity`` (FLOP/byte per kernel) the
    curve runs along arithmetic intensity instead of ideal time."""
    ok = (ideal_ns > 0) & (dur_ns > 0)
    if intensity is not None:
        ok &= np.isfinite(intensity) & (intensity > 0)
    x = np.log10(ideal_ns[ok] if intensity is None else intensity[ok])
    y = np.log10(dur_ns[ok] / ideal_ns[ok])
    if len(x) == 0:
        raise ValueError("no kernels with positive ideal and measured time")
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    nbins = int(max(1, min(bins, len(x) // MIN_PEERS)))
    groups = np.array_split(np.arange(len(x)), nbins)
    knots = [float(np.median(x[g])) for g in groups]
    vals = [float(np.median(y[g])) for g in groups]
    # merge knots that coincide (many kernels of identical size)
    kx, ky = [knots[0]], [vals[0]]
    for a, b in zip(knots[1:], vals[1:]):
        if a - kx[-1] < 1e-9:
            ky[-1] = (ky[-1] + b) / 2
        else:
            kx.append(a)
            ky.append(b)
    floor = float(np.min(dur_ns[ok])) if floor_ns is None else float(floor_ns)
    return ClassEfficiency(tuple(kx), tuple(ky), floor, int(len(x)),
                           "ideal" if intensity is None else "intensity")


def memory_bound(flops: float, nbytes: float, device: Device, dtype: DType | str,
                 kernel_class: KernelClass | str | None = None) -> bool:
    """True when the kernel's byte time exceeds its FLOP time (left of the ridge point)."""
    peak = compute_peak(device, dtype, kernel_class)
    return nbytes / device.mem_bw_bytes_per_s >= flops / peak


@dataclass(frozen=True)
class CalibratedRoofline:
    """Per-class efficiency curves of one device and dtype, fitted on measured kernels.

    Each class has one curve per roofline regime (memory-bound, compute-bound) when both have
    enough peers (a weight-streaming GEMV and a large GEMM of equal ideal time are not peers),
    one curve for the whole class, and one over all kernels as the last fallback. Compute-bound
    matrix kernels are placed on their curve by arithmetic intensity (a tall-skinny GEMM is less
    efficient than a square one of equal FLOPs), everything else by ideal time.
    """

    device: Device
    dtype: DType
    classes: dict[KernelClass, ClassEfficiency] = field(default_factory=dict)
    overall: ClassEfficiency | None = None
    regimes: dict[tuple[KernelClass, bool], ClassEfficiency] = field(default_factory=dict)

    @classmethod
    def fit(cls, device: Device, kernel_classes: Sequence[KernelClass | str],
            flops: Sequence[float], nbytes: Sequence[float], dur_ns: Sequence[float],
            dtype: DType | str = DType.BF16, bins: int = 12) -> CalibratedRoofline:
        """Fit from arrays of class, FLOPs, bytes and measured duration (ns) on ``device``."""
        kcls = np.array([KernelClass(c).value for c in kernel_classes])
        f = np.asarray(flops, dtype=float)
        b = np.asarray(nbytes, dtype=float)
        d = np.asarray(dur_ns, dtype=float)
        if not (len(kcls) == len(f) == len(b) == len(d)):
            raise ValueError("class, flops, bytes and dur_ns must have the same length")
        ideal = np.array([roofline_time_ns(fi, bi, device, dtype, c)
                          for fi, bi, c in zip(f, b, kcls)])
        mem = np.array([memory_bound(fi, bi, device, dtype, c) for fi, bi, c in zip(f, b, kcls)],
                       dtype=bool)
        intensity = np.divide(f, b, out=np.full_like(f, np.inf), where=b > 0)
        good = (ideal > 0) & (d > 0)
        floor = float(d[good].min()) if good.any() else 0.0
        curves, regimes = {}, {}
        for c in sorted(set(kcls)):
            m = (kcls == c) & good
            if m.any():
                curves[KernelClass(c)] = fit_efficiency(ideal[m], d[m], bins, floor)
            for regime in (True, False):
                mr = m & (mem == regime)
                if mr.sum() >= MIN_PEERS:
                    inten = intensity[mr] if (KernelClass(c).compute_bound and not regime) else None
                    regimes[(KernelClass(c), regime)] = fit_efficiency(ideal[mr], d[mr], bins,
                                                                       floor, inten)
        overall = fit_efficiency(ideal[good], d[good], bins) if good.any() else None
        return cls(device, DType(dtype), curves, overall, regimes)

    def kernel_time_ns(self, kernel_class: KernelClass | str, flops: float, nbytes: float) -> float:
        """Predicted ns of a kernel of ``kernel_class`` doing ``flops`` and moving ``nbytes``."""
        cls = KernelClass(kernel_class)
        ideal = roofline_time_ns(flops, nbytes, self.device, self.dtype, cls)
        regime = memory_bound(flops, nbytes, self.device, self.dtype, cls)
        curve = self.regimes.get((cls, regime)) or self.classes.get(cls)
        if curve is None or curve.samples < MIN_PEERS:
            curve = self.overall if curve is None else curve
        if curve is None:
            return ideal
        return curve.time_ns(ideal, arithmetic_intensity(flops, nbytes))

    def efficiency(self, kernel_class: KernelClass | str, flops: float, nbytes: float) -> float:
        """Fraction of the roofline the kernel is predicted to reach (0..1]."""
        ideal = roofline_time_ns(flops, nbytes, self.device, self.dtype, kernel_class)
        return ideal / self.kernel_time_ns(kernel_class, flops, nbytes)


def kernel_time_ns(flops: float, nbytes: float, device: Device, dtype: DType | str = DType.BF16,
                   kernel_class: KernelClass | str | None = None,
                   calibration: CalibratedRoofline | None = None) -> float:
    """Price one kernel on ``device``: calibrated when a calibration is given, else ideal roofline.

    >>> from whatif.hardware.devices import get_device
    >>> kernel_time_ns(2e9, 4e6, get_device("H100_SXM"), "bf16", "gemm") > 0
    True
    """
    if calibration is not None:
        if calibration.device.name != device.name:
            raise ValueError(f"calibration is for {calibration.device.name}, "
                             f"not {device.name}")
        return calibration.kernel_time_ns(kernel_class or KernelClass.OTHER, flops, nbytes)
    return roofline_time_ns(flops, nbytes, device, dtype, kernel_class)
