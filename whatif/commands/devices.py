"""List the GPU catalog: peak dense FLOP/s per dtype (TFLOP/s; int8 in TOP/s), memory, DRAM
bandwidth, SMs/CUs, boost clock and peer link (sources: docs/cost-models.md)."""
from __future__ import annotations

import argparse
import sys

from rich.console import Console
from rich.table import Table

from whatif.core.dtypes import DType
from whatif.hardware.devices import DEVICES, find_device

_DTYPES = (DType.FP32, DType.TF32, DType.BF16, DType.FP16, DType.FP8, DType.INT8)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="only GPUs whose catalog name contains this, or the entry a trace's "
                                                "device name (e.g. 'NVIDIA H100 80GB HBM3') maps to")


def run(args: argparse.Namespace) -> int:
    devices = list(DEVICES.values())
    if args.name:
        key = args.name.lower()
        devices = [d for d in devices if key in d.name.lower()]
        if not devices:
            found = find_device(args.name)
            devices = [found] if found is not None else []
        if not devices:
            print(f"whatif: no GPU in the catalog matches {args.name!r}; run 'whatif devices' for the list",
                  file=sys.stderr)
            return 2
    table = Table(title="whatif devices (dense peaks; '-': no native rate)", title_justify="left")
    for col in ("name", "vendor", *(f"{d.value} T" for d in _DTYPES), "mem GB", "BW TB/s", "SMs", "clock GHz",
                "link GB/s"):
        table.add_column(col, justify="left" if col in ("name", "vendor") else "right", no_wrap=True)
    for d in devices:
        peaks = [f"{d.peak[t] / 1e12:g}" if d.peak.get(t) else "-" for t in _DTYPES]
        link = f"{d.link_bw_bytes_per_s / 1e9:g} {d.link_kind}" if d.link_bw_bytes_per_s else "-"
        table.add_row(d.name, d.vendor.value, *peaks, f"{d.mem_bytes / (1 << 30):g}",
                      f"{d.mem_bw_bytes_per_s / 1e12:.3g}", str(d.sm_count), f"{d.clock_hz / 1e9:.3g}", link)
    Console(width=200).print(table)
    return 0
