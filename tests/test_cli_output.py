"""The CLI's output path: a stdout that cannot be written is one line and exit 2; change-log lines
say what a change touched (edges are not "0 tasks")."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from whatif.cli import main

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_traces" / "gpu" / "backends" / "train-torch"


@pytest.mark.slow
@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_full_disk_on_stdout_is_one_line() -> None:
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "whatif.cli", "transforms"], stdout=full,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["whatif: cannot write the output: No space left on device"]


def test_edge_changes_are_counted_as_edges(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", str(SAMPLE), "-s", str(ROOT / "scenarios" / "fuse_and_graph.toml")]) == 0
    lines = [ln.strip() for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("cuda_graph:")]
    edges = [ln for ln in lines if "edge latency" in ln]
    assert edges and all(" 0 tasks" not in ln and " edges, edge latency " in ln for ln in edges)
    assert any(" tasks, task time " in ln for ln in lines)


def test_breakdown_says_how_many_step_rows_it_left_out(capsys: pytest.CaptureFixture[str]) -> None:
    serve = ROOT / "sample_traces" / "gpu" / "backends" / "llm_serve-torch"
    assert main(["breakdown", str(serve), "--steps", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "more rows: --top, or --json for all)" in out
    assert main(["breakdown", str(serve), "--steps", "--top", "1000"]) == 0
    assert "more rows" not in capsys.readouterr().out


@pytest.mark.parametrize("command", ["breakdown", "ops"])
def test_gpu_activity_without_any_launch_call(tmp_path: Path, command: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A trace whose runtime/driver calls were not recorded (only the kernels): was an IndexError."""
    trace = tmp_path / "kernels_only.json"
    trace.write_text('{"traceEvents":[{"ph":"X","name":"k","cat":"kernel","ts":12,"dur":3,"pid":0,"tid":7,'
                     '"args":{"correlation":1,"device":0,"stream":7}}]}')
    assert main([command, str(trace)]) == 0
    assert "100.0 %" in capsys.readouterr().out
