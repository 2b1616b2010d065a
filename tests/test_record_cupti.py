"""The cupti backend: record conversion on CPU (records built from the documented fields of
cupti-python's activity classes), and a real recording on an NVIDIA GPU (``gpu`` marker)."""
from __future__ import annotations

import gzip
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest

from whatif.tracer import EventKind, load_trace
from whatif.tracer.record.cupti_records import (
    KIND_CONCURRENT_KERNEL,
    KIND_DRIVER,
    KIND_EXTERNAL_CORRELATION,
    KIND_MEMCPY,
    KIND_MEMSET,
    KIND_RUNTIME,
    KIND_SYNCHRONIZATION,
    CpuRange,
    cupti_to_kineto,
    snapshot,
)

T0 = 1_790_000_000_123_456_789  # ns on CUPTI's clock
PID, TID = 4242, 4243


def api(corr: int, cbid: int, start: int, end: int) -> dict:
    return {"kind": KIND_RUNTIME, "cbid": cbid, "start": T0 + start, "end": T0 + end, "process_id": PID,
            "thread_id": TID, "correlation_id": corr}


def records() -> list[dict]:
    kernel = {"kind": KIND_CONCURRENT_KERNEL, "name": "ampere_sgemm_128x64_nn", "start": T0 + 5_000,
              "end": T0 + 25_000, "device_id": 0, "context_id": 1, "stream_id": 7, "correlation_id": 10,
              "grid_x": 64, "grid_y": 2, "grid_z": 1, "block_x": 128, "block_y": 1, "block_z": 1,
              "registers_per_thread": 96, "static_shared_memory": 1024, "dynamic_shared_memory": 2048}
    memcpy = {"kind": KIND_MEMCPY, "copy_kind": 1, "src_kind": 1, "dst_kind": 3, "bytes": 4096,
              "start": T0 + 30_000, "end": T0 + 32_000, "device_id": 0, "context_id": 1, "stream_id": 7,
              "correlation_id": 11}
    memset = {"kind": KIND_MEMSET, "value": 0, "bytes": 512, "start": T0 + 33_000, "end": T0 + 33_500,
              "device_id": 0, "context_id": 1, "stream_id": 7, "correlation_id": 12}
    sync = {"kind": KIND_SYNCHRONIZATION, "type": 3, "start": T0 + 34_000, "end": T0 + 40_000,
            "correlation_id": 13, "context_id": 1, "stream_id": 7, "cuda_event_id": 0xFFFFFFFF}
    ext = [{"kind": KIND_EXTERNAL_CORRELATION, "external_kind": 1, "external_id": 7, "correlation_id": c}
           for c in (10, 11, 12, 13)]
    return [api(10, 211, 1_000, 4_000), api(11, 31, 26_000, 33_000), api(12, 41, 33_100, 33_200),
            api(13, 131, 33_900, 40_100), kernel, memcpy, memset, sync, *ext]


# CUPTI's callback names, as cupti.get_callback_name gives them (the version suffix included).
NAMES = {211: "cudaLaunchKernel_v7000", 31: "cudaMemcpyAsync_v3020", 41: "cudaMemsetAsync_v3020",
         131: "cudaStreamSynchronize_v3020"}


def convert() -> dict:
    phase = CpuRange(name="phase:prefill", start_ns=T0, end_ns=T0 + 41_000, pid=PID, tid=TID, external_id=7)
    return cupti_to_kineto(records(), annotations=[phase], api_name=lambda kind, cbid: NAMES[cbid], pid=PID,
                           device_properties=[{"name": "NVIDIA H100 80GB HBM3", "numSms": 132}])


