"""`whatif record` follows the program's Python children (docs/recording.md, "Child processes").

In-process: a rank recorded as several processes loads as one rank (ids kept apart, one step
sequence), the child configuration and bootstrap. Slow: the real CLI records
examples/engine_split.py (a vLLM-V1-like front-end and engine core, spawn and fork, and an engine
core stopped by SIGTERM), examples/spawn_workers.py (torch.multiprocessing.spawn, two gloo ranks)
and a script whose `subprocess` children import torch or not.
"""
from __future__ import annotations

import doctest
import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tracegen import CPU_PID, KinetoTrace  # noqa: E402

from whatif.core.errors import TraceError  # noqa: E402
from whatif.depgraph.build import build_graph  # noqa: E402
from whatif.depgraph.graph import EdgeKind, TaskKind  # noqa: E402
from whatif.tracer import EventKind, load_trace  # noqa: E402
from whatif.tracer.record import distributed, processes, signals, summary  # noqa: E402
from whatif.tracer.record.child_site import CHILD_ENV, TorchImportHook  # noqa: E402
from whatif.tracer.record.children import ChildConfig, read_config  # noqa: E402
from whatif.tracer.record.options import RecordOptions, Schedule  # noqa: E402
from whatif.tracer.record.target import MainAlias  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ENGINE_PID = 4242


def _process(rank: int, pid: int, steps: int, kernel: str) -> KinetoTrace:
    """One process of rank ``rank``: ``steps`` steps, each an op (External id 5) launching
    ``kernel`` (correlation 1, as every process numbers its ids from 1)."""
    tr = KinetoTrace(rank=rank, world_size=1)
    for n in range(steps):
        t = 100.0 * n
        tr.step(n, t, 90)
        tr.op("aten::mm", t + 5, 30, args={"External id": 5 + n})
        tr.runtime("cudaLaunchKernel", t + 10, 5, corr=1 + n)
        tr.gpu(kernel, t + 20, 40, corr=1 + n, **{"External id": 5 + n})
    for ev in tr.events:
        if ev["pid"] == CPU_PID:
            ev["pid"] = pid
    return tr


def _two_processes(folder: Path, engine_pid: int = ENGINE_PID) -> Path:
    folder.mkdir()
    front = _process(0, CPU_PID, 1, "front_kernel")
    front.op("frontend::wait_for_results", 95, 250)  # waits through the engine core's steps 0-2
    front.write(folder / "rank0.pt.trace.json.gz")
    _process(0, engine_pid, 3, "engine_kernel").write(folder / f"rank0.engine_core.{engine_pid}.pt.trace.json.gz")
    return folder


def test_processes_of_one_rank_load_as_one_rank(tmp_path: Path) -> None:
    trace = load_trace(_two_processes(tmp_path / "run"))
    assert [(r.rank, sorted(f.name for f in r.files)) for r in trace.ranks] == [
        (0, ["rank0.engine_core.4242.pt.trace.json.gz", "rank0.pt.trace.json.gz"])]
    ev = trace.events
    cpu = ev[ev["device"] < 0]
    assert sorted(cpu["pid"].unique().tolist()) == [CPU_PID, ENGINE_PID]
    kernels = ev[ev["kind"] == int(EventKind.KERNEL)]
    assert sorted(kernels["name"].astype(str)) == ["engine_kernel"] * 3 + ["front_kernel"]
    calls = ev[ev["kind"] == int(EventKind.RUNTIME)]
    # each kernel keeps its own process's launch: correlation ids no longer collide
    pid_of_call = dict(zip(calls["correlation"].tolist(), calls["pid"].tolist()))
    assert len(pid_of_call) == 4
    for name, corr in zip(kernels["name"].astype(str), kernels["correlation"].tolist()):
        assert pid_of_call[corr] == (CPU_PID if name == "front_kernel" else ENGINE_PID)
    # and its own process's op
    ops = trace.launching_op_rows(kernels.index.to_numpy())
    assert [int(ev["pid"].iloc[int(r)]) for r in ops] == [CPU_PID if n == "front_kernel" else ENGINE_PID
                                                          for n in kernels["name"].astype(str)]


