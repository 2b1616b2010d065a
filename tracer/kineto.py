"""Read one Kineto / Chrome-trace JSON file (``.json`` or ``.json.gz``) into columns.

Handles the format drift of real traces 2021 -> 2025 (see ``docs/traces.md``): old category
names, string tids such as ``"stream 7"``, ``external id`` vs ``External id``, float ``ts``
relative to ``baseTimeNanoseconds``, missing metadata events, HIP runtime names.
All times become integer nanoseconds (``ts`` and ``dur`` are always microseconds in Kineto,
whatever ``displayTimeUnit`` says).
"""
from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from .errors import TraceError
from .kinds import IGNORED_CATEGORIES, EventKind, kind_of

_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


@dataclass
class FileColumns:
    """The events of one trace file as parallel lists (one entry per complete event)."""

    ts_ns: list[int] = field(default_factory=list)
    dur_ns: list[int] = field(default_factory=list)
    kind: list[int] = field(default_factory=list)
    name: list[str] = field(default_factory=list)
    pid: list[int] = field(default_factory=list)
    tid: list[int] = field(default_factory=list)
    device: list[int] = field(default_factory=list)
    stream: list[int] = field(default_factory=list)
    correlation: list[int] = field(default_factory=list)
    external_id: list[int] = field(default_factory=list)
    args: list[dict[str, Any] | None] = field(default_factory=list)


@dataclass
class Flow:
    """One end of a non-launch flow (e.g. ``fwdbwd``), located by thread and time."""

    category: str
    flow_id: int
    phase: str  # "s" or "f"
    pid: int
    tid: int
    ts_ns: int


@dataclass
class FileTrace:
    """What one file holds: its events, flows, and the top-level metadata."""

    path: Path
    columns: FileColumns
    flows: list[Flow]
    metadata: dict[str, Any]
    thread_names: dict[tuple[int, int], str]
    process_names: dict[int, str]
    category_counts: dict[str, int]
    skipped: dict[str, int]

    @property
    def distributed_info(self) -> dict[str, Any]:
        info = self.metadata.get("distributedInfo")
        return info if isinstance(info, dict) else {}

    def rank_hint(self) -> int | None:
        """Rank from ``distributedInfo``, else from a ``rank<k>`` in the file name."""
        rank = self.distributed_info.get("rank")
        if isinstance(rank, int) and rank >= 0:
            return rank
        match = _RANK_IN_NAME.search(self.path.name)
        return int(match.group(1)) if match else None

    def world_size_hint(self) -> int | None:
        size = self.distributed_info.get("world_size")
        return size if isinstance(size, int) and size > 0 else None


