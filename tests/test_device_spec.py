"""User device specs (docs/device-specs.md): a TOML file read into a Device, checked with one-line
errors, registered for the code that needs it, and usable from the CLI and from a scenario."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from whatif.cli import main
from whatif.core.dtypes import DType
from whatif.hardware.device_spec import DeviceSpecError, device_spec_toml, load_device_spec
from whatif.hardware.devices import DEVICES, SMALL_GEMM_FLOPS, find_device, get_device, registered
from whatif.transforms.scenario import ScenarioError, load_scenario

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "scenarios" / "devices" / "rtx_6000_ada.toml"
SCENARIO = ROOT / "scenarios" / "bf16_on_rtx_6000_ada.toml"


def test_the_sample_spec_loads_with_its_figures_and_sources():
    d = load_device_spec(SAMPLE)
    assert d.name == "RTX_6000_ADA" and d.sm_count == 142 and d.mem_bytes == 48 << 30
    assert d.peak_flops("bf16") == pytest.approx(364.2e12) and d.mem_bw_bytes_per_s == pytest.approx(960e9)
    a = d.achievable
    assert a.gemm_flops[DType.BF16] == pytest.approx(310.8e12)
    # dtypes without their own figure run at the bf16 share of their peak; small ones lose the bf16
    # small GEMM's extra time over its large rate
    assert a.gemm_flops[DType.FP8] == pytest.approx(310.8 / 364.2 * 728.5e12)
    extra_s = SMALL_GEMM_FLOPS / 127e12 - SMALL_GEMM_FLOPS / 310.8e12
    assert a.small_gemm_flops[DType.FP8] == pytest.approx(SMALL_GEMM_FLOPS / (SMALL_GEMM_FLOPS / a.gemm_flops[DType.FP8]
                                                                              + extra_s))
    assert a.launch_ns == pytest.approx(940) and a.pcie_bw_bytes_per_s == pytest.approx(25.6e9)
    assert "L40S" in a.sources["gemm_flops"]
    assert a.sources["link_bw_bytes_per_s"] == "rtx_6000_ada.toml (user device spec)"   # no source given


@pytest.mark.parametrize("name", ["H100_SXM", "MI300X", "A40", "V100_PCIE_32GB", "GB200"])
def test_catalog_entries_round_trip_through_toml(tmp_path, name):
    original = get_device(name)
    path = tmp_path / "spec.toml"
    path.write_text(device_spec_toml(original))
    back = load_device_spec(path)
    for field in ("name", "vendor", "sm_count", "mem_bytes", "l2_bytes", "link_kind"):
        assert getattr(back, field) == getattr(original, field)
    for field in ("mem_bw_bytes_per_s", "clock_hz", "link_bw_bytes_per_s", "pcie_bw_bytes_per_s"):
        assert getattr(back, field) == pytest.approx(getattr(original, field), rel=1e-12)
    assert back.peak == pytest.approx(original.peak, rel=1e-12)
    a, b = original.achievable, back.achievable
    assert b.gemm_flops == pytest.approx(a.gemm_flops, rel=1e-12)
    assert b.small_gemm_flops == pytest.approx(a.small_gemm_flops, rel=1e-12)
    assert (b.stream_bw_bytes_per_s, b.l2_bw_bytes_per_s, b.launch_ns) == pytest.approx(
        (a.stream_bw_bytes_per_s, a.l2_bw_bytes_per_s, a.launch_ns), rel=1e-12)
    assert b.sources == a.sources
    assert device_spec_toml(back) == device_spec_toml(original)            # same figures, same bytes


def _edit(tmp_path: Path, old: str, new: str) -> Path:
    text = SAMPLE.read_text()
    assert old in text, old
    path = tmp_path / "bad.toml"
    path.write_text(text.replace(old, new, 1))
    return path


BAD = [
    ("sm_count = 142", "sm_count = 142\ncolour = \"green\"", "unknown key 'colour'"),
    ("sm_count = 142\n", "", "missing field sm_count"),
    ("memory_bw_gbps = 960", "memory_bw_gbps = -960", "memory_bw_gbps must be > 0"),
    ("clock_mhz = 2505", "clock_mhz = 2505000", "clock_mhz = 2505000 is not plausible"),
    ("sm_count = 142", "sm_count = \"many\"", "sm_count must be a number"),
    ("sm_count = 142", "sm_count = 142.5", "sm_count must be a whole number"),
    ("fp8 = 728.5, int8", "fp4 = 1457, int8", "unknown dtype peak_tflops.fp4"),
    ("gemm_tflops = { bf16 = 310.8 }", "gemm_tflops = { bf16 = 400 }",
     "achievable.gemm_tflops.bf16 = 400 is above its datasheet peak 364.2"),
    ("small_gemm_tflops = { bf16 = 127 }", "small_gemm_tflops = { bf16 = 320 }", "is above the large-GEMM figure"),
    ("stream_gbps = 892", "stream_gbps = 1000", "achievable.stream_gbps = 1000 is above the datasheet figure 960"),
    ("pcie_gbps = 25.6", "pcie_gbps = 0", "achievable.pcie_gbps must be > 0"),
    ("launch_us = 0.94", "launch_us = 0.94\nfudge = 2", "unknown key achievable.'fudge'"),
    ("launch_us = 0.94\n", "", "missing field achievable.launch_us"),
    ('vendor = "nvidia"', 'vendor = "intel"', "vendor must be one of nvidia, amd"),
    ('name = "RTX_6000_ADA"', 'name = "my gpu!"', "name must be letters"),
    ('gemm_tflops = "derived', 'gemm_flops_typo = "derived', "unknown key achievable.sources.'gemm_flops_typo'"),
    ("[achievable]", "[achievable", "not valid TOML"),
]


@pytest.mark.parametrize(("old", "new", "problem"), BAD, ids=[b[2][:40] for b in BAD])
def test_a_bad_spec_is_one_line_naming_the_file(tmp_path, old, new, problem):
    path = _edit(tmp_path, old, new)
    with pytest.raises(DeviceSpecError) as err:
        load_device_spec(path)
    assert str(err.value).startswith(f"{path}: ") and problem in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("old", "new", "problem"), [BAD[0], BAD[6], BAD[-1]], ids=["unknown", "above", "toml"])
def test_a_bad_spec_through_the_cli_is_one_line_and_exit_2(tmp_path, capsys, old, new, problem):
    path = _edit(tmp_path, old, new)
    assert main(["devices", "--device-spec", str(path)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith(f"whatif: {path}: ") and problem in err[0]


def test_get_device_finds_a_registered_spec_only_inside_the_block():
    mine = load_device_spec(SAMPLE)
    with pytest.raises(KeyError):
        get_device("RTX_6000_ADA")
    with registered(mine):
        assert get_device("rtx_6000_ada") is mine and "RTX_6000_ADA" in DEVICES
        assert find_device("NVIDIA RTX 6000 Ada Generation") is mine
        assert find_device("NVIDIA H100 80GB HBM3").name == "H100_SXM"         # the catalog still answers
    with pytest.raises(KeyError):
        get_device("RTX_6000_ADA")
    assert "RTX_6000_ADA" not in DEVICES and find_device("NVIDIA RTX 6000 Ada Generation") is None


def test_a_registration_does_not_leak_into_another_thread():
    seen = []
    with registered(load_device_spec(SAMPLE)):
        thread = threading.Thread(target=lambda: seen.append("RTX_6000_ADA" in DEVICES))
        thread.start()
        thread.join()
        assert "RTX_6000_ADA" in DEVICES
    assert seen == [False]


def test_a_registered_spec_shadows_the_catalog_entry_of_its_name(tmp_path):
    path = tmp_path / "h100.toml"
    path.write_text(device_spec_toml(get_device("H100_SXM")).replace("memory_gib = 80.0", "memory_gib = 96.0"))
    with registered(load_device_spec(path)):
        assert get_device("H100_SXM").mem_bytes == 96 << 30
        assert find_device("NVIDIA H100 80GB HBM3").mem_bytes == 96 << 30
    assert get_device("H100_SXM").mem_bytes == 80 << 30


def test_devices_lists_a_spec_with_its_sources(capsys):
    assert main(["devices", "--device-spec", str(SAMPLE), "RTX_6000"]) == 0
    out = capsys.readouterr().out
    assert "RTX_6000_ADA" in out and "364.2 / 311 / 127" in out and "the catalog L40S's share of peak" in out


def test_devices_prints_one_gpu_as_a_spec_that_loads(tmp_path, capsys):
    assert main(["devices", "MI300X", "--toml"]) == 0
    path = tmp_path / "mi300x.toml"
    path.write_text(capsys.readouterr().out)
    assert load_device_spec(path).achievable.gemm_flops == get_device("MI300X").achievable.gemm_flops
    assert main(["devices", "A100", "--toml"]) == 2                            # several match: one line
    assert "needs one GPU" in capsys.readouterr().err


def test_a_scenario_names_its_device_spec_relative_to_itself(tmp_path):
    scenario = load_scenario(SCENARIO)
    assert [d.name for d in scenario.devices] == ["RTX_6000_ADA"]
    bad = tmp_path / "s.toml"
    bad.write_text('device_spec = "nowhere.toml"\n[[transform]]\nname = "gpu"\ndevice = "X"\n')
    with pytest.raises(ScenarioError, match=r"s\.toml: device_spec: .*nowhere\.toml: no such device spec file"):
        load_scenario(bad)
    bad.write_text('device_spec = 3\n[[transform]]\nname = "gpu"\ndevice = "X"\n')
    with pytest.raises(ScenarioError, match="device_spec must be a path or a list of paths"):
        load_scenario(bad)


def test_a_scenario_moves_a_trace_to_its_spec_gpu(shared_traces):
    from whatif.api import predict

    trace = shared_traces / "hta" / "negative_queue_a100_rank0of16.json.gz"
    p = predict(trace, [SCENARIO, ROOT / "scenarios" / "bf16_on_h100.toml"])
    ada, h100 = (r.steps["predicted_ns"].sum() for r in p.scenarios)
    # no NVLink on the RTX 6000 Ada: the 16-rank job's collectives go over PCIe and it gets slower,
    # while the H100 makes it faster; the spec device is priced, not refused
    assert h100 < p.baseline.steps["predicted_ns"].sum() < ada
    assert "RTX_6000_ADA" not in DEVICES


def test_predict_takes_device_spec_on_the_command_line(shared_traces, tmp_path, capsys):
    scenario = tmp_path / "move.toml"
    scenario.write_text('[[transform]]\nname = "gpu"\ndevice = "RTX_6000_ADA"\n')
    trace = str(shared_traces / "tracelens" / "hf_h100" / "gaunernst_bert-small-uncased__1016001.json.gz")
    assert main(["predict", trace, "-s", str(scenario), "-q"]) == 2         # unknown without the spec
    assert "unknown GPU 'RTX_6000_ADA'" in capsys.readouterr().err
    assert main(["predict", trace, "-s", str(scenario), "--device-spec", str(SAMPLE), "-q",
                 "--json", str(tmp_path / "p.json")]) == 0


def test_ops_prices_a_trace_of_an_unknown_gpu_with_a_spec_naming_it(shared_traces, tmp_path):
    import orjson

    trace = str(shared_traces / "hta" / "mi250_minitoy_rocm6.2.json.gz")   # deviceProperties: "AMD Radeon Graphics"
    spec = tmp_path / "mi250.toml"
    spec.write_text(device_spec_toml(get_device("MI250X")).replace('"MI250X"', '"MY_MI250"', 1)
                    .replace('vendor = "amd"', 'vendor = "amd"\ntrace_names = ["radeon graphics"]'))
    without, with_spec = tmp_path / "a.json", tmp_path / "b.json"
    assert main(["ops", trace, "-q", "--json", str(without)]) == 0
    assert main(["ops", trace, "-q", "--json", str(with_spec), "--device-spec", str(spec)]) == 0
    a, b = orjson.loads(without.read_bytes()), orjson.loads(with_spec.read_bytes())
    assert a["devices"] == [] and all(r["roofline_tflops"] is None for r in a["rows"])
    assert b["devices"] == ["MY_MI250"] and any(r["roofline_tflops"] for r in b["rows"])


def test_the_schema_in_the_docs_is_a_valid_spec(tmp_path):
    import re

    text = (ROOT / "docs" / "device-specs.md").read_text()
    schema = text[text.index("## The schema"):]
    block = re.search(r"```toml\n(.*?)```", schema, flags=re.S).group(1)
    path = tmp_path / "schema.toml"
    path.write_text(block)
    d = load_device_spec(path)
    assert d.name == "MY_GPU" and d.achievable.sources["stream_bw_bytes_per_s"] == "BabelStream triad"


def test_a_spec_without_achievable_figures_is_listed_with_dashes(tmp_path, capsys):
    text = SAMPLE.read_text()
    path = tmp_path / "bare.toml"
    path.write_text(text[:text.index("[achievable]")])
    assert load_device_spec(path).achievable is None
    assert main(["devices", "--device-spec", str(path), "RTX_6000_ADA"]) == 0
    out = capsys.readouterr().out
    assert "364.2 " in out and "no achieved figures" in out