def test_one_step_sequence_per_rank_is_the_stepping_process(tmp_path: Path) -> None:
    trace = load_trace(_two_processes(tmp_path / "run"))
    ann = trace.events[trace.events["kind"] == int(EventKind.ANNOTATION)]
    steps = {(int(p), str(n)) for p, n in zip(ann["pid"], ann["name"])}
    assert steps == {(ENGINE_PID, "ProfilerStep#0"), (ENGINE_PID, "ProfilerStep#1"), (ENGINE_PID, "ProfilerStep#2"),
                     (CPU_PID, f"ProfilerStep#0 (process {CPU_PID})")}
    graph = build_graph(trace)
    # the steps are the engine core's, and the front-end's long wait does not stretch them
    windows = graph.steps[["step", "measured_begin_ns", "measured_end_ns"]].to_numpy().tolist()
    base_ns = 1_000_000_000
    assert windows == [[n, base_ns + n * 100_000, base_ns + n * 100_000 + 90_000] for n in range(3)]
    tasks = graph.tasks
    calls = tasks.loc[tasks["kind"] == int(TaskKind.CPU_CALL), "event"]
    threads = {int(trace.events["pid"].iloc[int(e)]) for e in calls}
    assert threads == {CPU_PID, ENGINE_PID}
    launches = graph.edges[graph.edges["kind"] == int(EdgeKind.LAUNCH)]
    pid = trace.events["pid"].to_numpy()
    kernel_name = trace.events["name"].astype(str).to_numpy()
    src_pid = pid[tasks["event"].to_numpy()[launches["src"].to_numpy()]]
    dst_name = kernel_name[tasks["event"].to_numpy()[launches["dst"].to_numpy()]]
    assert len(launches) == 4
    assert [int(p) for p in src_pid] == [CPU_PID if n == "front_kernel" else ENGINE_PID for n in dst_name]


def test_same_process_twice_is_still_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="both claim rank 0"):
        load_trace(_two_processes(tmp_path / "run", engine_pid=CPU_PID))


def test_cache_keeps_the_files_of_a_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WHATIF_CACHE_DIR", str(tmp_path / "cache"))
    run = _two_processes(tmp_path / "run")
    first, again = load_trace(run), load_trace(run)
    assert [r.files for r in again.ranks] == [r.files for r in first.ranks]
    assert again.events.equals(first.events)


def test_child_config_round_trip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    options = RecordOptions(output=tmp_path / "run", schedule=Schedule(wait=1, warmup=2, active=3, repeat=2),
                            record_shapes=True, step_on="mod:fn")
    monkeypatch.delenv("RANK", raising=False)
    config = ChildConfig.of(options)
    monkeypatch.setenv(CHILD_ENV, json.dumps({"run_dir": config.run_dir, **{
        k: getattr(config, k) for k in ChildConfig.__struct_fields__ if k != "run_dir"}}))
    back = read_config()
    assert back == config and back.parent_pid == os.getpid() and not back.parent_env_rank
    child = back.options()
    assert (child.output, child.schedule, child.record_shapes, child.step_on) == (
        (tmp_path / "run").resolve(), options.schedule, True, "mod:fn")
    monkeypatch.setenv(CHILD_ENV, "{not json")
    assert read_config() is None


@pytest.mark.parametrize("module", [processes, distributed, summary, signals])
def test_doctests(module: object) -> None:
    assert doctest.testmod(module).failed == 0  # type: ignore[arg-type]


