"""Write the predicted (replayed) timeline of a trace as a Chrome/Kineto trace that Perfetto,
chrome://tracing and HolisticTraceAnalysis open: one track per resource."""
from __future__ import annotations

import argparse
from pathlib import Path

from whatif.api import analyze
from whatif.core.output import OutputError, refuse_overwrite
from whatif.tracer.readers import is_trace_name

from ._progress import working


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, help="trace file, folder of per-rank traces, or run folder")
    parser.add_argument("-o", "--output", type=Path, required=True,
                        help="output file (.json or .json.gz, e.g. predicted.pt.trace.json.gz)")
    parser.add_argument("-f", "--force", action="store_true", help="overwrite the output file if it exists")


def refuse_inside_input(output: str | Path, input_path: str | Path) -> None:
    """Refuse an output that a trace reader would take for a trace, inside an input folder: the
    folder would no longer load (a second "rank" file).

    >>> refuse_inside_input("/runs/a/predicted.json", "/runs/a")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    whatif.core.output.OutputError: /runs/a/predicted.json: inside the input folder /runs/a, ...
    >>> refuse_inside_input("/runs/predicted.json", "/runs/a")
    """
    out, src = Path(output).absolute(), Path(input_path).absolute()
    if is_trace_name(out.name) and src in out.parents:
        raise OutputError(f"{output}: inside the input folder {input_path}, where a trace file would become part "
                          "of it; write it elsewhere")


def run(args: argparse.Namespace) -> int:
    refuse_inside_input(args.output, args.path)
    refuse_overwrite([args.output], args.force)
    with working(f"whatif export: analyzing {args.path}"):
        out = analyze(args.path).export(args.output)
    print(f"wrote {out}")
    return 0
