"""The memory timeline (issue 16 item 3): allocator records read once at read time, the peak and
what held it, per step and operator; checked on a hand-made trace with known answers and against
an independent computation on the raw JSON of shared traces recorded with profile_memory."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from tracegen import KinetoTrace

from whatif.cli import main
from whatif.core.errors import WhatifError
from whatif.depgraph.build import build_graph
from whatif.documents import MemoryDocument, from_json
from whatif.memory import NO_OP, OUTSIDE_STEPS, MemoryOptions, memory, memory_table, thin
from whatif.tracer.memory import UNSEEN_FREE_OP
from whatif.tracer.trace import load_trace

ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20
# (file, devices with records) of the shared traces recorded with profile_memory
SHARED_MEMORY = [("hta/df_index_resolver_v100_rank1of2.json.gz", {"GPU 1", "CPU"}),
                 ("tracelens/hf_h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", {"GPU 0", "CPU"}),
                 ("tracelens/hf_mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", {"GPU 0", "CPU"}),
                 ("kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz", {"GPU 0", "CPU"})]


def known_trace(tmp_path: Path) -> Path:
    """Two steps on one thread and a backward thread; GPU 0 starts with 100 MiB allocated before
    the recording; known peaks, owners and frees."""
    t = KinetoTrace()
    t.step(0, 0, 100)
    t.op("aten::linear", 10, 30)
    t.op("aten::mm", 12, 20)                       # nested: the innermost op owns the record
    t.memory(15, 8 * MiB, addr=1, total_allocated=108 * MiB, total_reserved=200 * MiB)
    t.op("aten::relu", 50, 10)
    t.memory(52, 4 * MiB, addr=2, total_allocated=112 * MiB, total_reserved=200 * MiB)
    t.memory(70, -8 * MiB, addr=1, total_allocated=104 * MiB, total_reserved=200 * MiB)  # outside any op
    t.step(1, 100, 100)
    t.op("aten::mm", 110, 20)
    t.memory(115, 16 * MiB, addr=3, total_allocated=120 * MiB, total_reserved=240 * MiB)  # the peak
    t.op("MulBackward0", 120, 30, tid=2)           # another thread, same step by time
    t.memory(125, -16 * MiB, addr=3, total_allocated=104 * MiB, total_reserved=240 * MiB, tid=2)
    t.memory(130, 64, addr=9, total_allocated=64, total_reserved=0, device=-1, device_type=0)
    t.memory(250, -4 * MiB, addr=2, total_allocated=100 * MiB, total_reserved=240 * MiB)  # after the steps
    t.gpu("gemm", 20, 5, corr=1)
    path = tmp_path / "known.json.gz"
    t.write(path)
    return path


def test_known_trace(tmp_path: Path) -> None:
    trace = load_trace(known_trace(tmp_path))
    assert len(trace.memory) == 7 and trace.ranks[0].skipped["instant"] == 0
    doc = memory(trace)
    gpu, cpu = doc.devices
    assert (gpu.device, cpu.device) == ("GPU 0", "CPU")
    assert (gpu.peak_allocated_bytes, gpu.peak_reserved_bytes, gpu.peak_step, gpu.peak_op) == \
        (120 * MiB, 240 * MiB, 1, "aten::mm")
    assert (gpu.start_allocated_bytes, gpu.end_allocated_bytes, gpu.baseline) == (100 * MiB, 100 * MiB, "recorded")
    assert (gpu.allocations, gpu.frees, gpu.allocated_bytes, gpu.freed_bytes) == (3, 3, 28 * MiB, 28 * MiB)
    # at the peak: block 2 (relu, 4 MiB) and block 3 (mm, 16 MiB) live; block 1 freed; 100 MiB from before
    held = {o.op: o.held_at_peak_bytes for o in doc.ops if o.device == "GPU 0"}
    assert held == {"aten::mm": 16 * MiB, "aten::relu": 4 * MiB, "MulBackward0": 0, NO_OP: 0}
    assert gpu.held_at_peak_unrecorded_bytes == 100 * MiB
    ops = {o.op: o for o in doc.ops if o.device == "GPU 0"}
    assert (ops["aten::mm"].allocations, ops["aten::mm"].allocated_bytes, ops["aten::mm"].net_bytes) == \
        (2, 24 * MiB, 24 * MiB)
    assert ops["MulBackward0"].freed_bytes == 16 * MiB and ops[NO_OP].freed_bytes == 12 * MiB
    steps = [(s.step, s.records, s.start_allocated_bytes, s.peak_allocated_bytes, s.end_allocated_bytes)
             for s in doc.steps if s.device == "GPU 0"]
    assert steps == [(0, 3, 100 * MiB, 112 * MiB, 104 * MiB), (1, 2, 104 * MiB, 120 * MiB, 104 * MiB)]
    assert cpu.peak_reserved_bytes is None  # the CPU allocator reserves nothing
    table = memory_table(trace)
    assert len(table) == 7 and table["step"].tolist().count(OUTSIDE_STEPS) == 1
    assert table[table["device"] == "GPU 0"]["op"].tolist() == ["aten::mm", "aten::relu", NO_OP, "aten::mm",
                                                                "MulBackward0", NO_OP]


def test_a_free_on_a_thread_the_profiler_did_not_record_is_inferred(tmp_path: Path) -> None:
    """A block whose last reference died on a communication thread has no free record; its
    address allocated again proves it gone. The CPU allocator's counter missed the free too (the
    totals are lowered from there on); a GPU's counted it (its totals are kept)."""
    t = KinetoTrace()
    t.step(0, 0, 100)
    t.op("aten::empty", 10, 5)
    t.memory(11, 4 * MiB, addr=5, total_allocated=4 * MiB, total_reserved=0, device=-1, device_type=0)
    t.memory(12, 2 * MiB, addr=6, total_allocated=106 * MiB, total_reserved=200 * MiB)
    t.op("aten::mm", 30, 5)
    t.memory(31, 4 * MiB, addr=5, total_allocated=8 * MiB, total_reserved=0, device=-1, device_type=0)
    t.memory(32, 2 * MiB, addr=6, total_allocated=106 * MiB, total_reserved=200 * MiB)   # GPU: counted
    t.memory(40, -4 * MiB, addr=5, total_allocated=4 * MiB, total_reserved=0, device=-1, device_type=0)
    t.memory(41, -2 * MiB, addr=6, total_allocated=104 * MiB, total_reserved=200 * MiB)
    t.gpu("gemm", 20, 5, corr=1)
    t.write(tmp_path / "unseen.json.gz")
    trace = load_trace(tmp_path / "unseen.json.gz")
    assert len(trace.memory) == 8
    table = memory_table(trace)
    cpu, gpu = table[table["device"] == "CPU"], table[table["device"] == "GPU 0"]
    assert cpu["bytes"].tolist() == [4 * MiB, -4 * MiB, 4 * MiB, -4 * MiB]
    assert cpu["allocated_bytes"].tolist() == [4 * MiB, 0, 4 * MiB, 0]
    assert cpu["op"].tolist() == ["aten::empty", UNSEEN_FREE_OP, "aten::mm", NO_OP]
    assert gpu["allocated_bytes"].tolist() == [106 * MiB, 104 * MiB, 106 * MiB, 104 * MiB]
    doc = memory(trace)
    assert [(d.device, d.peak_allocated_bytes, d.end_allocated_bytes, d.frees) for d in doc.devices] == \
        [("GPU 0", 106 * MiB, 104 * MiB, 2), ("CPU", 4 * MiB, 0, 2)]


