"""``record()``: run a program under tracing and write its run folder.

Order of events: check the output folder and the backend (errors before anything runs), arm
the step detector and the signal guard, start tracing, run the program, stop tracing whatever
happened (SIGINT/SIGTERM from here on are deferred, :mod:`.signals`), then write
``rank<k>.pt.trace.json.gz`` and (rank 0) ``meta.jsonc``.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from ..markers import add_step_hook, remove_step_hook
from .children import FollowChildren
from .distributed import DistributedWatcher, rank_from_env
from .meta import build_meta
from .options import RecordOptions
from .output import prepare_output
from .processes import (
    ProcessEnd,
    ProcessRecord,
    ProcessRole,
    add_process,
    count_descendants,
    process_trace_name,
    write_meta,
)
from .progress import ProgressLine
from .session import Session, make_session, options_record, record_info, trace_document
from .signals import ProgramTerminated, SignalGuard, exit_status
from .steps import StepDetector
from .summary import RunSummary, format_summary, summarize
from .target import Target, run_target
from .trace_file import write_trace


@dataclass
class RecordResult:
    """What a recording produced."""

    exit_status: int
    run_dir: Path
    trace_path: Path | None
    trace_bytes: int
    meta: dict[str, Any]
    summary: RunSummary | None
    report_lines: list[str] = field(default_factory=list)
    rank: int = 0


class DurationAlarm:
    """Stops recording after ``duration_s`` seconds of wall-clock time (SIGALRM, main thread)."""

    def __init__(self, duration_s: float | None, stop: Any) -> None:
        self._duration_s = duration_s
        self._stop = stop
        self._previous: Any = None
        self.fired = False

    def arm(self) -> None:
        if self._duration_s is None:
            return
        self._previous = signal.signal(signal.SIGALRM, self._on_alarm)
        signal.setitimer(signal.ITIMER_REAL, self._duration_s)

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        self.fired = True
        self._stop()
        print(f"whatif: --duration {self._duration_s:g} s reached; recording stopped, the program goes on",
              file=sys.stderr)

    def disarm(self) -> None:
        if self._duration_s is None:
            return
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self._previous if self._previous is not None else signal.SIG_DFL)


def record(target: Target, options: RecordOptions, command: list[str]) -> RecordResult:
    """Run ``target`` under tracing; returns the exit status (the program's, or 128 + a signal
    deferred while writing) and what was written. Raises :class:`RecordingAborted` on a second
    signal while writing (no temp file left behind)."""
    env_rank = rank_from_env()
    out = options.output
    session = make_session(options, out)
    search_dirs = [str(target.source_dir), os.getcwd()]
    guard = SignalGuard()
    detector = StepDetector(guard.shielded(session.step), options.step_on, search_dirs)
    detector.install()
    try:
        prepare_output(out, env_rank.rank, env_rank.size, options.force)
    except BaseException:
        detector.uninstall()
        raise
    watcher = DistributedWatcher()
    progress = ProgressLine(target.name, lambda: detector.steps, enabled=options.progress)
    alarm = DurationAlarm(options.duration_s, session.stop)

    def forget_in_forked_child() -> None:
        remove_step_hook(detector.on_mark)
        detector.uninstall()
        watcher.uninstall()
        session.disown()

    follow = FollowChildren(options, forget_in_forked_child) if options.follow_children else None
    main_pid = os.getpid()
    started = False

    def start_tracing() -> None:
        nonlocal started
        session.start(on_yield=detector.yield_to_program)
        started = True

    started_at_s = time.time()
    t0 = time.perf_counter()
    add_step_hook(detector.on_mark)
    watcher.install()
    guard.install()
    status = 1
    try:
        try:
            if follow is not None:
                follow.install()
            # shielded: a signal while the profiler starts (torch's start() takes a second or two) is
            # raised once it has started, so that it can be stopped and its events written
            guard.shielded(start_tracing)()
            alarm.arm()
            progress.start()
            status = run_target(target)
        except KeyboardInterrupt:   # a signal outside the program's own code (tracing start-up)
            status = exit_status(signal.SIGINT)
        except ProgramTerminated as exc:
            status = exit_status(exc.signum)
        finally:
            if os.getpid() == main_pid:
                guard.defer()
                alarm.disarm()
                progress.stop()
                remove_step_hook(detector.on_mark)
                detector.uninstall()
                session.stop()
                watcher.uninstall()
                if follow is not None:
                    follow.uninstall()
        if os.getpid() != main_pid:  # a child the program forked left the program's code: it records itself
            raise SystemExit(status)
        return _write_run(target, options, command, session, detector, watcher, guard, status,
                          started_at_s, time.perf_counter() - t0, started)
    finally:
        if os.getpid() == main_pid:
            guard.restore()


def _write_run(target: Target, options: RecordOptions, command: list[str], session: Session,
               detector: StepDetector, watcher: DistributedWatcher, guard: SignalGuard, status: int,
               started_at_s: float, wall_time_s: float, started: bool) -> RecordResult:
    """Write the trace and (rank 0) meta.jsonc of a recording that has stopped."""
    out = options.output
    rank = watcher.current()
    info = record_info(target.argv, status, session, detector, options)
    trace_path = out / process_trace_name(rank.rank, ProcessRole.MAIN, os.getpid())
    doc = trace_document(session, detector, options, rank, trace_path, info)
    trace_bytes = 0
    summary: RunSummary | None = None
    report: list[str] = []
    if doc is not None:
        trace_bytes = write_trace(trace_path, doc)
        summary = summarize(doc)
        gpu_note = None if session.gpu else \
            "GPU activity: not available (torch sees no CUDA device); the trace holds CPU activity only"
        report = format_summary(summary, gpu_note=gpu_note, options=options.summary_steps)
    end = guard.end()
    if doc is None:
        report = [_no_trace_line(started, end.signal, session, detector, options)]
    main = ProcessRecord(role=ProcessRole.MAIN, name=target.name, pid=os.getpid(), parent_pid=os.getppid(),
                         rank=rank.rank, file=trace_path.name if doc is not None else None, exit_status=status,
                         end=ProcessEnd(signal=end.signal, during=end.during))
    meta = build_meta(command=command, argv=target.argv, cwd=os.getcwd(), exit_status=status,
                      wall_time_s=wall_time_s, started_at_s=started_at_s, backend=session.name,
                      rank=rank.rank, world_size=rank.size, steps=info["steps_marked"],
                      step_source=info["step_source"], gpu_activity=bool(summary and summary.gpu_event_count),
                      source_dir=target.source_dir, trace_files=[main.file] if main.file else [],
                      options=options_record(options), end=end.as_meta())
    if rank.rank == 0:
        meta = write_meta(out, meta, main)
        children = count_descendants(meta["processes"], main.pid)  # not the other ranks' processes
        if children:
            report.append(f"child processes: {children} traced so far (meta.jsonc lists them)")
    else:
        add_process(out, main)
    return RecordResult(exit_status=guard.status(status), run_dir=out,
                        trace_path=trace_path if doc is not None else None, trace_bytes=trace_bytes,
                        meta=meta, summary=summary, report_lines=report, rank=rank.rank)


def _no_trace_line(started: bool, signal_name: str | None, session: Session, detector: StepDetector,
                   options: RecordOptions) -> str:
    """Why a recording that ended wrote no trace, in one line."""
    if not started:
        return f"no trace written: {signal_name} arrived before tracing started" if signal_name else \
            "no trace written: tracing never started"
    if session.program_profiler_used:
        return "no trace written: the program's own torch.profiler finished no cycle before the program ended"
    first = options.schedule.wait + options.schedule.warmup
    if detector.steps >= first:
        return "no trace written: the profiler recorded nothing"
    seen = f"{detector.steps} step boundar{'y' if detector.steps == 1 else 'ies'}"
    return (f"no trace written: the program ended after {seen}, before step {first}, the first the schedule "
            f"records (--wait {options.schedule.wait} --warmup {options.schedule.warmup})")
