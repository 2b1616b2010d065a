"""Overview: measured vs replayed step times, critical-path breakdown per step and by phase,
top kernels / ops / layers (the numbers of ``whatif analyze``'s document), and the ops with the
most GPU time on the roofline (the Ops page's table, its top rows)."""
from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, dcc, html
from msgspec import UNSET

from whatif import figures
from whatif.documents import TopEntry, top_tables
from whatif.ops import GroupBy
from whatif.summary import excluded_line

from ..derive import phase_rows
from ..jobs import Pending, poller, watch, working
from ..layout import COUNT_ALL, card, error_box, guarded, loading, ms, table
from ..state import get_store, step_options
from . import Page
from .ops import document as ops_document
from .ops import rows as ops_rows

ROOFLINE_ROWS = 10
ROOFLINE_COLUMNS = ("total ms", "share %", "count", "TFLOP/s", "TB/s", "% roof", "bound", "op", "shapes", "dtype")


def layout(**_: Any) -> html.Div:
    return html.Div([html.H2("Overview"), error_box("ov-error"), loading(html.Div(id="ov-body"), id="ov-loading"),
                     poller("ov")])


def _top(rows: list[TopEntry], cpu: bool) -> list[dict[str, Any]]:
    return [{"count": r.count, "GPU ms": ms(r.gpu_ns), **({"CPU ms": ms(r.cpu_ns)} if cpu else {}), "name": r.name}
            for r in rows]


def body(run_id: str | None, count_all: list[str] | None = None) -> html.Div:
    """The page for one run, from its analysis document (steps counted as the box says)."""
    run = get_store().get(run_id)
    doc = run.document(step_options(count_all))
    steps = doc.steps
    fid = doc.fidelity
    cards = html.Div([
        card("run", run.label), card("device", run.device, id="ov-device"), card("ranks", len(doc.ranks)),
        card("steps", len(steps), id="ov-steps-count"), card("tasks", f"{doc.tasks:,}", id="ov-tasks"),
        card("edges", f"{doc.edges:,}", id="ov-edges"),
        card("mean step measured (ms)", f"{doc.mean_measured_step_ns / 1e6:,.3f}", id="ov-measured"),
        card("mean step replayed (ms)", f"{doc.mean_predicted_step_ns / 1e6:,.3f}", id="ov-replayed"),
        card("replay error median / worst",
             "n/a" if fid.median_abs_error is None or fid.max_abs_error is None else
             f"{fid.median_abs_error * 100:.2f}% / {fid.max_abs_error * 100:.2f}%", id="ov-error-pct"),
    ], className="cards")
    step_rows = [{"rank": s.rank, "step": s.step, "counted": "yes" if s.excluded is UNSET else f"no: {s.excluded}",
                  "measured ms": ms(s.measured_ns),
                  "replayed ms": ms(s.predicted_ns), "error %": round(s.error * 100, 3),
                  **{f"{c} ms": ms(v) for c, v in cp.breakdown_ns.items()}}
                 for s, cp in zip(steps, doc.critical_path)]
    phases = phase_rows(run.analysis.graph, doc.critical_path)
    excluded = excluded_line(steps)
    top_panels = [html.Div([html.H4(f"Top {what}"),
                            table(f"ov-top_{what}", _top(rows, cpu), page_size=10, names=("name",)) if rows
                            else html.P(f"No {what} in this run.", className="note")], className="panel")
                  for rows, what, cpu in top_tables(doc)]
    ops = ops_document(run_id, GroupBy.OP.value)
    roofline = html.Div([
        html.H4("Ops with the most GPU time, on the roofline (the Ops page has them all)"),
        table("ov-roofline", [{c: r[c] for c in ROOFLINE_COLUMNS} for r in ops_rows(ops)[:ROOFLINE_ROWS]],
              page_size=ROOFLINE_ROWS, names=("op", "shapes")) if ops.rows
        else html.P("No GPU activity in this run: no ops to price.", className="note")], className="panel")
    return html.Div([
        cards,
        html.P(excluded or "", id="ov-excluded"),
        html.Div([html.Div(dcc.Graph(id="ov-fidelity", figure=figures.step_times_figure(doc.steps)), className="panel"),
                  html.Div(dcc.Graph(id="ov-breakdown", figure=figures.breakdown_figure(doc.critical_path)),
                           className="panel")], className="row"),
        html.Div([html.Div(dcc.Graph(id="ov-phases", figure=figures.phase_breakdown_figure(phases)), className="panel"),
                  top_panels[0]], className="row"),
        html.Div(top_panels[1:], className="row"),
        roofline,
        html.Div([html.H4("Steps"), table("ov-steps", step_rows, page_size=10)], className="panel"),
    ])


def register(app: dash.Dash) -> None:
    watch(app, "ov", lambda: get_store().jobs)

    @app.callback(Output("ov-body", "children"), Output("ov-poll", "disabled"), Output("ov-waiting", "data"),
                  Output("ov-error", "children"),
                  Input("run", "value"), Input(COUNT_ALL, "value"), Input("ov-ready", "data"))
    @guarded(4, poll=1)
    def show(run_id: str | None, count_all: list[str] | None, _: str | None) -> tuple[Any, ...]:
        run = get_store().get(run_id)
        options = step_options(count_all)
        doc = get_store().jobs.result(("document", run.id, options),
                                      lambda: (run.document(options), ops_document(run_id, GroupBy.OP.value)))
        if isinstance(doc, Pending):
            return working(f"analysing {run.label}"), False, doc.token
        return body(run_id, count_all), True, dash.no_update


PAGE = Page(path="/overview", title="Overview", order=10, layout=layout, register_callbacks=register)
