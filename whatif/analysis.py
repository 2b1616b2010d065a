"""Analysis and prediction: load a trace, build its graph, replay it, apply scenarios.
Re-exported, with the serving API, by :mod:`whatif.api` (the public front door);
:mod:`whatif.serving` builds on this module, so neither imports the other in a cycle.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import cached_property
from pathlib import Path

import pandas as pd

from whatif.depgraph.build import build_graph
from whatif.depgraph.graph import TaskGraph
from whatif.predictors.bounds import step_bounds
from whatif.predictors.cost_models import COST_MODELS, CostModelError, CostModelName
from whatif.predictors.export import write_chrome_trace
from whatif.predictors.replay import Replay, replay
from whatif.predictors.steps import (
    COUNT_DEFAULT,
    CriticalPath,
    StepOptions,
    critical_path,
    step_times,
    step_times_ns,
    utilization,
)
from whatif.tracer.trace import Trace, load_trace
from whatif.transforms.base import Transform, TransformContext
from whatif.transforms.scenario import Scenario, ScenarioError, check_distinct_names, load_scenario
from whatif.transforms.sharing import with_reference

__all__ = ["Analysis", "Prediction", "ScenarioResult", "StepOptions", "analyze", "build_graph", "load_scenario",
           "load_trace", "make_context", "predict", "replay", "scenario_cost_model"]


@dataclass
class Analysis:
    """A trace, its dependency graph, and the graph's replay; ``options``: which steps count in
    means (:class:`~whatif.predictors.steps.StepOptions`)."""

    trace: Trace
    graph: TaskGraph
    replay: Replay
    options: StepOptions = COUNT_DEFAULT
    _paths: dict[int, CriticalPath] = field(default_factory=dict, repr=False)

    @cached_property
    def steps(self) -> pd.DataFrame:
        """Per step: ``rank``, ``step``, ``measured_ns``, ``predicted_ns``, ``error``,
        ``excluded_reason``, ``included`` (:func:`~whatif.predictors.steps.step_times`)."""
        return step_times(self.replay, self.options)

    @cached_property
    def bounds(self) -> pd.DataFrame:
        """Per step: the bounds any prediction respects (:func:`~whatif.predictors.bounds.step_bounds`)."""
        return step_bounds(self.graph)

    def with_options(self, options: StepOptions) -> Analysis:
        """The same analysis counting the steps ``options`` selects (graph and replay shared)."""
        return self if options == self.options else replace(self, options=options, _paths=self._paths)

    def critical_path(self, step_row: int) -> CriticalPath:
        """Critical path of row ``step_row`` of :attr:`steps`."""
        if step_row not in self._paths:
            self._paths[step_row] = critical_path(self.replay, step_row)
        return self._paths[step_row]

    @cached_property
    def utilization(self) -> pd.DataFrame:
        return utilization(self.replay)

    def export(self, path: str | Path) -> Path:
        """Write the predicted timeline as Kineto traces (:func:`~whatif.predictors.export.write_chrome_trace`):
        the file ``path`` (``.json`` or ``.json.gz``) for one rank, the folder ``path`` with a
        ``rank<k>.pt.trace.json.gz`` per rank for several; returns ``path``."""
        return write_chrome_trace(self.replay, path)


def analyze(path: str | Path, options: StepOptions = COUNT_DEFAULT) -> Analysis:
    """Load ``path`` (a trace file, a folder of per-rank traces or a run folder), build the
    dependency graph and replay it."""
    trace = load_trace(path)
    graph = build_graph(trace)
    base = replay(graph)
    with_reference(graph, base.start_ns, base.end_ns)   # what scenarios re-price kernels beside collectives by
    return Analysis(trace=trace, graph=graph, replay=base, options=options)


def make_context(trace: Trace, cost_model: str | Enum = CostModelName.TRACE,
                 collective_points: Sequence[tuple] = ()) -> TransformContext:
    """The context transforms get for ``trace``: the recorded GPU, the cost model named
    ``cost_model`` (``COST_MODELS.names()``; default the trace-calibrated one), calibrated on the
    measured ``collective_points`` as well (a scenario's ``collectives_measured``), and the replay."""
    gpu = trace.gpu_name
    cost = COST_MODELS.get(cost_model)(trace)
    if collective_points:
        cost.measure_collectives(collective_points)
    return TransformContext(device=gpu, cost=cost, step_times_ns=step_times_ns)


def scenario_cost_model(scenario: Scenario, default: str | Enum = CostModelName.TRACE) -> Enum:
    """The key of the cost model that prices ``scenario``: its ``cost_model``, else ``default``
    (:class:`ScenarioError` naming its file when the scenario names an unknown one)."""
    if scenario.cost_model is None:
        return COST_MODELS.key(default)
    try:
        return COST_MODELS.key(scenario.cost_model)
    except CostModelError as exc:
        raise ScenarioError(f"{scenario.source or scenario.name}: cost_model: {exc}") from None


@dataclass
class ScenarioResult:
    """One scenario's graphs (after each transform, as its replay priced it: the replay's
    re-pricing of kernels beside collectives included) and their replays; steps are judged
    (warm-up, partial) on the measured ``reference`` graph and counted under ``options``."""

    scenario: Scenario
    graphs: list[TaskGraph]
    replays: list[Replay]
    reference: TaskGraph | None = None
    options: StepOptions = COUNT_DEFAULT

    @property
    def graph(self) -> TaskGraph:
        return self.graphs[-1]

    @property
    def replay(self) -> Replay:
        return self.replays[-1]

    @cached_property
    def steps(self) -> pd.DataFrame:
        return self.steps_of(self.replay)

    def steps_of(self, rep: Replay) -> pd.DataFrame:
        """:func:`~whatif.predictors.steps.step_times` of one of this scenario's replays."""
        return step_times(rep, self.options, self.reference)


@dataclass
class Prediction:
    """A baseline analysis and the predictions of one or more scenarios on it."""

    baseline: Analysis
    scenarios: list[ScenarioResult]


def predict(path_or_analysis: str | Path | Analysis, scenarios: Sequence[Scenario | str | Path | Transform],
            ctx: TransformContext | None = None, *, cost_model: str | Enum = CostModelName.TRACE) -> Prediction:
    """Apply each scenario (a :class:`Scenario`, a TOML file, or a single transform) to the
    baseline graph and replay after every transform (for the per-transform waterfall).

    ``ctx``, when given, prices every scenario; otherwise each scenario gets the context of its
    own ``cost_model``, else of ``cost_model`` (both checked before the trace is read)."""
    loaded = [Scenario(name=item.label(), transforms=[item]) if isinstance(item, Transform)
              else item if isinstance(item, Scenario) else load_scenario(item) for item in scenarios]
    check_distinct_names(loaded)
    models = [scenario_cost_model(s, cost_model) for s in loaded]
    base = path_or_analysis if isinstance(path_or_analysis, Analysis) else analyze(path_or_analysis)
    contexts: dict[tuple[Enum, tuple[tuple, ...]], TransformContext] = {}
    results = []
    for scenario, model in zip(loaded, models):
        key = (model, scenario.collective_points)
        if ctx is None and key not in contexts:
            contexts[key] = make_context(base.trace, model, scenario.collective_points)
        # an empty scenario predicts the baseline graph itself (copied, replayed afresh)
        graphs = scenario.apply(base.graph, ctx or contexts[key]) or [base.graph.copy()]
        replays = [replay(g) for g in graphs]   # each replay's graph: with the durations it ran with
        results.append(ScenarioResult(scenario=scenario, graphs=[r.graph for r in replays], replays=replays,
                                      reference=base.graph, options=base.options))
    return Prediction(baseline=base, scenarios=results)
