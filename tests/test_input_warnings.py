"""Events the reader drops or changes are said, one line per file on stderr, not silently: every
kernel of a trace with ``"dur": "abc"`` gave a smaller graph, an empty top-kernels table and exit 0
without a word; negative durations were read as 0 unannounced; a trace whose every ``ts`` was a
string was refused as having "no complete events" (the CLI audit of 2026-11-28)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from _llm_tracegen import llm_trace
from tracegen import KinetoTrace

from whatif.cli import main


def _edited(src: Path, dst: Path, field: str, value: object, every: bool) -> Path:
    doc = json.loads(gzip.open(src).read())
    kernels = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel"]
    for e in kernels[::2] if every else kernels[:1]:   # half the kernels, or the first
        e[field] = value
    dst.write_text(json.dumps(doc))
    return dst


def test_dropped_and_clamped_events_are_one_warning_line_each(tmp_path: Path, capsys) -> None:
    src = llm_trace(tmp_path / "t.json.gz", layers=1, steps=2)
    for name, field, value, every, said in (("dur_abc", "dur", "abc", True, "events skipped: a ts or dur"),
                                            ("ts_one", "ts", "abc", False, "1 event skipped: a ts or dur"),
                                            ("neg", "dur", -5, True, "negative durations read as 0")):
        path = _edited(src, tmp_path / f"{name}.json", field, value, every)
        assert main(["analyze", str(path), "--no-cache"]) == 0
        warnings = [x for x in capsys.readouterr().err.splitlines() if x.startswith("whatif: warning:")]
        assert len(warnings) == 1 and str(path) in warnings[0] and said in warnings[0]
    assert main(["analyze", str(src), "--no-cache"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_trace_without_any_numeric_ts_says_so(tmp_path: Path, capsys) -> None:
    src = llm_trace(tmp_path / "t.json.gz", layers=1, steps=2)
    doc = json.loads(gzip.open(src).read())
    for e in doc["traceEvents"]:
        if e.get("ph") == "X":
            e["ts"] = "abc"
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    assert main(["analyze", str(tmp_path / "bad.json"), "--no-cache"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "none of its complete (ph 'X') events has a numeric ts and dur" in err[0]


def test_an_unnamed_gpu_is_named_from_its_properties(tmp_path: Path, capsys) -> None:
    """A ROCm trace whose ``deviceProperties`` leave the name empty (the shared vLLM MI300X
    traces): the one catalog GPU of its vendor, compute units and memory names it, said in a
    warning line, so GPU what-ifs can scale from it; properties two GPUs share name nothing."""
    src = llm_trace(tmp_path / "t.json.gz", layers=1, steps=2)
    doc = json.loads(gzip.open(src).read())
    mi300x = {"id": 0, "name": "", "warpSize": 64, "numSms": 304, "totalGlobalMem": 206141652992}
    a100 = {**mi300x, "warpSize": 32, "numSms": 108, "totalGlobalMem": 85899345920}   # SXM or PCIe
    h100 = {"id": 0, "name": "NVIDIA H100 80GB HBM3"}
    broken = {**mi300x, "totalGlobalMem": None}
    for name, props, named in (("mi300x", [mi300x], "MI300X"), ("a100", [a100], None),
                               ("named_and_not", [h100, {**mi300x, "id": 1}], None), ("broken", [broken], None)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({**doc, "deviceProperties": props}))
        assert main(["analyze", str(path), "--no-cache"]) == 0
        captured = capsys.readouterr()
        warnings = [x for x in captured.err.splitlines() if x.startswith("whatif: warning:")]
        if named:
            assert len(warnings) == 1 and f"taken as {named} from its properties (304 SMs" in warnings[0]
            assert f"({named})" in captured.out
        else:
            assert not warnings


def test_a_folder_of_files_that_name_no_rank_is_said_to_be_read_as_one_job(tmp_path: Path, capsys) -> None:
    """Several files that state no rank (no ``distributedInfo``, no ``rank<k>`` in the name: three
    unrelated HF runs in one folder) are read as ranks 0..n-1 of one job: said in one line; files
    that state their ranks are not."""
    for folder, ranked in (("loose", False), ("job", True)):
        (tmp_path / folder).mkdir()
        for rank in range(2):
            tr = KinetoTrace(rank=rank, world_size=2) if ranked else KinetoTrace()
            tr.op("aten::mm", 10, 50)
            tr.runtime("cudaLaunchKernel", 20, 5, corr=1)
            tr.gpu("gemm", 30, 20, corr=1)
            tr.write(tmp_path / folder / f"model{'ab'[rank]}.json.gz")
        assert main(["analyze", str(tmp_path / folder), "--no-cache"]) == 0
        warnings = [x for x in capsys.readouterr().err.splitlines() if x.startswith("whatif: warning:")]
        if ranked:
            assert not warnings
        else:
            assert len(warnings) == 1 and "2 files name no rank" in warnings[0]
            assert "ranks 0-1 of one job" in warnings[0]
