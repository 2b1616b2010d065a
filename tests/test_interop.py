"""Interop with HolisticTraceAnalysis and TraceLens, checked without them (fast lane): what
``whatif export`` keeps of its input, its files and flow ids, the round trip, and the run folder
layout HTA 0.5.0 reads. The peers themselves run in tests/test_interop_peers.py (slow)."""
from __future__ import annotations

import gzip
import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from conftest import SHARED_TRACES
from test_shared_replay import REFUSED, shared_inputs
from tracegen import KinetoTrace

from whatif.api import analyze
from whatif.cli import main
from whatif.depgraph.graph import TaskKind
from whatif.tracer.kinds import GPU_KINDS
from whatif.tracer.readers import OLD_RUN_META_NAME, RUN_META_NAME, run_meta_path
from whatif.tracer.record.output import prepare_output
from whatif.tracer.record.trace_file import write_trace
from whatif.tracer.trace import Trace, load_trace

HTA_RANK = re.compile(r'"rank":\s+(\d+)')  # HTA 0.5.0, hta/common/trace_file.py: create_rank_to_trace_dict


def hta_rank_map(folder: Path) -> dict[str, int]:
    """HTA 0.5.0's reading of a folder: every ``*.gz``/``*.json`` file is a trace, whose rank is the
    first match of its pattern (read line by line), else 0 (of two files of one rank, it keeps the
    one ``os.listdir`` gives last)."""
    ranks: dict[str, int] = {}
    for f in sorted(os.listdir(folder)):
        if not (f.endswith(".gz") or f.endswith(".json")):
            continue
        raw = (folder / f).read_bytes()
        text = (gzip.decompress(raw) if f.endswith("gz") else raw).decode()
        match = next((m for line in text.splitlines(keepends=True) if (m := HTA_RANK.search(line))), None)
        ranks[f] = int(match.group(1)) if match else 0
    return ranks


def two_rank_folder(folder: Path) -> Path:
    """Two ranks of a training step: nested ops with shapes, a launch, a GEMM, an all-reduce, a
    backward flow; the same correlation ids on both ranks (as real ranks have)."""
    folder.mkdir()
    for rank in (0, 1):
        tr = KinetoTrace(rank=rank, world_size=2)
        for n in range(3):
            t0 = n * 300
            tr.step(n, t0, 280)
            tr.op("aten::linear", t0 + 2, 60, args={"Input Dims": [[8, 16], [32, 16]], "Input type": ["float", "float"],
                                                    "External id": 10 * n + 1})
            tr.op("aten::addmm", t0 + 4, 50, args={"Input Dims": [[32], [8, 16], [16, 32]], "External id": 10 * n + 2,
                                                   "Concrete Inputs": ["", "", "", "1", "1"]})
            tr.runtime("cudaLaunchKernel", t0 + 10, 8, corr=100 + n)
            tr.gpu("sm80_xmma_gemm_f32f32", t0 + 30, 40 + 10 * rank, corr=100 + n)
            tr.op("c10d::allreduce_", t0 + 70, 30, args={"External id": 10 * n + 3})
            tr.runtime("cudaLaunchKernel", t0 + 75, 8, corr=200 + n)
            tr.gpu("ncclDevKernel_AllReduce_Sum_f32_RING_LL", t0 + 100, 60, corr=200 + n, stream=9)
            tr.flow("fwdbwd", n + 1, "s", t0 + 3, 1)
            tr.flow("fwdbwd", n + 1, "f", t0 + 71, 1)
        tr.write(folder / f"rank{rank}.pt.trace.json.gz")
    return folder


