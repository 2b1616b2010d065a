"""Run a PyTorch script (or ``-m module``) in this process under tracing and write a run folder:
``rank<k>.pt.trace.json.gz`` (Kineto JSON, one per rank) and ``meta.jsonc``.

  whatif record [options] [--] script.py [args...]
  whatif record [options] -m module [args...]

Steps come from ``whatif.step()`` in the program, its own torch.profiler schedule, each
``optimizer.step()``, each call of the outermost model, or ``--step-on module:function``.
Exit status is the program's (an uncaught exception gives 1, Ctrl-C 130, SIGTERM 143); 2 for bad
options; 128 + the signal number when a signal arrived while the trace was being written.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from whatif.core.steps import StepOptions

from ._dataclass_args import add_dataclass_arguments, from_args
from ._values import nonnegative_int, positive_float, positive_int

SCHEDULE_FLAGS = ("wait", "warmup", "active", "repeat")
DEFAULT_WARMUP_STEPS = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("-o", "--output", type=Path, metavar="DIR",
                        help="run folder (default: whatif-runs/<script>-<timestamp>/)")
    parser.add_argument("-f", "--force", action="store_true", help="overwrite a recording in DIR")
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a module, like python -m")
    sched = parser.add_argument_group("schedule (in steps; without these, everything is recorded)")
    sched.add_argument("--wait", type=nonnegative_int, metavar="N", help="steps to skip first (default 0)")
    sched.add_argument("--warmup", type=nonnegative_int, metavar="N",
                       help=f"steps traced but dropped, so start-up cost stays out (default {DEFAULT_WARMUP_STEPS})")
    sched.add_argument("--active", type=positive_int,
                       metavar="N", help="steps to record per cycle (default: until the end)")
    sched.add_argument("--repeat", type=positive_int, metavar="N", help="cycles (default 1; needs --active)")
    what = parser.add_argument_group("what to record")
    what.add_argument("--record-shapes", action="store_true", help="input shapes of each op")
    what.add_argument("--with-stack", action="store_true", help="Python call stacks (larger, slower)")
    what.add_argument("--memory", "--profile-memory", dest="profile_memory", action="store_true",
                      help="allocator records of every tensor allocation and free, for whatif memory (torch.profiler's "
                           "profile_memory)")
    what.add_argument("--duration", type=positive_float, metavar="S",
                      help="stop recording after S seconds of wall-clock time (for programs without steps)")
    what.add_argument("--step-on", metavar="MODULE:FUNCTION",
                      help="a step ends each time this function returns (e.g. mypkg.server:run_iteration)")
    what.add_argument("--backend", choices=("torch", "cupti"), default="torch",
                      help="torch: torch.profiler/Kineto (default); cupti: NVIDIA cupti-python Activity API")
    what.add_argument("--no-follow-children", dest="follow_children", action="store_false",
                      help="trace only this process, not the program's Python children that import torch")
    parser.add_argument("--no-summary", dest="summary", action="store_false", help="print no summary")
    add_dataclass_arguments(parser.add_argument_group("summary"), StepOptions)
    parser.add_argument("script", nargs="?", metavar="script.py", help="the program to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")


def _schedule_from(args: argparse.Namespace) -> tuple[object, str | None]:
    from whatif.tracer.record import Schedule
    given = {name: getattr(args, name) for name in SCHEDULE_FLAGS if getattr(args, name) is not None}
    if not given:
        return Schedule(), None
    warmup = given.get("warmup", DEFAULT_WARMUP_STEPS)
    warning = ("whatif: warning: --warmup 0: the first recorded step also holds the profiler's start-up "
               "cost") if warmup == 0 else None
    return Schedule(wait=given.get("wait", 0), warmup=warmup, active=given.get("active"),
                    repeat=given.get("repeat", 1)), warning


def run(args: argparse.Namespace) -> int:
    from whatif.tracer.record import (
        RecordOptions,
        default_output,
        record,
        resolve_target,
    )
    from whatif.tracer.record.distributed import rank_from_env
    from whatif.tracer.record.signals import RecordingAborted, exit_status
    from whatif.tracer.record.summary import rank_lines

    script, prog_args = args.script, list(args.args)
    if args.module is not None and script is not None:
        prog_args.insert(0, script)
        script = None
    target = resolve_target(script, args.module, prog_args)
    schedule, warning = _schedule_from(args)
    world_size = rank_from_env().size
    output = args.output if args.output is not None else default_output(target.name, world_size=world_size)
    options = RecordOptions(output=output, force=args.force, schedule=schedule,  # type: ignore[arg-type]
                            record_shapes=args.record_shapes, with_stack=args.with_stack,
                            profile_memory=args.profile_memory, duration_s=args.duration,
                            step_on=args.step_on, backend=args.backend, follow_children=args.follow_children,
                            summary=args.summary,
                            summary_steps=from_args(StepOptions, args))
    if warning:
        print(warning, file=sys.stderr)
    command = ["whatif", "record", *sys.argv[2:]] if sys.argv[1:2] == ["record"] else ["whatif", "record"]
    try:
        result = record(target, options, command)
    except RecordingAborted as exc:
        print(f"whatif: {exc}", file=sys.stderr)
        return exit_status(exc.signum)
    if args.summary:
        lines = [f"whatif record: {target.name} exited with status {result.exit_status} "
                 f"after {result.meta['wall_time_s']:.1f} s"]
        lines += result.report_lines
        if result.trace_path is not None:
            lines.append(f"trace: {result.trace_path} ({result.trace_bytes / 1e6:.2f} MB)")
            if result.rank == 0:
                lines.append(f"next: whatif analyze {shlex.quote(str(result.run_dir))}")
        print("\n".join(rank_lines(lines, result.rank)), file=sys.stderr)
    return result.exit_status
