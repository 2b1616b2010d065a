"""Convert CUPTI Activity API records into Kineto-compatible trace JSON (a pure function).

Records are plain mappings holding the documented fields of the cupti-python activity
classes (``ActivityAPI``, ``ActivityKernel*``, ``ActivityMemcpy*``, ``ActivityMemset*``,
``ActivitySynchronization*``, ``ActivityExternalCorrelation``), all times in CUPTI nanoseconds.
The output follows Kineto's JSON: categories ``cuda_runtime``/``cuda_driver``/``kernel``/
``gpu_memcpy``/``gpu_memset``/``cuda_sync``/``user_annotation``; GPU events on
``pid`` = device, ``tid`` = stream; ``ts``/``dur`` in microseconds relative to
``baseTimeNanoseconds``; ``correlation`` and ``External id`` in ``args``; ``ac2g`` flows from
each launch to its GPU work.

What Kineto does and the converter repeats (compared on the H200 recordings of
``sample_traces/gpu/backends``, ``bench/gpu_backends.py``): kernel names demangled and call names
without CUPTI's ``_v7000`` suffix (:func:`whatif.tracer.names.kineto_name`); the runtime calls
Kineto blocklists as noise (``cudaGetDevice``... :data:`SKIPPED_RUNTIME_CALLS`) left out, and of
the driver calls only those Kineto tracks (launches and virtual-memory calls,
:data:`KEPT_DRIVER_CALLS`), those that can launch GPU work (copies, memsets) and any that did
launch some kept (:func:`is_noise_call`); CUPTI's thread ids (the low 32 bits of
``pthread_self``) replaced by the system thread ids the annotations carry where the recorder knows
them; ``deviceProperties`` as given.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from whatif.tracer.names import api_call_name, demangle

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

# Kineto's CuptiCbidRegistry: runtime callbacks it drops as noise, and the only driver callbacks
# it records (each cuLaunchKernel the runtime did not already cover, and the virtual-memory calls).
SKIPPED_RUNTIME_CALLS = frozenset({"cudaGetDevice", "cudaSetDevice", "cudaGetLastError", "cudaEventCreate",
                                   "cudaEventCreateWithFlags", "cudaEventDestroy"})
KEPT_DRIVER_CALLS = frozenset({"cuLaunchKernel", "cuLaunchKernelEx", "cuMemCreate", "cuMemMap", "cuMemUnmap",
                               "cuMemRelease", "cuMemExportToShareableHandle", "cuMemImportFromShareableHandle"})
GPU_WORK_KINDS = frozenset({KIND_KERNEL, KIND_CONCURRENT_KERNEL, KIND_MEMCPY, KIND_MEMSET})
DRIVER_WORK_PREFIXES = ("cuLaunch", "cuGraphLaunch", "cuMemcpy", "cuMemset")
"""Driver calls that may put work on a GPU stream: kept even where Kineto would not track them."""


def is_noise_call(kind: int, name: str) -> bool:
    """Whether a runtime/driver call (``name`` without CUPTI's suffix) is one Kineto leaves out and
    that cannot have launched GPU work: the backend drops such records as they arrive.

    >>> is_noise_call(KIND_RUNTIME, "cudaGetDevice"), is_noise_call(KIND_RUNTIME, "cudaLaunchKernel")
    (True, False)
    >>> is_noise_call(KIND_DRIVER, "cuDevicePrimaryCtxGetState"), is_noise_call(KIND_DRIVER, "cuMemcpyHtoDAsync_v2")
    (True, False)
    """
    if kind == KIND_RUNTIME:
        return name in SKIPPED_RUNTIME_CALLS
    return name not in KEPT_DRIVER_CALLS and not name.startswith(DRIVER_WORK_PREFIXES)


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
                    device_properties: Sequence[Mapping[str, Any]] = (),
                    thread_ids: Mapping[int, int] | None = None) -> dict[str, Any]:
    """Build a Kineto trace document from activity records and CPU annotations.

    ``api_name(kind, cbid)`` names a runtime/driver call (CUPTI's callback name, e.g.
    ``cudaLaunchKernel_v7000``); ``pid`` is the traced process (for annotations and the
    process-name metadata); ``device_properties[i]`` the properties of device ``i`` as Kineto
    names them (``name``, ``totalGlobalMem``, ``numSms``...); ``thread_ids`` maps CUPTI's thread
    id of a call to the system thread id (a thread left out keeps CUPTI's id).
    """
    recs = [r for r in records if int(r.get("kind", -1)) in RECORD_FIELDS]
    timed = [r for r in recs if r["kind"] != KIND_EXTERNAL_CORRELATION and (int(r["start"]) or int(r["end"]))]
    starts = [int(r["start"]) for r in timed if int(r["start"]) > 0] + [a.start_ns for a in annotations]
    base_ns = (min(starts) // 1_000_000_000) * 1_000_000_000 if starts else 0
    conv = _Converter(base_ns=base_ns, api_name=api_name, thread_ids=thread_ids or {},
                      external_of={int(r["correlation_id"]): int(r["external_id"]) for r in recs
                                   if r["kind"] == KIND_EXTERNAL_CORRELATION},
                      device_of_context={int(r["context_id"]): int(r["device_id"]) for r in recs
                                         if "device_id" in r and "context_id" in r},
                      launching={int(r["correlation_id"]) for r in timed if r["kind"] in GPU_WORK_KINDS})
    events = [{"ph": "X", "cat": "user_annotation", "name": a.name, "pid": a.pid, "tid": a.tid,
               "ts": conv.us(a.start_ns), "dur": (a.end_ns - a.start_ns) / 1000.0,
               "args": {"External id": a.external_id}} for a in annotations]
    conv.threads.update((a.pid, a.tid) for a in annotations)
    for r in timed:
        ev = conv.event(r)
        if ev is not None:
            events.append(ev)
    events.extend(_launch_flows(events, conv.launches))
    return {"schemaVersion": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": base_ns,
            "deviceProperties": [{"id": i, **props} for i, props in enumerate(device_properties)],
            "traceEvents": conv.metadata(pid) + events}


@dataclass
class _Converter:
    """The state of one conversion: the time base, the lookups between records, and the threads,
    streams and launches seen so far."""

    base_ns: int
    api_name: Callable[[int, int], str]
    thread_ids: Mapping[int, int]
    external_of: dict[int, int]
    device_of_context: dict[int, int]
    launching: set[int]
    threads: set[tuple[int, int]] = field(default_factory=set)
    streams: set[tuple[int, int]] = field(default_factory=set)
    launches: dict[int, tuple[int, int, float]] = field(default_factory=dict)  # correlation -> (pid, tid, ts us)

    def us(self, ns: int) -> float:
        return (int(ns) - self.base_ns) / 1000.0

    def event(self, r: Mapping[str, Any]) -> dict[str, Any] | None:
        """One record as a complete event; ``None`` for a call Kineto would not write."""
        kind = int(r["kind"])
        start, end = int(r["start"]), int(r["end"])
        corr = int(r["correlation_id"])
        args: dict[str, Any] = {"correlation": corr}
        if corr in self.external_of:
            args["External id"] = self.external_of[corr]
        ev: dict[str, Any] = {"ph": "X", "ts": self.us(start), "dur": max(0, end - start) / 1000.0}
        if kind in (KIND_RUNTIME, KIND_DRIVER):
            name = api_call_name(self.api_name(kind, int(r["cbid"])))
            if not self._kept_call(kind, name, corr):
                return None
            proc = int(r["process_id"])
            thread = self.thread_ids.get(int(r["thread_id"]), int(r["thread_id"]))
            ev.update(cat="cuda_runtime" if kind == KIND_RUNTIME else "cuda_driver", name=name, pid=proc, tid=thread)
            args["cbid"] = int(r["cbid"])
            self.launches[corr] = (proc, thread, ev["ts"])
            self.threads.add((proc, thread))
        elif kind == KIND_SYNCHRONIZATION:
            ctx, stream = int(r["context_id"]), int(r["stream_id"])
            device = self.device_of_context.get(ctx, 0)
            ev.update(cat="cuda_sync", name=_name(SYNC_TYPES, r["type"]), pid=device,
                      tid=stream if stream != INVALID_ID else 0)
            args.update(device=device, context=ctx, stream=stream if stream != INVALID_ID else -1)
            if int(r.get("cuda_event_id", INVALID_ID)) != INVALID_ID:
                args["cuda_event_id"] = int(r["cuda_event_id"])
        else:
            self._gpu_work(r, ev, args)
        ev["args"] = args
        return ev

    def _kept_call(self, kind: int, name: str, corr: int) -> bool:
        return corr in self.launching or not is_noise_call(kind, name)

    def _gpu_work(self, r: Mapping[str, Any], ev: dict[str, Any], args: dict[str, Any]) -> None:
        kind = int(r["kind"])
        start, end = int(r["start"]), int(r["end"])
        device, stream = int(r["device_id"]), int(r["stream_id"])
        ev.update(pid=device, tid=stream)
        args.update(device=device, context=int(r["context_id"]), stream=stream)
        if kind in (KIND_KERNEL, KIND_CONCURRENT_KERNEL):
            ev.update(cat="kernel", name=demangle(str(r["name"])))
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
        self.streams.add((device, stream))

    def metadata(self, pid: int) -> list[dict[str, Any]]:
        """Process and thread names: the traced process, its threads, each device and stream."""
        meta: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                                       "args": {"name": "python"}}]
        meta += [{"ph": "M", "name": "thread_name", "pid": p, "tid": t, "args": {"name": f"thread {t}"}}
                 for p, t in sorted(self.threads)]
        for device in sorted({d for d, _ in self.streams}):
            meta.append({"ph": "M", "name": "process_name", "pid": device, "tid": 0,
                         "args": {"name": f"GPU {device}"}})
        meta += [{"ph": "M", "name": "thread_name", "pid": d, "tid": s, "args": {"name": f"stream {s}"}}
                 for d, s in sorted(self.streams)]
        return meta


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
