"""The options every command that predicts scenarios on a trace shares (predict, report, suggest):
the trace, the scenario files, the cost model, which steps count and the device specs, written once."""
from __future__ import annotations

import argparse
from pathlib import Path

from whatif.predictors.cost_models import CostConfig
from whatif.predictors.steps import StepOptions

from ._dataclass_args import add_dataclass_arguments
from ._device_specs import add_device_spec_argument

TRACE_HELP = "trace file, folder of per-rank traces, or run folder"


def add_trace_and_scenarios(parser: argparse.ArgumentParser, *, scenarios_required: bool = False,
                            scenario_help: str = "scenario TOML file (repeatable)") -> None:
    """``path``, ``-s/--scenario FILE`` (repeatable), ``--cost-model``, the step options and
    ``--device-spec FILE``."""
    parser.add_argument("path", type=Path, help=TRACE_HELP)
    scenario: dict = {"required": True} if scenarios_required else {"default": []}
    parser.add_argument("-s", "--scenario", type=Path, action="append", metavar="FILE", help=scenario_help,
                        **scenario)
    add_dataclass_arguments(parser, CostConfig)
    add_dataclass_arguments(parser, StepOptions)
    add_device_spec_argument(parser)
