"""Outputs never destroy inputs (docs/reliability.md): ``--json`` onto the input trace replaced it
with the analysis, and ``--json`` inside the input run folder left a folder that no command could
load (``not a Chrome/Kineto trace``), both with exit 0, until 2026-11-28."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from _llm_tracegen import llm_trace

from whatif.api import analyze
from whatif.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def trace(tmp_path: Path) -> Path:
    return llm_trace(tmp_path / "t.json.gz", layers=1, steps=2)


def test_json_onto_the_input_trace_is_refused_and_the_trace_kept(trace: Path, capsys) -> None:
    before = trace.read_bytes()
    for argv in (["analyze", str(trace), "--json", str(trace)], ["breakdown", str(trace), "--json", str(trace)],
                 ["export", str(trace), "-o", str(trace), "-f"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is the input itself" in err[0]
    assert trace.read_bytes() == before


def test_json_inside_the_input_run_folder_is_refused(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    shutil.copytree(ROOT / "sample_traces" / "dit_serve", run)
    assert main(["analyze", str(run), "--json", str(run / "analysis.json"), "-q"]) == 2
    assert "inside the input folder" in capsys.readouterr().err
    assert not (run / "analysis.json").exists()
    analyze(run)   # still loads
    assert main(["analyze", str(run), "--json", str(tmp_path / "analysis.json"), "-q"]) == 0


def test_a_report_folder_is_not_the_input_folder(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    shutil.copytree(ROOT / "sample_traces" / "dit_serve", run)
    assert main(["report", str(run), "-s", str(ROOT / "scenarios" / "faster_linear.toml"), "-o", str(run)]) == 2
    assert "is the input itself" in capsys.readouterr().err


def test_json_dash_is_stdout_and_only_json(trace: Path, capsys) -> None:
    import json
    for command, schema in (("analyze", "analysis"), ("breakdown", "breakdown"), ("ops", "ops")):
        assert main([command, str(trace), "--json", "-"]) == 0
        out = capsys.readouterr().out
        assert json.loads(out)["schema"] == f"whatif.{schema}"   # no table around it
    assert not Path("-").exists()


def test_quiet_alone_is_the_exit_status(trace: Path, tmp_path: Path, capsys) -> None:
    assert main(["analyze", str(trace), "-q"]) == 0
    assert capsys.readouterr().out == ""
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert main(["analyze", str(bad), "-q"]) == 2
