"""Figures as plain functions: a whatif document in, a plotly figure out.

Shared by the dashboard and the HTML reports, so both show the same pictures. Inputs are the
typed documents of :mod:`whatif.documents` (``whatif.analysis``, ``whatif.prediction``,
``whatif.serving-sweep``), never live analyses, so a figure can be rebuilt from a saved report
(``from_json``).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import msgspec
import plotly.graph_objects as go
from msgspec import UNSET, UnsetType

from whatif.documents import (
    BaselinePrediction,
    BaselineStep,
    CriticalPathEntry,
    DitSweepPoint,
    LatencyStats,
    LlmSweepDocument,
    LlmSweepPoint,
    PlanSweepDocument,
    PredictionDocument,
    ScenarioHeadline,
    ScenarioPrediction,
    StepBreakdown,
    StepFidelity,
    SweepDocument,
    TopEntry,
    counted,
    mean_breakdown_ns,
)

CATEGORY_COLORS = {"cpu": "#4C78A8", "launch": "#72B7B2", "gpu": "#54A24B", "comm": "#E45756", "sync": "#F58518",
                   "idle": "#BAB0AC"}
MEASURED, PREDICTED = "#9D755D", "#4C78A8"
LEGEND_BELOW = {"orientation": "h", "yanchor": "top", "y": -0.2}
"""A horizontal legend under the x-axis title (plotly's default, y = -0.1, sits on it)."""


class StepLike(Protocol):
    """A per-step entry: which rank and step it is."""

    @property
    def rank(self) -> int: ...

    @property
    def step(self) -> int: ...

    @property
    def excluded(self) -> str | UnsetType: ...


def _step_labels(steps: Sequence[StepLike]) -> list[str]:
    multi_rank = len({s.rank for s in steps}) > 1
    return [f"r{s.rank}/{s.step}" if multi_rank else str(s.step) for s in steps]


def _excluded_note(entries: Sequence[StepLike]) -> str:
    """`` (excluded: step 0 warm-up, step 160 partial)`` for a chart title; empty when all count."""
    parts = [f"step {e.step} {e.excluded}" for e in entries if e.excluded is not UNSET]
    return f" (excluded: {', '.join(parts)})" if parts else ""


def step_times_figure(steps: Sequence[StepFidelity] | Sequence[BaselineStep]) -> go.Figure:
    """Measured vs replayed time of every step (the fidelity figure), in ms: the ``steps`` of an
    analysis document or of a prediction's baseline.

    >>> steps = [BaselineStep(rank=0, step=1, measured_ns=2_000_000, predicted_ns=2_100_000)]
    >>> [trace.name for trace in step_times_figure(steps).data]
    ['measured', 'replayed']
    """
    title = "Step time: measured vs replayed" + _excluded_note(steps)
    shown = [s for s in steps if s.excluded is UNSET] or list(steps)
    x = _step_labels(shown)
    fig = go.Figure([
        go.Bar(name="measured", x=x, y=[s.measured_ns / 1e6 for s in shown], marker_color=MEASURED),
        go.Bar(name="replayed", x=x, y=[s.predicted_ns / 1e6 for s in shown], marker_color=PREDICTED),
    ])
    fig.update_layout(barmode="group", title=title, xaxis_title="step",
                      yaxis_title="ms", legend=LEGEND_BELOW)
    return fig


def breakdown_figure(paths: Sequence[StepBreakdown] | Sequence[CriticalPathEntry],
                     title: str = "Critical path per step") -> go.Figure:
    """Stacked critical-path breakdown (cpu, launch, gpu, comm, sync, idle) per step, in ms.

    ``paths``: the ``critical_path`` of an analysis or of a prediction's baseline/scenario.
    """
    title += _excluded_note(paths)
    shown = [p for p in paths if p.excluded is UNSET] or list(paths)
    x = _step_labels(shown)
    cats = list(paths[0].breakdown_ns) if paths else list(CATEGORY_COLORS)
    fig = go.Figure([go.Bar(name=c, x=x, y=[p.breakdown_ns[c] / 1e6 for p in shown],
                            marker_color=CATEGORY_COLORS.get(c)) for c in cats])
    fig.update_layout(barmode="stack", title=title, xaxis_title="step", yaxis_title="ms", legend=LEGEND_BELOW)
    return fig


def _example_prediction() -> PredictionDocument:
    """A small prediction document for the examples below: a 10 ms baseline, scenario ``fuse`` at 8 ms."""
    from whatif.documents import ScenarioStep, WaterfallEntry

    return PredictionDocument(
        source="t", device=None,
        baseline=BaselinePrediction(
            mean_step_ns=10_000_000,
            steps=[BaselineStep(rank=0, step=0, measured_ns=10_000_000, predicted_ns=10_000_000)],
            critical_path=[StepBreakdown(rank=0, step=0, breakdown_ns={"cpu": 4_000_000, "gpu": 6_000_000})]),
        scenarios=[ScenarioPrediction(
            name="fuse", source=None, transforms=["fuse()", "precision(dtype=bf16)"], mean_step_ns=8_000_000,
            speedup=1.25,
            steps=[ScenarioStep(rank=0, step=0, baseline_ns=10_000_000, predicted_ns=8_000_000, speedup=1.25)],
            waterfall=[WaterfallEntry(transform="fuse()", mean_step_ns=9_000_000, speedup=1.111111),
                       WaterfallEntry(transform="precision(dtype=bf16)", mean_step_ns=8_000_000, speedup=1.25)],
            changes=[],
            critical_path=[StepBreakdown(rank=0, step=0, breakdown_ns={"cpu": 2_000_000, "gpu": 6_000_000})])])


def scenarios_figure(prediction: PredictionDocument) -> go.Figure:
    """Mean predicted step time of the baseline and every scenario, labelled with the speedup.

    >>> list(scenarios_figure(_example_prediction()).data[0].text)
    ['1.000x', '1.250x']
    """
    rows = prediction.rows()
    fig = go.Figure(go.Bar(x=[r.name for r in rows], y=[r.mean_step_ns / 1e6 for r in rows],
                           text=[f"{r.speedup:.3f}x" for r in rows], textposition="outside",
                           marker_color=[MEASURED] + [PREDICTED] * (len(rows) - 1)))
    fig.update_layout(title="Predicted mean step time per scenario", yaxis_title="ms")
    return fig


def waterfall_figure(baseline_ns: int, scenario: ScenarioPrediction | ScenarioHeadline) -> go.Figure:
    """How each transform of a scenario moves the mean step time (ms), cumulative.

    >>> [round(v, 3) for v in waterfall_figure(10_000_000, _example_prediction().scenarios[0]).data[0].y]
    [10.0, -1.0, -1.0, 8.0]
    """
    labels = ["baseline"] + [w.transform for w in scenario.waterfall] + ["predicted"]
    values, prev = [baseline_ns / 1e6], baseline_ns
    for w in scenario.waterfall:
        values.append((w.mean_step_ns - prev) / 1e6)
        prev = w.mean_step_ns
    values.append(scenario.mean_step_ns / 1e6)
    measures = ["absolute"] + ["relative"] * len(scenario.waterfall) + ["total"]
    fig = go.Figure(go.Waterfall(x=labels, y=values, measure=measures,
                                 decreasing={"marker": {"color": CATEGORY_COLORS["gpu"]}},
                                 increasing={"marker": {"color": CATEGORY_COLORS["comm"]}}))
    fig.update_layout(title=f"{scenario.name}: effect of each transform", yaxis_title="mean step ms")
    return fig


def top_table_figure(rows: list[TopEntry], title: str, cpu: bool = True) -> go.Figure:
    """A table of the top kernels / ops / layers (name, count, GPU ms, and with ``cpu`` CPU ms:
    :func:`~whatif.documents.top_tables` says which have it)."""
    values = [[r.name for r in rows], [r.count for r in rows], [round(r.gpu_ns / 1e6, 3) for r in rows]]
    fig = go.Figure(go.Table(
        header={"values": ["name", "count", "GPU ms", *(["CPU ms"] if cpu else [])], "align": "left"},
        cells={"values": values + ([[round(r.cpu_ns / 1e6, 3) for r in rows]] if cpu else []), "align": "left"}))
    fig.update_layout(title=title)
    return fig


TIMELINE_COLORS = {"cpu": CATEGORY_COLORS["cpu"], "launch": CATEGORY_COLORS["launch"], "gpu": CATEGORY_COLORS["gpu"],
                   "comm": CATEGORY_COLORS["comm"], "sync": CATEGORY_COLORS["sync"]}


def _exact_traces(panel: dict[str, Any], row: int) -> list[go.Scattergl]:
    """WebGL line segments, one trace per category; each task is start, middle, end, gap (the
    middle point makes long slices clickable anywhere); ``customdata`` = [task id, panel row]."""
    out = []
    for cat, seg in panel["segments"].items():
        n = len(seg["id"])
        x: list[float | None] = [None] * (4 * n)
        y: list[int | None] = [None] * (4 * n)
        x[0::4], x[1::4], x[2::4] = seg["start"], [(a + b) / 2 for a, b in zip(seg["start"], seg["end"])], seg["end"]
        y[0::4] = y[1::4] = y[2::4] = seg["lane"]
        custom: list[list[int] | None] = [None] * (4 * n)
        custom[0::4] = custom[1::4] = custom[2::4] = [[i, row - 1] for i in seg["id"]]
        text = [""] * (4 * n)  # hover text on the middle point only (keeps the figure small)
        text[1::4] = [f"{name}<br>{(e - s) * 1e3:,.1f} us" for name, s, e in zip(seg["name"], seg["start"], seg["end"])]
        out.append(go.Scattergl(x=x, y=y, mode="lines", name=cat, legendgroup=cat, showlegend=row == 1,
                                line={"color": TIMELINE_COLORS.get(cat, "#888"), "width": 14},
                                customdata=custom, text=text, hovertemplate="%{text}<extra>" + cat + "</extra>",
                                connectgaps=False))
    return out


def timeline_figure(view: dict[str, Any], height_per_lane: int = 26) -> go.Figure:
    """Stacked timelines (e.g. measured above, predicted below) of a time window, in ms.

    ``view``: ``lanes`` (labels), ``range_ms``, ``panels`` (each ``name`` and either ``mode="bins"``
    with ``x``/``z``, the busy fraction per lane and bin, drawn as a heatmap, or ``mode="exact"``
    with ``segments`` per category, drawn as WebGL line segments). Built by
    :func:`whatif.dashboard.timeline.view`.

    >>> v = {"lanes": ["stream 7"], "range_ms": [0, 1], "panels": [
    ...     {"name": "measured", "mode": "bins", "x": [0.25, 0.75], "z": [[1.0, 0.5]]},
    ...     {"name": "predicted", "mode": "exact", "segments": {"gpu": {"start": [0.1], "end": [0.4],
    ...      "lane": [0], "id": [3], "name": ["gemm"]}}}]}
    >>> [type(t).__name__ for t in timeline_figure(v).data]
    ['Heatmap', 'Scattergl']
    """
    from plotly.subplots import make_subplots

    panels = view["panels"]
    lanes = view["lanes"]
    rows = max(len(panels), 1)
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True,
                        vertical_spacing=min(0.25, 60 / (rows * (len(lanes) * height_per_lane + 110))),
                        subplot_titles=[f"{p['name']} ({p['mode']}, {p.get('tasks', 0):,} tasks)" for p in panels])
    for row, p in enumerate(panels, start=1):
        if p["mode"] == "bins":
            fig.add_trace(go.Heatmap(x=p["x"], y=list(range(len(lanes))), z=p["z"], zmin=0, zmax=1,
                                     colorscale=[[0, "#ffffff"], [1, PREDICTED if row > 1 else MEASURED]],
                                     showscale=False, hovertemplate="%{x:.3f} ms: busy %{z:.0%}<extra></extra>"),
                          row=row, col=1)
        else:
            for trace in _exact_traces(p, row):
                fig.add_trace(trace, row=row, col=1)
        fig.update_yaxes(tickvals=list(range(len(lanes))), ticktext=lanes, range=[len(lanes) - 0.5, -0.5],
                         fixedrange=True, row=row, col=1)
    fig.update_xaxes(range=view["range_ms"], row=rows, col=1, title_text="ms")
    fig.update_layout(height=max(300, rows * (len(lanes) * height_per_lane + 110)), margin={"l": 10, "r": 10, "t": 40,
                      "b": 40}, dragmode="zoom", hovermode="closest", uirevision="timeline", legend_orientation="h",
                      legend_y=-0.12, plot_bgcolor="#fafafa")
    return fig


