import numpy as np
import pytest
from _cost_data import VIDUR, bench_module, need

from whatif.core.dtypes import DType
from whatif.hardware.devices import get_device
from whatif.hardware.roofline import (
    CalibratedRoofline,
    compute_peak,
    kernel_time_ns,
    memory_bound,
    roofline_time_ns,
)

A100 = get_device("A100_SXM_80GB")


def test_roofline_by_hand():
    # 1 GFLOP and 1 MB on A100 bf16: compute 1e9/312e12 s = 3205 ns > memory 490 ns
    assert roofline_time_ns(1e9, 1e6, A100, "bf16", "gemm") == pytest.approx(1e18 / 312e12)
    assert roofline_time_ns(1e3, 1e9, A100, "bf16", "elementwise") == pytest.approx(1e18 / 2039e9)
    # elementwise kernels run on CUDA cores (fp32 peak), GEMMs on tensor cores
    assert compute_peak(A100, "bf16", "elementwise") == 19.5e12
    assert memory_bound(1e6, 1e6, A100, "bf16", "gemm")


def test_memory_bound_kernel_on_2x_bandwidth_device_takes_half():
    a, b = get_device("A100_SXM_40GB"), get_device("A100_SXM_80GB")
    ratio = roofline_time_ns(1e6, 1e9, b, "fp16", "elementwise") / \
        roofline_time_ns(1e6, 1e9, a, "fp16", "elementwise")
    assert ratio == pytest.approx(1555 / 2039)


def test_calibration_recovers_constant_efficiency():
    rng = np.random.default_rng(0)
    flops = rng.uniform(1e10, 1e12, 50)
    ideal = flops / 312e12 * 1e9
    cal = CalibratedRoofline.fit(A100, ["gemm"] * 50, flops, flops / 500, ideal / 0.7, DType.BF16)
    assert cal.kernel_time_ns("gemm", 5e11, 1e9) == pytest.approx(5e11 / 312e12 * 1e9 / 0.7,
                                                                  rel=1e-6)
    assert cal.efficiency("gemm", 5e11, 1e9) == pytest.approx(0.7)
    # unknown class falls back to the overall curve; with no calibration: plain roofline
    assert cal.kernel_time_ns("conv", 5e11, 1e9) == pytest.approx(5e11 / 312e12 * 1e9 / 0.7)
    assert kernel_time_ns(5e11, 1e9, A100, "bf16", "gemm") == pytest.approx(5e11 / 312e12 * 1e9)
    with pytest.raises(ValueError):
        kernel_time_ns(1, 1, get_device("H100_SXM"), calibration=cal)


def test_calibration_floor_and_size_dependence():
    # small kernels are less efficient than large ones
    ideal = np.array([1e3, 1e4, 1e5, 1e6] * 3)
    dur = np.where(ideal < 5e4, ideal * 3, ideal * 1.2)
    flops = ideal * 1e-9 * 312e12
    cal = CalibratedRoofline.fit(A100, ["gemm"] * len(ideal), flops, flops / 1000, dur, "bf16",
                                 bins=4)
    small = cal.kernel_time_ns("gemm", 1e3 * 1e-9 * 312e12, 1)
    large = cal.kernel_time_ns("gemm", 1e6 * 1e-9 * 312e12, 1)
    assert small / 1e3 > large / 1e6
    assert cal.kernel_time_ns("gemm", 1.0, 1.0) >= dur.min()          # latency floor


@pytest.mark.shared
def test_tensor_parallel_from_tp1_within_goal():
    need(VIDUR)
    bench = bench_module("cost_tensor_parallel")
    med = bench.evaluate("op").groupby("class")["err"].median()
    assert (med <= 10.0).all(), med
