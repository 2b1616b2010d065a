"""Write the predicted (replayed) timeline of a trace as a Chrome/Kineto trace that Perfetto,
chrome://tracing and HolisticTraceAnalysis open: one track per resource."""
from __future__ import annotations

import argparse
from pathlib import Path

from whatif.api import analyze
from whatif.core.output import refuse_inside_input


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, help="trace file, folder of per-rank traces, or run folder")
    parser.add_argument("-o", "--output", type=Path, required=True,
                        help="output file (.json or .json.gz, e.g. predicted.pt.trace.json.gz)")


def run(args: argparse.Namespace) -> int:
    refuse_inside_input(args.output, args.path)
    out = analyze(args.path).export(args.output)
    print(f"wrote {out}")
    return 0