@dataclass(frozen=True)
class PhaseBreakdown:
    """Mean critical-path breakdown (ns per category) of the ``steps`` steps of one phase."""

    phase: str
    steps: int
    breakdown_ns: dict[str, float]


def phase_breakdown_figure(rows: Sequence[PhaseBreakdown]) -> go.Figure:
    """Mean critical-path breakdown of the steps of each phase, in ms per step.

    >>> fig = phase_breakdown_figure([PhaseBreakdown("decode", 3, {"cpu": 2e6, "gpu": 1e6})])
    >>> [t.name for t in fig.data], list(fig.data[0].x)
    (['cpu', 'gpu'], ['decode (3)'])
    """
    x = [f"{r.phase} ({r.steps})" for r in rows]
    cats = list(rows[0].breakdown_ns) if rows else list(CATEGORY_COLORS)
    fig = go.Figure([go.Bar(name=c, x=x, y=[r.breakdown_ns[c] / 1e6 for r in rows],
                            marker_color=CATEGORY_COLORS.get(c)) for c in cats])
    fig.update_layout(barmode="stack", title="Critical path per step, by phase (mean)", xaxis_title="phase (steps)",
                      yaxis_title="ms per step", legend=LEGEND_BELOW)
    return fig


def scenario_breakdown_figure(prediction: PredictionDocument) -> go.Figure:
    """Mean critical-path breakdown per step of the baseline and of every scenario (stacked, ms).

    >>> [list(t.y) for t in scenario_breakdown_figure(_example_prediction()).data]
    [[4.0, 2.0], [6.0, 6.0]]
    """
    rows = prediction.rows()
    means = [mean_breakdown_ns(r.critical_path) for r in rows]
    cats = list(means[0]) or list(CATEGORY_COLORS)
    fig = go.Figure([go.Bar(name=c, x=[r.name for r in rows], y=[m.get(c, 0) / 1e6 for m in means],
                            marker_color=CATEGORY_COLORS.get(c)) for c in cats])
    fig.update_layout(barmode="stack", title="Critical path per step (mean)", yaxis_title="ms per step",
                      legend=LEGEND_BELOW)
    return fig


