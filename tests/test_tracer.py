"""The trace reader on small hand-written traces: format quirks of real traces, bad input, and
the event table's contract (columns, dtypes, order) that the graph builder relies on."""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from whatif.tracer import EventKind, TraceError, load_trace
from whatif.tracer.trace import COLUMNS

CPU_PID, CPU_TID, GPU_PID, STREAM = 100, 1, 0, 7
BASE_US = 1_700_000_000_000_000  # an epoch-microsecond start, as 2021-2023 traces use


def write(path: Path, doc: Any, gz: bool | None = None) -> Path:
    """Write ``doc`` as JSON (gzipped when the name ends in .gz)."""
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if (gz if gz is not None else path.name.endswith(".gz")) else data)
    return path


def x(cat: str, name: str, ts: float, dur: float, pid: Any = CPU_PID, tid: Any = CPU_TID, **args: Any) -> dict:
    ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        ev["args"] = args
    return ev


def launch_and_kernel(t: float, corr: int, ext: int = 5, runtime: str = "cuda_runtime", kernel: str = "kernel",
                      ext_key: str = "External id") -> list[dict]:
    """A cudaLaunchKernel at ``t`` and the kernel it launches, linked by ``corr``."""
    return [x(runtime, "cudaLaunchKernel", t, 5, correlation=corr, **{ext_key: ext}),
            x(kernel, "gemm", t + 10, 20, pid=GPU_PID, tid=STREAM, device=0, stream=STREAM, correlation=corr,
              **{ext_key: ext})]


def minimal(*extra: dict, **top: Any) -> dict:
    """A 2023-style trace: one op launching one kernel, plus ``extra`` events."""
    events = [x("cpu_op", "aten::mm", BASE_US, 40, **{"External id": 5}),
              *launch_and_kernel(BASE_US + 1, corr=11), *extra]
    return {"schemaVersion": 1, "traceEvents": events, **top}


def one_line_error(path: Path) -> str:
    """Load ``path``, expect a :class:`TraceError`, return its message (checked to be one line)."""
    with pytest.raises(TraceError) as info:
        load_trace(path)
    message = str(info.value)
    assert "\n" not in message and message.strip() == message
    return message


# --- the table's contract -------------------------------------------------------------------

def test_columns_dtypes_and_sort_order(tmp_path: Path) -> None:
    doc = minimal(x("user_annotation", "ProfilerStep#1", BASE_US, 100),  # same start as aten::mm, longer
                  x("cpu_op", "aten::relu", BASE_US - 50, 10))
    trace = load_trace(write(tmp_path / "t.json", doc))
    ev = trace.events
    assert tuple(ev.columns) == COLUMNS
    dtypes = {c: str(t) for c, t in ev.dtypes.items()}
    assert dtypes == {"rank": "int32", "ts_ns": "int64", "dur_ns": "int64", "kind": "int8", "name": "category",
                      "pid": "int64", "tid": "int64", "device": "int32", "stream": "int64",
                      "correlation": "int64", "external_id": "int64"}
    assert list(ev["name"]) == ["aten::relu", "ProfilerStep#1", "aten::mm", "cudaLaunchKernel", "gemm"]
    assert (np.diff(ev["ts_ns"].to_numpy()) >= 0).all()
    assert ev["ts_ns"].iloc[0] == (BASE_US - 50) * 1000
    kernel = ev[ev["kind"] == EventKind.KERNEL].iloc[0]
    assert (kernel.device, kernel.stream, kernel.correlation, kernel.external_id) == (0, STREAM, 11, 5)
    op = ev[ev["name"] == "aten::mm"].iloc[0]
    assert (op.device, op.stream, op.correlation) == (-1, -1, -1)
    assert trace.raw_args(np.flatnonzero(ev["name"] == "aten::mm"))[0] == {"External id": 5}


def test_args_are_kept_for_every_kind(tmp_path: Path) -> None:
    py = {"ph": "X", "cat": "python_function", "name": "nn.Module: Linear", "pid": CPU_PID, "tid": CPU_TID,
          "ts": BASE_US + 2, "dur": 3, "args": {"Python id": 7, "Python parent id": 3}}
    trace = load_trace(write(tmp_path / "t.json", minimal(py)))
    row = np.flatnonzero(trace.events["kind"] == EventKind.PYTHON)[0]
    assert trace.raw_args()[row] == {"Python id": 7, "Python parent id": 3}


# --- format quirks (../shared/traces/README.md, "Format quirks") ------------------------------

