"""SIGINT and SIGTERM while recording (issue 20): at several points of the program and of the
trace write, the run folder holds a trace that ``whatif analyze`` loads and a meta.json that says
how the run ended, or (a second signal during the write) nothing half-written.

The in-process tests record a tiny program with the real recorder and send the signals to this
process at chosen points (from the program itself, or from a patched step of the write); the
subprocess tests send them from outside, as a terminal or a job scheduler would."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from whatif.api import analyze
from whatif.tracer.record import RecordOptions, record, resolve_target
from whatif.tracer.record import recorder as recorder_module
from whatif.tracer.record.signals import RecordingAborted, SignalGuard

PROGRAM = """
import os, signal, sys, torch, whatif
send_at = int(sys.argv[1]); signum = getattr(signal, sys.argv[2]) if len(sys.argv) > 2 else None
x = torch.randn(32, 32)
for i in range(6):
    if i == send_at and signum is not None:
        os.kill(os.getpid(), signum)
    x = torch.relu(x @ x) / 32
    whatif.step()
"""


def _record(tmp_path: Path, *args: str) -> tuple[int, Path]:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(PROGRAM))
    out = tmp_path / "run"
    result = record(resolve_target(str(script), None, list(args)),
                    RecordOptions(output=out, progress=False, summary=False), ["whatif", "record"])
    return result.exit_status, out


def _meta(run: Path) -> dict:
    return json.loads((run / "meta.jsonc").read_text())


def _steps(run: Path) -> int:
    return len(analyze(run).replay.graph.steps)


@pytest.fixture(autouse=True)
def _handlers_restored():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    assert {s: signal.getsignal(s) for s in before} == before


@pytest.mark.parametrize("send_at", [0, 3, 5])
@pytest.mark.parametrize(("name", "status"), [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_signal_during_the_program_still_writes_a_loadable_trace(tmp_path: Path, send_at: int, name: str,
                                                                   status: int) -> None:
    code, run = _record(tmp_path, str(send_at), name)
    assert code == status
    assert _meta(run)["end"] == {"signal": name, "during": "program"}
    assert _meta(run)["exit_status"] == status
    assert _steps(run) >= send_at   # the steps before the signal are in the trace
    assert not [p for p in run.iterdir() if p.name.startswith(".")]


def test_no_signal_is_an_ordinary_end(tmp_path: Path) -> None:
    code, run = _record(tmp_path, "-1")
    assert code == 0 and _meta(run)["end"] == {"signal": None, "during": None}


def _signal_then_write(signums: list[int], where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Patch the trace write (``where`` = "before": before the bytes are made; "rename": inside
    the atomic write, after the temp file is written) to send ``signums`` to this process."""
    def send() -> None:
        for s in signums:
            os.kill(os.getpid(), s)

    if where == "before":
        original = recorder_module.write_trace

        def write_trace(path, doc):   # noqa: ANN001, ANN202 - the patched function's own signature
            send()
            return original(path, doc)
        monkeypatch.setattr(recorder_module, "write_trace", write_trace)
    else:
        from whatif.core import output

        real_replace = os.replace

        def replace(src, dst):   # noqa: ANN001, ANN202
            if str(dst).endswith(".json.gz"):
                send()
            return real_replace(src, dst)
        monkeypatch.setattr(output.os, "replace", replace)


@pytest.mark.parametrize("where", ["before", "rename"])
@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_one_signal_during_the_write_is_deferred(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str], where: str, signum: int,
                                                 status: int) -> None:
    _signal_then_write([signum], where, monkeypatch)
    code, run = _record(tmp_path, "-1")
    assert code == status
    name = signal.Signals(signum).name
    assert _meta(run)["end"] == {"signal": name, "during": "write"} and _meta(run)["exit_status"] == 0
    assert _steps(run) == 7   # the start-up step and the 6 marked ones: nothing lost
    assert f"whatif: {name} received while writing the trace; finishing it" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["before", "rename"])
def test_a_second_signal_during_the_write_aborts_and_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    where: str) -> None:
    _signal_then_write([signal.SIGTERM, signal.SIGINT], where, monkeypatch)
    with pytest.raises(RecordingAborted, match="second SIGINT while writing the trace"):
        _record(tmp_path, "-1")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == []   # no trace, no temp file, no meta


def test_an_ignored_signal_stays_ignored() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        guard = SignalGuard()
        guard.install()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == guard._handle
        guard.restore()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


LOOP = """
import sys, time, torch, whatif
x = torch.randn(64, 64)
for i in range(10_000):
    x = torch.relu(x @ x) / 64
    whatif.step()
    if i >= 2:
        open(sys.argv[1], "w").write(str(i))
    time.sleep(0.01)
"""


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "after_steps"), [(signal.SIGTERM, 3), (signal.SIGTERM, 40), (signal.SIGINT, 20)])
def test_a_signal_from_outside_leaves_a_trace_analyze_loads(tmp_path: Path, signum: int, after_steps: int) -> None:
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent(LOOP))
    progress, run = tmp_path / "progress.txt", tmp_path / "run"
    driver = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
              "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
              "from whatif import cli; sys.exit(cli.main(sys.argv[1:]))")
    proc = subprocess.Popen([sys.executable, "-c", driver, "record", "--no-summary", "-o", str(run), str(script),
                             str(progress)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        # read once: the loop rewrites the file ("w" truncates first), so a second read may see ""
        done = progress.read_text() if progress.exists() else ""
        if done.isdigit() and int(done) >= after_steps:
            break
        time.sleep(0.02)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err
    assert _meta(run)["end"] == {"signal": signal.Signals(signum).name, "during": "program"}
    assert _steps(run) >= after_steps
    out = subprocess.run([sys.executable, "-m", "whatif.cli", "analyze", str(run)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr


def test_the_cli_says_an_aborted_write_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from whatif.cli import main

    _signal_then_write([signal.SIGINT, signal.SIGTERM], "rename", monkeypatch)
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(PROGRAM))
    assert main(["record", "--no-summary", "-o", str(tmp_path / "run"), str(script), "-1"]) == 143
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("whatif")]
    assert err[-1] == "whatif: second SIGTERM while writing the trace: recording aborted, nothing more written"