def test_converted_records_read_back_as_linked_gpu_events(tmp_path: Path) -> None:
    path = tmp_path / "rank0.pt.trace.json.gz"
    path.write_bytes(gzip.compress(orjson.dumps(convert())))
    trace = load_trace(path)
    ev = trace.events.assign(args=trace.raw_args()).set_index(trace.events["name"].astype(str))
    kernel = ev.loc["ampere_sgemm_128x64_nn"]
    assert kernel["kind"] == EventKind.KERNEL
    assert (kernel["ts_ns"], kernel["dur_ns"]) == (T0 + 5_000, 20_000)  # exact ns through base + us
    assert (kernel["device"], kernel["stream"], kernel["correlation"], kernel["external_id"]) == (0, 7, 10, 7)
    assert kernel["args"]["grid"] == [64, 2, 1] and kernel["args"]["shared memory"] == 3072
    launch = ev.loc["cudaLaunchKernel"]
    assert launch["kind"] == EventKind.RUNTIME
    assert (launch["pid"], launch["tid"], launch["correlation"]) == (PID, TID, 10)
    copy = ev.loc["Memcpy HtoD (Pageable -> Device)"]
    assert copy["kind"] == EventKind.MEMCPY and copy["args"]["bytes"] == 4096
    assert ev.loc["Memset (Device)"]["kind"] == EventKind.MEMSET
    sync = ev.loc["Stream Sync"]
    assert sync["kind"] == EventKind.GPU_SYNC and (sync["device"], sync["stream"]) == (0, 7)
    phase = ev.loc["phase:prefill"]
    assert phase["kind"] == EventKind.ANNOTATION and phase["external_id"] == 7
    assert trace.ranks[0].gpu_name == "NVIDIA H100 80GB HBM3"


def test_launch_flows_pair_each_call_with_its_gpu_work() -> None:
    flows = [e for e in convert()["traceEvents"] if e.get("cat") == "ac2g"]
    starts = {e["id"]: (e["pid"], e["tid"]) for e in flows if e["ph"] == "s"}
    ends = {e["id"]: (e["pid"], e["tid"]) for e in flows if e["ph"] == "f"}
    assert starts == {10: (PID, TID), 11: (PID, TID), 12: (PID, TID)}
    assert ends == {10: (0, 7), 11: (0, 7), 12: (0, 7)}


def test_untimed_and_unknown_records_are_left_out() -> None:
    untimed = {**records()[4], "start": 0, "end": 0, "correlation_id": 99}
    doc = cupti_to_kineto([untimed, {"kind": 17}], api_name=lambda k, c: "x", pid=PID)
    assert [e for e in doc["traceEvents"] if e["ph"] == "X"] == []


def test_snapshot_keeps_documented_fields_of_a_record_object() -> None:
    obj = SimpleNamespace(**records()[6], extra_field="not copied")
    assert snapshot(obj) == records()[6]
    assert snapshot(SimpleNamespace(kind=17)) is None  # OVERHEAD: not converted


# What the H200 recordings of sample_traces/gpu/backends showed (bench/gpu_backends.py): mangled
# kernel names, CUPTI's versioned call names, Kineto-blocklisted runtime calls (cudaGetDevice
# around each launch), driver calls nested in runtime calls, and the calls of the annotated thread
# under CUPTI's thread id (the low 32 bits of pthread_self) rather than the system tid.
MAIN_PTHREAD, MAIN_TID = 0x45BA5740, 596
CALLBACKS = {(KIND_RUNTIME, 211): "cudaLaunchKernel_v7000", (KIND_RUNTIME, 3): "cudaGetDevice_v3020",
             (KIND_RUNTIME, 10): "cudaGetLastError_v3020", (KIND_RUNTIME, 131): "cudaStreamSynchronize_v3020",
             (KIND_DRIVER, 392): "cuDevicePrimaryCtxGetState", (KIND_DRIVER, 307): "cuLaunchKernel",
             (KIND_DRIVER, 735): "cuKernelGetName", (KIND_DRIVER, 31): "cuMemcpyHtoDAsync_v2"}
MANGLED = "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_"


def call(kind: int, cbid: int, corr: int, start: int, end: int, thread: int = MAIN_PTHREAD) -> dict:
    return {"kind": kind, "cbid": cbid, "start": T0 + start, "end": T0 + end, "process_id": PID,
            "thread_id": thread, "correlation_id": corr}


def kernel(corr: int, start: int, end: int, name: str = MANGLED) -> dict:
    return {"kind": KIND_CONCURRENT_KERNEL, "name": name, "start": T0 + start, "end": T0 + end, "device_id": 0,
            "context_id": 1, "stream_id": 7, "correlation_id": corr, "grid_x": 1, "grid_y": 1, "grid_z": 1,
            "block_x": 128, "block_y": 1, "block_z": 1, "registers_per_thread": 16, "static_shared_memory": 0,
            "dynamic_shared_memory": 0}


