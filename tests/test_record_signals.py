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
from whatif.tracer.record import RecordOptions, Schedule, record, resolve_target
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


def test_ctrl_c_while_the_profiler_starts_still_writes_what_it_recorded(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.profiler's start() takes a second or two (it imports torch._dynamo): a Ctrl-C then
    waits for it to return, so that the profiler, started, can be stopped and written."""
    import torch.profiler

    original = torch.profiler.profile.start

    def start(self):   # noqa: ANN001, ANN202 - the patched method's own signature
        original(self)   # Kineto is recording from here on
        os.kill(os.getpid(), signal.SIGINT)   # its handler runs before the next line of Python
    monkeypatch.setattr(torch.profiler.profile, "start", start)
    code, run = _record(tmp_path, "-1")
    assert code == 130
    assert _meta(run)["end"] == {"signal": "SIGINT", "during": "program"}
    assert _meta(run)["trace_files"] == ["rank0.pt.trace.json.gz"]
    assert _steps(run) == 1   # ProfilerStep#0 only: the program never ran


def test_ctrl_c_before_tracing_starts_says_so_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    original = recorder_module.FollowChildren.install

    def install(self):   # noqa: ANN001, ANN202
        original(self)
        os.kill(os.getpid(), signal.SIGINT)
    monkeypatch.setattr(recorder_module.FollowChildren, "install", install)
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(PROGRAM))
    result = record(resolve_target(str(script), None, ["-1"]),
                    RecordOptions(output=tmp_path / "run", progress=False), ["whatif", "record"])
    assert result.exit_status == 130 and result.trace_path is None
    assert result.report_lines == ["no trace written: SIGINT arrived before tracing started"]
    assert _meta(tmp_path / "run")["trace_files"] == [] and "WHATIF_RECORD_CHILD" not in os.environ


def test_a_program_that_is_interrupted_at_its_first_line_leaves_a_trace(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text("raise KeyboardInterrupt\n")
    result = record(resolve_target(str(script), None, []), RecordOptions(output=tmp_path / "run", progress=False),
                    ["whatif", "record"])
    assert result.exit_status == 130 and result.trace_path is not None
    assert _meta(tmp_path / "run")["trace_files"] == ["rank0.pt.trace.json.gz"]
    assert _steps(tmp_path / "run") == 1


def test_a_schedule_that_never_records_says_why(tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(PROGRAM))
    result = record(resolve_target(str(script), None, ["-1"]),
                    RecordOptions(output=tmp_path / "run", progress=False, schedule=Schedule(wait=8, warmup=1)),
                    ["whatif", "record"])
    assert result.exit_status == 0 and result.trace_path is None
    assert result.report_lines == ["no trace written: the program ended after 6 step boundaries, before step 9, "
                                   "the first the schedule records (--wait 8 --warmup 1)"]


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
