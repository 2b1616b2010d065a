"""The ``whatif`` command: one sub-command per module in :mod:`whatif.commands`.

Exit codes (like pytest's): 0 success, 1 a threshold or check failed, 2 bad input or usage,
130 interrupted. Errors are printed as one line: ``whatif: <file>: <problem>``.
"""
from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from whatif import __version__
from whatif.core.errors import WhatifError
from whatif.tracer import cache

from .commands._device_specs import device_specs
from .commands._outputs import refuse_clobbering, settle_quiet

# name -> module in whatif.commands; each module has ``add_arguments(parser)`` and ``run(args) -> int``
COMMANDS: dict[str, str] = {
    "analyze": "Replay a trace and summarize measured vs predicted step times",
    "breakdown": "Where each GPU's time went: idle, compute, communication, idle causes, launch delays, queues",
    "memory": "The memory timeline: peak allocated/reserved per device, what held it, per step and operator",
    "collectives": "The collectives of a multi-rank job: bus bandwidth, arrival skew, stragglers, per rank",
    "job": "Analyze a job of many ranks rank-parallel (local processes or Ray): steps, time and memory per group",
    "ops": "Per-op roofline table: time, FLOPs, bytes, achieved TFLOP/s and TB/s, share of the roofline, bound",
    "export": "Write the predicted timeline as a Chrome/Kineto trace (Perfetto, HTA)",
    "predict": "Predict step times under what-if scenarios (TOML files of transforms)",
    "suggest": "Try every optimization whatif knows on a trace and rank them by predicted speedup",
    "nanoflow": "NanoFlow's intra-device overlap priced on a trace: nano-batches on a partition of the GPU",
    "transforms": "List the registered transforms and their parameters",
    "record": "Run a PyTorch script under tracing and write a run folder",
    "dashboard": "Open the web dashboard on traces and run folders",
    "devices": "List the GPU catalog with peak rates and bandwidths",
    "serve": "Predict TTFT, TPOT, latency and throughput of a serving loop under a workload and scenarios",
    "sweep": "Latency-vs-throughput curves of a serving loop over arrival rates (and scenarios)",
    "report": "Write a prediction report for CI (Markdown, JSON, HTML, JUnit) with pass/fail thresholds",
    "diff": "Compare two traces (steps, kernels, critical path) and check a prediction against the after one",
}

NO_TRACES = frozenset({"transforms", "devices", "record"})  # the commands that load no trace (no --no-cache)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2
        self.exit(2, f"whatif: {message} (see 'whatif {self.prog.split()[-1]} --help')\n"
                  if " " in self.prog else f"whatif: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="whatif", description="What-if analysis of GPU traces of LLM and DiT programs.")
    parser.add_argument("--version", action="version", version=f"whatif {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, help_text in COMMANDS.items():
        module = importlib.import_module(f"whatif.commands.{name}")
        cmd = sub.add_parser(name, help=help_text, description=module.__doc__)
        module.add_arguments(cmd)
        if name not in NO_TRACES:
            cmd.add_argument("--no-cache", action="store_true",
                             help="parse the trace files, neither reading nor writing the trace cache (docs/scale.md)")
        cmd.set_defaults(_run=module.run)
    return parser


_OUTPUT_ERRNOS = (errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EFBIG)  # writing stdout failed


def main(argv: Sequence[str] | None = None) -> int:
    try:  # building the parser imports every command and lists the registries, which load plugins
        parser = build_parser()
        args = parser.parse_args(argv)
    except WhatifError as exc:
        print(f"whatif: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C during start-up: no traceback of half-done imports
        print("whatif: interrupted", file=sys.stderr)
        return 130
    _report_input_warnings()
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        refuse_clobbering(args)
        settle_quiet(args)
        with device_specs(args), cache.bypassed(bool(vars(args).get("no_cache"))):
            code = int(args._run(args) or 0)
        sys.stdout.flush()  # a full disk or a closed pipe shows here, not at the interpreter's exit
        return code
    except WhatifError as exc:
        print(f"whatif: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("whatif: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader left (`| head`): what it wanted was written
        _drop_stdout()
        return 0
    except OSError as exc:
        if exc.errno not in _OUTPUT_ERRNOS:
            raise
        _drop_stdout()
        print(f"whatif: cannot write the output: {exc.strerror}", file=sys.stderr)
        return 2


def _report_input_warnings() -> None:
    """Data problems of a loaded trace that do not stop the analysis (``whatif.input``) as
    ``whatif: warning: <file>: <problem>`` lines on stderr, once per process."""
    log = logging.getLogger("whatif.input")
    if not any(isinstance(h, _StderrNow) for h in log.handlers):
        log.addHandler(_StderrNow())
        log.propagate = False


class _StderrNow(logging.Handler):
    """Writes each record to the ``sys.stderr`` of the moment it is emitted (a test or a caller may
    have replaced it since the handler was made)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"whatif: warning: {record.getMessage()}", file=sys.stderr)


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's flush at exit does not fail a second time."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
