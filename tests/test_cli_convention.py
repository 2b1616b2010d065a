"""The one CLI convention of docs/cli.md, checked over every command's parser: a short flag
means one thing everywhere; ``-o`` is ``--output``; the main output is refused when it exists
unless ``--force``."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from whatif.cli import COMMANDS, build_parser, main

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "llm_serve"


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_a_short_flag_means_one_thing_everywhere():
    meaning: dict[str, set[str]] = {}
    for sub in _subparsers().values():
        for action in sub._actions:
            shorts = [o for o in action.option_strings if not o.startswith("--")]
            longs = [o for o in action.option_strings if o.startswith("--")]
            for s in shorts:
                meaning.setdefault(s, set()).add(longs[0] if longs else s)
    assert {s: m for s, m in meaning.items() if len(m) > 1} == {}
    assert meaning["-o"] == {"--output"} and meaning["-q"] == {"--quiet"} and meaning["-f"] == {"--force"}


def test_every_command_is_documented_in_cli_md():
    text = (REPO / "docs" / "cli.md").read_text()
    assert all(f"`{name}`" in text for name in COMMANDS)


def test_export_refuses_to_overwrite_without_force(tmp_path, capsys):
    out = tmp_path / "pred.json"
    out.write_text("keep me")
    assert main(["export", str(SAMPLE), "-o", str(out)]) == 2
    assert "exists; --force overwrites it" in capsys.readouterr().err
    assert out.read_text() == "keep me"
    assert main(["export", str(SAMPLE), "-o", str(out), "--force"]) == 0
    assert out.read_text() != "keep me"


@pytest.mark.parametrize("flag", ["-o", "--output", "--out"])
def test_report_refuses_to_overwrite_its_files_without_force(tmp_path, capsys, flag):
    scenario = REPO / "scenarios" / "faster_linear.toml"
    folder = tmp_path / "r"
    args = ["report", str(SAMPLE), "-s", str(scenario), flag, str(folder), "--format", "json", "-q",
            "--no-step-summary"]
    assert main(args) == 0
    first = (folder / "report.json").read_bytes()
    assert main(args) == 2
    assert "report.json: exists; --force overwrites it" in capsys.readouterr().err
    assert main([*args, "-f"]) == 0 and (folder / "report.json").read_bytes() == first
