"""Runs: the loaded traces and run folders (device, ranks, steps); add one by path or upload (streamed
to the upload route by assets/upload.js)."""
from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, dcc, html

from whatif.tracer.readers import accepted

from ..layout import error_box, guarded, loading, table
from ..state import get_store
from ..uploads import UPLOAD_ROUTE
from . import Page

COLUMNS = ("run", "device", "ranks", "steps", "tasks", "status", "path", "id")


def rows() -> list[dict[str, Any]]:
    return [r.summary() for r in get_store().runs.values()]


def layout(**_: Any) -> html.Div:
    store = get_store()
    return html.Div([
        html.H2("Runs"),
        html.P("Traces and run folders this dashboard has loaded. Pick one in the run menu (top right); it is "
               "analyzed on first use.", className="note"),
        html.Div([loading(table("runs-table", rows(), COLUMNS, row_selectable=False)),
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
            loading(html.Div(id="runs-message", className="note")), error_box("runs-error"),
        ], className="panel"),
    ])


def register(app: dash.Dash) -> None:
    @app.callback(Output("runs-table", "data"), Output("run", "options"), Output("run", "value"),
                  Output("runs-message", "children"), Output("runs-error", "children"),
                  Input("runs-add", "n_clicks"), Input("runs-analyze", "n_clicks"),
                  State("runs-path", "value"), State("run", "value"), prevent_initial_call=True)
    @guarded(5)
    def add(add_clicks: int | None, analyze_clicks: int | None, path: str | None,
            current: str | None) -> tuple[Any, ...]:
        store = get_store()
        trigger = dash.ctx.triggered_id
        if not (add_clicks if trigger == "runs-add" else analyze_clicks):   # the first render, not a click
            raise dash.exceptions.PreventUpdate
        if trigger == "runs-analyze":
            failed = []
            for run in store.runs.values():
                try:
                    _ = run.analysis
                except Exception as exc:  # noqa: BLE001 - listed, the others still load
                    failed.append(f"{run.label}: {exc}")
            msg = "analyzed all runs" + (f"; failed: {'; '.join(failed)}" if failed else "")
            return rows(), store.options(), current, msg
        if not path or not path.strip():
            raise ValueError("type the path of a trace file or run folder first")
        added = store.add_path(path.strip())
        for run in added:  # analyze now, so the table shows device, ranks and steps (or the error)
            _ = run.analysis
        return rows(), store.options(), added[0].id, f"added {', '.join(r.label for r in added)}"

    @app.callback(Output("runs-table", "data", allow_duplicate=True), Input("run", "value"),
                  prevent_initial_call="initial_duplicate")
    def refresh(run_id: str | None) -> list[dict[str, Any]]:
        """Selecting a run analyzes it (the Runs table then shows its device, ranks and steps)."""
        store = get_store()
        if run_id in store.runs:
            try:
                _ = store.runs[run_id].analysis
            except Exception:  # noqa: BLE001 - the table's status column shows the error
                pass
        return rows()


PAGE = Page(path="/", title="Runs", order=0, layout=layout, register_callbacks=register)