def h200_like() -> dict:
    recs = [call(KIND_RUNTIME, 3, 20, 1_000, 1_100),                   # cudaGetDevice before the launch
            call(KIND_RUNTIME, 211, 21, 1_200, 4_000),                 # cudaLaunchKernel ...
            call(KIND_DRIVER, 735, 22, 1_300, 1_400),                  # ... with a driver call inside
            kernel(21, 5_000, 6_000),
            call(KIND_RUNTIME, 10, 23, 4_100, 4_150),                  # cudaGetLastError after it
            call(KIND_DRIVER, 392, 24, 4_200, 4_250),                  # a lone driver query
            call(KIND_DRIVER, 307, 25, 4_300, 5_500),                  # cuLaunchKernel (cuBLAS, Triton)
            kernel(25, 6_000, 7_000, name="sm90_xmma_gemm_bf16bf16_bf16f32"),
            call(KIND_DRIVER, 31, 26, 7_100, 7_300),                   # an untracked driver call with GPU work
            {"kind": KIND_MEMCPY, "copy_kind": 1, "src_kind": 2, "dst_kind": 3, "bytes": 64, "start": T0 + 7_400,
             "end": T0 + 7_500, "device_id": 0, "context_id": 1, "stream_id": 7, "correlation_id": 26},
            call(KIND_RUNTIME, 131, 27, 7_600, 9_000),                 # cudaStreamSynchronize
            call(KIND_RUNTIME, 211, 28, 9_100, 9_900, thread=0xE0FC46C0),  # a thread the recorder never saw
            kernel(28, 10_000, 10_500)]
    step = CpuRange(name="ProfilerStep#1", start_ns=T0 + 500, end_ns=T0 + 11_000, pid=PID, tid=MAIN_TID,
                    external_id=3)
    return cupti_to_kineto(recs, annotations=[step], api_name=lambda kind, cbid: CALLBACKS[kind, cbid], pid=PID,
                           thread_ids={MAIN_PTHREAD: MAIN_TID})


def complete(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


def test_kernel_names_are_demangled_as_kineto_writes_them() -> None:
    names = [e["name"] for e in complete(h200_like()) if e["cat"] == "kernel"]
    assert names == ["void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
                     "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
                     "sm90_xmma_gemm_bf16bf16_bf16f32", names[0]]


def test_calls_are_the_ones_kineto_keeps_under_their_api_names() -> None:
    calls = [(e["cat"], e["name"]) for e in complete(h200_like()) if e["cat"] in ("cuda_runtime", "cuda_driver")]
    assert calls == [("cuda_runtime", "cudaLaunchKernel"), ("cuda_driver", "cuLaunchKernel"),
                     ("cuda_driver", "cuMemcpyHtoDAsync_v2"), ("cuda_runtime", "cudaStreamSynchronize"),
                     ("cuda_runtime", "cudaLaunchKernel")]


def test_calls_of_a_known_thread_nest_in_its_step_and_every_kernel_keeps_its_launch(tmp_path: Path) -> None:
    path = tmp_path / "rank0.pt.trace.json.gz"
    path.write_bytes(gzip.compress(orjson.dumps(h200_like())))
    trace = load_trace(path)
    ev = trace.events
    calls = ev[ev["kind"].isin([EventKind.RUNTIME, EventKind.DRIVER])]
    assert sorted(set(calls["tid"])) == [MAIN_TID, 0xE0FC46C0]
    assert (calls[calls["tid"] == MAIN_TID]["pid"] == PID).all()
    gpu = ev[ev["kind"].isin([EventKind.KERNEL, EventKind.MEMCPY])]
    assert set(gpu["correlation"]) <= set(calls["correlation"]) and len(gpu) == 4
    from whatif.depgraph.build import build_graph
    from whatif.depgraph.graph import TaskKind
    tasks = build_graph(trace).tasks
    assert set(tasks[tasks["kind"] == int(TaskKind.CPU_CALL)]["name"]) == {
        "cudaLaunchKernel", "cuLaunchKernel", "cuMemcpyHtoDAsync_v2", "cudaStreamSynchronize"}
    assert set(tasks[tasks["kind"] == int(TaskKind.KERNEL)]["step"]) == {1}


def test_device_properties_are_written_with_their_ids() -> None:
    doc = convert()
    assert doc["deviceProperties"] == [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}]