def file_doc(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    return orjson.loads(gzip.decompress(raw) if path.name.endswith(".gz") else raw)


def parents(trace: Trace) -> Counter[tuple[int, str, str, str]]:
    """(rank, event, its innermost enclosing event on the thread, the event's args) of every CPU event."""
    ev = trace.events.assign(args=trace.raw_args())
    out: Counter[tuple[int, str, str, str]] = Counter()
    cpu = ev[~ev["kind"].isin([int(k) for k in GPU_KINDS])]
    for (_, _, _), group in cpu.groupby(["rank", "pid", "tid"], sort=True):
        stack: list[tuple[int, str]] = []
        for rank, name, ts, dur, args in zip(group["rank"], group["name"].astype(str), group["ts_ns"], group["dur_ns"],
                                             group["args"]):
            while stack and stack[-1][0] <= ts:  # the innermost open event ended before this one
                stack.pop()
            out[(int(rank), name, stack[-1][1] if stack else "", json.dumps(args, sort_keys=True))] += 1
            stack.append((int(ts + dur), name))
    return out


def same_content(a: Trace, b: Trace) -> None:
    """Same events per rank and kind, same names and args, same nesting on the threads."""
    key = ["rank", "kind"]
    assert a.events.groupby(key).size().to_dict() == b.events.groupby(key).size().to_dict()
    assert parents(a) == parents(b)
    gpu_a = a.events[a.events["kind"].isin([int(k) for k in GPU_KINDS])]
    gpu_b = b.events[b.events["kind"].isin([int(k) for k in GPU_KINDS])]
    assert Counter(zip(gpu_a["name"].astype(str), gpu_a["correlation"], gpu_a["stream"])) == \
        Counter(zip(gpu_b["name"].astype(str), gpu_b["correlation"], gpu_b["stream"]))


def round_trips(path: Path, out: Path) -> None:
    """analyze(export(trace)): the same tasks (per rank, kind and name) and, measured, the replay's step times."""
    a = analyze(path)
    b = analyze(a.export(out))
    cols = ["rank", "kind", "name"]
    assert a.graph.tasks.groupby(cols, observed=True).size().to_dict() == \
        b.graph.tasks.groupby(cols, observed=True).size().to_dict()
    assert a.steps[["rank", "step"]].values.tolist() == b.steps[["rank", "step"]].values.tolist()
    assert np.array_equal(b.steps["measured_ns"].to_numpy(), a.steps["predicted_ns"].to_numpy())


def test_export_keeps_every_event_its_nesting_args_and_metadata(tmp_path: Path) -> None:
    src = two_rank_folder(tmp_path / "in")
    out = analyze(src).export(tmp_path / "out")
    same_content(load_trace(src), load_trace(out))
    for rank in (0, 1):
        doc = file_doc(out / f"rank{rank}.pt.trace.json.gz")
        assert doc["distributedInfo"] == {"backend": "nccl", "rank": rank, "world_size": 2}
        assert doc["deviceProperties"] == [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}]
        addmm = [e for e in doc["traceEvents"] if e.get("name") == "aten::addmm"]
        assert [e["cat"] for e in addmm] == ["cpu_op"] * 3
        assert addmm[0]["args"]["Concrete Inputs"] == ["", "", "", "1", "1"]


def test_export_writes_one_file_per_rank_with_unique_flow_ids(tmp_path: Path) -> None:
    src = two_rank_folder(tmp_path / "in")
    assert main(["export", str(src), "-o", str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    for rank in (0, 1):
        events = file_doc(tmp_path / "out" / f"rank{rank}.pt.trace.json.gz")["traceEvents"]
        flows = Counter((e["id"], e["ph"]) for e in events if e.get("ph") in ("s", "f"))
        assert set(flows.values()) == {1}, "a flow id used twice in one file"
        assert {i for i, ph in flows if ph == "s"} == {i for i, ph in flows if ph == "f"}
        assert Counter(e["cat"] for e in events if e.get("ph") == "s") == {"ac2g": 6, "fwdbwd": 3}
        assert {e["id"] for e in events if e.get("ph") == "s" and e["cat"] == "ac2g"} == {100, 101, 102, 200, 201, 202}
    assert hta_rank_map(tmp_path / "out") == {"rank0.pt.trace.json.gz": 0, "rank1.pt.trace.json.gz": 1}


def test_export_moves_nested_events_with_their_tasks(tmp_path: Path) -> None:
    """A launch call's and a GEMM's event land exactly on their task's replayed interval, and the
    operator around a launch still holds it."""
    src = two_rank_folder(tmp_path / "in")
    a = analyze(src)
    out = a.export(tmp_path / "out")
    t = a.graph.tasks
    ev = a.trace.events
    base = file_doc(out / "rank0.pt.trace.json.gz")["baseTimeNanoseconds"]
    for rank in (0, 1):
        events = [e for e in file_doc(out / f"rank{rank}.pt.trace.json.gz")["traceEvents"] if e.get("ph") == "X"]
        pinned = (t["rank"] == rank) & t["kind"].isin([int(TaskKind.CPU_CALL), int(TaskKind.KERNEL)])
        for i in np.flatnonzero(pinned.to_numpy()).tolist():
            row = int(t["event"].iat[i])
            name, corr = str(ev["name"].iat[row]), int(ev["correlation"].iat[row])
            match = [e for e in events if e["name"] == name and e.get("args", {}).get("correlation") == corr]
            assert len(match) == 1
            assert round(match[0]["ts"] * 1000) + base == int(a.replay.start_ns[i])
            assert round((match[0]["ts"] + match[0]["dur"]) * 1000) + base == int(a.replay.end_ns[i])
        linear = sorted((e for e in events if e["name"] == "aten::linear"), key=lambda e: e["ts"])
        launches = sorted((e for e in events if e["name"] == "cudaLaunchKernel"), key=lambda e: e["ts"])
        for op, call in zip(linear, launches[::2]):
            assert op["ts"] <= call["ts"] and call["ts"] + call["dur"] <= op["ts"] + op["dur"]


def test_export_round_trips_a_two_rank_trace(tmp_path: Path) -> None:
    round_trips(two_rank_folder(tmp_path / "in"), tmp_path / "out")


@pytest.mark.parametrize("name", ["hta/critical_path_alexnet_a100.json.gz",
                                  "tracelens/hf_h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
                                  "hta/sampled_world128"])
def test_export_of_shared_traces_round_trips_and_keeps_events(shared_traces: Path, tmp_path: Path, name: str) -> None:
    src = shared_traces / name
    out = tmp_path / ("out" if src.is_dir() else "out.json.gz")
    round_trips(src, out)
    same_content(load_trace(src), load_trace(out))


def test_export_of_several_ranks_to_a_file_name_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = two_rank_folder(tmp_path / "in")
    assert main(["export", str(src), "-o", str(tmp_path / "x.json.gz")]) == 2
    err = capsys.readouterr().err.strip()
    assert "2 ranks are written one file per rank; name a folder" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "x.json.gz").exists()


def test_run_folder_is_read_by_hta_with_every_rank(tmp_path: Path) -> None:
    """The recorder's writers: a trace per rank whose distributedInfo HTA's pattern finds, and
    metadata HTA does not take for a trace; whatif loads both ranks."""
    run = tmp_path / "run"
    for rank in (0, 1):
        doc = KinetoTrace(rank=rank, world_size=2).document()
        doc["traceEvents"] = [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 10.0,
                               "dur": 5.0, "args": {"rank": 7}}]
        write_trace(run / f"rank{rank}.pt.trace.json.gz", doc)
    (run / RUN_META_NAME).write_text(json.dumps({"rank": 0, "world_size": 2}, indent=2))
    assert hta_rank_map(run) == {"rank0.pt.trace.json.gz": 0, "rank1.pt.trace.json.gz": 1}
    assert sorted(load_trace(run).events["rank"].unique().tolist()) == [0, 1]
    (run / OLD_RUN_META_NAME).write_text(json.dumps({"rank": 0}, indent=2))  # what HTA took for a trace before
    assert hta_rank_map(run)[OLD_RUN_META_NAME] == 0


