"""The analyze/export commands: outputs, the JSON document, and one-line errors on bad input."""
from __future__ import annotations

import gzip
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from tracegen import KinetoTrace

from whatif.cli import main
from whatif.tracer import load_trace


def small_trace(path: Path) -> Path:
    tr = KinetoTrace()
    for n in range(2):
        t0 = n * 100
        tr.step(n, t0, 90)
        tr.op("aten::mm", t0 + 2, 20)
        tr.runtime("cudaLaunchKernel", t0 + 5, 5, corr=n + 1)
        tr.gpu("gemm", t0 + 12, 60, corr=n + 1)
    return tr.write(path)


def test_analyze_writes_the_documented_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "a.json"
    assert main(["analyze", str(small_trace(tmp_path / "t.json.gz")), "--json", str(out)]) == 0
    doc = orjson.loads(out.read_bytes())
    assert (doc["schema"], doc["version"]) == ("whatif.analysis", 1)
    assert [(s["rank"], s["step"]) for s in doc["steps"]] == [(0, 0), (0, 1)]
    assert [(s["measured_ns"], s["predicted_ns"]) for s in doc["steps"]] == [(90_000, 90_000), (100_000, 100_000)]
    assert doc["tasks"] > 0 and doc["edges"] > 0
    assert doc["top_kernels"][0]["name"] == "gemm" and doc["top_kernels"][0]["gpu_ns"] == 120_000
    assert sum(doc["critical_path"][0]["breakdown_ns"].values()) == 90_000
    text = capsys.readouterr().out
    assert "measured mean" in text and "replayed mean" in text and "gemm" in text


def test_export_is_a_readable_trace_whose_slices_nest(tmp_path: Path) -> None:
    out = tmp_path / "predicted.pt.trace.json.gz"
    assert main(["export", str(small_trace(tmp_path / "t.json.gz")), "-o", str(out)]) == 0
    doc = orjson.loads(gzip.decompress(out.read_bytes()))
    by_track: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X":
            by_track.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_track.values():
        open_ends: list[float] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while open_ends and start >= open_ends[-1] - 1e-3:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1] + 1e-3, "a slice overlaps another without nesting in it"
            open_ends.append(end)
    assert len(by_track[(100, 1)]) == 6  # both steps' annotation, aten::mm and launch: on their thread, nested
    again = load_trace(out)
    assert again.count(__import__("whatif.tracer", fromlist=["EventKind"]).EventKind.KERNEL) == 2
    assert main(["analyze", str(out), "-q"]) == 0


def test_export_writes_the_timeline_a_scenario_predicts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``export -s``: the written trace, read again, runs each step in the time ``predict`` gives
    the scenario (fuse + CUDA graphs on our own H200 recording), not the recorded time."""
    from whatif.api import analyze, predict

    sample = Path(__file__).resolve().parents[1] / "sample_traces" / "gpu" / "pairs" / "p2_cuda_graph-before-r1"
    scenario = Path(__file__).resolve().parents[1] / "scenarios" / "fuse_and_graph.toml"
    out = tmp_path / "predicted.pt.trace.json.gz"
    assert main(["export", str(sample), "-o", str(out), "-s", str(scenario)]) == 0
    assert "the timeline 'fuse + CUDA graphs' predicts" in capsys.readouterr().out
    predicted = predict(analyze(sample), [scenario]).scenarios[0].steps.set_index("step")["predicted_ns"]
    written = analyze(out).steps.set_index("step")["measured_ns"]
    assert written.index.equals(predicted.index)
    assert (abs(written / predicted - 1) < 0.01).all()
    assert written.sum() < 0.5 * analyze(sample).steps["measured_ns"].sum()


BAD_INPUTS = {
    "empty.json": b"",
    "truncated.json.gz": gzip.compress(b'{"traceEvents": [' + b'{"ph": "X"},' * 200 + b"]}")[:60],
    "invalid.json": b'{"traceEvents": [',
    "not_a_trace.json": b'{"hello": 1}',
    "a_list.json": b"[1, 2, 3]",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_exits_2_with_one_line(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(BAD_INPUTS[name])
    proc = subprocess.run([sys.executable, "-m", "whatif.cli", "analyze", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and name in lines[0] and "Traceback" not in proc.stderr


def test_folder_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["analyze", str(empty)]) == 2
    assert "no trace files" in capsys.readouterr().err
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for name in ("a.json", "b.json"):
        tr = KinetoTrace(rank=0, world_size=2)
        tr.runtime("cudaLaunchKernel", 0, 5, corr=1)
        tr.gpu("k", 10, 5, corr=1)
        tr.write(mixed / name)
    assert main(["analyze", str(mixed)]) == 2
    assert "both claim rank 0" in capsys.readouterr().err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["analyze"])
    assert exc.value.code == 2
    assert main([]) == 2


def test_analyze_text_is_compact_and_honours_top(capsys) -> None:
    sample = Path(__file__).resolve().parents[1] / "sample_traces" / "llm_serve"
    assert main(["analyze", str(sample), "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) < 40 and "steps: 161 (159 counted)" in out and "--steps shows every step" in out
    top_ops = out.split("Top ops")[1].split("Top layers")[0]
    assert top_ops.count("aten::") == 2                       # --top 2: two rows, not the old fixed 8
    assert main(["analyze", str(sample), "--steps"]) == 0
    full = capsys.readouterr().out
    assert "Steps: measured vs replayed" in full and len(full.splitlines()) > 161


def test_top_kernels_have_no_cpu_column_ops_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A kernel is GPU work: its CPU time (always 0) is not a column; an op's CPU time (its call and
    launches) is."""
    assert main(["analyze", str(small_trace(tmp_path / "t.json.gz"))]) == 0
    out = capsys.readouterr().out
    kernels, ops = out.split("Top kernels")[1].split("Top ops")[0], out.split("Top ops")[1]
    assert "gemm" in kernels and "GPU ms" in kernels and "CPU ms" not in kernels
    assert "aten::mm" in ops and "CPU ms" in ops


def test_a_scenario_that_matches_nothing_does_not_stop_the_others(tmp_path: Path, capsys) -> None:
    trace = small_trace(tmp_path / "t.json.gz")
    nothing = tmp_path / "nothing.toml"
    nothing.write_text('name = "no such op"\n[[transform]]\nname = "scale"\nfactor = 0.5\n'
                       'select = { op = "^aten::linear$" }\n')
    fine = tmp_path / "fine.toml"
    fine.write_text('name = "gemm 2x"\n[[transform]]\nname = "scale"\nfactor = 0.5\nselect = { name = "gemm" }\n')
    out = tmp_path / "p.json"
    assert main(["predict", str(trace), "-s", str(nothing), "-s", str(fine), "-q", "--json", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "scenario 'no such op'" in err[0] and "op '^aten::linear$' matches nothing" in err[0]
    assert "most common ops: aten::mm (4)" in err[0]   # two ops and their two kernels
    doc = orjson.loads(out.read_bytes())
    assert [s["name"] for s in doc["scenarios"]] == ["gemm 2x"]          # predicted despite the other's refusal
    assert [w["transform"] for w in doc["scenarios"][0]["waterfall"]] == [
        "scale(select=Selector(name='gemm'), factor=0.5)"]