def test_rank_0_counts_its_own_children_not_the_other_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torchrun meta.jsonc lists every rank's processes; rank 0's summary counts only the
    processes below it (here: a child and its child, not rank 1 or rank 1's child)."""
    from whatif.tracer.record import record, resolve_target
    from whatif.tracer.record.processes import ProcessRecord, ProcessRole, add_process

    run = tmp_path / "run"
    run.mkdir()
    me, launcher = os.getpid(), os.getppid()
    for role, pid, parent, rank in [(ProcessRole.MAIN, 900001, launcher, 1), (ProcessRole.CHILD, 900002, 900001, 1),
                                    (ProcessRole.CHILD, 900003, me, 0), (ProcessRole.CHILD, 900004, 900003, 0)]:
        add_process(run, ProcessRecord(role=role, name="p", pid=pid, parent_pid=parent, rank=rank, file=None,
                                       exit_status=0))
    script = tmp_path / "prog.py"
    script.write_text("import torch\nprint(torch.ones(2).sum())\n")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    result = record(resolve_target(str(script), None, []), RecordOptions(output=run, progress=False),
                    ["whatif", "record"])
    assert result.exit_status == 0 and len(result.meta["processes"]) == 5
    assert [ln for ln in result.report_lines if ln.startswith("child processes")] == [
        "child processes: 2 traced so far (meta.jsonc lists them)"]


def test_a_signal_in_a_shielded_step_waits_for_its_end() -> None:
    import signal

    from whatif.tracer.record.signals import ProgramTerminated, SignalGuard
    guard = SignalGuard()
    done: list[str] = []

    def step() -> None:
        signal.raise_signal(signal.SIGTERM)
        done.append("step finished")

    guard.install()
    try:
        with pytest.raises(ProgramTerminated):
            guard.shielded(step)()
        assert done == ["step finished"] and guard.first == (signal.SIGTERM, "program")
        with pytest.raises(ProgramTerminated):  # outside a shielded call: at once
            signal.raise_signal(signal.SIGTERM)
    finally:
        guard.restore()


def test_sigterm_calls_terminate_instead_of_raising_and_sigint_still_raises() -> None:
    import signal

    from whatif.tracer.record.signals import SignalGuard
    ended: list[int] = []

    def terminate(signum: int) -> None:
        ended.append(signum)
        raise SystemExit(0)  # stands in for the process ending

    guard = SignalGuard(terminate=terminate)
    guard.install()
    try:
        with pytest.raises(SystemExit):
            guard.shielded(lambda: signal.raise_signal(signal.SIGTERM))()
        assert ended == [signal.SIGTERM]  # held until the shielded call returned, then terminate
        with pytest.raises(KeyboardInterrupt):  # SIGINT unwinds the program, as under python
            signal.raise_signal(signal.SIGINT)
        assert ended == [signal.SIGTERM]
    finally:
        guard.restore()


def test_torch_import_hook_ignores_other_modules() -> None:
    assert TorchImportHook().find_spec("json", None) is None


def test_main_alias_finds_the_programs_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    program = type(sys)("__main__")
    program.Request = type("Request", (), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "__main__", program)
    alias = MainAlias("__mp_main__")
    assert alias.Request is program.Request
    with pytest.raises(AttributeError):
        alias.missing  # noqa: B018


# -- the real CLI --------------------------------------------------------------------------------
def _record(tmp_path: Path, *args: str, timeout_s: float = 300) -> tuple[Path, subprocess.CompletedProcess[str]]:
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "whatif.cli", "record", "--no-summary", "-o", str(run), *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout_s)
    return run, done


