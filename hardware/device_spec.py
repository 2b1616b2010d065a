"""A GPU described by its user: a TOML device spec (docs/device-specs.md) read into a
:class:`~whatif.hardware.devices.Device`, and a catalog entry written back as one.

Every problem is one line naming the file (:class:`DeviceSpecError`, exit 2 in the CLI): a key the
schema does not have, a missing field, a number that is not positive or not plausible, an
achievable figure above its datasheet figure, an unknown dtype.

>>> from whatif.hardware.devices import get_device
>>> text = device_spec_toml(get_device("H100_SXM"))
>>> print(text.splitlines()[0])
name = "H100_SXM"
>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / "h100.toml"
>>> _ = path.write_text(text.replace('"H100_SXM"', '"MY_H100"'))
>>> mine = load_device_spec(path)
>>> mine.name, mine.peak_flops("bf16") == get_device("H100_SXM").peak_flops("bf16")
('MY_H100', True)
"""
from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from whatif.core.dtypes import DType
from whatif.core.errors import WhatifError

from .devices import GIB, MIB, Achievable, Device, Vendor, gemm_at_peak_share, small_at_ratio

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

T, G = 1e12, 1e9


class DeviceSpecError(WhatifError):
    """A device spec file that cannot be used, with the reason.

    >>> str(DeviceSpecError("my_gpu.toml", "missing field sm_count"))
    'my_gpu.toml: missing field sm_count'
    """

    def __init__(self, path: str | Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")


@dataclass(frozen=True)
class _Number:
    """One numeric key: its multiplier to the Device's unit and the plausible range (in the key's unit)."""

    key: str
    scale: float
    low: float
    high: float
    zero_ok: bool = False


# top-level numbers: key -> unit scale, plausible range
_DATASHEET = {n.key: n for n in (
    _Number("memory_bw_gbps", G, 1, 100_000),
    _Number("sm_count", 1, 1, 100_000),
    _Number("clock_mhz", 1e6, 100, 10_000),
    _Number("memory_gib", GIB, 0.25, 16_384),
    _Number("l2_mib", MIB, 0.0625, 65_536),
    _Number("link_gbps", G, 0, 100_000, zero_ok=True),
    _Number("pcie_gbps", G, 0.1, 10_000),
)}
_PEAK_TFLOPS = _Number("peak_tflops", T, 0.01, 100_000)
_ACHIEVABLE = {n.key: n for n in (
    _Number("stream_gbps", G, 1, 100_000),
    _Number("l2_gbps", G, 1, 1_000_000),
    _Number("launch_us", 1e3, 0.05, 1000),
    _Number("link_gbps", G, 0, 100_000, zero_ok=True),
    _Number("pcie_gbps", G, 0.1, 10_000),
)}
_ACHIEVABLE_RATES = ("gemm_tflops", "small_gemm_tflops")
_TOP = ("name", "vendor", "link_kind", "trace_names", "peak_tflops", "achievable", *_DATASHEET)
# spec key -> Achievable field (its sources are keyed by the field)
_FIELD = {"gemm_tflops": "gemm_flops", "small_gemm_tflops": "small_gemm_flops", "stream_gbps": "stream_bw_bytes_per_s",
          "l2_gbps": "l2_bw_bytes_per_s", "launch_us": "launch_ns", "link_gbps": "link_bw_bytes_per_s",
          "pcie_gbps": "pcie_bw_bytes_per_s"}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")


class _Reader:
    """Checks one parsed file, raising DeviceSpecError naming it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, problem: str) -> DeviceSpecError:
        return DeviceSpecError(self.path, problem)

    def keys(self, table: dict[str, Any], allowed: tuple[str, ...] | list[str], where: str) -> None:
        unknown = sorted(set(table) - set(allowed))
        if unknown:
            raise self.fail(f"unknown key {where}{unknown[0]!r} (expected one of {', '.join(allowed)})")

    def number(self, value: Any, spec: _Number, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(f"{where} must be a number, not {value!r}")
        if value < 0 or (value == 0 and not spec.zero_ok):
            raise self.fail(f"{where} must be {'>= 0' if spec.zero_ok else '> 0'}, not {value!r}")
        if value and not spec.low <= value <= spec.high:
            raise self.fail(f"{where} = {value!r} is not plausible (expected {spec.low:g} to {spec.high:g})")
        return float(value)

    def required(self, table: dict[str, Any], key: str, where: str = "") -> Any:
        if key not in table:
            raise self.fail(f"missing field {where}{key}")
        return table[key]

    def table(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(f"{where} must be a table, not {value!r}")
        return value

    def dtype_rates(self, value: Any, where: str) -> dict[DType, float]:
        rates = {}
        for key, rate in self.table(value, where).items():
            try:
                dtype = DType(str(key).lower())
            except ValueError:
                raise self.fail(f"unknown dtype {where}.{key} (expected {', '.join(d.value for d in DType)})") from None
            rates[dtype] = self.number(rate, _PEAK_TFLOPS, f"{where}.{key}") * T
        if not rates:
            raise self.fail(f"{where} names no dtype")
        return rates


def load_device_spec(path: str | Path) -> Device:
    """The Device a TOML spec describes (schema: docs/device-specs.md).

    Raises
    ------
    DeviceSpecError
        One line naming the file and the problem.
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise DeviceSpecError(path, "no such device spec file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DeviceSpecError(path, f"cannot be read ({exc.__class__.__name__})") from None
    except tomllib.TOMLDecodeError as exc:
        raise DeviceSpecError(path, f"not valid TOML ({exc})") from None
    return device_from_spec(data, path)


def device_from_spec(data: dict[str, Any], path: str | Path = "<device spec>") -> Device:
    """The Device of an already parsed spec; ``path`` names it in errors."""
    r = _Reader(Path(path))
    r.keys(data, _TOP, "")
    name = r.required(data, "name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise r.fail(f"name must be letters, digits, '_', '.' or '-' (like \"MY_GPU\"), not {name!r}")
    try:
        vendor = Vendor(str(r.required(data, "vendor")).lower())
    except ValueError:
        raise r.fail(f"vendor must be one of {', '.join(v.value for v in Vendor)}, not {data['vendor']!r}") from None
    trace_names = data.get("trace_names", [])
    if not isinstance(trace_names, list) or not all(isinstance(n, str) and n.strip() for n in trace_names):
        raise r.fail(f"trace_names must be a list of names as traces write them, not {trace_names!r}")
    link_kind = data.get("link_kind", "")
    if not isinstance(link_kind, str):
        raise r.fail(f"link_kind must be a string, not {link_kind!r}")
    fig = {k: r.number(r.required(data, k), spec, k) * spec.scale for k, spec in _DATASHEET.items()}
    if not fig["sm_count"].is_integer():
        raise r.fail(f"sm_count must be a whole number, not {data['sm_count']!r}")
    peak = r.dtype_rates(r.required(data, "peak_tflops"), "peak_tflops")
    device = Device(name.upper(), vendor, peak, fig["memory_bw_gbps"], int(fig["sm_count"]), fig["clock_mhz"],
                    int(fig["memory_gib"]), int(fig["l2_mib"]), fig["link_gbps"], link_kind, fig["pcie_gbps"],
                    trace_names=tuple(n.strip().lower() for n in trace_names))
    if "achievable" not in data:
        return device
    return replace(device, achievable=_achievable(r, r.table(data["achievable"], "[achievable]"), device))


def _achievable(r: _Reader, table: dict[str, Any], device: Device) -> Achievable:
    r.keys(table, [*_ACHIEVABLE_RATES, *_ACHIEVABLE, "sources"], "achievable.")
    gemm = r.dtype_rates(r.required(table, "gemm_tflops", "achievable."), "achievable.gemm_tflops")
    small = r.dtype_rates(r.required(table, "small_gemm_tflops", "achievable."), "achievable.small_gemm_tflops")
    for dtype, rate in gemm.items():
        if dtype not in device.peak:
            raise r.fail(f"achievable.gemm_tflops.{dtype.value}: no peak_tflops.{dtype.value} to be under")
        if rate > device.peak[dtype]:
            raise r.fail(f"achievable.gemm_tflops.{dtype.value} = {rate / T:g} is above its datasheet peak "
                         f"{device.peak[dtype] / T:g}")
    full_gemm = gemm_at_peak_share(device.peak, gemm)
    for dtype, rate in small.items():
        if dtype not in device.peak:
            raise r.fail(f"achievable.small_gemm_tflops.{dtype.value}: no peak_tflops.{dtype.value} to be under")
        if rate > full_gemm[dtype]:
            raise r.fail(f"achievable.small_gemm_tflops.{dtype.value} = {rate / T:g} is above the large-GEMM "
                         f"figure {full_gemm[dtype] / T:g} (a 2^31-FLOP GEMM cannot beat an 8192^3 one)")
    bw = {k: r.number(r.required(table, k, "achievable."), spec, f"achievable.{k}") * spec.scale
          for k, spec in _ACHIEVABLE.items()}
    for key, datasheet in (("stream_gbps", device.mem_bw_bytes_per_s), ("link_gbps", device.link_bw_bytes_per_s),
                           ("pcie_gbps", device.pcie_bw_bytes_per_s)):
        if bw[key] > datasheet:
            raise r.fail(f"achievable.{key} = {bw[key] / G:g} is above the datasheet figure {datasheet / G:g}")
    sources = r.table(table.get("sources", {}), "[achievable.sources]")
    r.keys(sources, list(_FIELD), "achievable.sources.")
    for key, text in sources.items():
        if not isinstance(text, str) or not text.strip():
            raise r.fail(f"achievable.sources.{key} must say where the figure comes from, not {text!r}")
    default = f"{r.path.name} (user device spec)"
    return Achievable(full_gemm, small_at_ratio(full_gemm, small), bw["stream_gbps"], bw["l2_gbps"],
                      bw["launch_us"], bw["link_gbps"], bw["pcie_gbps"],
                      {field: str(sources.get(key, default)).strip() for key, field in _FIELD.items()})


def _toml_value(value: float | str) -> str:
    return json.dumps(value) if isinstance(value, str) else repr(float(value))


def _rates(rates: dict[DType, float]) -> str:
    return "{ " + ", ".join(f"{d.value} = {_toml_value(v / T)}" for d, v in sorted(
        rates.items(), key=lambda kv: list(DType).index(kv[0]))) + " }"


def device_spec_toml(device: Device) -> str:
    """``device`` as a TOML spec that :func:`load_device_spec` reads back to the same figures."""
    lines = [f"name = {json.dumps(device.name)}", f"vendor = {json.dumps(device.vendor.value)}"]
    if device.trace_names:
        lines.append(f"trace_names = {json.dumps(list(device.trace_names))}")
    lines += [f"memory_bw_gbps = {_toml_value(device.mem_bw_bytes_per_s / G)}",
              f"sm_count = {device.sm_count}", f"clock_mhz = {_toml_value(device.clock_hz / 1e6)}",
              f"memory_gib = {_toml_value(device.mem_bytes / GIB)}", f"l2_mib = {_toml_value(device.l2_bytes / MIB)}",
              f"link_gbps = {_toml_value(device.link_bw_bytes_per_s / G)}",
              f"link_kind = {json.dumps(device.link_kind)}",
              f"pcie_gbps = {_toml_value(device.pcie_bw_bytes_per_s / G)}",
              f"peak_tflops = {_rates(device.peak)}"]
    a = device.achievable
    if a is not None:
        lines += ["", "[achievable]", f"gemm_tflops = {_rates(a.gemm_flops)}",
                  f"small_gemm_tflops = {_rates(a.small_gemm_flops)}",
                  f"stream_gbps = {_toml_value(a.stream_bw_bytes_per_s / G)}",
                  f"l2_gbps = {_toml_value(a.l2_bw_bytes_per_s / G)}", f"launch_us = {_toml_value(a.launch_ns / 1e3)}",
                  f"link_gbps = {_toml_value(a.link_bw_bytes_per_s / G)}",
                  f"pcie_gbps = {_toml_value(a.pcie_bw_bytes_per_s / G)}", "", "[achievable.sources]"]
        lines += [f"{key} = {json.dumps(a.sources[field])}" for key, field in _FIELD.items() if field in a.sources]
    return "\n".join(lines) + "\n"
