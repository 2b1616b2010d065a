"""Ops: the per-op roofline table of the selected run (the ``whatif ops`` document,
docs/cost-models.md): GPU time by bound, then every op (or op and kernel) with its time, FLOPs,
bytes, achieved TFLOP/s and TB/s and its share of the device's roofline; numbers first, names
shortened from the middle."""
from __future__ import annotations

from typing import Any

import dash
import plotly.graph_objects as go
from dash import Input, Output, dcc, html

from whatif.documents import OpsDocument
from whatif.ops import Bound, GroupBy, ops_table
from whatif.report.diff_text import short_name, short_names

from ..jobs import Pending, poller, watch, working
from ..layout import card, error_box, guarded, loading, ms, table
from ..state import get_store
from . import Page

BOUND_COLORS = {Bound.COMPUTE.value: "#4c78a8", Bound.MEMORY.value: "#f58518", Bound.LATENCY.value: "#72b7b2",
                Bound.LAUNCH.value: "#e45756", Bound.UNKNOWN.value: "#bab0ac"}

TEXT_COLUMNS = ("bound", "op", "kernel", "shapes", "dtype")


def layout(**_: Any) -> html.Div:
    return html.Div([
        html.H2("Ops"),
        html.P("Every GPU activity grouped by the op that launched it, its shapes and dtype. FLOPs and bytes come from "
               "the recorded shapes; the roof is the device's achievable roofline (the catalog's measured GEMM "
               "rate at the group's size and its streaming bandwidth, docs/cost-models.md), so a group can read "
               "above 100 %. Bound: "
               "launch (the stream waited on a launch call longer than the kernel ran), latency (activities under "
               "5 us), else compute or memory by the roofline's ridge.", className="note"),
        dcc.RadioItems(id="ops-by", options=[{"label": f" by {g.value}", "value": g.value} for g in GroupBy],
                       value=GroupBy.OP.value, inline=True),
        error_box("ops-error"), loading(html.Div(id="ops-body"), id="ops-loading"), poller("ops"),
    ])


def document(run_id: str | None, by: str) -> OpsDocument:
    """The run's ops table grouped ``by`` (computed once per grouping)."""
    run = get_store().get(run_id)
    key = f"ops:{by}"
    with run.lock:
        if key not in run.cache:
            run.cache[key] = ops_table(run.analysis.trace, by)
        return run.cache[key]  # type: ignore[no-any-return]


def bound_figure(doc: OpsDocument) -> go.Figure:
    """GPU time per bound, one horizontal stacked bar."""
    fig = go.Figure()
    for b in Bound:
        total = sum(r.total_ns for r in doc.rows if r.bound == b.value)
        if total:
            fig.add_bar(name=b.value, y=["GPU time"], x=[ms(total)], orientation="h",
                        marker_color=BOUND_COLORS[b.value])
    fig.update_layout(barmode="stack", xaxis_title="ms", height=150, margin=dict(l=80, r=10, t=10, b=40),
                      legend=dict(orientation="h", y=1.3))
    return fig


def rows(doc: OpsDocument) -> list[dict[str, Any]]:
    """The table's rows: numbers first, then the bound and the shortened names."""
    def num(x: float | None, scale: float = 1.0, digits: int = 2) -> float | None:
        return None if x is None else round(x / scale, digits)
    out = []
    op_labels = short_names([r.op for r in doc.rows], 48)
    kernel_labels = short_names([r.kernel or "" for r in doc.rows], 56)
    for r, op_label, kernel_label in zip(doc.rows, op_labels, kernel_labels):
        out.append({"total ms": ms(r.total_ns), "share %": round(100 * r.total_ns / doc.gpu_total_ns, 1),
                    "count": r.count, "mean us": round(r.mean_ns / 1e3, 1), "GFLOP": num(r.flops, 1e9),
                    "MB": num(r.bytes, 1e6), "FLOP/B": num(r.intensity, digits=1), "TFLOP/s": num(r.achieved_tflops),
                    "TB/s": num(r.achieved_tbps, digits=3), "roof TFLOP/s": r.roofline_tflops, "% roof": r.roofline_pct,
                    "bound": r.bound, "op": op_label, **({"kernel": kernel_label} if r.kernel else {}),
                    "shapes": short_name(r.shapes, 56), "dtype": r.dtype})
    return out


def body(run_id: str | None, by: str = GroupBy.OP.value) -> html.Div:
    doc = document(run_id, by)
    if not doc.rows:
        return html.Div("No GPU activity (kernel, copy or memset) in this run: no ops to price.",
                        className="note", id="ops-empty")
    priced = sum(r.total_ns for r in doc.rows if r.flops is not None)
    ideal = sum(r.total_ns * r.roofline_pct / 100 for r in doc.rows if r.roofline_pct is not None)
    return html.Div([
        html.Div([card("GPU time", f"{ms(doc.gpu_total_ns):,.3f} ms", id="ops-total"),
                  card("time with FLOPs and bytes known", f"{100 * priced / doc.gpu_total_ns:.1f} %", id="ops-priced"),
                  card("of roofline, over that time", f"{100 * ideal / priced:.1f} %" if priced else "-",
                       id="ops-roof"),
                  card("device", ", ".join(doc.devices) or "not in the catalog", id="ops-device")],
                 className="cards"),
        html.Div([html.H4("GPU time by bound"), dcc.Graph(id="ops-bounds", figure=bound_figure(doc))],
                 className="panel"),
        html.Div([html.H4(f"{len(doc.rows)} groups by {doc.by}, longest first"),
                  table("ops-table", rows(doc), page_size=20, style_cell_conditional=[
                      {"if": {"column_id": c}, "textAlign": "left"} for c in TEXT_COLUMNS])], className="panel"),
    ])


def register(app: dash.Dash) -> None:
    watch(app, "ops", lambda: get_store().jobs)

    @app.callback(Output("ops-body", "children"), Output("ops-poll", "disabled"), Output("ops-waiting", "data"),
                  Output("ops-error", "children"), Input("run", "value"), Input("ops-by", "value"),
                  Input("ops-ready", "data"))
    @guarded(4, poll=1)
    def show(run_id: str | None, by: str, _: str | None) -> tuple[Any, ...]:
        if not run_id:
            raise dash.exceptions.PreventUpdate
        run = get_store().get(run_id)
        doc = get_store().jobs.result(("ops", run.id, by), lambda: document(run_id, by))
        if isinstance(doc, Pending):
            return working(f"pricing the ops of {run.label}"), False, doc.token
        return body(run_id, by), True, dash.no_update


PAGE = Page(path="/ops", title="Ops", order=24, layout=layout, register_callbacks=register)