def test_2021_category_names_and_profiler_step_under_operator(tmp_path: Path) -> None:
    events = [x("Operator", "ProfilerStep#4", BASE_US, 500, tid="25738"),
              x("Operator", "aten::conv2d", BASE_US + 1, 100, tid="25738", **{"External id": 9}),
              *launch_and_kernel(BASE_US + 2, corr=3, ext=9, runtime="Runtime", kernel="Kernel",
                                 ext_key="external id"),
              x("Memcpy", "Memcpy HtoD", BASE_US + 50, 4, pid=GPU_PID, tid="stream 7", correlation=4),
              x("Memset", "Memset", BASE_US + 60, 0, pid=GPU_PID, tid="stream 7", correlation=5),
              {"ph": "s", "cat": "async", "name": "launch", "id": 3, "pid": CPU_PID, "tid": 25738, "ts": BASE_US + 2},
              {"ph": "f", "cat": "async", "name": "launch", "id": 3, "pid": GPU_PID, "tid": "stream 7",
               "ts": BASE_US + 12, "bp": "e"},
              {"ph": "i", "name": "[memory]", "pid": CPU_PID, "tid": 25738, "ts": BASE_US + 3, "s": "t",
               "args": {"Device Type": 0, "Device Id": -1, "Bytes": 4}},
              {"ph": "i", "name": "[memory]", "pid": CPU_PID, "tid": 25738, "ts": BASE_US + 4, "s": "t"},
              {"ph": "i", "name": "marker", "pid": CPU_PID, "tid": 25738, "ts": BASE_US + 5, "s": "t"}]
    trace = load_trace(write(tmp_path / "old.pt.trace.json.gz", {"schemaVersion": 1, "traceEvents": events}))
    ev = trace.events
    kinds = dict(zip(ev["name"], ev["kind"]))
    assert kinds == {"ProfilerStep#4": EventKind.ANNOTATION, "aten::conv2d": EventKind.CPU_OP,
                     "cudaLaunchKernel": EventKind.RUNTIME, "gemm": EventKind.KERNEL,
                     "Memcpy HtoD": EventKind.MEMCPY, "Memset": EventKind.MEMSET}
    # lowercase "external id" on runtime/GPU events links them to the op's "External id"
    assert set(ev.loc[ev["name"].isin(["aten::conv2d", "cudaLaunchKernel", "gemm"]), "external_id"]) == {9}
    # launch flows are not kept (the correlation id is the link); allocator records are kept (2021: no
    # cat, sizes only), one without args is malformed; other instants are counted
    assert trace.flows == []
    assert trace.ranks[0].skipped["launch_flow"] == 2 and trace.ranks[0].skipped["instant"] == 1
    assert trace.memory["bytes"].tolist() == [4] and trace.ranks[0].skipped["malformed"] == 1
    assert trace.ranks[0].category_counts["Operator"] == 2


def test_string_tids_stream_and_numeric(tmp_path: Path) -> None:
    events = [x("Operator", "aten::add", BASE_US, 10, tid="25738"),
              x("Kernel", "add_kernel", BASE_US + 5, 2, pid=0, tid="stream 7"),  # no device/stream args
              {"ph": "f", "cat": "fwdbwd", "id": 1, "pid": CPU_PID, "tid": 25738, "ts": BASE_US, "bp": "e"}]
    trace = load_trace(write(tmp_path / "t.json", {"traceEvents": events}))
    ev = trace.events
    op = ev[ev["name"] == "aten::add"].iloc[0]
    kernel = ev[ev["name"] == "add_kernel"].iloc[0]
    assert op.tid == 25738 and trace.flows[0][1].tid == 25738  # the int used by flows joins the string
    assert (kernel.tid, kernel.stream, kernel.device) == (7, 7, 0)


def test_float_ts_relative_to_base_time_ns_exact(tmp_path: Path) -> None:
    base_ns = 1_711_964_646_000_000_000
    # ts around 4.5e12 us: a double holds them to ~1 ns; ts * 1000 rounded would be off by one
    events = [x("cpu_op", "aten::mm", 4458676522690.655, 12.345),
              x("cpu_op", "aten::add", 4458676522709.059, 0.5)]
    ev = load_trace(write(tmp_path / "t.json", {"traceEvents": events, "baseTimeNanoseconds": base_ns,
                                                 "displayTimeUnit": "ms"})).events
    assert list(ev["ts_ns"]) == [base_ns + 4458676522690655, base_ns + 4458676522709059]
    assert list(ev["dur_ns"]) == [12345, 500]


def test_display_time_unit_does_not_scale_ts(tmp_path: Path) -> None:
    for unit in ("ns", "ms"):
        ev = load_trace(write(tmp_path / f"{unit}.json", minimal(displayTimeUnit=unit))).events
        assert ev["ts_ns"].min() == BASE_US * 1000 and ev["dur_ns"].max() == 40_000


