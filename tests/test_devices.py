import msgspec
import pytest
from _cost_data import TRACES, need

from whatif.core.dtypes import DType
from whatif.hardware.devices import DEVICES, Vendor, find_device, get_device


def test_catalog_covers_required_devices():
    for name in ("V100_SXM2_32GB", "A100_SXM_40GB", "A100_SXM_80GB", "A100_PCIE_40GB",
                 "A100_PCIE_80GB", "A40", "L40S", "RTX_4090", "H100_SXM", "H100_PCIE", "H200",
                 "B200", "MI250X", "MI300X", "RTX_2080_TI", "GP100"):
        assert name in DEVICES


def test_figures_are_sane():
    for d in DEVICES.values():
        assert d.mem_bw_bytes_per_s > 1e11 and d.sm_count > 0 and d.clock_hz > 5e8
        assert d.peak_flops(DType.FP16) >= d.peak_flops(DType.FP32) * 0.99
        assert d.mem_bytes >= 8 << 30
    assert get_device("H100_SXM").peak_flops("bf16") == pytest.approx(989.4e12)
    assert get_device("a100_sxm_80gb").mem_bw_bytes_per_s == pytest.approx(2039e9)
    assert get_device("MI300X").vendor is Vendor.AMD


def test_dtype_fallback():
    v100 = get_device("V100_SXM2_32GB")
    assert v100.peak_flops("bf16") == v100.peak_flops("fp16")      # no bf16 on Volta
    assert v100.peak_flops("tf32") == v100.peak_flops("fp32")
    assert get_device("A100_SXM_80GB").peak_flops("fp8") == pytest.approx(312e12)


def test_ridge_point_by_hand():
    h100 = get_device("H100_SXM")
    assert h100.ridge_point("bf16") == pytest.approx(989.4e12 / 3.35e12)


@pytest.mark.parametrize("trace_name,expected", [
    ("NVIDIA A100-SXM4-80GB", "A100_SXM_80GB"), ("NVIDIA A100-PG509-200", "A100_SXM_40GB"),
    ("Tesla V100-SXM2-32GB", "V100_SXM2_32GB"), ("Tesla V100-SXM2-16GB", "V100_SXM2_16GB"),
    ("Tesla V100-DGXS-32GB", "V100_SXM2_32GB"), ("AMD Instinct MI300X VF", "MI300X"),
    ("AMD Instinct MI300X", "MI300X"), ("NVIDIA H100 80GB HBM3", "H100_SXM"),
    ("NVIDIA H100 PCIe", "H100_PCIE"), ("NVIDIA B200", "B200"), ("Quadro GP100", "GP100"),
    ("NVIDIA GeForce RTX 2080 Ti", "RTX_2080_TI"), ("NVIDIA GeForce RTX 4090", "RTX_4090"),
    ("NVIDIA A40", "A40"), ("NVIDIA L40S", "L40S"), ("AMD Instinct MI210", "MI210"),
    ("NVIDIA A100 80GB PCIe", "A100_PCIE_80GB"), ("NVIDIA H200", "H200"),
])
def test_find_device(trace_name, expected):
    assert find_device(trace_name).name == expected


def test_unknown_device():
    assert find_device("AMD Radeon Graphics") is None and find_device("") is None
    with pytest.raises(KeyError):
        get_device("toaster")


class _Device(msgspec.Struct):
    name: str | None = None


class _Head(msgspec.Struct):
    """The one key this test reads; msgspec skips the rest (traceEvents) without building it."""

    deviceProperties: list[_Device] | None = None


@pytest.mark.shared
def test_every_named_gpu_in_shared_traces_is_known():
    from isal import igzip

    root = need(TRACES)
    decode = msgspec.json.Decoder(_Head).decode
    names = set()
    for path in root.rglob("*.json*"):
        head = decode(igzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes())
        names |= {d.name for d in head.deviceProperties or [] if d.name}
    assert names
    unknown = {n for n in names if find_device(n) is None} - {"AMD Radeon Graphics", "ARTEMIS"}  # APU, MTIA: not GPUs
    assert not unknown, unknown
