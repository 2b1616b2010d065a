"""Timeline: one lane per resource, measured above and replayed (baseline or a scenario) below;
zoom and pan re-render the window on the server (bins when it holds many tasks, exact WebGL
slices when few); clicking a slice shows the task, its dependencies and criticality."""
from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, dcc, html

from whatif import figures

from .. import timeline as tl
from ..derive import task_details
from ..jobs import Pending, poller, watch, working
from ..layout import error_box, guarded, loading
from ..state import Run, get_store
from . import Page

BASELINE = "__baseline__"

# Only an x-axis zoom, pan or reset reaches the server. dcc.Graph also reports resizes
# ({"autosize": true}); when the loading spinner shows (a draw over 150 ms) the graph resizes, and
# a resize sent to the server while that draw runs would supersede it (Dash keeps only the newest
# run of a callback), leaving the page on its empty first figure.
ZOOM_ONLY = """function(relayout) {
  for (const key of Object.keys(relayout || {}))
    if (/^xaxis\\d*\\.(range|autorange)/.test(key)) return relayout;
  return window.dash_clientside.no_update;
}"""


def layout(**_: Any) -> html.Div:
    return html.Div([
        html.H2("Timeline"),
        html.Div([
            html.Label("replayed timeline: "),
            dcc.Dropdown(id="tl-predicted", options=[{"label": "baseline replay", "value": BASELINE}], value=BASELINE,
                         clearable=False, style={"width": 320, "display": "inline-block", "verticalAlign": "middle"}),
            html.Button("Reset zoom", id="tl-reset", className="secondary"),
            html.Span(id="tl-info", className="note", style={"marginLeft": 12}),
        ]),
        error_box("tl-error"),
        html.Div(loading(dcc.Graph(id="tl-graph", config={"scrollZoom": True, "displaylogo": False},
                                   figure=figures.timeline_figure({"lanes": [], "range_ms": [0, 1], "panels": []}))),
                 className="panel"),
        dcc.Store(id="tl-window"),
        dcc.Store(id="tl-zoom"), poller("tl"),
        html.Div([html.H4("Task"), error_box("tl-details-error"),
                  html.Div("Click a slice (zoom in until slices are exact) to see the task.", id="tl-details",
                           className="note")], className="panel"),
    ])


def timelines(run: Run, scenario: str | None) -> tuple[list[tl.Timeline], tl.Lanes, Any]:
    """Measured and replayed timelines of a run (cached on the run), and the replay shown."""
    key = f"tl:{scenario or BASELINE}"
    if key not in run.cache:
        a = run.analysis
        if scenario and scenario != BASELINE:
            if scenario not in run.scenarios:
                raise KeyError(f"no scenario {scenario!r} on this run (save one in the What-if builder)")
            res = run.result(run.scenarios[scenario])
            graph, rep, label = res.graph, res.replay, f"predicted: {scenario}"
        else:
            graph, rep, label = a.graph, a.replay, "replayed (baseline)"
        lanes = tl.lanes(graph)
        t0 = tl.origin_ns(a.graph)
        figures = [tl.build("measured", a.graph, lanes, t0), tl.build(label, graph, lanes, t0, rep)]
        run.cache[key] = (figures, lanes, rep)
    return run.cache[key]


