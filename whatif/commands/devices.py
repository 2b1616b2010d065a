"""List the GPU catalog: each datasheet figure beside what the hardware achieves (dense peak vs
large- and small-GEMM rates, DRAM bandwidth vs a streaming kernel's, L2 bandwidth, the shortest
kernel, peer link and host link datasheet vs achieved), with the source of every achieved figure
when one GPU is named or with --sources (docs/cost-models.md "Device catalog"). --device-spec adds
GPUs described by TOML files (docs/device-specs.md); --toml prints one GPU as such a file."""
from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.table import Table

from whatif.core.dtypes import DType
from whatif.hardware.device_spec import device_spec_toml
from whatif.hardware.devices import DEVICES, Achievable, Device, find_device, sixteen_bit

from ._device_specs import add_device_spec_argument

T, G = 1e12, 1e9
_FIELDS = (("gemm_flops", "GEMM M=N=K=8192"), ("small_gemm_flops", "GEMM M=N=K=1024"),
           ("stream_bw_bytes_per_s", "DRAM stream"), ("l2_bw_bytes_per_s", "L2"), ("launch_ns", "shortest kernel"),
           ("link_bw_bytes_per_s", "peer link"), ("pcie_bw_bytes_per_s", "host link"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="only GPUs whose catalog name contains this, or the entry a trace's "
                                                "device name (e.g. 'NVIDIA H100 80GB HBM3') maps to")
    parser.add_argument("--sources", action="store_true",
                        help="print where each achieved figure comes from (the default when one GPU matches)")
    parser.add_argument("--toml", action="store_true",
                        help="print the one matching GPU as a device spec file (a start for your own)")
    add_device_spec_argument(parser)


def _matching(name: str | None) -> list[Device]:
    devices = list(DEVICES.values())
    if not name:
        return devices
    key = name.lower()
    found = [d for d in devices if key in d.name.lower()]
    if not found:
        by_trace_name = find_device(name)
        found = [by_trace_name] if by_trace_name is not None else []
    return found


def _rates(d: Device, dtype: DType, a: Achievable | None, small: bool = False) -> str:
    if not d.peak.get(dtype):
        return "-"
    cells = [f"{d.peak[dtype] / T:g}"]
    if a is not None:
        cells.append(f"{a.gemm_flops[dtype] / T:.0f}")
        if small:
            cells.append(f"{a.small_gemm_flops[dtype] / T:.0f}")
    return " / ".join(cells)


def _pair(datasheet: float, achieved: float | None, unit: float, digits: str) -> str:
    if not datasheet:
        return "-"
    text = f"{datasheet / unit:{digits}}"
    return text if achieved is None else f"{text} / {achieved / unit:{digits}}"


def _row(d: Device) -> list[str]:
    a = d.achievable
    half = sixteen_bit(d)
    sixteen = _rates(d, half, a, small=True) + ("" if half is DType.BF16 else " (fp16)")
    link = _pair(d.link_bw_bytes_per_s, a.link_bw_bytes_per_s if a else None, G, ".0f")
    dram = _pair(d.mem_bw_bytes_per_s, a.stream_bw_bytes_per_s if a else None, T, ".2f")
    return [d.name, d.vendor.value, _rates(d, DType.FP32, a), sixteen, _rates(d, DType.FP8, a),
            f"{d.mem_bytes / (1 << 30):g}", dram,
            f"{d.l2_bytes / (1 << 20):g}", f"{a.l2_bw_bytes_per_s / T:.1f}" if a else "-",
            f"{a.launch_ns / 1e3:.2f}" if a else "-", f"{link} {d.link_kind}" if d.link_bw_bytes_per_s else "-",
            _pair(d.pcie_bw_bytes_per_s, a.pcie_bw_bytes_per_s if a else None, G, ".0f"), str(d.sm_count),
            f"{d.clock_hz / 1e9:.3g}"]


def _table(devices: list[Device]) -> Table:
    table = Table(title="whatif devices: datasheet / achieved (dense TFLOP/s, int8 TOP/s; 16-bit: peak / "
                        "8192^3 GEMM / 1024^3 GEMM; '-': no native rate)", title_justify="left")
    for col in ("name", "vendor", "fp32 T", "16-bit T", "fp8 T", "mem GB", "DRAM TB/s", "L2 MB", "L2 TB/s",
                "kernel us", "link GB/s", "host GB/s", "SMs", "GHz"):
        table.add_column(col, justify="left" if col in ("name", "vendor") else "right", no_wrap=True)
    for d in devices:
        table.add_row(*_row(d))
    return table


def _print_sources(console: Console, devices: list[Device]) -> None:
    for d in devices:
        console.print(f"\n{d.name}: where the achieved figures come from", highlight=False)
        if d.achievable is None:
            console.print("  (no achieved figures: the spec file has no [achievable] table)", highlight=False)
            continue
        for field, label in _FIELDS:
            console.print(f"  {label}: {d.achievable.sources.get(field, '-')}", highlight=False, soft_wrap=True)


def run(args: argparse.Namespace) -> int:
    devices = _matching(args.name)
    if not devices:
        print(f"whatif: no GPU in the catalog matches {args.name!r}; run 'whatif devices' for the list",
              file=sys.stderr)
        return 2
    if args.toml:
        if len(devices) != 1:
            print(f"whatif: --toml needs one GPU, {len(devices)} match {args.name or 'no name'!r} "
                  f"({', '.join(d.name for d in devices[:5])}{', ...' if len(devices) > 5 else ''})", file=sys.stderr)
            return 2
        sys.stdout.write(device_spec_toml(devices[0]))
        return 0
    console = Console(width=220)
    console.print(_table(devices))
    if args.sources or len(devices) == 1:
        _print_sources(console, devices)
    return 0
