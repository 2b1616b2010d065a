"""Breakdown: where each GPU's time went on the selected run (the ``whatif breakdown`` document,
docs/breakdown.md): idle / compute / non-compute per rank and step as stacked bars, idle gaps by
cause per stream, launch delays, launch-queue length and GPU time by kernel class. Every GPU
activity counts; the steps left out of means are labelled with the reason."""
from __future__ import annotations

from typing import Any

import dash
import plotly.graph_objects as go
from dash import Input, Output, dcc, html

from whatif.breakdown import WHOLE_RANK, breakdown, step_label
from whatif.documents import BreakdownDocument

from ..jobs import Pending, poller, watch, working
from ..layout import card, error_box, guarded, loading, ms, table
from ..state import get_store
from . import Page


def layout(**_: Any) -> html.Div:
    return html.Div([
        html.H2("Breakdown"),
        html.P("Every GPU activity of the run, HolisticTraceAnalysis's definitions with no step window: "
               "idle is time with nothing running between a GPU's first and last activity; host wait is an idle "
               "gap that began before its launch call did.", className="note"),
        error_box("bd-error"), loading(html.Div(id="bd-body"), id="bd-loading"), poller("bd"),
    ])


def document(run_id: str | None) -> BreakdownDocument:
    """The run's breakdown (computed once)."""
    run = get_store().get(run_id)
    analysis = run.analysis
    with run.lock:
        if "breakdown" not in run.cache:
            run.cache["breakdown"] = breakdown(analysis.trace, analysis.graph)
        return run.cache["breakdown"]  # type: ignore[no-any-return]


def temporal_figure(doc: BreakdownDocument) -> go.Figure:
    rows = [r for r in doc.temporal if r.step != WHOLE_RANK] or doc.temporal
    x = [f"rank {r.rank} · {step_label(r.step, r.excluded, prefix='step ')}" for r in rows]
    fig = go.Figure()
    for name, values, color in (("compute", [r.compute_ns for r in rows], "#4c78a8"),
                                ("non-compute", [r.non_compute_ns for r in rows], "#f58518"),
                                ("idle", [r.idle_ns for r in rows], "#bab0ac")):
        fig.add_bar(name=name, x=x, y=[ms(v) for v in values], marker_color=color)
    fig.update_layout(barmode="stack", yaxis_title="ms", height=320, margin=dict(l=50, r=10, t=10, b=80),
                      legend=dict(orientation="h", y=1.1))
    return fig


def body(run_id: str | None) -> html.Div:
    doc = document(run_id)
    if not doc.temporal:
        return html.Div("No GPU activity (kernel, copy or memset) in this run: nothing to break down.",
                        className="note", id="bd-empty")
    whole = [r for r in doc.temporal if r.step == WHOLE_RANK]
    span = sum(r.span_ns for r in whole)
    idle = sum(r.idle_ns for r in whole)
    comm = sum(r.communication_ns for r in whole)
    hidden = sum(r.comm_overlapped_ns for r in whole)
    host = sum(g.host_wait_ns for g in doc.idle)
    gaps = sum(g.host_wait_ns + g.kernel_wait_ns + g.other_ns for g in doc.idle)
    temporal = [{"rank": r.rank, "step": step_label(r.step, r.excluded, prefix="step "), "span ms": ms(r.span_ns),
                 "idle ms": ms(r.idle_ns),
                 "compute ms": ms(r.compute_ns), "non-compute ms": ms(r.non_compute_ns),
                 "comm ms": ms(r.communication_ns), "memory ms": ms(r.memory_ns),
                 "comm overlapped ms": ms(r.comm_overlapped_ns), "activities": r.activities} for r in doc.temporal]
    idle_rows = [{"rank": g.rank, "stream": g.stream, "host wait ms": ms(g.host_wait_ns),
                  "kernel wait ms": ms(g.kernel_wait_ns), "other ms": ms(g.other_ns), "gaps": g.gaps} for g in doc.idle]
    launch_rows = [{"rank": d.rank, "launches": d.launches, "p50 us": d.p50_ns / 1e3, "p90 us": d.p90_ns / 1e3,
                    "p99 us": d.p99_ns / 1e3, "max us": d.max_ns / 1e3, "long": d.long_delays,
                    "GPU < launch": d.shorter_than_launch} for d in doc.launches]
    queue_rows = [{"rank": q.rank, "stream": q.stream, "max": q.max, "mean": q.mean,
                   "empty %": round(100 * q.empty_share, 1)} for q in doc.queues]
    class_rows = [{"rank": c.rank, "step": step_label(c.step, prefix="step "), "class": c.kernel_class,
                   "ms": ms(c.total_ns),
                   "share %": round(100 * c.share, 1), "count": c.count} for c in doc.classes]
    return html.Div([
        html.Div([card("GPU idle", f"{100 * idle / span:.1f} %" if span else "-", id="bd-idle"),
                  card("idle gaps that are host wait", f"{100 * host / gaps:.1f} %" if gaps else "-", id="bd-host"),
                  card("communication hidden under compute", f"{100 * hidden / comm:.1f} %" if comm else "no comm",
                       id="bd-overlap")], className="cards"),
        html.Div([html.H4("GPU time per rank and step"), dcc.Graph(id="bd-temporal", figure=temporal_figure(doc)),
                  table("bd-temporal-table", temporal)], className="panel"),
        html.Div([html.H4(f"Idle gaps by cause (kernel wait: under {doc.kernel_wait_ns / 1e3:g} us)"),
                  table("bd-idle-table", idle_rows)], className="panel"),
        html.Div([html.H4("Launch delay"), table("bd-launch-table", launch_rows),
                  html.H4("Launch queue (launched, not started)"), table("bd-queue-table", queue_rows)],
                 className="panel"),
        html.Div([html.H4("GPU time by kernel class"), table("bd-class-table", class_rows, page_size=20)],
                 className="panel"),
    ])


def register(app: dash.Dash) -> None:
    watch(app, "bd", lambda: get_store().jobs)

    @app.callback(Output("bd-body", "children"), Output("bd-poll", "disabled"), Output("bd-waiting", "data"),
                  Output("bd-error", "children"), Input("run", "value"), Input("bd-ready", "data"))
    @guarded(4, poll=1)
    def show(run_id: str | None, _: str | None) -> tuple[Any, ...]:
        if not run_id:
            raise dash.exceptions.PreventUpdate
        run = get_store().get(run_id)
        doc = get_store().jobs.result(("breakdown", run.id), lambda: document(run_id))
        if isinstance(doc, Pending):
            return working(f"breaking down the GPU time of {run.label}"), False, doc.token
        return body(run_id), True, dash.no_update


PAGE = Page(path="/breakdown", title="Breakdown", order=26, layout=layout, register_callbacks=register)
