"""Analysis and prediction: load a trace, build its graph, replay it, apply scenarios.
Re-exported, with the serving API, by :mod:`whatif.api` (the public front door);
:mod:`whatif.serving` builds on this module, so neither imports the other in a cycle.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import pandas as pd

from whatif.depgraph.build import build_graph
from whatif.depgraph.graph import TaskGraph
from whatif.predictors.export import write_chrome_trace
from whatif.predictors.replay import Replay, replay
from whatif.predictors.steps import CriticalPath, critical_path, step_times, utilization
from whatif.tracer.trace import Trace, load_trace
from whatif.transforms.base import Transform, TransformContext
from whatif.transforms.scenario import Scenario, load_scenario

__all__ = ["Analysis", "Prediction", "ScenarioResult", "analyze", "build_graph", "load_scenario", "load_trace",
           "make_context", "predict", "replay"]


@dataclass
class Analysis:
    """A trace, its dependency graph, and the graph's replay."""

    trace: Trace
    graph: TaskGraph
    replay: Replay
    _paths: dict[int, CriticalPath] = field(default_factory=dict, repr=False)

    @cached_property
    def steps(self) -> pd.DataFrame:
        """Per step: ``rank``, ``step``, ``measured_ns``, ``predicted_ns``, ``error``."""
        return step_times(self.replay)

    def critical_path(self, step_row: int) -> CriticalPath:
        """Critical path of row ``step_row`` of :attr:`steps`."""
        if step_row not in self._paths:
            self._paths[step_row] = critical_path(self.replay, step_row)
        return self._paths[step_row]

    @cached_property
    def utilization(self) -> pd.DataFrame:
        return utilization(self.replay)

    def export(self, path: str | Path) -> Path:
        """Write the predicted timeline as a Chrome/Kineto trace (``.json`` or ``.json.gz``)."""
        return write_chrome_trace(self.replay, path)


def analyze(path: str | Path) -> Analysis:
    """Load ``path`` (a trace file, a folder of per-rank traces or a run folder), build the
    dependency graph and replay it."""
    trace = load_trace(path)
    graph = build_graph(trace)
    return Analysis(trace=trace, graph=graph, replay=replay(graph))


def make_context(trace: Trace) -> TransformContext:
    """The context transforms get for ``trace``: the recorded GPU and the trace-calibrated cost models."""
    from whatif.predictors.costs import TraceCostModel

    gpu = next((r.gpu_name for r in trace.ranks if r.gpu_name), None)
    return TransformContext(device=gpu, cost=TraceCostModel(trace))


@dataclass
class ScenarioResult:
    """One scenario's graphs (after each transform) and the replay of the final one."""

    scenario: Scenario
    graphs: list[TaskGraph]
    replays: list[Replay]

    @property
    def graph(self) -> TaskGraph:
        return self.graphs[-1]

    @property
    def replay(self) -> Replay:
        return self.replays[-1]

    @cached_property
    def steps(self) -> pd.DataFrame:
        return step_times(self.replay)


@dataclass
class Prediction:
    """A baseline analysis and the predictions of one or more scenarios on it."""

    baseline: Analysis
    scenarios: list[ScenarioResult]


def predict(path_or_analysis: str | Path | Analysis, scenarios: Sequence[Scenario | str | Path | Transform],
            ctx: TransformContext | None = None) -> Prediction:
    """Apply each scenario (a :class:`Scenario`, a TOML file, or a single transform) to the
    baseline graph and replay after every transform (for the per-transform waterfall)."""
    base = path_or_analysis if isinstance(path_or_analysis, Analysis) else analyze(path_or_analysis)
    ctx = ctx or make_context(base.trace)
    results = []
    for item in scenarios:
        if isinstance(item, Transform):
            scenario = Scenario(name=item.label(), transforms=[item])
        elif isinstance(item, Scenario):
            scenario = item
        else:
            scenario = load_scenario(item)
        graphs = scenario.apply(base.graph, ctx)
        results.append(ScenarioResult(scenario=scenario, graphs=graphs, replays=[replay(g) for g in graphs]))
    return Prediction(baseline=base, scenarios=results)