def read_document(path: Path) -> Any:
    """Read and decode a (possibly gzipped) JSON file, or raise :class:`TraceError`."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise TraceError(path, "no such file") from None
    except IsADirectoryError:
        raise TraceError(path, "is a folder, expected a trace file") from None
    except OSError as exc:
        raise TraceError(path, f"cannot be read ({exc.strerror})") from None
    if not raw:
        raise TraceError(path, "empty file")
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except EOFError:
            raise TraceError(path, "truncated gzip (the file ends before the compressed data does)") from None
        except (OSError, zlib.error) as exc:
            raise TraceError(path, f"corrupt gzip ({exc})") from None
        if not raw:
            raise TraceError(path, "empty file (gzip holds no data)")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise TraceError(path, f"not valid JSON ({exc})") from None


def _int_id(value: Any, interned: dict[str, int]) -> int:
    """Normalize a pid/tid: ints stay, ``"stream 7"`` and ``"25738"`` become ints, other
    strings get a stable negative id (first seen first)."""
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value[7:] if value.startswith("stream ") else value
        try:
            return int(text.strip())
        except ValueError:
            if value not in interned:
                interned[value] = -1000 - len(interned)
            return interned[value]
    if isinstance(value, float):
        return int(value)
    return -1


def _id_arg(args: dict[str, Any], *keys: str) -> int:
    for key in keys:
        value = args.get(key)
        if isinstance(value, int):
            return value
        if isinstance(value, str) and value.lstrip("-").isdigit():
            return int(value)
    return -1


def parse_file(path: str | Path) -> FileTrace:
    """Parse one Kineto trace file. Raises :class:`TraceError` for unusable input."""
    path = Path(path)
    doc = read_document(path)
    if isinstance(doc, dict):
        events = doc.get("traceEvents")
        if not isinstance(events, list):
            raise TraceError(path, "not a Chrome/Kineto trace (no 'traceEvents' list)")
        metadata = {k: v for k, v in doc.items() if k != "traceEvents"}
    elif isinstance(doc, list):
        events, metadata = doc, {}
    else:
        raise TraceError(path, "not a Chrome/Kineto trace (top level is neither an object nor a list)")
    if not events:
        raise TraceError(path, "trace has no events")

    base_ns = metadata.get("baseTimeNanoseconds")
    base_ns = int(base_ns) if isinstance(base_ns, (int, float)) else 0
    cols = FileColumns()
    flows: list[Flow] = []
    thread_names: dict[tuple[int, int], str] = {}
    process_names: dict[int, str] = {}
    categories: dict[str, int] = {}
    skipped = {"instant": 0, "malformed": 0, "launch_flow": 0, "other_phase": 0}
    interned: dict[str, int] = {}
    append = (cols.ts_ns.append, cols.dur_ns.append, cols.kind.append, cols.name.append,
              cols.pid.append, cols.tid.append, cols.device.append, cols.stream.append,
              cols.correlation.append, cols.external_id.append, cols.args.append)
    gpu_kinds = (EventKind.KERNEL, EventKind.MEMCPY, EventKind.MEMSET,
                 EventKind.GPU_ANNOTATION, EventKind.GPU_SYNC)

    for ev in events:
        if not isinstance(ev, dict):
            skipped["malformed"] += 1
            continue
        ph = ev.get("ph")
        if ph == "X":
            cat = ev.get("cat")
            if cat is not None and not isinstance(cat, str):
                cat = str(cat)
            categories[cat or ""] = categories.get(cat or "", 0) + 1
            if cat and cat.lower() in IGNORED_CATEGORIES:
                continue
            ts = ev.get("ts")
            dur = ev.get("dur", 0)
            if not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
                skipped["malformed"] += 1
                continue
            kind = kind_of(cat)
            name = ev.get("name")
            name = name if isinstance(name, str) else str(name)
            if kind == EventKind.CPU_OP and name.startswith("ProfilerStep#"):
                kind = EventKind.ANNOTATION  # 2021 traces file steps under "Operator"
            args = ev.get("args")
            if not isinstance(args, dict):
                args = None
            pid = _int_id(ev.get("pid"), interned)
            tid = _int_id(ev.get("tid"), interned)
            if kind in gpu_kinds:
                device = _id_arg(args, "device") if args else -1
                stream = _id_arg(args, "stream") if args else -1
                device = pid if device < 0 else device
                stream = tid if stream < 0 else stream
            else:
                device = stream = -1
            append[0](base_ns + (ts * 1000 if isinstance(ts, int) else round(ts * 1000)))
            append[1](max(0, dur * 1000 if isinstance(dur, int) else round(dur * 1000)))
            append[2](int(kind))
            append[3](name)
            append[4](pid)
            append[5](tid)
            append[6](device)
            append[7](stream)
            append[8](_id_arg(args, "correlation") if args else -1)
            append[9](_id_arg(args, "External id", "external id") if args else -1)
            append[10](args)
        elif ph in ("s", "f", "t"):
            cat = ev.get("cat") or ""
            low = cat.lower()
            if low in ("ac2g", "async", "async_gpu", "async_cpu_to_gpu"):
                skipped["launch_flow"] += 1  # the launch link is the correlation id itself
                continue
            ts = ev.get("ts")
            fid = ev.get("id")
            if not isinstance(ts, (int, float)) or fid is None:
                skipped["malformed"] += 1
                continue
            flows.append(Flow(category=cat, flow_id=_int_id(fid, interned), phase=ph,
                              pid=_int_id(ev.get("pid"), interned), tid=_int_id(ev.get("tid"), interned),
                              ts_ns=base_ns + (ts * 1000 if isinstance(ts, int) else round(ts * 1000))))
        elif ph == "M":
            args = ev.get("args") or {}
            label = args.get("name") if isinstance(args, dict) else None
            if ev.get("name") == "thread_name" and isinstance(label, str):
                thread_names[(_int_id(ev.get("pid"), interned), _int_id(ev.get("tid"), interned))] = label.strip()
            elif ev.get("name") == "process_name" and isinstance(label, str):
                process_names[_int_id(ev.get("pid"), interned)] = label.strip()
        elif ph in ("i", "I"):
            skipped["instant"] += 1
        else:
            skipped["other_phase"] += 1

    return FileTrace(path=path, columns=cols, flows=flows, metadata=metadata,
                     thread_names=thread_names, process_names=process_names,
                     category_counts=categories, skipped=skipped)


def step_number(name: str) -> int | None:
    """The N of a ``ProfilerStep#N`` annotation.

    >>> step_number("ProfilerStep#12"), step_number("aten::mm")
    (12, None)
    """
    match = _STEP_RE.match(name)
    return int(match.group(1)) if match else None