def test_missing_metadata_events(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path / "trimmed.json.gz", minimal()))
    assert trace.ranks[0].thread_names == {} and trace.ranks[0].process_names == {}
    assert trace.count(EventKind.KERNEL) == 1
    named = minimal({"ph": "M", "name": "thread_name", "pid": CPU_PID, "tid": CPU_TID, "args": {"name": "main "}},
                    {"ph": "M", "name": "process_name", "pid": GPU_PID, "args": {"name": "GPU 0"}})
    info = load_trace(write(tmp_path / "named.json", named)).ranks[0]
    assert info.thread_names == {(CPU_PID, CPU_TID): "main"} and info.process_names == {GPU_PID: "GPU 0"}


def test_graph_launch_one_correlation_many_kernels(tmp_path: Path) -> None:
    kernels = [x("kernel", f"graph_kernel_{i}", BASE_US + 10 + 5 * i, 4, pid=GPU_PID, tid=STREAM, device=0,
                 stream=STREAM, correlation=77) for i in range(3)]  # AMD: no External id on graph kernels
    doc = {"traceEvents": [x("cuda_runtime", "hipGraphLaunch", BASE_US, 8, correlation=77), *kernels]}
    ev = load_trace(write(tmp_path / "t.json", doc)).events
    assert list(ev["correlation"]) == [77, 77, 77, 77]
    assert list(ev.loc[ev["kind"] == EventKind.KERNEL, "external_id"]) == [-1, -1, -1]


def test_hip_runtime_names_and_amd_pid(tmp_path: Path) -> None:
    """AMD: HIP calls under cat cuda_runtime, GPU pid = device index 2 (not the rank), stream 0."""
    events = [x("cuda_runtime", "hipExtModuleLaunchKernel", BASE_US, 6, correlation=9, kernel="k"),
              x("kernel", "Cijk_gemm", BASE_US + 20, 30, pid=2, tid=0, device=2, stream=0, correlation=9,
                kind="Dispatch Kernel")]
    trace = load_trace(write(tmp_path / "t.json", {"traceEvents": events, "distributedInfo": {"rank": 0}}))
    ev = trace.events
    assert list(ev["kind"]) == [EventKind.RUNTIME, EventKind.KERNEL] and trace.ranks[0].rank == 0
    assert (ev["device"].iloc[1], ev["stream"].iloc[1]) == (2, 0)
    no_kernels = {"traceEvents": [x("cuda_runtime", "hipGraphLaunch", BASE_US, 6, correlation=9)]}
    assert "1 kernel launches/copies" in one_line_error(write(tmp_path / "hip.json", no_kernels))


def test_collective_metadata_and_overlap_kept(tmp_path: Path) -> None:
    """NCCL kernels keep their args; same-stream GPU events that overlap are kept as recorded."""
    nccl = {"Collective name": "allreduce", "In msg nelems": 1024, "Group size": 8, "dtype": "Float"}
    events = [x("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", BASE_US, 50, pid=0, tid=STREAM, device=0,
                stream=STREAM, correlation=1, **nccl),
              x("kernel", "gemm", BASE_US + 48, 10, pid=0, tid=STREAM, device=0, stream=STREAM, correlation=2)]
    trace = load_trace(write(tmp_path / "t.json", {"traceEvents": events}))
    assert {k: trace.raw_args()[0][k] for k in nccl} == nccl and len(trace.events) == 2


def test_device_names_from_either_key_and_syncs_off_stream(tmp_path: Path) -> None:
    sync = x("cuda_sync", "Event Sync", BASE_US + 50, 3, pid=0, tid=-1, device=0, stream=-1, correlation=12,
             wait_on_cuda_event_record_corr_id=11)
    old = load_trace(write(tmp_path / "old.json", minimal(sync, computeProperties=[{"name": "Tesla V100"}])))
    assert old.ranks[0].gpu_name == "Tesla V100"
    row = old.events[old.events["kind"] == EventKind.GPU_SYNC].iloc[0]
    assert (row.device, row.stream) == (0, -1)  # waits on no stream of its own
    blank = load_trace(write(tmp_path / "blank.json", minimal(deviceProperties=[{"name": ""}, {"name": ""}])))
    assert blank.ranks[0].device_names == ["", ""] and blank.ranks[0].gpu_name is None


def test_zero_duration_and_missing_duration(tmp_path: Path) -> None:
    events = [x("Kernel", "tiny", BASE_US, 0, pid=GPU_PID, tid="stream 7"),
              {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": CPU_PID, "tid": CPU_TID,
               "ts": BASE_US - 5}]
    ev = load_trace(write(tmp_path / "t.json", {"traceEvents": events})).events
    assert list(ev["dur_ns"]) == [0, 0] and len(ev) == 2


