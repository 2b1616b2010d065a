"""Runs: the loaded traces and run folders (device, ranks, steps); add one by path or upload (streamed
to the upload route by assets/upload.js)."""
from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, dcc, html

from whatif.tracer.readers import accepted

from ..jobs import poller
from ..layout import error_box, guarded, loading, name_cells, table
from ..state import Run, get_store
from ..uploads import UPLOAD_ROUTE
from . import Page

COLUMNS = ("run", "device", "ranks", "steps", "tasks", "status", "path", "id")
NUMBERS = ("ranks", "steps", "tasks")  # known once a run is analysed


NAMES = ("run", "path")
ANALYSING = "analysing every run (the status column follows)"


def rows() -> list[dict[str, Any]]:
    return [{**r.summary(), **({"status": "analysing…"} if get_store().jobs.running(("analysis", r.id)) else {})}
            for r in get_store().runs.values()]


def cells() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The table's data (long run names and paths shortened from the middle) and its tooltips."""
    return name_cells(rows(), NAMES)


def layout(**_: Any) -> html.Div:
    store = get_store()
    return html.Div([
        html.H2("Runs"),
        html.P("Traces and run folders this dashboard has loaded. Pick one in the run menu of the navigation bar; it "
               "is analyzed on first use.", className="note"),
        html.Div([loading(table("runs-table", rows(), COLUMNS, names=NAMES, numbers=NUMBERS, row_selectable=False)),
                  html.Button("Analyze all", id="runs-analyze", className="secondary")], className="panel"),
        html.Div([
            html.H4("Add a run"),
            html.Label("Path (a trace file, a run folder or a folder of them; inside: "
                       + ", ".join(str(r) for r in store.guard.roots) + ")"), html.Br(),
            dcc.Input(id="runs-path", type="text", style={"width": "60%"}, debounce=False),
            html.Button("Add", id="runs-add"),
            html.Div([f"Drop a trace here ({accepted()}, at most {store.max_upload_bytes / 2**20:,.0f} MiB) or ",
                      html.A("choose one", id="runs-choose", href="#")],
                     id="runs-drop", **{"data-upload-url": UPLOAD_ROUTE},  # type: ignore[arg-type] # a data-* attribute
                     style={"border": "1px dashed #99a", "borderRadius": 6, "padding": 14, "marginTop": 10,
                            "textAlign": "center"}),
            html.Div(id="runs-upload-status", className="note"),
            loading(html.Div(id="runs-message", className="note")), error_box("runs-error"), poller("runs"),
        ], className="panel"),
    ])


def analyse(runs: list[Run]) -> None:
    """Start analysing ``runs`` in the background (the table shows their progress, and a failure in
    the run's status: this raises nothing, so a failed run does not fail every poll)."""
    for run in runs:
        get_store().start_analysis(run)


def register(app: dash.Dash) -> None:
    @app.callback(Output("runs-table", "data"), Output("runs-table", "tooltip_data"), Output("run", "options"),
                  Output("run", "value"), Output("runs-poll", "disabled"),
                  Output("runs-message", "children"), Output("runs-error", "children"),
                  Input("runs-add", "n_clicks"), Input("runs-analyze", "n_clicks"),
                  State("runs-path", "value"), State("run", "value"), prevent_initial_call=True)
    @guarded(7)
    def add(add_clicks: int | None, analyze_clicks: int | None, path: str | None,
            current: str | None) -> tuple[Any, ...]:
        store = get_store()
        trigger = dash.ctx.triggered_id
        if not (add_clicks if trigger == "runs-add" else analyze_clicks):   # the first render, not a click
            raise dash.exceptions.PreventUpdate
        if trigger == "runs-analyze":
            analyse(list(store.runs.values()))
            return *cells(), store.options(), current, False, ANALYSING
        if not path or not path.strip():
            raise ValueError("type the path of a trace file or run folder first")
        added = store.add_path(path.strip())
        analyse(added)  # so the table shows device, ranks and steps (or the error)
        return *cells(), store.options(), added[0].id, False, f"added {', '.join(r.label for r in added)}"

    @app.callback(Output("runs-table", "data", allow_duplicate=True),
                  Output("runs-table", "tooltip_data", allow_duplicate=True),
                  Output("runs-poll", "disabled", allow_duplicate=True),
                  Output("runs-message", "children", allow_duplicate=True),
                  Input("run", "value"), Input("runs-poll", "n_intervals"), State("runs-message", "children"),
                  prevent_initial_call="initial_duplicate")
    def refresh(run_id: str | None, _: int | None, message: Any) -> tuple[Any, ...]:
        """Selecting a run analyses it in the background; the table follows until no run is
        analysing, and then the line saying that every run is being analysed goes."""
        store = get_store()
        if run_id in store.runs:
            analyse([store.runs[run_id]])
        busy = any(get_store().jobs.running(("analysis", r)) for r in store.runs)
        return *cells(), not busy, None if message == ANALYSING and not busy else dash.no_update


PAGE = Page(path="/", title="Runs", order=0, layout=layout, register_callbacks=register)
