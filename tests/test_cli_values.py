"""Bad command-line values and unwritable outputs (issue 20): each is one ``whatif:`` line and exit
2 at parse or write time, never a traceback, a hang or a corrupted input folder."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from whatif.cli import main

ROOT = Path(__file__).resolve().parents[1]
DIT = ROOT / "sample_traces" / "dit_serve"


def _refused(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as info:   # argparse usage errors exit 2
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("whatif: ")
    return err[0]


@pytest.mark.parametrize(("argv", "message"), [
    (["serve", str(DIT), "--rate", "-1"], "must be a number > 0"),
    (["serve", str(DIT), "--rate", "nan"], "must be a number > 0"),
    (["serve", str(DIT), "--rate", "1", "--num-requests", "0"], "must be an integer >= 1"),
    (["serve", str(DIT), "--rate", "1", "--max-seqs", "0"], "must be an integer >= 1"),
    (["serve", str(DIT), "--rate", "1", "--slo-ttft-ms", "inf"], "finite number > 0"),
    (["sweep", str(DIT), "--rates", "inf,nan"], "rates must be finite numbers > 0"),
    (["diff", "a", "b", "--tolerance", "-1"], "finite number >= 0"),
    (["dashboard", "--port", "99999"], "<= 65535"),
    (["dashboard", "--port", "-1"], ">= 1"),
    (["dashboard", "--max-upload-mb", "-5"], ">= 1"),
    (["analyze", str(DIT), "--top", "0"], ">= 1"),
])
def test_bad_values_are_usage_errors(argv: list[str], message: str, capsys) -> None:
    assert message in _refused(argv, capsys)


def test_rate_inf_is_still_all_at_once(capsys) -> None:
    from whatif.commands._values import number

    assert number(float, exclusive_minimum=0, allow_inf=True)("inf") == float("inf")


def test_unwritable_outputs_are_one_line(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    assert main(["analyze", str(DIT), "--json", str(folder)]) == 2
    assert "is a folder, not a file to write" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["analyze", str(DIT), "--json", str(blocker / "sub.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot be written" in err[0]
    if Path("/dev/full").exists():
        assert main(["analyze", str(DIT), "--json", "/dev/full"]) == 2
        assert "No space left" in capsys.readouterr().err
        assert not Path("/dev/full").is_file()      # the device is written in place, never replaced


def test_export_into_its_own_input_folder_is_refused(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    shutil.copytree(DIT, run)
    before = sorted(p.name for p in run.iterdir())
    assert main(["export", str(run), "-o", str(run / "predicted.json")]) == 2
    assert "inside the input folder" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == before
    assert main(["analyze", str(run)]) == 0