def test_string_pids_and_ignored_categories(tmp_path: Path) -> None:
    doc = minimal({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
                   "ts": BASE_US, "dur": 1000, "args": {"Op count": 0}},
                  {"ph": "M", "name": "process_name", "pid": "Spans", "args": {"name": "spans"}},
                  {"ph": "M", "name": "process_name", "pid": "", "args": {"name": "empty"}},
                  x("user_annotation", "marker", BASE_US + 3, 1, pid="Spans", tid=""))
    trace = load_trace(write(tmp_path / "t.json", doc))
    ev = trace.events
    assert "PyTorch Profiler (0)" not in set(ev["name"])  # category "Trace" carries nothing for the graph
    assert trace.ranks[0].category_counts["Trace"] == 1
    marker = ev[ev["name"] == "marker"].iloc[0]
    assert marker.pid < 0 and marker.pid != -1  # a stable id of its own, not "unknown"
    names = trace.ranks[0].process_names
    assert names[marker.pid] == "spans"  # the same string pid gets the same id everywhere
    assert sorted(names.values()) == ["empty", "spans"]


def test_large_64_bit_ids(tmp_path: Path) -> None:
    big = 2**64 - 1
    doc = minimal(x("cpu_op", "record_param_comms", BASE_US + 30, 5,
                    **{"External id": 2**53 + 1, "Comms Id": big, "correlation": 2**63 + 5}))
    trace = load_trace(write(tmp_path / "t.json", doc))
    ev = trace.events
    row = ev[ev["name"] == "record_param_comms"].iloc[0]
    assert trace.raw_args(np.flatnonzero(ev["name"] == "record_param_comms"))[0]["Comms Id"] == big  # exact
    assert row.external_id == 2**53 + 1
    assert row.correlation == 2**63 + 5 - 2**64  # unsigned 64-bit wraps to int64, distinct from -1


def test_list_top_level_and_odd_values(tmp_path: Path) -> None:
    events = [*minimal()["traceEvents"], 42, "junk", {"ph": "X", "cat": "cpu_op", "name": "bad ts", "ts": "soon"},
              x("cpu_op", None, BASE_US + 2, 1), x(["weird"], "listcat", BASE_US + 3, 1)]
    trace = load_trace(write(tmp_path / "t.json", events))
    names = set(trace.events["name"])
    assert {"aten::mm", "gemm", "None", "listcat"} <= names and "bad ts" not in names
    assert trace.ranks[0].skipped["malformed"] == 3


# --- bad input: one line naming the file and the problem ---------------------------------------

def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.json"
    path.write_bytes(b"")
    assert one_line_error(path) == f"{path}: empty file"