def register(app: dash.Dash) -> None:
    watch(app, "tl", lambda: get_store().jobs)
    app.clientside_callback(ZOOM_ONLY, Output("tl-zoom", "data"), Input("tl-graph", "relayoutData"),
                            prevent_initial_call=True)

    @app.callback(Output("tl-predicted", "options"), Input("run", "value"))
    def options(run_id: str | None) -> list[dict[str, str]]:
        store = get_store()
        names = list(store.runs[run_id].scenarios) if run_id in store.runs else []
        return [{"label": "baseline replay", "value": BASELINE}] + [{"label": n, "value": n} for n in names]

    @app.callback(Output("tl-graph", "figure"), Output("tl-window", "data"), Output("tl-info", "children"),
                  Output("tl-poll", "disabled"), Output("tl-waiting", "data"), Output("tl-error", "children"),
                  Input("run", "value"), Input("tl-predicted", "value"), Input("tl-zoom", "data"),
                  Input("tl-reset", "n_clicks"), Input("tl-ready", "data"), State("tl-window", "data"))
    @guarded(6, poll=3)
    def draw(run_id: str | None, scenario: str | None, relayout: dict[str, Any] | None, _reset: int | None,
             _ready: str | None, window: list[int] | None) -> tuple[Any, ...]:
        trigger = dash.ctx.triggered_id
        current: tuple[int, int] | None = (window[0], window[1]) if window else None
        if trigger == "tl-zoom":
            new = tl.window_from_relayout(relayout, current)
            if new == current and not (relayout or {}).get("xaxis.autorange"):
                raise dash.exceptions.PreventUpdate
            current = new
        elif trigger in ("tl-reset", "run", "tl-predicted"):
            current = None if trigger != "tl-predicted" else current
        store = get_store()
        run = store.get(run_id)
        analysis = store.analysed(run)
        if isinstance(analysis, Pending):
            return dash.no_update, dash.no_update, working(f"analysing {run.label}"), False, analysis.token
        lines, lanes, _ = timelines(run, scenario)
        v = tl.view(lines, lanes, current)
        info = " · ".join(f"{p['name']}: {p['tasks']:,} tasks in view ({p['mode']})" for p in v["panels"])
        return figures.timeline_figure(v), list(current) if current else None, info, True, dash.no_update

    @app.callback(Output("tl-details", "children"), Output("tl-details-error", "children"),
                  Input("tl-graph", "clickData"), State("run", "value"), State("tl-predicted", "value"),
                  prevent_initial_call=True)
    @guarded(2)
    def details(click: dict[str, Any] | None, run_id: str | None, scenario: str | None) -> tuple[Any]:
        points = (click or {}).get("points") or []
        custom = points[0].get("customdata") if points else None
        if not custom:
            raise dash.exceptions.PreventUpdate
        task, panel = int(custom[0]), int(custom[1])
        run = get_store().get(run_id)
        lines, _, rep = timelines(run, scenario)
        graph = lines[panel].graph
        d = task_details(graph, rep if graph is rep.graph else run.analysis.replay, task, run.cache,
                         t0_ns=tl.origin_ns(run.analysis.graph))
        return (render_details(d, run_id),)


def render_details(d: dict[str, Any], run_id: str | None) -> html.Div:
    """A task's details as a small definition list with its dependencies."""
    fields = [(k, d.get(k)) for k in ("name", "kind", "resource", "rank", "step", "phase", "layer", "op",
                                       "measured_us", "duration_us", "predicted_start_ms", "predicted_us")
              if d.get(k) is not None]
    crit = d.get("critical")

    def deps(title: str, items: list[dict[str, Any]], total: int) -> html.Div:
        return html.Div([html.B(f"{title} ({total})"),
                         html.Ul([html.Li(f"{x['edge']} (+{x['lat_us']} us): {x['label']}") for x in items])])

    return html.Div([
        html.Div([html.B(f"task #{d['task']}"),
                  html.Span(" on the critical path of its step" if crit else " not on the critical path"
                            if crit is not None else "", id="tl-critical",
                            style={"color": "#c0392b" if crit else "#556"}),
                  dcc.Link(" · show its neighbourhood in the Graph page", href=f"/graph?task={d['task']}")]),
        html.Table([html.Tr([html.Td(k, style={"color": "#667", "paddingRight": 10}), html.Td(str(v))])
                    for k, v in fields]),
        html.Div([deps("depends on", d["predecessors"], d["n_predecessors"]),
                  deps("needed by", d["successors"], d["n_successors"])], className="row"),
    ], id="tl-task")


PAGE = Page(path="/timeline", title="Timeline", order=20, layout=layout, register_callbacks=register)
