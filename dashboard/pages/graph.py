"""Graph: the dependency neighbourhood of one task, or the critical path of one step (runs of
tasks on one resource merged), drawn with dash-cytoscape. Never the whole graph."""
from __future__ import annotations

from typing import Any

import dash
import dash_cytoscape as cyto
from dash import Input, Output, State, dcc, html

from ..derive import critical_path_elements, neighbourhood, task_details
from ..layout import error_box, guarded, loading
from ..state import get_store
from ..timeline import origin_ns
from . import Page
from .timeline import render_details

INLINE = {"display": "inline-block", "marginRight": 16, "verticalAlign": "middle"}
STYLE = [
    {"selector": "node", "style": {"label": "data(label)", "font-size": 9, "text-wrap": "wrap", "width": 18,
                                   "height": 18, "background-color": "#BAB0AC", "text-valign": "bottom"}},
    {"selector": ".cpu", "style": {"background-color": "#4C78A8"}},
    {"selector": ".gpu", "style": {"background-color": "#54A24B"}},
    {"selector": ".group", "style": {"shape": "round-rectangle", "background-color": "#F58518", "width": 26}},
    {"selector": ".selected", "style": {"border-width": 4, "border-color": "#E45756", "width": 26, "height": 26}},
    {"selector": "edge", "style": {"curve-style": "bezier", "target-arrow-shape": "triangle", "width": 1.2,
                                   "label": "data(label)", "font-size": 7, "line-color": "#99a",
                                   "target-arrow-color": "#99a"}},
]


def layout(task: str | None = None, **_: Any) -> html.Div:
    return html.Div([
        html.H2("Dependency graph"),
        html.Div([
            dcc.RadioItems(id="gr-mode", options=[{"label": " neighbourhood of a task", "value": "task"},
                                                  {"label": " critical path of a step", "value": "path"}],
                           value="task", inline=True, labelStyle={"marginRight": 16}),
            html.Div([html.Label(" task id "), dcc.Input(id="gr-task", type="number", value=int(task) if task else 0,
                                                         min=0, style={"width": 140})], style=INLINE),
            html.Div([html.Label(" depth "), dcc.Input(id="gr-depth", type="number", value=2, min=1, max=3,
                                                       style={"width": 90})], style=INLINE),
            html.Label(" step "), dcc.Dropdown(id="gr-step", options=[], value=None, clearable=False,
                                               style={"width": 200, "display": "inline-block",
                                                      "verticalAlign": "middle"}),
        ], className="panel"),
        error_box("gr-error"),
        html.Div(loading(cyto.Cytoscape(id="gr-cyto", elements=[], stylesheet=STYLE,
                                        layout={"name": "breadthfirst", "directed": True},
                                        style={"width": "100%", "height": "560px"})), className="panel"),
        html.Div(id="gr-info", className="note"),
        html.Div(id="gr-details", className="panel"),
    ])


def register(app: dash.Dash) -> None:
    @app.callback(Output("gr-step", "options"), Output("gr-step", "value"), Input("run", "value"))
    def steps(run_id: str | None) -> tuple[list[dict[str, Any]], Any]:
        store = get_store()
        if run_id not in store.runs or not store.runs[run_id].loaded:
            return [], None
        s = store.runs[run_id].analysis.steps
        multi = s["rank"].nunique() > 1
        opts = [{"label": f"rank {r} step {k}" if multi else f"step {k}", "value": i}
                for i, (r, k) in enumerate(zip(s["rank"], s["step"]))]
        slowest = int(s["predicted_ns"].to_numpy().argmax()) if len(s) else None
        return opts, slowest

    @app.callback(Output("gr-cyto", "elements"), Output("gr-cyto", "layout"), Output("gr-info", "children"),
                  Output("gr-error", "children"),
                  Input("run", "value"), Input("gr-mode", "value"), Input("gr-task", "value"),
                  Input("gr-depth", "value"), Input("gr-step", "value"))
    @guarded(4)
    def draw(run_id: str | None, mode: str, task: int | None, depth: int | None, step: int | None) -> tuple[Any, ...]:
        run = get_store().get(run_id)
        a = run.analysis
        if mode == "path":
            if step is None:
                raise ValueError("pick a step")
            els = critical_path_elements(a, a.replay, int(step))
            info = f"critical path of step row {step}: {sum(1 for e in els if 'source' not in e['data'])} nodes"
            return els, {"name": "breadthfirst", "directed": True}, info
        els = neighbourhood(a.graph, a.replay, int(task or 0), depth=int(depth or 1))
        n = sum(1 for e in els if "source" not in e["data"])
        return els, {"name": "breadthfirst", "directed": True, "roots": f"#{int(task or 0)}"} if n < 12 else \
            {"name": "cose"}, f"{n} tasks within {depth} edge(s) of task {task}"

    @app.callback(Output("gr-task", "value"), Output("gr-mode", "value"), Input("gr-cyto", "tapNodeData"),
                  prevent_initial_call=True)
    def recentre(node: dict[str, Any] | None) -> tuple[int, str]:
        if not node or "task" not in node:
            raise dash.exceptions.PreventUpdate
        return int(node["task"]), "task"

    @app.callback(Output("gr-details", "children"), Input("gr-task", "value"), State("run", "value"))
    def details(task: int | None, run_id: str | None) -> Any:
        store = get_store()
        if task is None or run_id not in store.runs or not store.runs[run_id].loaded:
            return None
        run = store.runs[run_id]
        try:
            return render_details(task_details(run.analysis.graph, run.analysis.replay, int(task), run.cache,
                                               t0_ns=origin_ns(run.analysis.graph)), run_id)
        except (IndexError, ValueError) as exc:
            return html.Div(str(exc), className="error")


PAGE = Page(path="/graph", title="Graph", order=50, layout=layout, register_callbacks=register)