def _meta(run: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((run / "meta.jsonc").read_text())


def _cpu_pids(path: Path) -> set[int]:
    doc = json.loads(gzip.decompress(path.read_bytes()))
    return {ev["pid"] for ev in doc["traceEvents"] if ev.get("ph") == "X" and ev.get("cat") != "Trace"
            and isinstance(ev.get("tid"), int) and ev["pid"] != "Spans"}


def _window_ns(trace: object, pid: int) -> tuple[int, int]:
    ev = trace.events  # type: ignore[attr-defined]
    mine = ev[ev["pid"] == pid]
    return int(mine["ts_ns"].min()), int((mine["ts_ns"] + mine["dur_ns"]).max())


@pytest.mark.slow
@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_engine_split_traces_the_engine_core(tmp_path: Path, start_method: str) -> None:
    run, done = _record(tmp_path, str(REPO / "examples" / "engine_split.py"), "--num-requests", "3",
                        "--output-len", "4", "--start-method", start_method)
    assert done.returncode == 0, done.stderr
    meta = _meta(run)
    roles = [(p["role"], p["name"], p["rank"]) for p in meta["processes"]]
    assert roles == [("main", "engine_split.py", 0), ("engine_core", "EngineCore_0", 0)]
    main, core = meta["processes"]
    assert core["parent_pid"] == main["pid"] and core["exit_status"] == 0 and core["end"]["signal"] is None
    assert core["file"] == f"rank0.engine_core.{core['pid']}.pt.trace.json.gz"
    assert sorted(meta["trace_files"]) == sorted([main["file"], core["file"]])
    assert not [p for p in run.iterdir() if p.name.startswith(".")]
    # the engine core's file holds its own process only (a forked child does not repeat its parent's events)
    assert _cpu_pids(run / core["file"]) == {core["pid"]}
    trace = load_trace(run)
    ev = trace.events
    linear = ev[(ev["name"].astype(str) == "aten::linear")]
    assert set(linear["pid"].tolist()) == {core["pid"]} and len(linear) >= 3 * 3
    steps = ev[ev["name"].astype(str).str.fullmatch(r"ProfilerStep#\d+")]
    assert set(steps["pid"].tolist()) == {core["pid"]} and len(steps) >= 4
    # one clock: the engine core ran while the front-end waited for it
    main_start, main_end = _window_ns(trace, main["pid"])
    core_start, core_end = _window_ns(trace, core["pid"])
    assert main_start < core_start < core_end < main_end
    analyzed = subprocess.run([sys.executable, "-m", "whatif.cli", "analyze", str(run)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
    assert analyzed.returncode == 0, analyzed.stderr
    assert "run (2 files): rank 0" in analyzed.stdout


@pytest.mark.slow
def test_engine_core_stopped_by_sigterm_leaves_a_readable_trace(tmp_path: Path) -> None:
    log = tmp_path / "log.json"
    run, done = _record(tmp_path, str(REPO / "examples" / "engine_split.py"), "--num-requests", "3",
                        "--output-len", "4", "--terminate-after", "1", "--log", str(log))
    assert done.returncode == 0, done.stderr
    meta = _meta(run)
    why = f"{meta['processes']}\n{done.stderr}"
    assert json.loads(log.read_text())["engine"]["exitcode"] == -15, why  # as without whatif
    core = meta["processes"][1]
    assert (core["role"], core["exit_status"], core["end"]["signal"]) == ("engine_core", 143, "SIGTERM"), why
    assert core["end"]["during"] in ("program", "write"), why   # where the signal lands is the scheduler's call
    trace = load_trace(run)
    assert (trace.events["pid"] == core["pid"]).sum() > 0


HANGS_IF_UNWOUND = """
import multiprocessing as mp, sys, threading, time
import torch

def worker(ready):
    torch.ones(4).sum()
    try:
        ready.set()
        while True:
            time.sleep(0.01)
    finally:  # never reached under python: SIGTERM ends the process at once
        threading.Event().wait()

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    child = ctx.Process(target=worker, args=(ready,), name="Worker")
    child.start()
    assert ready.wait(120)
    child.terminate()
    child.join(120)
    print("exitcode", child.exitcode)
    sys.exit(0 if child.exitcode == -15 else 1)
"""


@pytest.mark.slow
def test_sigterm_ends_a_child_at_once_without_running_its_finally_blocks(tmp_path: Path) -> None:
    # unwinding the child's program on SIGTERM ran its finally blocks and multiprocessing's
    # finalizers, which can wait forever (a queue's lock held by the code the signal interrupted)
    program = tmp_path / "hangs_if_unwound.py"
    program.write_text(HANGS_IF_UNWOUND)
    run, done = _record(tmp_path, str(program), timeout_s=200)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "exitcode -15" in done.stdout
    child = _meta(run)["processes"][1]
    assert (child["name"], child["exit_status"], child["end"]) == ("Worker", 143,
                                                                   {"signal": "SIGTERM", "during": "program"})
    ev = load_trace(run).events
    assert (ev["pid"] == child["pid"]).sum() > 0


@pytest.mark.slow
def test_engine_core_that_raises_leaves_a_readable_trace(tmp_path: Path) -> None:
    run, done = _record(tmp_path, str(REPO / "examples" / "engine_split.py"), "--num-requests", "3",
                        "--output-len", "4", "--fail-after", "2")
    assert done.returncode == 1, done.stderr  # the front-end's status: it saw its engine core die
    assert "RuntimeError: engine core: failing after 2 iterations" in done.stderr
    core = _meta(run)["processes"][1]
    assert (core["role"], core["exit_status"], core["end"]["signal"]) == ("engine_core", 1, None)
    ev = load_trace(run).events
    steps = ev[(ev["pid"] == core["pid"]) & ev["name"].astype(str).str.fullmatch(r"ProfilerStep#\d+")]
    assert len(steps) == 3  # two iterations and the one it died in


@pytest.mark.slow
def test_spawned_gloo_workers_are_two_ranks(tmp_path: Path) -> None:
    run, done = _record(tmp_path, str(REPO / "examples" / "spawn_workers.py"), "--workers", "2", "--steps", "3")
    assert done.returncode == 0, done.stderr
    processes = _meta(run)["processes"]
    assert [(p["role"], p["rank"]) for p in processes] == [("main", 0), ("child", 0), ("child", 1)]
    workers = processes[1:]
    assert [p["name"] for p in workers] == ["SpawnProcess-1", "SpawnProcess-2"]
    assert all(p["parent_pid"] == processes[0]["pid"] and p["exit_status"] == 0 for p in workers)
    trace = load_trace(run)
    assert [(r.rank, r.world_size, len(r.files)) for r in trace.ranks] == [(0, 2, 2), (1, 2, 1)]
    for worker in workers:
        ev = trace.events[trace.events["pid"] == worker["pid"]]
        assert (ev["rank"] == worker["rank"]).all()
        assert ev["name"].astype(str).str.contains("allreduce|all_reduce").any()
        assert ev["name"].astype(str).str.fullmatch(r"ProfilerStep#\d+").sum() >= 3


SUBPROCESSES = """
import subprocess, sys
plain = "import json; print(json.dumps([1]))"
with_torch = "import torch, whatif\\nfor _ in range(2):\\n    torch.ones(8).sum()\\n    whatif.step()"
subprocess.run([sys.executable, "-c", plain], check=True)
subprocess.run([sys.executable, "-c", with_torch], check=True)
subprocess.run([sys.executable, "-c", with_torch + "\\nraise RuntimeError('child crash')"])
"""


@pytest.mark.slow
@pytest.mark.parametrize("follow", [True, False])
def test_subprocess_children_that_import_torch_are_traced(tmp_path: Path, follow: bool) -> None:
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(SUBPROCESSES))
    run, done = _record(tmp_path, *([] if follow else ["--no-follow-children"]), str(script))
    assert done.returncode == 0, done.stderr
    names = sorted(p.name for p in run.iterdir())
    processes = _meta(run)["processes"]
    if not follow:
        assert names == ["meta.jsonc", "rank0.pt.trace.json.gz"]
        assert [p["role"] for p in processes] == ["main"]
        return
    # the child that never imports torch writes nothing; the two others are traced, the one that
    # raised too (exit status 1: its uncaught exception)
    assert [p["role"] for p in processes] == ["main", "child", "child"]
    children = processes[1:]
    assert names == sorted(["meta.jsonc", "rank0.pt.trace.json.gz",
                            *(f"rank0.child.{c['pid']}.pt.trace.json.gz" for c in children)])
    assert [c["exit_status"] for c in children] == [None, 1]  # a script's sys.exit code is not seen
    ev = load_trace(run).events
    for child in children:
        assert child["name"] == "-c" and child["parent_pid"] == processes[0]["pid"]
        mine = ev[ev["pid"] == child["pid"]]
        assert np.isin(["aten::ones", "aten::sum"], mine["name"].astype(str).unique()).all()


TORCHRUN_SCRIPT = """
import torch, torch.distributed as dist, whatif
dist.init_process_group("gloo")
x = torch.ones(4)
for _ in range(2):
    dist.all_reduce(x)
    whatif.step()
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_torchrun_as_the_program_traces_its_workers(tmp_path: Path) -> None:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "ddp.py"
    script.write_text(TORCHRUN_SCRIPT)
    run, done = _record(tmp_path, "-m", "torch.distributed.run", "--", "--nproc-per-node", "2",
                        "--master-port", str(port), str(script))
    assert done.returncode == 0, done.stderr
    processes = _meta(run)["processes"]
    assert [(p["role"], p["rank"]) for p in processes] == [("main", 0), ("torchrun_rank", 0), ("torchrun_rank", 1)]
    trace = load_trace(run)
    assert [(r.rank, r.world_size, len(r.files)) for r in trace.ranks] == [(0, 2, 2), (1, 2, 1)]


@pytest.mark.slow
def test_bootstrap_runs_the_sitecustomize_it_hides(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir()
    theirs.mkdir()
    (ours / "sitecustomize.py").write_text((REPO / "tracer" / "record" / "child_site.py").read_text())
    (theirs / "sitecustomize.py").write_text("print('hidden sitecustomize ran')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ours), str(theirs)]),
           "WHATIF_RECORD_SITE_DIR": str(ours), "WHATIF_RECORD_START": "no_such_module_xyz:start"}
    done = subprocess.run([sys.executable, "-c", "import sys; print(type(sys.meta_path[0]).__name__)"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["hidden", "sitecustomize", "ran", "TorchImportHook"]
