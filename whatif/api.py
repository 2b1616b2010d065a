"""The public Python API: load a trace, build its graph, replay it, summarize.

>>> import whatif.api as wi                                    # doctest: +SKIP
>>> analysis = wi.analyze("sample_traces/llm_serve")             # doctest: +SKIP
>>> analysis.steps[["rank", "step", "measured_ns", "predicted_ns"]]  # doctest: +SKIP
"""
from __future__ import annotations

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

__all__ = ["Analysis", "analyze", "build_graph", "load_trace", "replay"]


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
