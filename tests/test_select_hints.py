"""A selection that matches nothing says why: an op the trace records only around other ops
(``aten::linear`` around ``aten::addmm`` on a GPU) is named as such, since the bundled
``faster_linear`` scenario refused a GPU trace with only "most common ops: aten::addmm ..." (the
CLI audit of 2026-11-28)."""
from __future__ import annotations

from pathlib import Path

import pytest

from whatif.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_an_enclosing_op_is_named_as_one(shared_traces: Path, capsys) -> None:
    bert = shared_traces / "tracelens" / "hf_h100" / "gaunernst_bert-small-uncased__1016001.json.gz"
    assert main(["predict", str(bert), "-s", str(ROOT / "scenarios" / "faster_linear.toml"), "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "26 trace events match '^aten::linear$', none as a task's innermost op: they enclose other ops" in err[0]


def test_an_op_the_trace_does_not_have_gets_no_such_note(tmp_path: Path, capsys) -> None:
    from _llm_tracegen import llm_trace
    trace = llm_trace(tmp_path / "t.json.gz", layers=1, steps=2)
    scenario = tmp_path / "s.toml"
    scenario.write_text('name = "x"\n[[transform]]\nname = "scale"\nfactor = 0.5\nselect = { op = "^aten::linear$" }\n')
    assert main(["predict", str(trace), "-s", str(scenario), "-q"]) == 2
    err = capsys.readouterr().err
    assert "op '^aten::linear$' matches nothing" in err and "trace events match" not in err


@pytest.mark.parametrize("transform, said", [
    ('name = "scale"\nfactor = 0.5\nselect = { kind = "kernal" }', "scale.select: unknown task kind 'kernal'"),
    ('name = "scale"\nfactor = 0.5\nselect = { name = "([" }', "scale.select: bad pattern '(['"),
    ('name = "scale"\nfactor = 0.5\nselect = { kernel_class = "gemmm" }', "unknown kernel class 'gemmm'"),
    ('name = "precision"\ndtype = "fp7"', "precision: unknown dtype 'fp7'"),
])
def test_a_scenario_is_checked_when_read_with_its_file_and_line(tmp_path: Path, capsys, transform: str,
                                                                said: str) -> None:
    """Before any trace is read: one line naming the file and the [[transform]] line (these were
    refused only after the baseline replay, naming the scenario, until 2026-11-28)."""
    scenario = tmp_path / "s.toml"
    scenario.write_text(f'name = "u"\n[[transform]]\n{transform}\n')
    assert main(["predict", str(tmp_path / "no-such-trace.json"), "-s", str(scenario)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"whatif: {scenario}:2: ") and said in err[0], err
