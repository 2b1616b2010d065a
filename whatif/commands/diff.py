"""Compare two traces of the same program, before and after a change: per-step times, GPU
kernels added / removed / slower / faster (by name, per step), GPU time by kernel class and the
critical-path breakdown. With --prediction (a report.json or prediction JSON made on BEFORE),
say how far each scenario's prediction was from what AFTER measured. Means, kernel times per step
and breakdowns are over the steps that count (--include-warmup / --include-partial)."""
from __future__ import annotations

import argparse
from pathlib import Path

import orjson
from rich.console import Console

from whatif.api import analyze
from whatif.core.output import write_output
from whatif.core.steps import StepOptions
from whatif.predictors.serving.engines.xdit import capture_notes
from whatif.report.diff import diff_document
from whatif.report.diff_text import render_diff
from whatif.report.document import load_report

from ._dataclass_args import add_dataclass_arguments, from_args
from ._progress import working
from ._values import nonnegative_float, positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("before", type=Path, help="trace before the change (file, per-rank folder, run folder)")
    parser.add_argument("after", type=Path, help="trace after the change")
    parser.add_argument("-p", "--prediction", type=Path, metavar="REPORT.json",
                        help="report.json (whatif report) or prediction JSON (whatif predict --json) made on BEFORE")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the whatif.diff JSON document")
    parser.add_argument("--top", type=positive_int, default=10, help="kernels listed per change (default 10)")
    parser.add_argument("--tolerance", type=nonnegative_float, default=0.05,
                        help="relative change under which a kernel counts as the same (default 0.05)")
    add_dataclass_arguments(parser, StepOptions)
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing (with --json)")


def run(args: argparse.Namespace) -> int:
    prediction = load_report(args.prediction) if args.prediction else None  # input errors first
    steps = from_args(StepOptions, args)
    with working(f"whatif diff: analyzing {args.before} and {args.after}", args.quiet):
        before, after = analyze(args.before, steps), analyze(args.after, steps)
    doc = diff_document(before, after, prediction, top=args.top,
                        tolerance=args.tolerance)
    if args.json:
        write_output(args.json, orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    if not args.quiet:
        notes = [f"{side}: {note}" for side, a in (("before", before), ("after", after))
                 for note in capture_notes(a.trace)]
        render_diff(doc, Console(width=140), top=args.top, notes=notes)
    return 0