def test_old_run_folders_keep_loading(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    tr = KinetoTrace()
    tr.step(0, 0, 50)
    tr.write(run / "rank0.pt.trace.json.gz")
    (run / OLD_RUN_META_NAME).write_text(json.dumps({"argv": [], "cwd": str(tmp_path)}))
    assert run_meta_path(run) == run / OLD_RUN_META_NAME
    assert len(load_trace(run).ranks) == 1
    (run / RUN_META_NAME).write_text("{}")
    assert run_meta_path(run) == run / RUN_META_NAME
    prepare_output(run, rank=0, world_size=2, force=True)  # a new recording replaces both names
    assert run_meta_path(run) is None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "corpus_input" in metafunc.fixturenames:
        names = shared_inputs(SHARED_TRACES) if SHARED_TRACES.is_dir() else ["<absent>"]
        metafunc.parametrize("corpus_input", [n for n in names if n not in REFUSED])


@pytest.mark.slow
def test_every_shared_trace_round_trips(shared_traces: Path, tmp_path: Path, corpus_input: str) -> None:
    src = shared_traces / corpus_input
    round_trips(src, tmp_path / ("out" if src.is_dir() else "out.json.gz"))


def test_export_of_an_edited_graph_moves_scaled_work_and_leaves_out_removed_work(tmp_path: Path) -> None:
    from whatif.predictors.export import chrome_traces
    from whatif.predictors.replay import replay
    from whatif.transforms import edit

    a = analyze(two_rank_folder(tmp_path / "in"))
    t = a.graph.tasks
    gemms = np.flatnonzero((t["name"].astype(str) == "sm80_xmma_gemm_f32f32").to_numpy())
    halved = edit.scale(a.graph, gemms, 0.5, reason="test")
    r = replay(halved)
    docs = chrome_traces(r)
    for i in gemms.tolist():
        rank, corr = int(t["rank"].iat[i]), int(a.trace.events["correlation"].iat[int(t["event"].iat[i])])
        e = next(e for e in docs[rank]["traceEvents"] if e.get("args", {}).get("correlation") == corr
                 and e["cat"] == "kernel" and e["name"] == "sm80_xmma_gemm_f32f32")
        assert round(e["dur"] * 1000) == int(r.end_ns[i] - r.start_ns[i]) == int(t["dur_ns"].iat[i]) // 2
    removed = chrome_traces(replay(edit.remove(a.graph, gemms[:1], reason="test")))
    kernels = [e for d in removed.values() for e in d["traceEvents"] if e.get("name") == "sm80_xmma_gemm_f32f32"]
    assert len(kernels) == len(gemms) - 1
