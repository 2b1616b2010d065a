"""Convert CUPTI Activity API records into Kineto-compatible trace JSON (a pure function).

Records are plain mappings holding the documented fields of the cupti-python activity
classes (``ActivityAPI``, ``ActivityKernel*``, ``ActivityMemcpy*``, ``ActivityMemset*``,
``ActivitySynchronization*``, ``ActivityExternalCorrelation``), all times in CUPTI nanoseconds.
The output follows Kineto's JSON: categories ``cuda_runtime``/``cuda_driver``/``kernel``/
``gpu_memcpy``/``gpu_memset``/``cuda_sync``/``user_annotation``; GPU events on
``pid`` = device, ``tid`` = stream; ``ts``/``dur`` in microseconds relative to
``baseTimeNanoseconds``; ``correlation`` and ``External id`` in ``args``; ``ac2g`` flows from
each launch to its GPU work.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# CUpti_ActivityKind values (cupti_activity.h; part of CUPTI's stable ABI).
KIND_MEMCPY = 1
KIND_MEMSET = 2
KIND_KERNEL = 3
KIND_DRIVER = 4
KIND_RUNTIME = 5
KIND_CONCURRENT_KERNEL = 10
KIND_SYNCHRONIZATION = 38
KIND_EXTERNAL_CORRELATION = 39

# Documented fields (cupti-python snake_case names) that are kept from each kind of record.
RECORD_FIELDS: dict[int, tuple[str, ...]] = {
    KIND_RUNTIME: ("kind", "cbid", "start", "end", "process_id", "thread_id", "correlation_id"),
    KIND_DRIVER: ("kind", "cbid", "start", "end", "process_id", "thread_id", "correlation_id"),
    KIND_CONCURRENT_KERNEL: ("kind", "name", "start", "end", "device_id", "context_id", "stream_id",
                             "correlation_id", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
                             "registers_per_thread", "static_shared_memory", "dynamic_shared_memory"),
    KIND_MEMCPY: ("kind", "copy_kind", "src_kind", "dst_kind", "bytes", "start", "end", "device_id",
                  "context_id", "stream_id", "correlation_id"),
    KIND_MEMSET: ("kind", "value", "bytes", "start", "end", "device_id", "context_id", "stream_id",
                  "correlation_id"),
    KIND_SYNCHRONIZATION: ("kind", "type", "start", "end", "correlation_id", "context_id", "stream_id",
                           "cuda_event_id"),
    KIND_EXTERNAL_CORRELATION: ("kind", "external_kind", "external_id", "correlation_id"),
}
RECORD_FIELDS[KIND_KERNEL] = RECORD_FIELDS[KIND_CONCURRENT_KERNEL]

# CUpti_ActivityMemcpyKind / CUpti_ActivityMemoryKind / CUpti_ActivitySynchronizationType names
# as Kineto prints them ("Memcpy HtoD (Pageable -> Device)", "Stream Sync").
MEMCPY_KINDS = ("Unknown", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH", "PtoP")
MEMORY_KINDS = ("Unknown", "Pageable", "Pinned", "Device", "Array", "Managed", "Device Static",
                "Managed Static")
SYNC_TYPES = ("Unknown Sync", "Event Sync", "Stream Wait Event", "Stream Sync", "Context Sync")
INVALID_ID = 0xFFFFFFFF


@dataclass(frozen=True)
class CpuRange:
    """A CPU-side annotation (``record_function``, ``ProfilerStep#N``) timed on CUPTI's clock."""

    name: str
    start_ns: int
    end_ns: int
    pid: int
    tid: int
    external_id: int


def snapshot(record: Any) -> dict[str, Any] | None:
    """Copy the documented fields of a cupti-python record into a dict (``None`` for kinds
    whatif does not convert), so that nothing refers to CUPTI's buffer afterwards."""
    fields = RECORD_FIELDS.get(int(record.kind))
    if fields is None:
        return None
    return {name: getattr(record, name) for name in fields}


def _name(table: Sequence[str], index: Any) -> str:
    i = int(index) if isinstance(index, int) else 0
    return table[i] if 0 <= i < len(table) else table[0]


def cupti_to_kineto(records: Iterable[Mapping[str, Any]], *, annotations: Sequence[CpuRange] = (),
                    api_name: Callable[[int, int], str], pid: int,
                    device_names: Sequence[str] = ()) -> dict[str, Any]:
    """Build a Kineto trace document from activity records and CPU annotations.

    ``api_name(kind, cbid)`` names a runtime/driver call (e.g. ``cudaLaunchKernel``);
    ``pid`` is the traced process (for annotations and the process-name metadata).
    """
    recs = [r for r in records if int(r.get("kind", -1)) in RECORD_FIELDS]
    external_of = {int(r["correlation_id"]): int(r["external_id"]) for r in recs
                   if r["kind"] == KIND_EXTERNAL_CORRELATION}
    device_of_context = {int(r["context_id"]): int(r["device_id"]) for r in recs
                         if "device_id" in r and "context_id" in r}
    starts = [int(r["start"]) for r in recs if r["kind"] != KIND_EXTERNAL_CORRELATION and int(r["start"]) > 0]
    starts += [a.start_ns for a in annotations]
    base_ns = (min(starts) // 1_000_000_000) * 1_000_000_000 if starts else 0

    def us(ns: int) -> float:
        return (int(ns) - base_ns) / 1000.0

    events: list[dict[str, Any]] = []
    launches: dict[int, tuple[int, int, float]] = {}  # correlation -> (pid, tid, ts us)
    for a in annotations:
        events.append({"ph": "X", "cat": "user_annotation", "name": a.name, "pid": a.pid, "tid": a.tid,
                       "ts": us(a.start_ns), "dur": (a.end_ns - a.start_ns) / 1000.0,
                       "args": {"External id": a.external_id}})
    threads: set[tuple[int, int]] = {(a.pid, a.tid) for a in annotations}
    streams: set[tuple[int, int]] = set()
    for r in recs:
        kind = int(r["kind"])
        if kind == KIND_EXTERNAL_CORRELATION:
            continue
        start, end = int(r["start"]), int(r["end"])
        if start == 0 and end == 0:
            continue  # CUPTI could not time it
        corr = int(r["correlation_id"])
        args: dict[str, Any] = {"correlation": corr}
        if corr in external_of:
            args["External id"] = external_of[corr]
        ev: dict[str, Any] = {"ph": "X", "ts": us(start), "dur": max(0, end - start) / 1000.0}
        if kind in (KIND_RUNTIME, KIND_DRIVER):
            proc, thread = int(r["process_id"]), int(r["thread_id"])
            ev.update(cat="cuda_runtime" if kind == KIND_RUNTIME else "cuda_driver",
                      name=api_name(kind, int(r["cbid"])), pid=proc, tid=thread)
            args["cbid"] = int(r["cbid"])
            launches[corr] = (proc, thread, ev["ts"])
            threads.add((proc, thread))
        elif kind == KIND_SYNCHRONIZATION:
            ctx = int(r["context_id"])
            stream = int(r["stream_id"])
            device = device_of_context.get(ctx, 0)
            ev.update(cat="cuda_sync", name=_name(SYNC_TYPES, r["type"]), pid=device,
                      tid=stream if stream != INVALID_ID else 0)
            args.update(device=device, context=ctx, stream=stream if stream != INVALID_ID else -1)
            if int(r.get("cuda_event_id", INVALID_ID)) != INVALID_ID:
                args["cuda_event_id"] = int(r["cuda_event_id"])
        else:
            device, stream = int(r["device_id"]), int(r["stream_id"])
            ev.update(pid=device, tid=stream)
            args.update(device=device, context=int(r["context_id"]), stream=stream)
            if kind in (KIND_KERNEL, KIND_CONCURRENT_KERNEL):
                ev.update(cat="kernel", name=str(r["name"]))
                args.update({"registers per thread": int(r["registers_per_thread"]),
                             "shared memory": int(r["static_shared_memory"]) + int(r["dynamic_shared_memory"]),
                             "grid": [int(r["grid_x"]), int(r["grid_y"]), int(r["grid_z"])],
                             "block": [int(r["block_x"]), int(r["block_y"]), int(r["block_z"])]})
            elif kind == KIND_MEMCPY:
                ev.update(cat="gpu_memcpy", name=f"Memcpy {_name(MEMCPY_KINDS, r['copy_kind'])} "
                          f"({_name(MEMORY_KINDS, r['src_kind'])} -> {_name(MEMORY_KINDS, r['dst_kind'])})")
                args["bytes"] = int(r["bytes"])
                if end > start:
                    args["memory bandwidth (GB/s)"] = int(r["bytes"]) / (end - start)
            else:
                ev.update(cat="gpu_memset", name="Memset (Device)")
                args["bytes"] = int(r["bytes"])
            streams.add((device, stream))
        ev["args"] = args
        events.append(ev)
    events.extend(_launch_flows(events, launches))
    meta = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python"}}]
    meta += [{"ph": "M", "name": "thread_name", "pid": p, "tid": t, "args": {"name": f"thread {t}"}}
             for p, t in sorted(threads)]
    for device in sorted({d for d, _ in streams}):
        meta.append({"ph": "M", "name": "process_name", "pid": device, "tid": 0, "args": {"name": f"GPU {device}"}})
    meta += [{"ph": "M", "name": "thread_name", "pid": d, "tid": s, "args": {"name": f"stream {s}"}}
             for d, s in sorted(streams)]
    return {"schemaVersion": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": base_ns,
            "deviceProperties": [{"id": i, "name": n} for i, n in enumerate(device_names)],
            "traceEvents": meta + events}


def _launch_flows(events: list[dict[str, Any]], launches: dict[int, tuple[int, int, float]]) -> list[dict[str, Any]]:
    """``ac2g`` flow pairs from each runtime/driver call to the GPU work it launched."""
    flows: list[dict[str, Any]] = []
    for ev in events:
        if ev.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        corr = ev["args"]["correlation"]
        launch = launches.get(corr)
        if launch is None:
            continue
        proc, thread, ts = launch
        flows.append({"ph": "s", "id": corr, "pid": proc, "tid": thread, "ts": ts, "cat": "ac2g", "name": "ac2g"})
        flows.append({"ph": "f", "id": corr, "pid": ev["pid"], "tid": ev["tid"], "ts": ev["ts"], "cat": "ac2g",
                      "name": "ac2g", "bp": "e"})
    return flows
