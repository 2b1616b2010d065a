"""Compare: several scenarios side by side on one run: mean step time and speedup, critical-path
breakdown, time per step. Serving metrics (TTFT, TPOT, throughput, latency-vs-throughput) get
their place here once ``whatif serve`` lands."""
from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, dcc, html

from whatif import figures

from ..derive import breakdown_row
from ..layout import error_box, guarded, loading, ms, table
from ..state import get_store

PATH, NAME = "/compare", "Compare"
SERVING_NOTE = ("Serving metrics (TTFT, TPOT, throughput) and latency-vs-throughput curves will appear here "
                "once the serving predictor (whatif serve) lands; this page compares step times until then.")


def layout(**_: Any) -> html.Div:
    return html.Div([
        html.H2("Compare scenarios"),
        html.Div([
            html.P("Scenarios saved or loaded in the What-if builder for the selected run:", className="note"),
            dcc.Checklist(id="cmp-scenarios", options=[], value=[], inline=True,
                          inputStyle={"marginRight": 4}, labelStyle={"marginRight": 14}),
            html.Button("Compare", id="cmp-run"),
        ], className="panel"),
        error_box("cmp-error"),
        loading(html.Div(id="cmp-body")),
        html.Div([html.H4("Serving"), html.P(SERVING_NOTE, className="note")], id="cmp-serving", className="panel"),
    ])


def body(run_id: str, names: list[str]) -> html.Div:
    run = get_store().get(run_id)
    missing = [n for n in names if n not in run.scenarios]
    if missing:
        raise KeyError(f"no scenario {missing[0]!r} on this run")
    doc = run.prediction([run.scenarios[n] for n in names])
    base_paths = doc["baseline"]["critical_path"]

    def mean(paths: list[dict[str, Any]]) -> dict[str, int]:
        cats = paths[0]["breakdown_ns"] if paths else {}
        return {c: sum(p["breakdown_ns"][c] for p in paths) // max(len(paths), 1) for c in cats}

    rows = [{"scenario": "baseline", "mean step ms": ms(doc["baseline"]["mean_step_ns"]), "speedup": 1.0,
             **breakdown_row(mean(base_paths))}]
    rows += [{"scenario": s["name"], "mean step ms": ms(s["mean_step_ns"]), "speedup": round(s["speedup"], 4),
              **breakdown_row(mean(s["critical_path"]))} for s in doc["scenarios"]]
    return html.Div([
        html.Div(table("cmp-table", rows, page_size=20), className="panel"),
        html.Div([html.Div(dcc.Graph(id="cmp-means", figure=figures.scenarios_figure(doc)), className="panel"),
                  html.Div(dcc.Graph(id="cmp-breakdown", figure=figures.scenario_breakdown_figure(doc)),
                           className="panel")], className="row"),
        html.Div(dcc.Graph(id="cmp-steps", figure=figures.step_compare_figure(doc)), className="panel"),
    ])


def register(app: dash.Dash) -> None:
    @app.callback(Output("cmp-scenarios", "options"), Output("cmp-scenarios", "value"), Input("run", "value"))
    def options(run_id: str | None) -> tuple[list[str], list[str]]:
        store = get_store()
        names = list(store.runs[run_id].scenarios) if run_id in store.runs else []
        return names, names

    @app.callback(Output("cmp-body", "children"), Output("cmp-error", "children"), Input("cmp-run", "n_clicks"),
                  State("run", "value"), State("cmp-scenarios", "value"), prevent_initial_call=True)
    @guarded(2)
    def compare(_n: int | None, run_id: str | None, names: list[str] | None) -> tuple[Any]:
        if not names:
            raise ValueError("no scenario selected: save one in the What-if builder first")
        return (body(run_id, names),)
