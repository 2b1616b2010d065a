"""Replay a trace through its dependency graph and summarize measured vs predicted step times,
the critical path of each step, and the top kernels, ops and layers."""
from __future__ import annotations

import argparse
from pathlib import Path

from whatif.api import analyze
from whatif.documents import write_json
from whatif.predictors.serving.engines.xdit import capture_notes
from whatif.predictors.steps import StepOptions
from whatif.summary import analysis_document, console, render_text
from whatif.tracer.readers import accepted

from ._dataclass_args import add_dataclass_arguments, from_args
from ._progress import working
from ._values import positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, help=f"trace file ({accepted()}), folder of per-rank traces, or run folder")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the whatif.analysis JSON document here")
    parser.add_argument("--top", type=positive_int, default=10,
                        help="rows in the top kernels/ops/layers tables (default 10)")
    parser.add_argument("--steps", action="store_true",
                        help="one row per step in the step and critical-path tables (default: their summary)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing (with --json)")
    add_dataclass_arguments(parser, StepOptions)


def run(args: argparse.Namespace) -> int:
    with working(f"whatif analyze: reading, building and replaying {args.path}", args.quiet):
        analysis = analyze(args.path, from_args(StepOptions, args))
        doc = analysis_document(analysis, top=args.top)
    if args.json:
        write_json(args.json, doc)
    if not args.quiet:
        render_text(doc, console(), steps=args.steps, notes=capture_notes(analysis.trace))
        if args.json:
            print(f"wrote {args.json}")
    return 0
