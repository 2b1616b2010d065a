"""`whatif record` end to end on CPU: each test runs the real CLI in a subprocess (marked slow:
`make test-fast` leaves them out), then the schedule and trace-file helpers in-process."""
from __future__ import annotations

import ctypes.util
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch.profiler import ProfilerAction  # noqa: E402

from whatif.tracer import EventKind, load_trace  # noqa: E402
from whatif.tracer.record.options import Schedule  # noqa: E402
from whatif.tracer.record.trace_file import fold_leading_steps, merge_cycles  # noqa: E402

# The CLI with only `record` registered, so these tests do not depend on other commands. SIGINT
# is set up as in a terminal (Python's KeyboardInterrupt handler, unblocked): a process inherits
# an ignored SIGINT, and a test suite run as a background job of a script (`make test &`) has
# one, so without this the Ctrl-C test would depend on how pytest was started.
DRIVER = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
          "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
          "from whatif import cli; cli.COMMANDS = {'record': cli.COMMANDS['record']}; "
          "sys.exit(cli.main(sys.argv[1:]))")

MARKED = """
import sys, torch, whatif
class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 16)
        self.b = torch.nn.Linear(16, 16)
    def forward(self, x):
        return self.b(torch.relu(self.a(x)))
open(sys.argv[1], "w").write(" ".join(sys.argv[1:]))
model = Tiny()
for i in range(3):
    with whatif.phase("prefill"):
        model(torch.randn(4, 16))
    with whatif.phase("decode"):
        model(torch.randn(1, 16))
    whatif.step()
mode = sys.argv[2]
if mode == "raise":
    raise RuntimeError("boom from the script")
if mode == "exit":
    sys.exit(3)
if mode == "sigint":  # Ctrl-C; raise_signal handles it before returning, so no waiting for it
    import signal
    signal.raise_signal(signal.SIGINT)
    sys.exit("SIGINT did not interrupt the script")
"""


def whatif(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", DRIVER, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def write(path: Path, source: str) -> Path:
    path.write_text(textwrap.dedent(source))
    return path


def names(run: Path) -> list[str]:
    return [str(n) for n in load_trace(run).events["name"]]


def step_names(run: Path) -> list[str]:
    return sorted({n for n in names(run) if n.startswith("ProfilerStep#")}, key=lambda n: int(n.split("#")[1]))


def meta(run: Path) -> dict:
    return json.loads((run / "meta.jsonc").read_text())


@pytest.mark.slow
def test_marked_steps_and_phases_are_recorded(tmp_path: Path) -> None:
    script = write(tmp_path / "serve.py", MARKED)
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank0.pt.trace.json.gz").write_bytes(b"stale, replaced because of --force")
    proc = whatif("record", "-f", "-o", str(run), str(script), str(tmp_path / "argv.txt"), "ok", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "argv.txt").read_text() == f"{tmp_path / 'argv.txt'} ok"  # the script's own argv
    assert sorted(p.name for p in run.iterdir()) == ["meta.jsonc", "rank0.pt.trace.json.gz"]
    trace = load_trace(run)
    ev = trace.events
    assert step_names(run) == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]
    phases = ev[ev["name"].astype(str).str.startswith("phase:")]
    assert sorted(phases["name"].astype(str).value_counts().items()) == [("phase:decode", 3), ("phase:prefill", 3)]
    assert set(phases["kind"]) == {EventKind.ANNOTATION}
    assert (ev["kind"] == EventKind.CPU_OP).sum() > 0
    m = meta(run)
    assert m["exit_status"] == 0 and m["step_source"] == "mark" and m["steps_marked"] == 3
    assert m["argv"] == [str(script), str(tmp_path / "argv.txt"), "ok"]
    assert m["torch"] == torch.__version__ and m["host"] == socket.gethostname()
    assert "whatif analyze" in proc.stderr and "GPU activity: not available" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "status", "message"), [
    ("raise", 1, "RuntimeError: boom from the script"),
    ("exit", 3, None),
    ("sigint", 130, "KeyboardInterrupt"),
])
def test_failing_program_still_leaves_a_readable_trace(tmp_path: Path, mode: str, status: int,
                                                      message: str | None) -> None:
    script = write(tmp_path / "serve.py", MARKED)
    run = tmp_path / "run"
    proc = whatif("record", "-o", str(run), str(script), str(tmp_path / "argv.txt"), mode, cwd=tmp_path)
    assert proc.returncode == status, proc.stderr
    if message:
        assert message in proc.stderr
    assert step_names(run)[:4] == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]
    assert "phase:prefill" in names(run)
    assert meta(run)["exit_status"] == status


