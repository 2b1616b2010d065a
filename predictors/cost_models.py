"""Cost models by name: the built-ins (``trace``: :class:`~whatif.predictors.costs.TraceCostModel`,
calibrated on the trace; ``datasheet``: :class:`~whatif.predictors.datasheet.DatasheetCostModel`,
the device catalog's figures only) and third-party ones from the entry-point group
``whatif.cost_models`` (``[project.entry-points."whatif.cost_models"] mine = "pkg.mod:MyCostModel"``).

A cost model is a :class:`CostModelBase` subclass with a ``key`` (a member of a ``str`` Enum: the
name ``--cost-model``, a scenario's ``cost_model`` key and the dashboard's dropdown take),
registered with ``COST_MODELS.register``. See docs/extending.md.

>>> COST_MODELS.names()
('trace', 'datasheet')
>>> CostConfig("datasheet").cost_model is CostModelName.DATASHEET
True
>>> CostConfig("roofline")
Traceback (most recent call last):
...
whatif.predictors.cost_models.CostModelError: unknown cost model 'roofline' (cost models: trace, datasheet)
"""
from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from typing import ClassVar

from whatif.core.errors import WhatifError
from whatif.core.registry import EnumRegistry
from whatif.tracer.trace import Trace
from whatif.transforms.base import CostModel


class CostModelError(WhatifError):
    """An unknown cost model name."""


class CostModelName(str, Enum):
    """Keys of the built-in cost models (the names ``--cost-model`` takes)."""

    TRACE = "trace"
    DATASHEET = "datasheet"


class CostModelBase(CostModel):
    """A cost model the registry can build: constructed from the trace whose graphs it prices."""

    key: ClassVar[Enum]

    @abstractmethod
    def __init__(self, trace: Trace) -> None: ...


COST_MODELS: EnumRegistry[type[CostModelBase]] = EnumRegistry(
    "cost model", CostModelBase, builtin_modules=("whatif.predictors.costs", "whatif.predictors.datasheet"),
    entry_point_group="whatif.cost_models", error=CostModelError)
register_cost_model = COST_MODELS.register


@dataclass
class CostConfig:
    """Which cost model prices the transforms' what-ifs (a scenario's own ``cost_model`` key wins)."""

    cost_model: Enum = field(default=CostModelName.TRACE, metadata={
        "help": "cost model for scenarios without a cost_model key (docs/cost-models.md)",
        "choices": COST_MODELS.names})

    def __post_init__(self) -> None:
        self.cost_model = COST_MODELS.key(self.cost_model)
