"""Predict step times under what-if scenarios: replay the baseline graph and the graph each
scenario (a TOML file of transforms, see docs/writing-a-transform.md) produces, and report the
predicted step time, the speedup after every transform, what changed, and the new critical path."""
from __future__ import annotations

import argparse
from pathlib import Path

from whatif.api import predict
from whatif.documents import write_json
from whatif.predictors.cost_models import CostConfig
from whatif.summary import console, prediction_document, render_prediction
from whatif.transforms.scenario import load_scenario

from ._dataclass_args import add_dataclass_arguments, from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, help="trace file, folder of per-rank traces, or run folder")
    parser.add_argument("-s", "--scenario", type=Path, action="append", required=True, metavar="FILE",
                        help="scenario TOML file (repeatable)")
    add_dataclass_arguments(parser, CostConfig)
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the whatif.prediction JSON document")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing (with --json)")


def run(args: argparse.Namespace) -> int:
    cost = from_args(CostConfig, args)
    scenarios = [load_scenario(p) for p in args.scenario]  # validate every file before the slow part
    doc = prediction_document(predict(args.path, scenarios, cost_model=cost.cost_model))
    if args.json:
        write_json(args.json, doc)
    if not args.quiet:
        render_prediction(doc, console())
    return 0
