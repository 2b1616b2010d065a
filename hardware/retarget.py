"""Move measured kernel times to another GPU, keeping each kernel's efficiency.

A kernel measured at ``T`` on the source GPU reached some fraction of what that GPU achieves at its
work (its FLOPs, bytes, dtype and class). On the destination it is taken to reach the same fraction
of what the destination achieves at the same work:

    T' = F·L_d/L_s + (T − F)·A_d/A_s · exp(r(x)),      F = min(T, L_s)

``A`` is the achievable roofline time (:func:`whatif.hardware.roofline.achievable_time_ns`: the
device's achievable GEMM rate at that GEMM's size, its streaming bandwidth; the datasheet where a
device has no achievable figures), ``L`` the device's launch-to-end time of an empty kernel
(:func:`~whatif.hardware.roofline.fixed_latency_ns`). ``r`` is 0 unless the pair of GPUs has
a :class:`RetargetFit`: per op family, a curve of the log residual ``log(T_d/T_s) − log(A_d/A_s)``
over ``x = log10 A_s`` fitted on kernels measured on both GPUs (two traces of the same program, or
a measurement table such as Vidur's). The curve captures what a roofline ratio cannot: one vendor's
library reaching a larger share at small sizes, a wave-quantization step, a different norm kernel.

>>> from whatif.hardware.devices import get_device
>>> a100, h100 = get_device("A100_SXM_80GB"), get_device("H100_SXM")
>>> t = retarget_ns([100_000.0], ["elementwise"], ["bf16"], [2.5e7], [1e8], a100, a100)
>>> float(t[0])                                   # same GPU: same time
100000.0
>>> bool(retarget_ns([100_000.0], ["gemm"], ["bf16"], [1e11], [1e8], a100, h100)[0] < 100_000)
True
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from whatif.core.kernels import KernelClass

from .devices import Device
from .roofline import achievable_times_ns, fixed_latency_ns

MIN_FAMILY_SAMPLES = 8     # a family curve needs this many paired kernels, else its class's curve
POINTS_PER_KNOT = 40
FADE_DECADES = 0.25        # above the largest fitted kernel, the residual fades out over this (log10 ns)


@dataclass(frozen=True)
class Curve:
    """A piecewise-linear function of ``x`` through (``knots``, ``values``): constant outside the
    knots up to ``x_max`` (the largest fitted point), then fading linearly to 0 over
    ``FADE_DECADES`` (a kernel larger than any fitted one is priced by the roofline ratio alone:
    what makes small kernels differ, launch and tail effects, shrinks with size). ``samples``: the
    paired kernels it was fitted on.

    >>> Curve((0.0, 1.0), (0.2, 0.4), 80, 1.0).at(np.array([-1.0, 0.5, 1.125, 3.0])).round(3).tolist()
    [0.2, 0.3, 0.2, 0.0]
    """

    knots: tuple[float, ...]
    values: tuple[float, ...]
    samples: int
    x_max: float

    def at(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        fade = np.clip(1.0 - (x - self.x_max) / FADE_DECADES, 0.0, 1.0)
        return np.interp(x, self.knots, self.values) * fade


def fit_curve(x: np.ndarray, y: np.ndarray, points_per_knot: int = POINTS_PER_KNOT) -> Curve:
    """Median ``y`` of consecutive groups of ``points_per_knot`` points sorted by ``x``, at the
    median ``x`` of each group (knots that coincide are merged).

    >>> c = fit_curve(np.arange(80.0), np.r_[np.zeros(40), np.ones(40)])
    >>> c.knots, c.values
    ((19.5, 59.5), (0.0, 1.0))
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if not len(x):
        raise ValueError("no finite points to fit")
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    knots: list[float] = []
    values: list[float] = []
    for chunk in np.array_split(np.arange(len(x)), max(1, len(x) // points_per_knot)):
        kx, ky = float(np.median(x[chunk])), float(np.median(y[chunk]))
        if knots and kx - knots[-1] < 1e-9:
            values[-1] = (values[-1] + ky) / 2
        else:
            knots.append(kx)
            values.append(ky)
    return Curve(tuple(knots), tuple(values), int(len(x)), float(x[-1]))


@dataclass(frozen=True)
class PairedKernels:
    """Kernels (or ops) measured on two GPUs: one row each, ``family`` (an op name such as
    ``aten::mm`` or a table's operator), ``kernel_class``, ``dtype``, ``flops``, ``bytes`` and the
    two measured times ``src_ns``, ``dst_ns`` (per call)."""

    frame: pd.DataFrame

    COLUMNS = ("family", "kernel_class", "dtype", "flops", "bytes", "src_ns", "dst_ns")

    def __post_init__(self) -> None:
        missing = [c for c in self.COLUMNS if c not in self.frame]
        if missing:
            raise ValueError(f"paired kernels lack column(s) {', '.join(missing)}")

    def __len__(self) -> int:
        return len(self.frame)

    def concat(self, other: PairedKernels) -> PairedKernels:
        return PairedKernels(pd.concat([self.frame, other.frame], ignore_index=True))


@dataclass(frozen=True)
class RetargetFit:
    """Residual curves of one (source, destination) pair of GPUs, per op family and per kernel
    class (the fallback for families with fewer than ``MIN_FAMILY_SAMPLES`` pairs)."""

    src: str
    dst: str
    families: dict[str, Curve] = field(default_factory=dict)
    classes: dict[str, Curve] = field(default_factory=dict)

    def residual(self, families: np.ndarray, classes: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Per kernel: the fitted log residual at ``x`` (0 where neither its family nor its class
        was fitted)."""
        out = np.zeros(len(x))
        fam = np.asarray(families, dtype=object)
        cls = np.asarray(classes, dtype=object)
        keys = pd.DataFrame({"f": fam, "c": cls}).astype(str)
        for (f, c), idx in keys.groupby(["f", "c"]).indices.items():
            curve = self.families.get(f) or self.classes.get(c)
            if curve is not None:
                out[idx] = curve.at(x[idx])
        return out


def _arrays(classes: ArrayLike, dtypes: ArrayLike, flops: ArrayLike,
            nbytes: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    cls = np.asarray([KernelClass(c).value for c in np.asarray(classes, dtype=object)], dtype=object)
    dts = np.asarray([d or "fp32" for d in np.asarray(dtypes, dtype=object)], dtype=object)
    return cls, dts, np.nan_to_num(np.asarray(flops, dtype=float)), np.nan_to_num(np.asarray(nbytes, dtype=float))


def fit_retarget(pairs: PairedKernels, src: Device, dst: Device,
                 points_per_knot: int = POINTS_PER_KNOT) -> RetargetFit:
    """Fit the residual curves of moving ``src`` kernels to ``dst`` on kernels measured on both.

    Raises
    ------
    ValueError
        When no pair has positive times and work.
    """
    f = pairs.frame
    cls, dts, flops, nbytes = _arrays(f["kernel_class"], f["dtype"], f["flops"], f["bytes"])
    a_s = achievable_times_ns(src, cls, dts, flops, nbytes)
    a_d = achievable_times_ns(dst, cls, dts, flops, nbytes)
    s = f["src_ns"].to_numpy(dtype=float)
    d = f["dst_ns"].to_numpy(dtype=float)
    ok = (s > 0) & (d > 0) & (a_s > 0) & (a_d > 0)
    if not ok.any():
        raise ValueError("no paired kernel with positive times and known work to fit on")
    x = np.log10(np.where(ok, a_s, 1.0))
    fixed = _fixed_part(s, fixed_latency_ns(src), fixed_latency_ns(dst))
    with np.errstate(divide="ignore", invalid="ignore"):   # measured over predicted, beyond the fixed part
        y = np.log((d - fixed) / (_moved(s, a_s, a_d, fixed_latency_ns(src), fixed_latency_ns(dst)) - fixed))
    ok &= np.isfinite(y)
    families: dict[str, Curve] = {}
    classes: dict[str, Curve] = {}
    fam = f["family"].astype(str).to_numpy()
    for name in sorted(set(fam[ok])):
        m = ok & (fam == name)
        if m.sum() >= MIN_FAMILY_SAMPLES:
            families[name] = fit_curve(x[m], y[m], points_per_knot)
    for c in sorted(set(cls[ok])):
        m = ok & (cls == c)
        classes[c] = fit_curve(x[m], y[m], points_per_knot)
    return RetargetFit(src.name, dst.name, families, classes)


def _fixed_src(dur: np.ndarray, l_src: np.ndarray | float, launches: np.ndarray | float = 1.0) -> np.ndarray:
    """The fixed part of each task on the source: ``n·min(T/n, L_s)`` (n launches)."""
    return launches * np.minimum(dur / launches, l_src)


def _fixed_part(dur: np.ndarray, l_src: float, l_dst: float, launches: np.ndarray | float = 1.0) -> np.ndarray:
    """The fixed part of each task on the destination: ``n·min(T/n, L_s)·L_d/L_s`` (n launches)."""
    return _fixed_src(dur, l_src, launches) * (l_dst / l_src)


def moved_ns(dur: np.ndarray, ratio: np.ndarray | float, l_src: np.ndarray | float, l_dst: np.ndarray | float,
             launches: np.ndarray | float = 1.0) -> np.ndarray:
    """A measured time on another device: its fixed part at the destination's launch figure
    (:func:`_fixed_part`), the rest times ``ratio``. The law of every move (kernels, copies,
    collectives); it composes, A→B→C = A→C. On the same device (``l_src = l_dst``: per task) it is
    ``precision``'s change of the work above the fixed part.

    >>> moved_ns(np.array([10_000.0, 1_000.0]), 0.5, 2_000.0, 1_000.0).tolist()
    [5000.0, 500.0]
    """
    fixed = _fixed_src(dur, l_src, launches)
    return fixed * (l_dst / l_src) + (dur - fixed) * ratio


def _moved(dur: np.ndarray, a_src: np.ndarray, a_dst: np.ndarray, l_src: float, l_dst: float,
           launches: np.ndarray | float = 1.0) -> np.ndarray:
    """``T'`` without a residual: the fixed part, plus the rest times the achievable-roofline ratio."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where((a_src > 0) & np.isfinite(a_dst), a_dst / a_src, 1.0)
    return moved_ns(dur, ratio, l_src, l_dst, launches)


def retarget_ns(dur_ns: ArrayLike, classes: ArrayLike, dtypes: ArrayLike, flops: ArrayLike,
                nbytes: ArrayLike, src: Device, dst: Device, fit: RetargetFit | None = None,
                families: ArrayLike | None = None, size_flops: ArrayLike | None = None,
                compute_scale: tuple[ArrayLike, ArrayLike] | None = None,
                launches: ArrayLike | None = None) -> np.ndarray:
    """Per kernel: its time (ns) on ``dst`` from its measured ``dur_ns`` on ``src`` (module
    docstring). ``fit`` (for this pair of GPUs) adds its residual curves by ``families`` (op names;
    the kernel class where none is given). ``size_flops``: the FLOPs of the kernel as measured, when
    a transform changed its work since (a shard): both GPUs' GEMM rates are read at that size, as
    :func:`whatif.predictors.costs.anchored_time_ns` reads them, so sharding then moving prices as
    moving then sharding. ``compute_scale``: the stretch of each kernel's compute term on ``src``
    and on ``dst`` (the wave term of a kernel whose rows a transform changed,
    :func:`~whatif.hardware.roofline.wave_tail_ratio` on each GPU's SMs). ``launches``: the
    launches each task stands for (a kernel run once per micro-batch): each pays the fixed latency,
    ``F = n·min(T/n, L_s)``.

    Raises
    ------
    ValueError
        When ``fit`` was made for another pair of GPUs.
    """
    dur = np.asarray(dur_ns, dtype=float)
    if src.name == dst.name:
        return dur.copy()
    cls, dts, f, b = _arrays(classes, dtypes, flops, nbytes)
    size = f if size_flops is None else np.nan_to_num(np.asarray(size_flops, dtype=float))
    s_src, s_dst = (np.ones(len(f)), np.ones(len(f))) if compute_scale is None else \
        (np.asarray(compute_scale[0], dtype=float), np.asarray(compute_scale[1], dtype=float))
    a_s = achievable_times_ns(src, cls, dts, f, b, size, s_src)
    a_d = achievable_times_ns(dst, cls, dts, f, b, size, s_dst)
    l_s, l_d = fixed_latency_ns(src), fixed_latency_ns(dst)
    n = np.ones(len(dur)) if launches is None else np.maximum(np.asarray(launches, dtype=float), 1.0)
    out = _moved(dur, a_s, a_d, l_s, l_d, n)
    if fit is not None:
        if (fit.src, fit.dst) != (src.name, dst.name):
            raise ValueError(f"the fit moves {fit.src} to {fit.dst}, not {src.name} to {dst.name}")
        fam = np.asarray(families if families is not None else cls, dtype=object)
        with np.errstate(divide="ignore", invalid="ignore"):
            x = np.log10(np.where(a_s > 0, a_s, 1.0))
        fixed = _fixed_part(dur, l_s, l_d, n)
        out = fixed + (out - fixed) * np.exp(fit.residual(fam, cls, x))
    return out
