"""Figures as plain functions: a whatif document in, a plotly figure out.

Shared by the dashboard and the HTML reports, so both show the same pictures. Inputs are the
versioned JSON documents (``whatif.analysis``, ``whatif.prediction``), never live objects, so a
figure can be rebuilt from a saved report.
"""
from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

CATEGORY_COLORS = {"cpu": "#4C78A8", "launch": "#72B7B2", "gpu": "#54A24B", "comm": "#E45756", "sync": "#F58518",
                   "idle": "#BAB0AC"}
MEASURED, PREDICTED = "#9D755D", "#4C78A8"


def _step_labels(steps: list[dict[str, Any]]) -> list[str]:
    multi_rank = len({s["rank"] for s in steps}) > 1
    return [f"r{s['rank']}/{s['step']}" if multi_rank else str(s["step"]) for s in steps]


def step_times_figure(analysis: dict[str, Any]) -> go.Figure:
    """Measured vs replayed time of every step (the fidelity figure), in ms.

    >>> doc = {"steps": [{"rank": 0, "step": 1, "measured_ns": 2_000_000, "predicted_ns": 2_100_000}]}
    >>> [trace.name for trace in step_times_figure(doc).data]
    ['measured', 'replayed']
    """
    steps = analysis["steps"]
    x = _step_labels(steps)
    fig = go.Figure([
        go.Bar(name="measured", x=x, y=[s["measured_ns"] / 1e6 for s in steps], marker_color=MEASURED),
        go.Bar(name="replayed", x=x, y=[s["predicted_ns"] / 1e6 for s in steps], marker_color=PREDICTED),
    ])
    fig.update_layout(barmode="group", title="Step time: measured vs replayed", xaxis_title="step",
                      yaxis_title="ms", legend_orientation="h")
    return fig


def breakdown_figure(paths: list[dict[str, Any]], title: str = "Critical path per step") -> go.Figure:
    """Stacked critical-path breakdown (cpu, launch, gpu, comm, sync, idle) per step, in ms.

    ``paths``: the ``critical_path`` list of an analysis or of a prediction's baseline/scenario.
    """
    x = _step_labels(paths)
    cats = list(paths[0]["breakdown_ns"]) if paths else list(CATEGORY_COLORS)
    fig = go.Figure([go.Bar(name=c, x=x, y=[p["breakdown_ns"][c] / 1e6 for p in paths],
                            marker_color=CATEGORY_COLORS.get(c)) for c in cats])
    fig.update_layout(barmode="stack", title=title, xaxis_title="step", yaxis_title="ms", legend_orientation="h")
    return fig


def scenarios_figure(prediction: dict[str, Any]) -> go.Figure:
    """Mean predicted step time of the baseline and every scenario, labelled with the speedup.

    >>> doc = {"baseline": {"mean_step_ns": 10_000_000},
    ...        "scenarios": [{"name": "fuse", "mean_step_ns": 8_000_000, "speedup": 1.25}]}
    >>> list(scenarios_figure(doc).data[0].text)
    ['1.000x', '1.250x']
    """
    names = ["baseline"] + [s["name"] for s in prediction["scenarios"]]
    ms = [prediction["baseline"]["mean_step_ns"] / 1e6] + [s["mean_step_ns"] / 1e6 for s in prediction["scenarios"]]
    speed = [1.0] + [s["speedup"] for s in prediction["scenarios"]]
    fig = go.Figure(go.Bar(x=names, y=ms, text=[f"{v:.3f}x" for v in speed], textposition="outside",
                           marker_color=[MEASURED] + [PREDICTED] * (len(names) - 1)))
    fig.update_layout(title="Predicted mean step time per scenario", yaxis_title="ms")
    return fig


def waterfall_figure(baseline_ns: int, scenario: dict[str, Any]) -> go.Figure:
    """How each transform of a scenario moves the mean step time (ms), cumulative.

    >>> sc = {"name": "s", "mean_step_ns": 7_000_000,
    ...       "waterfall": [{"transform": "fuse()", "mean_step_ns": 9_000_000},
    ...                     {"transform": "precision(dtype=bf16)", "mean_step_ns": 7_000_000}]}
    >>> [round(v, 3) for v in waterfall_figure(10_000_000, sc).data[0].y]
    [10.0, -1.0, -2.0, 7.0]
    """
    labels = ["baseline"] + [w["transform"] for w in scenario["waterfall"]] + ["predicted"]
    values, prev = [baseline_ns / 1e6], baseline_ns
    for w in scenario["waterfall"]:
        values.append((w["mean_step_ns"] - prev) / 1e6)
        prev = w["mean_step_ns"]
    values.append(scenario["mean_step_ns"] / 1e6)
    measures = ["absolute"] + ["relative"] * len(scenario["waterfall"]) + ["total"]
    fig = go.Figure(go.Waterfall(x=labels, y=values, measure=measures,
                                 decreasing={"marker": {"color": CATEGORY_COLORS["gpu"]}},
                                 increasing={"marker": {"color": CATEGORY_COLORS["comm"]}}))
    fig.update_layout(title=f"{scenario['name']}: effect of each transform", yaxis_title="mean step ms")
    return fig


def top_table_figure(rows: list[dict[str, Any]], title: str) -> go.Figure:
    """A table of the top kernels / ops / layers (name, count, GPU ms, CPU ms)."""
    fig = go.Figure(go.Table(
        header={"values": ["name", "count", "GPU ms", "CPU ms"], "align": "left"},
        cells={"values": [[r["name"] for r in rows], [r["count"] for r in rows],
                          [round(r["gpu_ns"] / 1e6, 3) for r in rows], [round(r["cpu_ns"] / 1e6, 3) for r in rows]],
               "align": "left"}))
    fig.update_layout(title=title)
    return fig


def serving_curves_figure(sweep: dict[str, Any], metric: str = "") -> go.Figure:
    """Latency vs throughput, one line per scenario, from a ``whatif.serving-sweep`` document:
    x = achieved throughput (output tokens/s for LLMs, requests/s for DiTs), y = mean and p99 of
    ``metric`` (default TPOT for LLMs, request latency for DiTs), in ms; points labelled by rate.

    >>> doc = {"kind": "dit", "curves": [{"name": "baseline", "points": [
    ...     {"rate_req_per_s": 1.0, "throughput_req_per_s": 0.9, "latency_ms": {"mean": 50.0, "p99": 80.0}}]}]}
    >>> [t.name for t in serving_curves_figure(doc).data]
    ['baseline mean', 'baseline p99']
    """
    llm = sweep.get("kind") == "llm"
    metric = metric or ("tpot_ms" if llm else "latency_ms")
    xkey = "throughput_tokens_per_s" if llm else "throughput_req_per_s"
    fig = go.Figure()
    for curve in sweep["curves"]:
        pts = curve["points"]
        x = [p[xkey] for p in pts]
        text = [f"{p['rate_req_per_s']:g} req/s" for p in pts]
        fig.add_trace(go.Scatter(x=x, y=[p[metric]["mean"] for p in pts], mode="lines+markers", text=text,
                                 name=f"{curve['name']} mean"))
        fig.add_trace(go.Scatter(x=x, y=[p[metric]["p99"] for p in pts], mode="lines+markers", text=text,
                                 line_dash="dot", name=f"{curve['name']} p99"))
    fig.update_layout(title=f"{metric.removesuffix('_ms')} vs throughput",
                      xaxis_title="output tokens/s" if llm else "requests/s", yaxis_title="ms",
                      legend_orientation="h")
    return fig
