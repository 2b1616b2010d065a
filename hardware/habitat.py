"""Move a measured kernel time from one GPU to another: Habitat's wave scaling.

Habitat (Yu, Gao, Golikov, Pekhimenko, USENIX ATC 2021) scales a kernel measured on origin GPU o
to destination d with

    T' = T · (B_o/B_d)^γ · (clk_o/clk_d)^(1−γ) · (SM_o/SM_d)^(1−γ)

where γ weighs memory against compute from the kernel's arithmetic intensity I and the
destination's ridge point R: γ = 1 − 0.5·I/R for I ≤ R, else 0.5·R/I.

Two refinements, both documented in docs/cost-models.md:

* ``compute="peak"`` (default) replaces clk·SM by the peak FLOP/s of the kernel's dtype and class,
  which equals Habitat's term when both GPUs do the same work per SM per clock and stays right
  when they don't (A40's tensor cores do half of A100's per SM and clock).
* Kernels smaller than one wave: a kernel with fewer thread blocks than SMs uses ``blocks`` SMs on
  either GPU, so the SM term uses ``min(blocks, SM)``; and a fixed latency (launch, ramp-up and
  drain, ``fixed_ns``) does not scale at all.

>>> from whatif.hardware.devices import get_device
>>> a100, h100 = get_device("A100_SXM_80GB"), get_device("H100_SXM")
>>> habitat_gamma(1.0, 1.0)
0.5
>>> round(move_kernel_time_ns(100_000, 1e6, 1e8, a100, h100, "bf16", fixed_ns=0))  # memory-bound
60854
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from whatif.core.dtypes import DType
from whatif.core.kernels import KernelClass

from .devices import Device
from .roofline import DEFAULT_FIXED_NS, arithmetic_intensity, compute_peak


def habitat_gamma(intensity: float, ridge: float) -> float:
    """Habitat's memory weight γ in [0, 1] from intensity I and ridge point R (both FLOP/byte).

    >>> habitat_gamma(0.0, 100.0), habitat_gamma(200.0, 100.0)
    (1.0, 0.25)
    """
    if ridge <= 0:
        raise ValueError("ridge point must be positive")
    if intensity <= ridge:
        return 1.0 - 0.5 * intensity / ridge
    return 0.5 * ridge / intensity


def _ratios(src: Device, dst: Device, dtype: DType | str, cls: KernelClass, compute: str,
            blocks: int | None) -> tuple[float, float]:
    """(memory ratio B_o/B_d, compute ratio) of Habitat's formula."""
    peak_d = compute_peak(dst, dtype, cls)
    sm_o, sm_d = src.sm_count, dst.sm_count
    if blocks is not None and blocks > 0:
        sm_o, sm_d = min(blocks, sm_o), min(blocks, sm_d)
    if compute == "habitat":
        comp = (src.clock_hz / dst.clock_hz) * (sm_o / sm_d)
    elif compute == "peak":
        # per-SM-per-clock throughput ratio x the SMs the kernel can actually occupy
        comp = compute_peak(src, dtype, cls) / peak_d
        comp *= (sm_o / sm_d) / (src.sm_count / dst.sm_count)
    else:
        raise ValueError(f"compute must be 'peak' or 'habitat', not {compute!r}")
    return src.mem_bw_bytes_per_s / dst.mem_bw_bytes_per_s, comp


def _class(kernel_class: KernelClass | str | None, flops: float, nbytes: float) -> KernelClass:
    if kernel_class is not None:
        return KernelClass(kernel_class)
    return KernelClass.GEMM if arithmetic_intensity(flops, nbytes) > 8 else KernelClass.ELEMENTWISE


def scale_factor(flops: float, nbytes: float, src: Device, dst: Device,
                 dtype: DType | str = DType.BF16, kernel_class: KernelClass | str | None = None,
                 compute: str = "peak", blocks: int | None = None,
                 gamma: float | None = None) -> float:
    """T'/T for the scalable part of a kernel (no fixed latency); ``gamma`` overrides Habitat's
    intensity-derived γ (e.g. one fitted by :func:`fit_gamma`)."""
    cls = _class(kernel_class, flops, nbytes)
    mem, comp = _ratios(src, dst, dtype, cls, compute, blocks)
    if gamma is None:
        ridge = compute_peak(dst, dtype, cls) / dst.mem_bw_bytes_per_s
        gamma = habitat_gamma(arithmetic_intensity(flops, nbytes), ridge)
    return mem ** gamma * comp ** (1.0 - gamma)


def fit_gamma(src_ns: Sequence[float], dst_ns: Sequence[float], src: Device, dst: Device,
              dtype: DType | str = DType.BF16, kernel_class: KernelClass | str = KernelClass.OTHER,
              compute: str = "peak", fixed_ns: float = DEFAULT_FIXED_NS) -> float:
    """γ in [0, 1] that best explains kernels of one class measured on both GPUs.

    Solves ``log(T'/T) = γ·log(mem ratio) + (1−γ)·log(compute ratio)`` per kernel (times above
    the fixed latency) and returns the median; use it as ``gamma=`` for unmeasured kernels of the
    class. Kernels not longer than ``2·fixed_ns`` on both GPUs carry no signal and are skipped.

    >>> from whatif.hardware.devices import get_device
    >>> a100, a40 = get_device("A100_SXM_80GB"), get_device("A40")
    >>> round(fit_gamma([300_000], [102_000], a40, a100, "fp16", "elementwise", fixed_ns=0), 2)
    1.0
    """
    mem, comp = _ratios(src, dst, dtype, KernelClass(kernel_class), compute, None)
    denom = math.log(mem) - math.log(comp)
    s, d = np.asarray(src_ns, dtype=float), np.asarray(dst_ns, dtype=float)
    ok = (s > 2 * fixed_ns) & (d > 2 * fixed_ns)
    if not ok.any() or abs(denom) < 1e-9:
        raise ValueError("no kernel long enough to fit γ, or the GPUs' ratios coincide")
    ratio = (d[ok] - fixed_ns) / (s[ok] - fixed_ns)
    gammas = (np.log(ratio) - math.log(comp)) / denom
    return float(np.clip(np.median(gammas), 0.0, 1.0))


def move_kernel_time_ns(dur_ns: float, flops: float, nbytes: float, src: Device, dst: Device,
                        dtype: DType | str = DType.BF16,
                        kernel_class: KernelClass | str | None = None, *,
                        compute: str = "peak", blocks: int | None = None,
                        fixed_ns: float = DEFAULT_FIXED_NS, gamma: float | None = None) -> float:
    """Predicted ns on ``dst`` of a kernel measured at ``dur_ns`` on ``src``.

    ``fixed_ns`` of the measured time (launch/ramp latency, capped at the kernel's duration) is
    kept; the rest scales by Habitat's factor. Same device in, same time out.

    >>> from whatif.hardware.devices import get_device
    >>> a = get_device("A100_SXM_80GB")
    >>> move_kernel_time_ns(5_000, 1e9, 1e6, a, a)
    5000.0
    """
    if dur_ns <= 0 or src.name == dst.name:
        return float(dur_ns)
    fixed = min(fixed_ns, dur_ns)
    factor = scale_factor(flops, nbytes, src, dst, dtype, kernel_class, compute, blocks, gamma)
    if not math.isfinite(factor) or factor <= 0:
        raise ValueError("non-finite Habitat factor")
    return fixed + (dur_ns - fixed) * factor
