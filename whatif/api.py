"""The public Python API: load a trace, build its graph, replay it, summarize, predict, serve.

>>> import whatif.api as wi                                    # doctest: +SKIP
>>> analysis = wi.analyze("sample_traces/llm_serve")             # doctest: +SKIP
>>> analysis.steps[["rank", "step", "measured_ns", "predicted_ns"]]  # doctest: +SKIP
>>> wi.serve(analysis, ["scenarios/faster_linear.toml"], wi.Workload(rate=10))  # doctest: +SKIP

The names live in :mod:`whatif.analysis` (analysis and prediction) and :mod:`whatif.serving`
(serving predictions, built on the former).
"""
from __future__ import annotations

from whatif.analysis import (
    Analysis,
    Prediction,
    ScenarioResult,
    analyze,
    build_graph,
    load_scenario,
    load_trace,
    make_context,
    predict,
    replay,
)
from whatif.nanoflow import NanoFlowOptions, nanoflow
from whatif.ops import ops_table
from whatif.serving import (
    DitOptions,
    ServingModels,
    Workload,
    fit_serving,
    serve,
    sweep,
)

__all__ = ["Analysis", "DitOptions", "NanoFlowOptions", "Prediction", "ScenarioResult", "ServingModels", "Workload",
           "analyze", "build_graph", "fit_serving", "load_scenario", "load_trace", "make_context", "nanoflow",
           "ops_table", "predict", "replay", "serve", "sweep"]
