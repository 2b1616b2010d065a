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


NAMES = {211: "cudaLaunchKernel", 31: "cudaMemcpyAsync", 41: "cudaMemsetAsync", 131: "cudaStreamSynchronize"}


def convert() -> dict:
    phase = CpuRange(name="phase:prefill", start_ns=T0, end_ns=T0 + 41_000, pid=PID, tid=TID, external_id=7)
    return cupti_to_kineto(records(), annotations=[phase], api_name=lambda kind, cbid: NAMES[cbid], pid=PID,
                           device_names=["NVIDIA H100 80GB HBM3"])


def test_converted_records_read_back_as_linked_gpu_events(tmp_path: Path) -> None:
    path = tmp_path / "rank0.pt.trace.json.gz"
    path.write_bytes(gzip.compress(orjson.dumps(convert())))
    trace = load_trace(path)
    ev = trace.events.set_index(trace.events["name"].astype(str))
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