def step_compare_figure(prediction: PredictionDocument) -> go.Figure:
    """Predicted time of every step: the baseline replay and each scenario, one line each (ms).

    >>> [(t.name, list(t.y)) for t in step_compare_figure(_example_prediction()).data]
    [('baseline', [10.0]), ('fuse', [8.0])]
    """
    base = counted(prediction.baseline.steps)
    x = _step_labels(base)
    fig = go.Figure([go.Scatter(name="baseline", x=x, y=[s.predicted_ns / 1e6 for s in base], mode="lines+markers",
                                line={"color": MEASURED})])
    for sc in prediction.scenarios:   # markers: a run of one step is one point, which a line does not draw
        fig.add_trace(go.Scatter(name=sc.name, x=x, y=[s.predicted_ns / 1e6 for s in counted(sc.steps)],
                                 mode="lines+markers"))
    title = "Predicted time per step" + _excluded_note(prediction.baseline.steps)
    fig.update_layout(title=title, xaxis_title="step", yaxis_title="ms", legend=LEGEND_BELOW)
    return fig


def serving_curves_figure(sweep: SweepDocument, metric: Literal["", "tpot_ms", "ttft_ms", "e2e_ms", "latency_ms",
                                                                  "queue_ms"] = "") -> go.Figure:
    """Latency vs throughput, one line per scenario, from a ``whatif.serving-sweep`` document:
    x = achieved throughput (output tokens/s for LLMs, requests/s for DiTs), y = mean and p99 of
    ``metric`` (default TPOT for LLMs, request latency for DiTs), in ms; points labelled by rate.

    >>> from whatif.documents import (DitIterationModel, DitSettings, DitSweepCurve, DitSweepDocument,
    ...                               DitSweepPoint, LatencyStats, WorkloadEntry)
    >>> lat = LatencyStats(mean=50.0, p50=50.0, p90=70.0, p99=80.0)
    >>> model = DitIterationModel(tokens_ref=64, attention_ns=[0, 1], rest_ns=[0, 1], batch_overhead_ns=0, n=1,
    ...                           mape=0, loo_mape=0, model_batches_seen=[2], profiler_correction=1.0)
    >>> point = DitSweepPoint(rate_req_per_s=1.0, latency_ms=lat, queue_ms=lat, throughput_req_per_s=0.9,
    ...                       busy_fraction=0.5, e2e_ms=lat)
    >>> doc = DitSweepDocument(source="t", workload=WorkloadEntry(), profiler_correction=None,
    ...     scheduler=DitSettings(steps=1, resolution=16, frames=1, patch=2, tokens=64, batch=1, cfg=False, replicas=1),
    ...     curves=[DitSweepCurve(name="baseline", iteration_model=model, points=[point])])
    >>> [t.name for t in serving_curves_figure(doc).data]
    ['baseline mean', 'baseline p99']
    """
    llm = isinstance(sweep, LlmSweepDocument)
    metric = metric or ("tpot_ms" if llm else "latency_ms")
    fig = go.Figure()
    for curve in sweep.curves:
        pts: Sequence[LlmSweepPoint | DitSweepPoint] = curve.points
        x = [p.throughput_tokens_per_s if isinstance(p, LlmSweepPoint) else p.throughput_req_per_s for p in pts]
        stats = [_point_stats(p, metric) for p in pts]
        text = [f"{p.rate_req_per_s:g} req/s" for p in pts]
        fig.add_trace(go.Scatter(x=x, y=[s.get("mean") for s in stats], mode="lines+markers", text=text,
                                 name=f"{curve.name} mean"))
        fig.add_trace(go.Scatter(x=x, y=[s.get("p99") for s in stats], mode="lines+markers", text=text,
                                 line_dash="dot", name=f"{curve.name} p99"))
    fig.update_layout(title=f"{metric.removesuffix('_ms')} vs throughput",
                      xaxis_title="output tokens/s" if llm else "requests/s", yaxis_title="ms",
                      legend=LEGEND_BELOW)
    return fig


