"""Predict step times under what-if scenarios: replay the baseline graph and the graph each
scenario (a TOML file of transforms, see docs/writing-a-transform.md) produces, and report the
predicted step time, the speedup after every transform, what changed, and the new critical path.
A scenario a transform refuses (a selection that matches nothing, with what it could have
matched) is reported on stderr while the others are still predicted (exit 2)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from whatif.api import Prediction, analyze, predict
from whatif.documents import write_json
from whatif.predictors.cost_models import CostConfig
from whatif.predictors.serving.engines.xdit import capture_notes
from whatif.predictors.steps import StepOptions
from whatif.summary import console, prediction_document, render_prediction
from whatif.transforms.base import TransformError
from whatif.transforms.scenario import check_distinct_names, load_scenario

from ._dataclass_args import from_args
from ._progress import working
from ._trace_scenarios import add_trace_and_scenarios


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_trace_and_scenarios(parser, scenarios_required=True)
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the whatif.prediction JSON document")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing (with --json)")


def run(args: argparse.Namespace) -> int:
    """Exit 0, or 2 when a scenario could not be applied: each such scenario is one ``whatif:``
    line on stderr (with the transform's reason), and every other scenario is still predicted."""
    cost = from_args(CostConfig, args)
    scenarios = [load_scenario(p) for p in args.scenario]  # validate every file before the slow part
    check_distinct_names(scenarios)
    with working(f"whatif predict: analyzing {args.path}", args.quiet) as status:
        base = analyze(args.path, from_args(StepOptions, args))
        results, refused = [], []
        for scenario in scenarios:
            status(f"whatif predict: {scenario.name}")
            try:
                results += predict(base, [scenario], cost_model=cost.cost_model).scenarios
            except TransformError as exc:
                refused.append(str(exc))
        status("whatif predict: critical paths")
        doc = prediction_document(Prediction(baseline=base, scenarios=results))
    if args.json:
        write_json(args.json, doc)
    if not args.quiet:
        render_prediction(doc, console(), notes=capture_notes(base.trace))
    for line in refused:
        print(f"whatif: {line}", file=sys.stderr)
    return 2 if refused else 0