def test_truncated_gzip(tmp_path: Path) -> None:
    data = gzip.compress(json.dumps(minimal()).encode() * 50)
    path = tmp_path / "cut.json.gz"
    path.write_bytes(data[: len(data) // 2])
    message = one_line_error(path)
    assert message.startswith(str(path)) and "truncated gzip" in message


def test_corrupt_gzip(tmp_path: Path) -> None:
    path = tmp_path / "bad.json.gz"
    path.write_bytes(b"\x1f\x8b" + b"not deflate data" * 4)
    message = one_line_error(path)
    assert message.startswith(str(path)) and "gzip" in message


def test_invalid_json(tmp_path: Path) -> None:
    for name, text in [("broken.json", b'{"traceEvents": [{"ph": "X",'), ("words.json", b"hello world")]:
        path = tmp_path / name
        path.write_bytes(text)
        message = one_line_error(path)
        assert message.startswith(f"{path}: not valid JSON")


@pytest.mark.parametrize("doc", [{"a": 1}, [1, 2], {"traceEvents": 5}, 3, [{"a": 1}]],
                         ids=["object", "numbers", "events-not-list", "scalar", "no-phase"])
def test_json_that_is_not_a_trace(tmp_path: Path, doc: Any) -> None:
    path = write(tmp_path / "other.json", doc)
    assert one_line_error(path).startswith(f"{path}: not a Chrome/Kineto trace")


def test_trace_without_events(tmp_path: Path) -> None:
    path = write(tmp_path / "none.json", {"traceEvents": []})
    assert one_line_error(path) == f"{path}: trace has no events"


def test_folder_without_traces(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("nothing here")
    (tmp_path / "meta.json").write_text("{}")
    assert one_line_error(tmp_path) == f"{tmp_path}: folder holds no trace files (*.json, *.json.gz)"


def test_missing_path(tmp_path: Path) -> None:
    assert one_line_error(tmp_path / "nope.json").endswith("no such file or folder")


def test_two_files_claim_one_rank(tmp_path: Path) -> None:
    for name in ("a.json", "b.json"):
        write(tmp_path / name, minimal(distributedInfo={"rank": 0, "world_size": 2}))
    message = one_line_error(tmp_path)
    assert message == f"{tmp_path}: mixed ranks: a.json and b.json both claim rank 0"


def test_world_sizes_disagree(tmp_path: Path) -> None:
    write(tmp_path / "rank0.json", minimal(distributedInfo={"rank": 0, "world_size": 2}))
    write(tmp_path / "rank1.json", minimal(distributedInfo={"rank": 1, "world_size": 4}))
    assert one_line_error(tmp_path) == (f"{tmp_path}: mixed ranks: files disagree on world size "
                                        "(rank0.json says 2, rank1.json says 4)")


def test_bad_file_in_a_folder_is_named(tmp_path: Path) -> None:
    write(tmp_path / "rank0.json", minimal(distributedInfo={"rank": 0, "world_size": 2}))
    (tmp_path / "rank1.json").write_bytes(b"")
    assert one_line_error(tmp_path) == f"{tmp_path / 'rank1.json'}: empty file"


def test_no_gpu_activity_refused(tmp_path: Path) -> None:
    doc = {"traceEvents": [x("cpu_op", "aten::mm", BASE_US, 40),
                           x("cuda_runtime", "cudaLaunchKernel", BASE_US + 1, 5, correlation=1)]}
    message = one_line_error(write(tmp_path / "t.json", doc))
    assert "no GPU activity recorded: 1 kernel launches/copies" in message


def test_concatenated_gzip_members(tmp_path: Path) -> None:
    text = json.dumps(minimal()).encode()
    path = tmp_path / "two.json.gz"
    path.write_bytes(gzip.compress(text[:100]) + gzip.compress(text[100:]))
    assert len(load_trace(path).events) == 3


# --- ranks --------------------------------------------------------------------------------------

def test_folder_of_ranks(tmp_path: Path) -> None:
    for rank in (1, 0):
        write(tmp_path / f"rank-{rank}.json.gz", minimal(distributedInfo={"rank": rank, "world_size": 2}))
    trace = load_trace(tmp_path)
    assert [r.rank for r in trace.ranks] == [0, 1] and [r.world_size for r in trace.ranks] == [2, 2]
    assert list(trace.events["rank"]) == [0, 0, 0, 1, 1, 1]
    assert trace.events["name"].cat.categories.tolist() == sorted({"aten::mm", "cudaLaunchKernel", "gemm"})


def test_rank_from_file_name_when_distributed_info_is_missing(tmp_path: Path) -> None:
    for rank in (3, 2):
        write(tmp_path / f"job_rank{rank}.json", minimal())
    assert [r.rank for r in load_trace(tmp_path).ranks] == [2, 3]
    write(tmp_path / "extra.json", minimal())
    assert "mixed ranks: extra.json names no rank" in one_line_error(tmp_path)


@pytest.mark.parametrize("layout", ["events-first", "events-last", "lists-after", "ph-last", "compact"])
def test_top_level_layouts(tmp_path: Path, layout: str) -> None:
    """Metadata before or after the events, lists of objects after them, "ph" as the last key of
    the last event, no whitespace: the reader finds the events array and every top-level key."""
    events = minimal()["traceEvents"]
    if layout == "ph-last":
        events = [{k: v for k, v in ev.items() if k != "ph"} | {"ph": ev["ph"]} for ev in events]
    meta = {"deviceProperties": [{"id": 0, "name": "GPU A"}], "distributedInfo": {"rank": 0, "world_size": 1},
            "ERROR": ["[W] profiler said [something]"], "traceName": "t.json"}
    if layout == "events-first":
        doc = {"traceEvents": events, **meta}
    elif layout == "lists-after":
        doc = {"traceName": "t.json", "traceEvents": events, "deviceProperties": meta["deviceProperties"],
               "ERROR": meta["ERROR"], "distributedInfo": meta["distributedInfo"]}
    else:
        doc = {**meta, "traceEvents": events}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc, indent=None if layout == "compact" else 2,
                               separators=(",", ":") if layout == "compact" else None))
    trace = load_trace(path)
    info = trace.ranks[0]
    assert len(trace.events) == 3 and info.gpu_name == "GPU A" and info.world_size == 1
    assert {k: info.metadata[k] for k in meta} == meta and "traceEvents" not in info.metadata
