"""Suggest: every optimization whatif knows, tried alone on the selected run and ranked by predicted
speedup (the ``whatif suggest`` document: docs/suggest.md), with where each acts, what caps it, and
the transforms not tried with the reason. Computed on the button, cached per run and step options."""
from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, html

from whatif.documents import SuggestDocument
from whatif.suggest import suggest

from ..jobs import Jobs, Pending, poller, watch, working
from ..layout import COUNT_ALL, card, error_box, guarded, loading, ms, table
from ..state import get_store, step_options
from . import Page

COLUMNS = ("rank", "optimization", "speedup", "step ms", "saved ms", "acts on", "cap", "also tried")
RESETS = {"run.value", f"{COUNT_ALL}.value"}
"""Changes that empty the page: its suggestions were for another run or other steps counted."""
NONE_APPLIES = "No optimization applies to this run: each one whatif knows is listed under Not tried, with the reason."


def layout(**_: Any) -> html.Div:
    return html.Div([
        html.H2("Suggest"),
        html.P("Every optimization whose needs this trace meets (GPU kernels, a GPU of the catalog, collectives…), "
               "applied alone at its candidate settings and replayed; ranked by predicted speedup over the steps "
               "that count.", className="note"),
        html.Button("Suggest", id="sg-run"), error_box("sg-error"),
        loading(html.Div(id="sg-body"), id="sg-loading"), poller("sg"),
    ])


def document(run_id: str | None, count_all: list[str] | None = None) -> SuggestDocument:
    """The run's suggestions (computed once per step options)."""
    run = get_store().get(run_id)
    options = step_options(count_all)
    key = ("suggest", options)
    with run.lock:
        if key not in run.cache:
            run.cache[key] = suggest(run.analysis_for(options))
        return run.cache[key]  # type: ignore[no-any-return]


def rows(doc: SuggestDocument) -> list[dict[str, Any]]:
    return [{"rank": s.rank, "optimization": s.setting, "speedup": round(s.headline.speedup, 4),
             "step ms": ms(s.headline.mean_step_ns), "saved ms": ms(s.saved_ns_per_step),
             "acts on": "; ".join(s.where) or "-", "cap": s.headline.cap.reason if s.headline.cap else "-",
             "also tried": "; ".join(f"{k} {v:.3f}x" for k, v in s.others.items()) or "-"}
            for s in doc.suggestions]


def ranking(doc: SuggestDocument) -> Any:
    """The table of what was tried, or a line saying nothing applies."""
    if not doc.suggestions:
        return html.P(NONE_APPLIES, className="note", id="sg-empty")
    return table("sg-table", rows(doc), COLUMNS, page_size=20,
                 style_cell_conditional=[{"if": {"column_id": c}, "textAlign": "left", "minWidth": 180}
                                         for c in ("acts on", "cap", "also tried")])


def body(run_id: str | None, count_all: list[str] | None = None) -> html.Div:
    doc = document(run_id, count_all)
    best = doc.suggestions[0] if doc.suggestions else None
    by_reason: dict[str, list[str]] = {}
    for k in doc.skipped:
        by_reason.setdefault(k.reason, []).append(k.transform)
    return html.Div([
        html.Div([card("mean step (ms)", f"{doc.baseline_mean_step_ns / 1e6:,.3f}"),
                  card("best", f"{best.setting} {best.headline.speedup:.3f}x" if best else "none applies",
                       id="sg-best"),
                  card("tried / not tried", f"{len(doc.suggestions)} / {len(doc.skipped)}")], className="cards"),
        html.Div([ranking(doc)], className="panel"),
        html.Div([html.H4("Not tried"),
                  html.Ul([html.Li(f"{', '.join(names)}: {reason}") for reason, names in by_reason.items()],
                          id="sg-skipped")], className="panel"),
    ])


def register(app: dash.Dash) -> None:
    watch(app, "sg", lambda: get_store().jobs)

    @app.callback(Output("sg-body", "children"), Output("sg-poll", "disabled"), Output("sg-waiting", "data"),
                  Output("sg-error", "children"), Input("sg-run", "n_clicks"), Input("sg-ready", "data"),
                  Input("run", "value"), Input(COUNT_ALL, "value"), prevent_initial_call=True)
    @guarded(4, poll=1, clear={0: None})
    def show(clicks: int | None, ready: str | None, run_id: str | None,
             count_all: list[str] | None) -> tuple[Any, ...]:
        """The suggestions on the button (a job: "working" until they are there); nothing, and no
        job waited for, once the run or the steps counted change."""
        if RESETS & set(dash.ctx.triggered_prop_ids):
            return None, True, None
        if not clicks:
            raise dash.exceptions.PreventUpdate
        run = get_store().get(run_id)
        options = step_options(count_all)
        key = ("suggest", run.id, options)
        if dash.ctx.triggered_id == "sg-ready" and not str(ready).startswith(Jobs.token(key)):
            raise dash.exceptions.PreventUpdate  # the job of a run or step count no longer shown
        doc = get_store().jobs.result(key, lambda: document(run_id, count_all))
        if isinstance(doc, Pending):
            return working(f"trying every optimization on {run.label}"), False, doc.token
        return body(run_id, count_all), True, dash.no_update


PAGE = Page(path="/suggest", title="Suggest", order=28, layout=layout, register_callbacks=register)
