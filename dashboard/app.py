"""The Dash app: a multi-page app (``use_pages``) whose pages are the modules of
:mod:`whatif.dashboard.pages`, each declaring its ``PAGE`` (found with ``discover_pages`` and
registered explicitly: the package is installed under ``whatif.dashboard``, so Dash scans no
pages folder)."""
from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import parse_qs

import dash
from dash import Input, Output, State

from .layout import INDEX, shell
from .pages import Page, discover_pages
from .state import RunStore, set_store
from .uploads import add_upload_route

MAX_REQUEST_BYTES = 4 << 20

RUN_TO_URL = """
function (run) {
  if (!run) { throw window.dash_clientside.PreventUpdate; }
  const url = new URL(window.location.href);
  if (url.searchParams.get("run") !== run) {
    url.searchParams.set("run", run);
    window.history.replaceState(window.history.state, "", url);
  }
  return PATHS.map(path => path + "?run=" + encodeURIComponent(run));
}"""
"""The run menu to the address bar's ``?run=`` (replaced in place: no new history entry, no page
render) and to the navigation links, so a reload, a copied link or the next page keep the run."""


def create_app(paths: Sequence[str | Path] = (), *, store: RunStore | None = None,
               max_upload_mb: int = 200) -> dash.Dash:
    """A dashboard on ``paths`` (trace files, run folders, folders of them), or on ``store``."""
    store = store or RunStore(list(paths), max_upload_bytes=max_upload_mb * 1024 * 1024)
    set_store(store)
    app = dash.Dash(__name__, use_pages=True, pages_folder="", title="whatif", suppress_callback_exceptions=True,
                    # dash documents None (no "Updating..." title) but annotates the parameter as str
                    update_title=None,  # type: ignore[arg-type]
                    assets_folder=str(Path(__file__).parent / "assets"), serve_locally=True)
    app.index_string = INDEX
    # Traces are streamed to UPLOAD_ROUTE (its own limit); every other request body is a callback's
    # small JSON (a scenario upload is at most MAX_SCENARIO_BYTES, base64-encoded).
    app.server.config["MAX_CONTENT_LENGTH"] = MAX_REQUEST_BYTES
    add_upload_route(app.server, store)
    pages = discover_pages()
    for page in pages:
        dash.register_page(page.module, path=page.path, name=page.title, title=f"whatif · {page.title}",
                           order=page.order, layout=page.layout)
    first = next(iter(store.runs), None)
    app.layout = lambda: shell(pages, store.options(), first)
    for page in pages:
        page.register_callbacks(app)

    @app.callback(Output("run", "value", allow_duplicate=True), Input("_pages_location", "search"),
                  State("run", "value"), prevent_initial_call="initial_duplicate")
    def run_from_url(search: str | None, current: str | None) -> str:
        """``?run=<id>`` in a page's address selects that run (links and tests), unless the menu
        shows it already (its pages' callbacks would run again for nothing)."""
        wanted = parse_qs((search or "").lstrip("?")).get("run", [None])[0]
        if wanted not in store.runs or wanted == current:
            raise dash.exceptions.PreventUpdate
        return wanted

    follow_run_in_url(app, pages)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    return app


def follow_run_in_url(app: dash.Dash, pages: Sequence[Page]) -> None:
    """Register :data:`RUN_TO_URL` on the run menu's changes (opening a page leaves its address
    as it is)."""
    script = RUN_TO_URL.replace("PATHS", json.dumps([p.path for p in pages]))
    app.clientside_callback(script, [Output(p.nav_id, "href") for p in pages], Input("run", "value"),
                            prevent_initial_call=True)