class FakeCupti:
    """The part of ``cupti.cupti`` the backend calls, on a CPU: a clock, no-op activity
    switches, and CUPTI's callback names."""

    CallbackDomain = SimpleNamespace(RUNTIME_API=1, DRIVER_API=2)
    ExternalCorrelationKind = SimpleNamespace(CUSTOM0=3)

    def __init__(self) -> None:
        self.now_ns = T0
        self.name_lookups = 0

    def get_timestamp(self) -> int:
        self.now_ns += 1_000
        return self.now_ns

    def get_callback_name(self, domain: int, cbid: int) -> str:
        self.name_lookups += 1
        return CALLBACKS[KIND_RUNTIME if domain == 1 else KIND_DRIVER, cbid]

    def activity_register_callbacks(self, *callbacks: object) -> None: ...
    def activity_enable(self, kind: int) -> None: ...
    def activity_disable(self, kind: int) -> None: ...
    def activity_flush_all(self, flag: int) -> None: ...
    def activity_push_external_correlation_id(self, kind: int, ext: int) -> None: ...
    def activity_pop_external_correlation_id(self, kind: int) -> None: ...


def test_backend_drops_noise_as_records_arrive_and_maps_its_threads(monkeypatch, tmp_path: Path) -> None:
    import threading

    import torch

    from whatif.tracer.record import cupti_backend
    from whatif.tracer.record.options import RecordOptions

    fake = FakeCupti()
    monkeypatch.setattr(cupti_backend, "check_cupti_available", lambda: fake)
    session = cupti_backend.CuptiSession(RecordOptions(output=tmp_path, backend="cupti"))
    session.start(lambda: None)
    with torch.autograd.profiler.record_function("phase:decode"):
        me = cupti_backend.cupti_thread_id(threading.get_ident())
        arrived = [call(KIND_RUNTIME, 3, 40 + i, 10_000 + i, 10_001 + i, thread=me) for i in range(50)]
        arrived += [call(KIND_RUNTIME, 211, 90, 11_000, 12_000, thread=me), kernel(90, 13_000, 14_000)]
        session._buffer_completed([SimpleNamespace(**r) for r in arrived])
    session.step()
    session.stop()
    assert len(session._records) == 2 and fake.name_lookups == 2  # one lookup per callback id
    events = complete(session.cycles[0])
    launch = next(e for e in events if e["cat"] == "cuda_runtime")
    assert launch["name"] == "cudaLaunchKernel" and launch["tid"] == threading.get_native_id()
    assert {e["name"] for e in events if e["cat"] == "user_annotation"} == {"phase:decode", "ProfilerStep#0",
                                                                             "ProfilerStep#1"}
    assert {e["tid"] for e in events if e["cat"] == "user_annotation"} == {threading.get_native_id()}


def _gpu_and_cupti() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and importlib.util.find_spec("cupti") is not None


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_and_cupti(), reason="needs an NVIDIA GPU, a CUDA driver and cupti-python")
def test_cupti_backend_records_kernels_on_a_gpu(tmp_path: Path) -> None:
    script = tmp_path / "gpu.py"
    script.write_text("import torch, whatif\nx = torch.randn(256, 256, device='cuda')\n"
                      "for i in range(3):\n    with whatif.phase('work'):\n        y = x @ x\n    whatif.step()\n"
                      "torch.cuda.synchronize()\n")
    driver = ("import sys; from whatif import cli; cli.COMMANDS = {'record': cli.COMMANDS['record']}; "
              "sys.exit(cli.main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", driver, "record", "--backend", "cupti", "-o", "run", str(script)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    trace = load_trace(tmp_path / "run")
    kinds = set(trace.events["kind"])
    assert {EventKind.KERNEL, EventKind.RUNTIME, EventKind.ANNOTATION} <= kinds
    kernels = trace.events[trace.events["kind"] == EventKind.KERNEL]
    assert (kernels["external_id"] > 0).all()
