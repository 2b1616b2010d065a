"""The options every command that predicts scenarios on a trace shares (predict, report, suggest):
the trace, the scenario files, the cost model and which steps count, written once."""
from __future__ import annotations

import argparse
from pathlib import Path

from whatif.predictors.cost_models import CostConfig
from whatif.predictors.steps import StepOptions

from ._dataclass_args import add_dataclass_arguments

TRACE_HELP = "trace file, folder of per-rank traces, or run folder"


def add_trace_and_scenarios(parser: argparse.ArgumentParser, *, scenarios_required: bool = False,
                            scenario_help: str = "scenario TOML file (repeatable)") -> None:
    """``path``, ``-s/--scenario FILE`` (repeatable), ``--cost-model`` and the step options."""
    parser.add_argument("path", type=Path, help=TRACE_HELP)
    scenario: dict = {"required": True} if scenarios_required else {"default": []}
    parser.add_argument("-s", "--scenario", type=Path, action="append", metavar="FILE", help=scenario_help,
                        **scenario)
    add_dataclass_arguments(parser, CostConfig)
    add_dataclass_arguments(parser, StepOptions)
