"""Write the predicted (replayed) timeline of a trace as Kineto traces that Perfetto,
chrome://tracing, HolisticTraceAnalysis and TraceLens open: every input event (nesting, args,
metadata) at its replayed time; one file for one rank, a folder of ``rank<k>`` files for several."""
from __future__ import annotations

import argparse
from pathlib import Path

from whatif.api import analyze
from whatif.core.output import refuse_overwrite
from whatif.predictors.export import export_paths
from whatif.tracer.readers import is_trace_name

from ._progress import working


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, help="trace file, folder of per-rank traces, or run folder")
    parser.add_argument("-o", "--output", type=Path, required=True,
                        help="output file (.json or .json.gz, e.g. predicted.pt.trace.json.gz); for a "
                             "multi-rank input a folder, which gets rank<k>.pt.trace.json.gz per rank")
    parser.add_argument("-f", "--force", action="store_true", help="overwrite the output file(s) if they exist")


def run(args: argparse.Namespace) -> int:
    if is_trace_name(args.output.name):
        refuse_overwrite([args.output], args.force)
    with working(f"whatif export: analyzing {args.path}"):
        analysis = analyze(args.path)
        paths = export_paths(analysis.replay, args.output)
        refuse_overwrite(list(paths.values()), args.force)
        out = analysis.export(args.output)
    print(f"wrote {out}" + (f" ({len(paths)} ranks, one file each)" if len(paths) > 1 else ""))
    return 0
