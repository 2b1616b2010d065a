"""Every command of the CLI, given bad input of each kind a user meets (a missing or wrong file,
a folder where a file goes, an unparsable value, an output that cannot be written), answers with
one ``whatif:`` line and exit 2 (issue 20): never a traceback, never exit 1. The table names every
command, and a test checks that it does, so a new command cannot be left out."""
from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from whatif.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[1]
DIT = ROOT / "sample_traces" / "dit_serve"
LLM = ROOT / "sample_traces" / "llm_serve"
SCENARIO = ROOT / "scenarios" / "bf16_on_h100.toml"
GEMMS = ROOT / "sample_traces" / "gpu" / "pairs" / "p6_batch-before-r1"   # a real H100 trace with GEMMs


def _files(tmp: Path) -> dict[str, str]:
    """Hostile files, made once per test: {placeholder: path}."""
    (tmp / "empty_dir").mkdir()
    (tmp / "blocker").write_text("a file, not a folder")
    (tmp / "not_toml.toml").write_bytes(b"\xff\xfe[[[")
    (tmp / "unknown.toml").write_text('name = "x"\n[[transform]]\nname = "no_such_transform"\n')
    (tmp / "not_json.json").write_text("{nope")
    (tmp / "model.pkl").write_bytes(b"\x80\x04")
    (tmp / "bad.csv").write_text("arrival_s,prompt_tokens\nx,y\n")
    (tmp / "script_dir.py").mkdir()
    (tmp / "ok.py").write_text("print('never run: the options are refused first')\n")
    return {"{tmp}": str(tmp), "{missing}": str(tmp / "missing.json"), "{empty}": str(tmp / "empty_dir"),
            "{blocker}": str(tmp / "blocker"), "{not_toml}": str(tmp / "not_toml.toml"),
            "{unknown}": str(tmp / "unknown.toml"), "{not_json}": str(tmp / "not_json.json"),
            "{pkl}": str(tmp / "model.pkl"), "{csv}": str(tmp / "bad.csv"),
            "{script_dir}": str(tmp / "script_dir.py"), "{dit}": str(DIT), "{llm}": str(LLM),
            "{scenario}": str(SCENARIO), "{script}": str(tmp / "ok.py"), "{gemms}": str(GEMMS)}