def _point_stats(point: LlmSweepPoint | DitSweepPoint, metric: str) -> LatencyStats:
    """The statistics of ``metric`` at a sweep point (a metric the kind of loop lacks is an error)."""
    fields = {f.name for f in msgspec.structs.fields(point)}
    if metric not in fields or metric == "rate_req_per_s":
        raise ValueError(f"{metric} is not a latency of this sweep (choose from "
                         f"{', '.join(sorted(f for f in fields if f.endswith('_ms')))})")
    value = msgspec.structs.asdict(point)[metric]
    assert isinstance(value, LatencyStats)
    return value


def plan_pareto_figure(sweep: PlanSweepDocument) -> go.Figure:
    """A ``whatif.plan-sweep/1`` document's predicted plans: x = step time (ms), y = throughput,
    marker size = GPUs; the Pareto front (fewer GPUs, shorter step, higher throughput) in its own
    trace, joined in order of step time; hover names each plan.

    >>> from whatif.documents import PlanRow, PlanSweepDocument
    >>> row = PlanRow(plan="tp1·pp1·sp1·dp1", tp=1, pp=1, micro_batches=0, sp=1, dp=1, batch=1.0, device="",
    ...               gpus=1, status="ok", step_ns=2_000_000, throughput_per_s=500.0, memory_per_gpu_bytes=None,
    ...               fits=None, pareto=True, reason="")
    >>> doc = PlanSweepDocument(source="t", device=None, ranks=1, mode="training", topology="dgx_h100",
    ...                         throughput_unit="traced batches/s", samples_per_step=0, baseline_step_ns=2_000_000,
    ...                         memory_model="not checked", plans=[row])
    >>> [t.name for t in plan_pareto_figure(doc).data]
    ['other plans', 'Pareto front']
    """
    ran = [r for r in sweep.plans if r.step_ns is not None and r.throughput_per_s is not None]
    fig = go.Figure()
    for name, rows in (("other plans", [r for r in ran if not r.pareto]),
                       ("Pareto front", sorted((r for r in ran if r.pareto), key=lambda r: (r.step_ns or 0, r.plan)))):
        fig.add_trace(go.Scatter(
            x=[(r.step_ns or 0) / 1e6 for r in rows], y=[r.throughput_per_s for r in rows],
            mode="markers" if name == "other plans" else "lines+markers", name=name,
            text=[f"{r.plan}: {r.gpus} GPUs" for r in rows],
            marker={"size": [6 + 3 * math.log2(max(r.gpus, 1)) for r in rows], "opacity": 0.6}))
    fig.update_layout(title=f"{sweep.source}: {len(ran)} plans predicted (marker size: GPUs)",
                      xaxis_title="step time (ms)", yaxis_title=sweep.throughput_unit, legend=LEGEND_BELOW)
    return fig
