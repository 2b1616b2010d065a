"""Graph: the critical path of one step (at first the slowest step that counts), drawn left to
right in rows with its slowest segments highlighted, or the dependency neighbourhood of one task;
drawn with dash-cytoscape. Never the whole graph."""
from __future__ import annotations

from typing import Any

import dash
import dash_cytoscape as cyto
from dash import Input, Output, State, dcc, html

from ..derive import (
    SLOWEST,
    X_GAP,
    Y_GAP,
    critical_path_elements,
    neighbourhood,
    path_rows,
    slowest_steady_step,
    task_details,
)
from ..jobs import Pending, poller, working
from ..layout import error_box, guarded, loading
from ..state import get_store
from ..timeline import origin_ns
from . import Page
from .timeline import render_details

INLINE = {"display": "inline-block", "marginRight": 16, "verticalAlign": "middle"}
FONT_PX = 12
STYLE = [
    {"selector": "node", "style": {"label": "data(label)", "font-size": FONT_PX, "text-wrap": "wrap",
                                   "text-max-width": f"{X_GAP - 15}px", "width": 18, "height": 18,
                                   "background-color": "#BAB0AC", "text-valign": "bottom", "text-margin-y": 3}},
    {"selector": ".cpu", "style": {"background-color": "#4C78A8"}},
    {"selector": ".gpu", "style": {"background-color": "#54A24B"}},
    {"selector": ".group", "style": {"shape": "round-rectangle", "background-color": "#F58518", "width": 26}},
    {"selector": ".selected", "style": {"border-width": 4, "border-color": "#E45756", "width": 26, "height": 26}},
    {"selector": ".slow", "style": {"border-width": 4, "border-color": "#E45756", "width": 30, "height": 30,
                                    "color": "#B0271C", "font-weight": "bold"}},
    {"selector": "edge", "style": {"curve-style": "bezier", "target-arrow-shape": "triangle", "width": 1.2,
                                   "label": "data(label)", "font-size": 10, "line-color": "#99a",
                                   "target-arrow-color": "#99a"}},
    {"selector": ".wrap", "style": {"line-style": "dashed", "opacity": 0.35}},
]
PATH_HEIGHT_PX = 90  # drawn height of a path row beyond its Y_GAP: margins and the last row's labels
NEIGHBOURHOOD_HEIGHT_PX = 560


def layout(task: str | None = None, **_: Any) -> html.Div:
    return html.Div([
        html.H2("Dependency graph"),
        html.Div([
            dcc.RadioItems(id="gr-mode", options=[{"label": " neighbourhood of a task", "value": "task"},
                                                  {"label": " critical path of a step", "value": "path"}],
                           value="task" if task else "path", inline=True, labelStyle={"marginRight": 16}),
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
                                        minZoom=0.9, maxZoom=1.6,
                                        style={"width": "100%", "height": f"{NEIGHBOURHOOD_HEIGHT_PX}px"})),
                 className="panel"),
        html.Div(id="gr-info", className="note"), poller("gr"),
        html.Div(id="gr-details", className="panel"),
    ])


def register(app: dash.Dash) -> None:
    @app.callback(Output("gr-step", "options"), Output("gr-step", "value"), Output("gr-poll", "disabled"),
                  Output("gr-info", "children", allow_duplicate=True),
                  Output("gr-error", "children", allow_duplicate=True),
                  Input("run", "value"), Input("gr-poll", "n_intervals"), prevent_initial_call="initial_duplicate")
    @guarded(5, poll=2)
    def steps(run_id: str | None, _: int | None) -> tuple[Any, ...]:
        run = get_store().get(run_id)
        a = get_store().analysed(run)
        if isinstance(a, Pending):
            return [], None, False, working(f"analysing {run.label}")
        s = a.steps
        multi = s["rank"].nunique() > 1
        opts = [{"label": f"rank {r} step {k}" if multi else f"step {k}", "value": i}
                for i, (r, k) in enumerate(zip(s["rank"], s["step"]))]
        return opts, slowest_steady_step(s), True, dash.no_update

    @app.callback(Output("gr-cyto", "elements"), Output("gr-cyto", "layout"), Output("gr-cyto", "style"),
                  Output("gr-info", "children"), Output("gr-error", "children"),
                  Input("run", "value"), Input("gr-mode", "value"), Input("gr-task", "value"),
                  Input("gr-depth", "value"), Input("gr-step", "value"))
    @guarded(5, clear={0: [], 3: None})
    def draw(run_id: str | None, mode: str, task: int | None, depth: int | None, step: int | None) -> tuple[Any, ...]:
        run = get_store().get(run_id)
        a = run.analysis
        if mode == "path":
            if step is None:
                raise dash.exceptions.PreventUpdate  # the step menu fills in the slowest step next
            els = critical_path_elements(a.replay, int(step))
            nodes = [e for e in els if "source" not in e["data"]]
            r, k = (int(a.steps[c].to_numpy()[int(step)]) for c in ("rank", "step"))
            info = (f"critical path of {f'rank {r} ' if a.steps['rank'].nunique() > 1 else ''}step {k}: "
                    f"{len(nodes)} segments, the {min(SLOWEST, len(nodes))} slowest in red; "
                    "read left to right, row by row")
            height = path_rows(len(nodes)) * Y_GAP + PATH_HEIGHT_PX
            return els, {"name": "preset", "fit": True, "padding": 30}, \
                {"width": "100%", "height": f"{height}px"}, info
        els = neighbourhood(a.graph, a.replay, int(task or 0), depth=int(depth or 1))
        n = sum(1 for e in els if "source" not in e["data"])
        drawing = {"name": "breadthfirst", "directed": True, "roots": f"#{int(task or 0)}"} if n < 12 else \
            {"name": "cose"}
        # laid out inside a box smaller than the panel, so that the fit keeps labels at zoom >= 1
        box = {"x1": 0, "y1": 0, "w": 1100, "h": NEIGHBOURHOOD_HEIGHT_PX - 140}
        return els, {**drawing, "padding": 40, "boundingBox": box}, \
            {"width": "100%", "height": f"{NEIGHBOURHOOD_HEIGHT_PX}px"}, \
            f"{n} tasks within {depth} edge(s) of task {task}"

    @app.callback(Output("gr-task", "value"), Output("gr-mode", "value"), Input("gr-cyto", "tapNodeData"),
                  prevent_initial_call=True)
    def recentre(node: dict[str, Any] | None) -> tuple[int, str]:
        if not node or "task" not in node:
            raise dash.exceptions.PreventUpdate
        return int(node["task"]), "task"

    @app.callback(Output("gr-details", "children"), Input("gr-task", "value"), Input("gr-mode", "value"),
                  Input("gr-step", "options"), State("run", "value"))
    def details(task: int | None, mode: str, _: Any, run_id: str | None) -> Any:
        """The task's details, in the neighbourhood view (a tapped path segment switches to it); the
        step menu filled in means the run is analysed."""
        store = get_store()
        if task is None or mode != "task" or run_id not in store.runs or not store.runs[run_id].loaded:
            return None
        run = store.runs[run_id]
        try:
            return render_details(task_details(run.analysis.graph, run.analysis.replay, int(task), run.cache,
                                               t0_ns=origin_ns(run.analysis.graph)), run_id)
        except IndexError:  # no such task: draw's error box says so
            return None
        except ValueError as exc:
            return html.Div(str(exc), className="error")


PAGE = Page(path="/graph", title="Graph", order=50, layout=layout, register_callbacks=register)