CASES: dict[str, list[tuple[str, ...]]] = {
    "analyze": [("{missing}",), ("{empty}",), ("{pkl}",), ("{not_json}",), ("{dit}", "--json", "{empty}"),
                ("{dit}", "--json", "{blocker}/x.json"), ("{dit}", "--top", "x")],
    "breakdown": [("{missing}",), ("{pkl}",), ("{dit}", "--json", "{empty}"), ("{dit}", "--kernel-wait-ns", "-1"),
                  ("{dit}", "--long-delay-ns", "x"), ("{dit}", "--top", "0")],
    "collectives": [("{missing}",), ("{pkl}",), ("{dit}", "--json", "{empty}"), ("{dit}", "-o", "{tmp}/t.xlsx"),
                    ("{dit}", "--ranks-per-node", "0"), ("{dit}", "--top", "x")],
    "job": [("{missing}",), ("{empty}",), ("{pkl}",), ("{not_json}",), ("{dit}", "--json", "{empty}"),
            ("{dit}", "--groups", "0"), ("{dit}", "--groups", "x"), ("{dit}", "--inline", "--ray")],
    "memory": [("{missing}",), ("{pkl}",), ("{dit}", "--json", "{empty}"), ("{dit}", "-o", "{tmp}/t.xlsx"),
               ("{dit}", "-o", "{blocker}/t.csv"), ("{dit}", "--max-points", "1"), ("{dit}", "--top", "0")],
    "ops": [("{missing}",), ("{pkl}",), ("{dit}", "-o", "{tmp}/t.xlsx"), ("{dit}", "-o", "{empty}"),
            ("{dit}", "-o", "{blocker}/t.csv"), ("{dit}", "--json", "{empty}"), ("{dit}", "--by", "layer"),
            ("{dit}", "--top", "0"), ("{dit}", "--device-spec", "{not_toml}")],
    "export": [("{missing}", "-o", "{tmp}/o.json"), ("{dit}", "-o", "{empty}"), ("{dit}", "-o", "{blocker}/o.json")],
    "predict": [("{dit}",), ("{dit}", "-s", "{missing}"), ("{dit}", "-s", "{not_toml}"), ("{dit}", "-s", "{unknown}"),
                ("{dit}", "-s", "{scenario}", "--json", "{empty}"), ("{missing}", "-s", "{scenario}"),
                ("{dit}", "-s", "{scenario}", "--cost-model", "magic"),
                ("{dit}", "-s", "{scenario}", "--device-spec", "{missing}")],
    "nanoflow": [("{missing}",), ("{pkl}",), ("{llm}",), ("{gemms}", "-s", "{unknown}"), ("{gemms}", "-s", "{missing}"),
                 ("{gemms}", "--topology", "nvlink9"), ("{gemms}", "--memory-saturation", "2"),
                 ("{gemms}", "--comm-saturation", "-0.1"), ("{gemms}", "-o", "{tmp}/t.xlsx"),
                 ("{gemms}", "-o", "{empty}"), ("{gemms}", "--json", "{empty}"), ("{gemms}", "--cost-model", "magic"),
                 ("{gemms}", "--device-spec", "{not_toml}")],
    "suggest": [("{missing}",), ("{dit}", "-s", "{unknown}"), ("{dit}", "-s", "{not_toml}"),
                ("{dit}", "--json", "{empty}"), ("{dit}", "--top", "0")],
    "transforms": [("no_such_transform",)],
    "record": [("{missing}",), ("{script_dir}",), ("-o", "{blocker}/run", "{script}"), ("-o", "{blocker}", "{script}"),
               ("--duration", "-1", "{script}"), ("--active", "0", "{script}"), ("--backend", "nope", "{script}"),
               ("-m", "no_such_module_whatif"), ("-o", "{tmp}/run"), ("{not_json}",), ("{pkl}",)],
    "dashboard": [("{missing}",), ("{empty}",), ("--port", "0"), ("--max-upload-mb", "x")],
    "devices": [("no_such_gpu_whatif",), ("--device-spec", "{missing}"), ("--device-spec", "{not_toml}"),
                ("--device-spec", "{unknown}"), ("A100", "--toml")],
    "serve": [("{dit}",), ("{missing}", "--rate", "1"), ("{dit}", "--workload", "{missing}"),
              ("{dit}", "--workload", "{csv}"), ("{dit}", "--rate", "1", "--iterations-log", "{not_json}"),
              ("{dit}", "--rate", "1", "--json", "{empty}"), ("{dit}", "--rate", "1", "-s", "{unknown}"),
              ("{llm}", "--rate", "1", "--prompt-tokens", "9:1")],
    "sweep": [("{dit}", "--rates", "a,b"), ("{dit}", "--rates", "1,2", "--html", "{empty}"),
              ("{missing}", "--rates", "1"), ("{dit}",), ("{dit}", "--plans", "--tp", "2,x"),
              ("{dit}", "--plans", "--device", "NO_SUCH_GPU"), ("{dit}", "--plans", "-o", "{tmp}/t.xlsx"),
              ("{dit}", "--plans", "-s", "{scenario}"), ("{dit}", "--plans", "--jobs", "-1"),
              ("{missing}", "--plans"), ("{dit}", "--plans", "--json", "{empty}"),
              ("{dit}", "--plans", "--topology", "nope")],
    "report": [("{dit}", "-s", "{scenario}", "-o", "{blocker}"), ("{dit}", "--format", "pdf", "-o", "{tmp}/r"),
               ("{dit}", "--fail-if", "speedup((( < 1", "-o", "{tmp}/r"),
               ("{dit}", "--baseline", "{not_json}", "-o", "{tmp}/r"),
               ("{dit}", "--max-regression", "x", "-o", "{tmp}/r"),
               ("{dit}", "--serving", "{missing}", "-o", "{tmp}/r")],
    "diff": [("{dit}", "{missing}"), ("{dit}", "{dit}", "-p", "{not_json}"), ("{dit}", "{dit}", "--json", "{empty}"),
             ("{dit}", "{dit}", "--top", "0")],
}


def _outcome(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    try:
        code = main(argv)
    except SystemExit as exc:      # argparse's usage errors
        code = exc.code if isinstance(exc.code, int) else 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return code, err


def test_every_command_is_in_the_table() -> None:
    assert set(CASES) == set(COMMANDS)


@pytest.mark.parametrize(("command", "args"), [(c, a) for c, cases in CASES.items() for a in cases],
                         ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str,
                                          args: tuple[str, ...]) -> None:
    files = _files(tmp_path)
    fill: Callable[[str], str] = lambda a: next((a.replace(k, v) for k, v in files.items() if k in a), a)  # noqa: E731
    code, err = _outcome([command, *map(fill, args)], capsys)
    assert (code, len(err)) == (2, 1), err[-5:]
    assert err[0].startswith("whatif"), err


def test_a_dashboard_port_in_use_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        code, err = _outcome(["dashboard", "--no-browser", "--port", str(s.getsockname()[1]), str(DIT)], capsys)
    assert code == 2 and len(err) == 1 and "in use by another program" in err[0]
