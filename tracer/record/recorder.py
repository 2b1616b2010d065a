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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

import orjson

from whatif.core.output import write_output

from ..markers import add_step_hook, remove_step_hook
from .distributed import DistributedWatcher, rank_from_env
from .meta import build_meta
from .options import RecordOptions
from .output import META_NAME, prepare_output
from .progress import ProgressLine
from .signals import ProgramTerminated, SignalGuard, exit_status
from .steps import StepDetector
from .summary import RunSummary, format_summary, summarize
from .target import Target, run_target
from .trace_file import fold_leading_steps, merge_cycles, trace_file_name, write_trace


class Session(Protocol):
    """A tracing backend (:class:`TorchSession` or :class:`CuptiSession`)."""

    name: str
    gpu: bool
    cycles: list[dict[str, Any]]
    program_profiler_used: bool

    def start(self, on_yield: Any) -> None: ...
    def step(self) -> None: ...
    def stop(self) -> None: ...


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


def make_session(options: RecordOptions, scratch_dir: Path) -> Session:
    """The backend's session; raises :class:`BackendUnavailableError` before anything runs."""
    if options.backend == "cupti":
        from .cupti_backend import CuptiSession
        return CuptiSession(options)
    from .torch_backend import TorchSession
    return TorchSession(options, scratch_dir)


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


def _options_record(options: RecordOptions) -> dict[str, Any]:
    raw = asdict(options)
    raw["output"] = str(options.output)
    raw.pop("progress", None)
    raw.pop("summary", None)
    raw.pop("summary_steps", None)
    return raw


def record(target: Target, options: RecordOptions, command: list[str]) -> RecordResult:
    """Run ``target`` under tracing; returns the exit status (the program's, or 128 + a signal
    deferred while writing) and what was written. Raises :class:`RecordingAborted` on a second
    signal while writing (no temp file left behind)."""
    env_rank = rank_from_env()
    out = options.output
    session = make_session(options, out)
    search_dirs = [str(target.source_dir), os.getcwd()]
    detector = StepDetector(session.step, options.step_on, search_dirs)
    detector.install()
    try:
        prepare_output(out, env_rank.rank, env_rank.world_size, options.force)
    except BaseException:
        detector.uninstall()
        raise
    watcher = DistributedWatcher()
    progress = ProgressLine(target.name, lambda: detector.steps, enabled=options.progress)
    alarm = DurationAlarm(options.duration_s, session.stop)

    guard = SignalGuard()
    started_at_s = time.time()
    t0 = time.perf_counter()
    add_step_hook(detector.on_mark)
    watcher.install()
    guard.install()
    try:
        try:
            session.start(on_yield=detector.yield_to_program)
            alarm.arm()
            progress.start()
            status = run_target(target)
        except KeyboardInterrupt:   # a signal outside the program's own code (tracing start-up)
            status = exit_status(signal.SIGINT)
        except ProgramTerminated as exc:
            status = exit_status(exc.signum)
        finally:
            guard.defer()
            alarm.disarm()
            progress.stop()
            remove_step_hook(detector.on_mark)
            detector.uninstall()
            session.stop()
            watcher.uninstall()
        return _write_run(target, options, command, session, detector, watcher, guard, status,
                          started_at_s, time.perf_counter() - t0)
    finally:
        guard.restore()


def _write_run(target: Target, options: RecordOptions, command: list[str], session: Session,
               detector: StepDetector, watcher: DistributedWatcher, guard: SignalGuard, status: int,
               started_at_s: float, wall_time_s: float) -> RecordResult:
    """Write the trace and (rank 0) meta.jsonc of a recording that has stopped."""
    out = options.output
    rank = watcher.current()
    folded = detector.tentative_steps if options.schedule.records_from_start else 0
    step_source = detector.source.name.lower()
    record_info = {"argv": target.argv, "exit_status": status, "backend": session.name,
                   "steps_marked": detector.steps - folded, "step_source": step_source,
                   "program_profiler": session.program_profiler_used, "options": _options_record(options)}
    trace_path: Path | None = None
    trace_bytes = 0
    summary: RunSummary | None = None
    report: list[str] = []
    if session.cycles:
        doc = merge_cycles(session.cycles)
        if options.schedule.records_from_start:
            fold_leading_steps(doc, detector.tentative_steps)
        dist_info = doc.get("distributedInfo")
        dist_info = dist_info if isinstance(dist_info, dict) else {}
        doc["distributedInfo"] = {**dist_info, **rank.as_kineto()}
        trace_path = out / trace_file_name(rank.rank)
        doc["traceName"] = str(trace_path)
        doc["whatifRecord"] = record_info
        trace_bytes = write_trace(trace_path, doc)
        summary = summarize(doc)
        gpu_note = None if session.gpu else \
            "GPU activity: not available (torch sees no CUDA device); the trace holds CPU activity only"
        report = format_summary(summary, rank=rank.rank, gpu_note=gpu_note, options=options.summary_steps)
    else:
        report = [f"no trace written: recording never started or nothing was recorded "
                  f"(steps seen: {detector.steps}; schedule {options.schedule})"]

    meta = build_meta(command=command, argv=target.argv, cwd=os.getcwd(), exit_status=status,
                      wall_time_s=wall_time_s, started_at_s=started_at_s, backend=session.name,
                      rank=rank.rank, world_size=rank.world_size, steps=detector.steps - folded,
                      step_source=step_source, gpu_activity=bool(summary and summary.gpu_event_count),
                      source_dir=target.source_dir,
                      trace_files=[trace_path.name] if trace_path else [],
                      options=_options_record(options), end=guard.end().as_meta())
    if rank.rank == 0:
        write_output(out / META_NAME, orjson.dumps(meta, option=orjson.OPT_INDENT_2))
    return RecordResult(exit_status=guard.status(status), run_dir=out, trace_path=trace_path, trace_bytes=trace_bytes,
                        meta=meta, summary=summary, report_lines=report)
