"""The reader spells event names as Kineto does in traces written from raw CUPTI records
(mangled kernels, ``cudaStreamSynchronize_v3020``), and keeps a Kineto trace's names as written
(``tracer/names.py``)."""
from __future__ import annotations

import gzip
from pathlib import Path

import orjson

from whatif.tracer import EventKind, load_trace
from whatif.tracer import names as names_module
from whatif.tracer.names import demangle, kineto_name

MANGLED = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_"


def trace_doc(kernel_name: str, sync_name: str, launch_name: str = "cudaLaunchKernel_v7000") -> dict:
    def x(cat: str, name: str, ts: float, dur: float, tid: int, **args: object) -> dict:
        return {"ph": "X", "cat": cat, "name": name, "pid": 0 if cat == "kernel" else 10, "tid": tid,
                "ts": ts, "dur": dur, "args": args}

    return {"traceEvents": [
        x("user_annotation", "ProfilerStep#0", 0, 100, 11),
        x("cuda_runtime", launch_name, 1, 4, 11, correlation=5),
        x("kernel", kernel_name, 10, 30, 7, correlation=5, device=0, stream=7),
        x("cuda_runtime", sync_name, 6, 40, 11, correlation=6),
    ]}


def load(tmp_path: Path, doc: dict):
    path = tmp_path / "t.pt.trace.json.gz"
    path.write_bytes(gzip.compress(orjson.dumps(doc)))
    return load_trace(path)


def test_mangled_kernels_and_versioned_calls_read_as_kineto_names(tmp_path: Path) -> None:
    trace = load(tmp_path, trace_doc(MANGLED, "cudaStreamSynchronize_v3020"))
    ev = trace.events
    kernel = ev[ev["kind"] == EventKind.KERNEL]["name"].astype(str).tolist()
    assert kernel == ["void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
                      "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)"]
    calls = sorted(ev[ev["kind"] == EventKind.RUNTIME]["name"].astype(str))
    assert calls == ["cudaLaunchKernel", "cudaStreamSynchronize"]


def test_a_kineto_trace_keeps_the_kernel_names_it_wrote(tmp_path: Path) -> None:
    trace = load(tmp_path, trace_doc(MANGLED, "cudaStreamSynchronize", launch_name="cudaLaunchKernel"))
    assert MANGLED in set(trace.events["name"].astype(str))


def test_two_raw_spellings_of_one_kernel_become_one_name(tmp_path: Path) -> None:
    doc = trace_doc(MANGLED, "cudaStreamSynchronize_v3020")
    twin = {**doc["traceEvents"][2], "name": demangle(MANGLED), "ts": 50}
    doc["traceEvents"].append(twin)
    ev = load(tmp_path, doc).events
    kernels = ev[ev["kind"] == EventKind.KERNEL]["name"].astype(str)
    assert kernels.tolist() == [demangle(MANGLED)] * 2


def test_without_libstdcxx_names_stay_mangled(monkeypatch) -> None:
    monkeypatch.setattr(names_module, "_cxa_demangle", lambda: None)
    demangle.cache_clear()
    try:
        assert kineto_name(MANGLED) == MANGLED
        assert kineto_name("cudaLaunchKernel_v7000") == "cudaLaunchKernel"
    finally:
        demangle.cache_clear()
