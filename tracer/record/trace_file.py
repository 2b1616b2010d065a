"""One rank's Kineto trace file: collect profiling cycles, add whatif's metadata, write gzip.

A run with ``--repeat N`` yields N cycles; they are merged into one ``rank<k>.pt.trace.json.gz``
(timestamps rebased onto the first cycle's ``baseTimeNanoseconds``) so that each rank keeps
exactly one file, which is what HTA, TensorBoard and :func:`whatif.tracer.load_trace` expect.
"""
from __future__ import annotations

import gzip
import re
from pathlib import Path
from typing import Any

import orjson

from whatif.core.output import write_output

from ..kineto import kineto_json

TRACE_SUFFIX = ".pt.trace.json.gz"
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
GZIP_LEVEL = 6


def trace_file_name(rank: int) -> str:
    return f"rank{rank}{TRACE_SUFFIX}"


def _metadata_key(ev: dict[str, Any]) -> bytes:
    return orjson.dumps([ev.get("name"), ev.get("pid"), ev.get("tid"), ev.get("args")],
                        option=orjson.OPT_SORT_KEYS)


def merge_cycles(cycles: list[dict[str, Any]]) -> dict[str, Any]:
    """Merge the documents of several profiling cycles of one process into one document.

    Events of later cycles are shifted by the difference of ``baseTimeNanoseconds`` (in us);
    duplicate metadata (``ph: M``) events are dropped.
    """
    if not cycles:
        raise ValueError("no cycles to merge")
    merged = {k: v for k, v in cycles[0].items() if k != "traceEvents"}
    events: list[dict[str, Any]] = list(cycles[0].get("traceEvents", []))
    base_ns = int(cycles[0].get("baseTimeNanoseconds") or 0)
    seen_meta = {_metadata_key(ev) for ev in events if ev.get("ph") == "M"}
    for doc in cycles[1:]:
        shift_us = (int(doc.get("baseTimeNanoseconds") or 0) - base_ns) / 1000.0
        for ev in doc.get("traceEvents", []):
            if ev.get("ph") == "M":
                key = _metadata_key(ev)
                if key in seen_meta:
                    continue
                seen_meta.add(key)
            if shift_us and isinstance(ev.get("ts"), (int, float)):
                ev = {**ev, "ts": ev["ts"] + shift_us}
            events.append(ev)
    merged["traceEvents"] = events
    if len(cycles) > 1:
        merged["whatifCycles"] = len(cycles)
    return merged


def write_trace(path: Path, doc: dict[str, Any]) -> int:
    """Write ``doc`` as gzipped JSON atomically (:func:`~whatif.core.output.write_output`), its
    ``distributedInfo`` first in Kineto's spelling (:func:`~whatif.tracer.kineto.kineto_json`: HTA reads
    the rank from it); returns bytes written."""
    data = gzip.compress(kineto_json(doc), compresslevel=GZIP_LEVEL)
    write_output(path, data)
    return len(data)


def read_kineto_export(path: Path) -> dict[str, Any]:
    """Read the JSON that ``torch.profiler`` exported (plain, not gzipped) and delete it."""
    try:
        doc = orjson.loads(path.read_bytes())
    finally:
        path.unlink(missing_ok=True)
    if isinstance(doc, list):
        return {"traceEvents": doc}
    return doc


def fold_leading_steps(doc: dict[str, Any], count: int) -> int:
    """Merge ``ProfilerStep#0..#count`` into one ``ProfilerStep#0`` and renumber later steps.

    Used when whatif found ``count`` step boundaries on its own before the program marked its
    first step: those boundaries were guesses, the program's marks are the truth. Applies to
    CPU and GPU-mirrored step annotations alike. Returns how many annotations were removed.
    """
    if count <= 0:
        return 0
    firsts: dict[tuple[str, Any, Any], dict[str, Any]] = {}
    ends_us: dict[tuple[str, Any, Any], float] = {}
    kept: list[dict[str, Any]] = []
    removed = 0
    for ev in doc.get("traceEvents", []):
        match = _STEP_RE.match(str(ev.get("name", ""))) if ev.get("ph") == "X" else None
        if match is None:
            kept.append(ev)
            continue
        number = int(match.group(1))
        key = (str(ev.get("cat")), ev.get("pid"), ev.get("tid"))
        if number > count:
            ev["name"] = f"ProfilerStep#{number - count}"
            kept.append(ev)
            continue
        end_us = float(ev["ts"]) + float(ev.get("dur", 0))
        ends_us[key] = max(ends_us.get(key, end_us), end_us)
        first = firsts.get(key)
        if first is None or float(ev["ts"]) < float(first["ts"]):
            if first is not None:
                removed += 1
            firsts[key] = ev
        else:
            removed += 1
    for key, ev in firsts.items():
        ev["name"] = "ProfilerStep#0"
        ev["dur"] = ends_us[key] - float(ev["ts"])
        kept.append(ev)
    doc["traceEvents"] = kept
    return removed