def test_sizes_only_is_relative_and_matches_nothing_to_the_peak(tmp_path: Path) -> None:
    t = KinetoTrace()
    t.step(0, 0, 100)
    for ts, size in ((10, 300), (20, 500), (30, -300), (40, 100)):
        t.memory(ts, size, addr=None)
    t.gpu("gemm", 20, 5, corr=1)
    t.write(tmp_path / "old.json.gz")
    doc = memory(load_trace(tmp_path / "old.json.gz"))
    (d,) = doc.devices
    assert (d.baseline, d.peak_allocated_bytes, d.start_allocated_bytes, d.end_allocated_bytes) == \
        ("relative", 800, 0, 600)
    assert d.held_at_peak_unrecorded_bytes is None and {o.held_at_peak_bytes for o in doc.ops} == {None}


def test_malformed_records_are_counted_not_fatal(tmp_path: Path) -> None:
    t = KinetoTrace()
    t.memory(10, 64, addr=1)
    t.events.append({"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1_000_020,
                     "args": {"Bytes": "many", "Device Type": 1}})
    t.events.append({"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1_000_030,
                     "args": {"Bytes": 2**62, "Device Type": 1}})
    t.events.append({"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1_000_040, "args": None})
    t.events.append({"ph": "i", "name": "other instant", "pid": 1, "tid": 1, "ts": 1_000_050})
    t.gpu("gemm", 20, 5, corr=1)
    t.write(tmp_path / "bad.json.gz")
    trace = load_trace(tmp_path / "bad.json.gz")
    assert len(trace.memory) == 1
    assert trace.ranks[0].skipped["malformed"] == 3 and trace.ranks[0].skipped["instant"] == 1


def test_thin_keeps_the_peak_and_the_shape() -> None:
    rng = np.random.default_rng(0)
    values = np.cumsum(rng.integers(-100, 101, size=50_000))
    keep = thin(values, 500)
    assert len(keep) <= 500 and int(np.argmax(values)) in keep and int(np.argmin(values)) in keep
    assert (np.diff(keep) > 0).all()
    with pytest.raises(WhatifError, match="max_points must be an integer >= 4"):
        MemoryOptions(max_points=1)


def _raw_records(path: Path) -> list[dict]:
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    return [e["args"] for e in events if e.get("ph") == "i" and e.get("name") == "[memory]"]


@pytest.mark.parametrize(("name", "devices"), SHARED_MEMORY, ids=[n.split("/")[-1][:24] for n, _ in SHARED_MEMORY])
def test_equals_the_raw_json(shared_traces: Path, name: str, devices: set[str]) -> None:
    """Peaks, counts and totals equal a computation on the raw JSON (gzip + json, file order)."""
    path = shared_traces / name
    raw = _raw_records(path)
    trace = load_trace(path)
    doc = memory(trace, build_graph(trace))
    assert {d.device for d in doc.devices} == devices
    assert sum(d.records for d in doc.devices) == len(raw) == len(trace.memory)
    for d in doc.devices:
        mine = [a for a in raw if (f"GPU {a['Device Id']}" if a["Device Type"] in (1, 6) else "CPU") == d.device]
        sizes = [a["Bytes"] for a in mine]
        assert d.records == len(mine) and d.allocated_bytes == sum(s for s in sizes if s > 0)
        if all("Total Allocated" in a for a in mine):
            assert d.baseline == "recorded" and d.peak_allocated_bytes == max(a["Total Allocated"] for a in mine)
            assert d.end_allocated_bytes == mine[-1]["Total Allocated"]
        else:
            assert d.baseline == "relative" and d.peak_allocated_bytes == max(np.cumsum(sizes).tolist())
        if d.held_at_peak_unrecorded_bytes is not None:  # what held the peak adds up to it
            held = sum(o.held_at_peak_bytes or 0 for o in doc.ops if o.rank == d.rank and o.device == d.device)
            assert held + d.held_at_peak_unrecorded_bytes == d.peak_allocated_bytes
            assert 0 <= d.held_at_peak_unrecorded_bytes <= d.start_allocated_bytes
    attributed = memory_table(trace)["op"].ne(NO_OP).mean()
    assert attributed > 0.5, f"only {attributed:.0%} of the records found their operator"


def test_cli_tables_json_and_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = known_trace(tmp_path)
    assert main(["memory", str(path), "--json", str(tmp_path / "m.json"), "-o", str(tmp_path / "m.csv"),
                 "--steps"]) == 0
    out = capsys.readouterr().out
    assert "120.0" in out and "aten::mm" in out and "wrote" in out
    doc = from_json((tmp_path / "m.json").read_text(), MemoryDocument)
    assert doc == memory(load_trace(path), build_graph(load_trace(path)))
    assert len(pd.read_csv(tmp_path / "m.csv")) == 7
    assert main(["memory", str(path), "-o", str(tmp_path / "m.csv")]) == 2
    assert "exists; --force" in capsys.readouterr().err
    assert main(["memory", str(path), "-o", str(tmp_path / "m.parquet"), "-q"]) == 0
    assert capsys.readouterr().out == ""
    assert pd.read_parquet(tmp_path / "m.parquet").equals(memory_table(load_trace(path)))
    assert main(["memory", str(ROOT / "sample_traces" / "llm_serve")]) == 0
    assert "no allocator records" in capsys.readouterr().out


def test_same_input_same_bytes(tmp_path: Path) -> None:
    path = known_trace(tmp_path)
    for i in (1, 2):
        assert main(["memory", str(path), "-q", "--json", str(tmp_path / f"{i}.json"),
                     "-o", str(tmp_path / f"{i}.parquet")]) == 0
    assert (tmp_path / "1.json").read_bytes() == (tmp_path / "2.json").read_bytes()
    assert (tmp_path / "1.parquet").read_bytes() == (tmp_path / "2.parquet").read_bytes()


@pytest.mark.slow
def test_record_memory_then_memory(tmp_path: Path) -> None:
    """``whatif record --memory`` writes allocator records that ``whatif memory`` reads (CPU run)."""
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "whatif.cli", "record", "-o", str(run), "--memory", "--no-summary",
                           str(ROOT / "examples" / "train.py"), "--", "--steps", "3"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    trace = load_trace(run)
    doc = memory(trace, build_graph(trace))
    (cpu,) = doc.devices
    assert cpu.device == "CPU" and cpu.allocations > 100 and cpu.baseline == "recorded"
    assert {s.step for s in doc.steps} >= {1, 2} and any(s.excluded == "warm-up" for s in doc.steps)
    held = sum(o.held_at_peak_bytes or 0 for o in doc.ops)
    assert held + (cpu.held_at_peak_unrecorded_bytes or 0) == cpu.peak_allocated_bytes


def test_ids_beyond_64_bits_in_a_record(tmp_path: Path) -> None:
    """A record's pid/tid beyond int64 is stored as the event table stores them (found by the fuzz
    campaign: OverflowError)."""
    t = KinetoTrace()
    t.memory(10, 64, addr=1)
    t.events[-1]["pid"] = 2**70
    t.events[-1]["tid"] = 2**64 - 1
    t.gpu("gemm", 20, 5, corr=1)
    path = tmp_path / "ids.json.gz"
    path.write_bytes(gzip.compress(json.dumps(t.document()).encode()))  # orjson refuses 70-bit ints
    trace = load_trace(path)
    assert trace.memory[["pid", "tid"]].values.tolist() == [[-1, -1]]