@pytest.mark.slow
def test_optimizer_steps_found_without_marks(tmp_path: Path) -> None:
    script = write(tmp_path / "train.py", """
        import torch
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for it in range(5):
            opt.zero_grad()
            for micro in range(2):  # two forwards per step: the optimizer, not forward, defines steps
                model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
    """)
    run = tmp_path / "run"
    proc = whatif("record", "-o", str(run), str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # 5 optimizer steps: boundaries before iterations 2..5, so steps #0..#4 (#0 holds start-up)
    assert step_names(run) == [f"ProfilerStep#{i}" for i in range(5)]
    assert meta(run)["step_source"] == "optimizer"


@pytest.mark.slow
def test_outermost_model_forward_defines_steps(tmp_path: Path) -> None:
    script = write(tmp_path / "serve.py", """
        import torch
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
        head = torch.nn.Linear(8, 2)  # a leaf called at top level is not the model
        with torch.no_grad():
            for it in range(4):
                head(model(torch.randn(2, 8)))
    """)
    run = tmp_path / "run"
    proc = whatif("record", "-o", str(run), str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert step_names(run) == [f"ProfilerStep#{i}" for i in range(4)]
    assert meta(run)["step_source"] == "forward"


@pytest.mark.slow
def test_step_on_names_the_iteration_function(tmp_path: Path) -> None:
    write(tmp_path / "loopmod.py", """
        import torch
        def iteration(x):
            return torch.relu(x @ x)
    """)
    script = write(tmp_path / "serve.py", """
        import torch, loopmod
        for it in range(3):
            loopmod.iteration(torch.randn(8, 8))
    """)
    run = tmp_path / "run"
    proc = whatif("record", "-o", str(run), "--step-on", "loopmod:iteration", str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert step_names(run) == [f"ProfilerStep#{i}" for i in range(4)]
    assert meta(run)["step_source"] == "function"


@pytest.mark.slow
def test_program_with_its_own_profiler_schedule_is_respected(tmp_path: Path) -> None:
    script = write(tmp_path / "own.py", """
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
        calls = []
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
                     on_trace_ready=lambda p: calls.append(1)) as prof:
            for i in range(6):
                model(torch.randn(2, 8))
                prof.step()
        print("handler calls", len(calls))
    """)
    run = tmp_path / "run"
    proc = whatif("record", "-o", str(run), str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "handler calls 1" in proc.stdout
    assert step_names(run) == ["ProfilerStep#2", "ProfilerStep#3"]
    assert meta(run)["step_source"] == "program_profiler"


@pytest.mark.slow
def test_two_gloo_ranks_write_two_traces(tmp_path: Path) -> None:
    script = write(tmp_path / "ddp.py", """
        import torch, torch.distributed as dist, whatif
        dist.init_process_group("gloo")
        x = torch.ones(4) * (dist.get_rank() + 1)
        for i in range(2):
            with whatif.phase("allreduce"):
                dist.all_reduce(x)
            whatif.step()
        assert x.tolist() == [6.0] * 4, x  # (1 + 2) * 2 after two all-reduces
        dist.destroy_process_group()
    """)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = tmp_path / "run"
    procs = [subprocess.Popen([sys.executable, "-c", DRIVER, "record", "--no-summary", "-o", str(run), str(script)],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
             for r in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert sorted(p.name for p in run.iterdir()) == ["meta.jsonc", "rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    trace = load_trace(run)
    infos = [r.metadata["distributedInfo"] for r in trace.ranks]
    assert [(i["rank"], i["world_size"], i["backend"]) for i in infos] == [(0, 2, "gloo"), (1, 2, "gloo")]
    assert sorted(trace.events["rank"].unique().tolist()) == [0, 1]


@pytest.mark.slow
@pytest.mark.parametrize(("args", "expected"), [
    (["missing.py"], "missing.py: no such script"),
    (["--bogus", "tiny.py"], "unrecognized arguments: --bogus"),
    (["-o", "taken", "tiny.py"], "taken: output folder already holds"),
    (["--active", "0", "tiny.py"], "argument --active: must be an integer >= 1"),
    (["--step-on", "nosuchmodule:f", "tiny.py"], "cannot import module 'nosuchmodule'"),
    (["-m", "no_such_module_xyz"], "no_such_module_xyz: no such module"),
    (["-o", "out"], "whatif: no script given (usage: whatif record [options] script.py"),
    (["-o", "out", "notes.txt"], "notes.txt: not a Python script (SyntaxError: invalid syntax, line 2)"),
    (["-o", "out", "blob.bin"], "blob.bin: not a Python script (a binary file: it holds null bytes)"),
])
def test_usage_errors_are_one_line_and_exit_2(tmp_path: Path, args: list[str], expected: str) -> None:
    write(tmp_path / "tiny.py", "print('should not run')\n")
    write(tmp_path / "notes.txt", "# shopping\nmilk eggs and bread\n")
    (tmp_path / "blob.bin").write_bytes(bytes(range(256)))
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "rank0.pt.trace.json.gz").write_bytes(b"old")
    proc = whatif("record", *args, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("whatif: ") and expected in proc.stderr
    assert "whatif: whatif" not in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "should not run" not in proc.stdout
    assert (tmp_path / "taken" / "rank0.pt.trace.json.gz").read_bytes() == b"old"
    assert not (tmp_path / "out").exists()  # refused before the run folder is made


@pytest.mark.slow
@pytest.mark.skipif(ctypes.util.find_library("cuda") is not None, reason="this machine has a CUDA driver")
def test_cupti_backend_without_driver_exits_2(tmp_path: Path) -> None:
    write(tmp_path / "tiny.py", "print('should not run')\n")
    proc = whatif("record", "--backend", "cupti", "-o", "run", "tiny.py", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("whatif: --backend cupti: no CUDA driver on this machine "
                                   "(libcuda.so.1 cannot be loaded); use --backend torch")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("content", "problem"), [
    (b"hello this is not Python\n", "SyntaxError: invalid syntax, line 1"),
    (b"x = 1\ndef f(:\n    pass\n", "SyntaxError: invalid syntax, line 2"),
    (b"x = (1,\n", "SyntaxError: '(' was never closed, line 1"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "a binary file: it holds null bytes"),
    (b"$;!\xd6\xe6S^ binary without a null byte", "not utf-8 text: byte 0xd6 at offset 3"),
    (b"# -*- coding: latin-1 -*-\nname = '\xd6l'\nname(\n", "SyntaxError: '(' was never closed, line 3"),
])
def test_a_file_that_does_not_compile_is_not_a_script(tmp_path: Path, content: bytes, problem: str) -> None:
    from whatif.tracer.record.errors import NotAScriptError
    from whatif.tracer.record.target import resolve_target

    path = tmp_path / "input.txt"
    path.write_bytes(content)
    with pytest.raises(NotAScriptError) as err:
        resolve_target(str(path), None, [])
    assert str(err.value) == f"{path}: not a Python script ({problem})"


def test_what_runpy_runs_is_a_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Source that compiles (a runtime error is the program's own), compiled Python and a zip
    archive with a ``__main__.py`` pass the check; so does a module given with -m."""
    import py_compile
    import zipfile

    from whatif.tracer.record.errors import NotAScriptError
    from whatif.tracer.record.target import resolve_target

    fails = write(tmp_path / "fails.py", "raise RuntimeError('at run time, not at compile time')\n")
    pyc = Path(py_compile.compile(str(fails), cfile=str(tmp_path / "fails.pyc")))
    app = tmp_path / "app.zip"
    with zipfile.ZipFile(app, "w") as z:
        z.writestr("__main__.py", "print('hi')\n")
    for path in (fails, pyc, app):
        assert resolve_target(str(path), None, ["a"]).path == path
    assert resolve_target(None, "json.tool", []).module == "json.tool"
    with zipfile.ZipFile(tmp_path / "lib.zip", "w") as z:
        z.writestr("helper.py", "x = 1\n")
    with pytest.raises(NotAScriptError, match=r"lib\.zip: not a Python script \(a zip archive without __main__\.py\)"):
        resolve_target(str(tmp_path / "lib.zip"), None, [])
    broken = write(tmp_path / "broken_mod.py", "def f(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(NotAScriptError, match=f"^{broken}: not a Python script"):
        resolve_target(None, "broken_mod", [])


def test_every_summary_line_of_a_rank_other_than_0_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Under torchrun the ranks share a terminal: rank 1's lines all say so (in-process, as rank 1
    of two by torchrun's environment)."""
    from whatif.cli import main

    script = write(tmp_path / "serve.py", MARKED)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["record", "-o", str(tmp_path / "run"), str(script), str(tmp_path / "argv.txt"), "ok"]) == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("USDT:")]
    assert lines[0].startswith("[rank 1] whatif record: serve.py exited with status 0 after ")
    assert any(ln.startswith("[rank 1] steps recorded: 4 ") for ln in lines)
    assert lines[-1].startswith(f"[rank 1] trace: {tmp_path / 'run' / 'rank1.pt.trace.json.gz'} (")
    assert all(ln.startswith("[rank 1] ") for ln in lines), lines
    assert not any("next: whatif analyze" in ln for ln in lines)  # rank 0 says it, once


@pytest.mark.parametrize("sample", ["llm_serve", "gpu/backends/train-torch", "gpu/backends/llm_serve-cupti"])
def test_summary_step_times_are_those_whatif_analyze_measures(sample: str) -> None:
    """The printed step times are analyze's measured times (completion to completion), without
    building the graph: on a CPU recording and on two GPU recordings (kernels that end after
    their step's annotation, launched from the autograd thread too)."""
    import gzip

    import orjson

    from whatif.api import analyze
    from whatif.core.steps import rank_exclusions
    from whatif.tracer.record.summary import summarize

    folder = Path(__file__).resolve().parents[1] / "sample_traces" / sample
    summary = summarize(orjson.loads(gzip.open(folder / "rank0.pt.trace.json.gz").read()))
    steps = analyze(folder).steps
    assert summary.step_numbers == steps["step"].tolist()
    assert summary.step_ms == pytest.approx((steps["measured_ns"] / 1e6).tolist(), abs=1e-5)  # ns rounding
    assert rank_exclusions(summary.step_numbers, summary.step_events) == steps["excluded_reason"].tolist()


def test_ctrl_c_while_whatif_starts_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C while the CLI imports its commands (about a second before `whatif record` runs
    anything): exit 130, one line, no traceback of the half-done imports."""
    from whatif import cli

    def interrupted() -> None:
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["record", "x.py"]) == 130
    assert capsys.readouterr().err == "whatif: interrupted\n"


def test_schedule_actions_follow_wait_warmup_active() -> None:
    sched = Schedule(wait=1, warmup=1, active=2, repeat=2)
    actions = [sched(i) for i in range(9)]
    N, W, R, S = ProfilerAction.NONE, ProfilerAction.WARMUP, ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE
    assert actions == [N, W, R, S, N, W, R, S, N]
    assert [Schedule(warmup=1)(i) for i in range(3)] == [W, R, R]


def test_fold_leading_steps_merges_guessed_boundaries() -> None:
    def step(n: int, ts: float, dur: float) -> dict:
        return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1,
                "ts": ts, "dur": dur}
    doc = {"traceEvents": [step(0, 0, 10), step(1, 10, 5), step(2, 15, 20), step(3, 35, 1),
                           {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 1}]}
    assert fold_leading_steps(doc, 1) == 1
    steps = sorted((e["name"], e["ts"], e["dur"]) for e in doc["traceEvents"] if e["cat"] == "user_annotation")
    assert steps == [("ProfilerStep#0", 0, 15), ("ProfilerStep#1", 15, 20), ("ProfilerStep#2", 35, 1)]


def test_merge_cycles_rebases_timestamps_and_drops_duplicate_metadata() -> None:
    meta_ev = {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}}
    first = {"baseTimeNanoseconds": 1_000_000, "traceEvents": [meta_ev, {"ph": "X", "name": "a", "ts": 1.0, "dur": 1}]}
    second = {"baseTimeNanoseconds": 3_000_000,
              "traceEvents": [dict(meta_ev), {"ph": "X", "name": "b", "ts": 1.0, "dur": 1}]}
    merged = merge_cycles([first, second])
    assert [(e["name"], e.get("ts")) for e in merged["traceEvents"]] == [
        ("thread_name", None), ("a", 1.0), ("b", 2001.0)]
    assert merged["baseTimeNanoseconds"] == 1_000_000 and merged["whatifCycles"] == 2
