"""Write the predicted timeline of a trace as Kineto traces that Perfetto, chrome://tracing,
HolisticTraceAnalysis and TraceLens open: every input event (nesting, args, metadata) at its
replayed time, or with ``-s`` at the time a scenario predicts; one file for one rank, a folder of
``rank<k>`` files for several."""
from __future__ import annotations

import argparse
from pathlib import Path

from whatif.api import analyze, predict
from whatif.core.output import refuse_overwrite
from whatif.predictors.export import export_paths, write_chrome_trace
from whatif.tracer.readers import is_trace_name
from whatif.transforms.scenario import load_scenario

from ._progress import working


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, help="trace file, folder of per-rank traces, or run folder")
    parser.add_argument("-o", "--output", type=Path, required=True,
                        help="output file (.json or .json.gz, e.g. predicted.pt.trace.json.gz); for a "
                             "multi-rank input a folder, which gets rank<k>.pt.trace.json.gz per rank")
    parser.add_argument("-f", "--force", action="store_true", help="overwrite the output file(s) if they exist")
    parser.add_argument("-s", "--scenario", type=Path, metavar="FILE",
                        help="the timeline this scenario predicts (a TOML file of transforms, as `whatif predict` "
                             "takes) instead of the replayed trace")


def run(args: argparse.Namespace) -> int:
    if is_trace_name(args.output.name):
        refuse_overwrite([args.output], args.force)
    scenario = load_scenario(args.scenario) if args.scenario else None
    with working(f"whatif export: analyzing {args.path}"):
        analysis = analyze(args.path)
        replay = analysis.replay if scenario is None else predict(analysis, [scenario]).scenarios[0].replay
        paths = export_paths(replay, args.output)
        refuse_overwrite(list(paths.values()), args.force)
        out = write_chrome_trace(replay, args.output)
    what = f"the timeline {scenario.name!r} predicts" if scenario is not None else "the replayed timeline"
    print(f"wrote {what} to {out}" + (f" ({len(paths)} ranks, one file each)" if len(paths) > 1 else ""))
    return 0
