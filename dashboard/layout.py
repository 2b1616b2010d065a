"""Layout helpers shared by the pages: the app shell, cards, sortable tables, error boxes, and
``guarded``, which turns any exception of a callback into a readable one-line message in the page."""
from __future__ import annotations

import functools
import logging
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dash
from dash import dash_table, dcc, html

from whatif.report.diff_text import short_names

from .pages import Page

log = logging.getLogger("whatif.dashboard")

COUNT_ALL = "count-all"
"""The id of the box that counts warm-up and partial steps in means, phase tables, charts and fits
(its value to options: :func:`whatif.dashboard.state.step_options`)."""

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #222; background: #f4f5f7; }
.nav { display: flex; flex-wrap: wrap; gap: 6px 16px; align-items: center; padding: 8px 18px; background: #1f2a44;
       color: #fff; }
.nav a { color: #dfe6f5; text-decoration: none; font-weight: 500; white-space: nowrap; }
.nav a:hover { color: #fff; text-decoration: underline; }
.nav .brand { font-weight: 700; font-size: 18px; margin-right: 12px; color: #fff; }
.nav .run { width: 360px; max-width: 100%; color: #222; }
.nav .count-all { margin-left: auto; } .nav .count-all label { color: #dfe6f5; white-space: nowrap; }
.page { padding: 14px 18px; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin-bottom: 10px; }
.card { background: #fff; border-radius: 6px; padding: 8px 14px; box-shadow: 0 1px 2px #0002; min-width: 120px; }
.card .label { font-size: 12px; color: #667; } .card .value { font-size: 20px; font-weight: 600; }
.panel { background: #fff; border-radius: 6px; padding: 10px; box-shadow: 0 1px 2px #0002; margin-bottom: 12px; }
.row { display: flex; gap: 12px; flex-wrap: wrap; } .row > * { flex: 1 1 420px; min-width: 0; }
.error { background: #fdecea; color: #8a1c12; border: 1px solid #f5c2bd; padding: 8px 12px; border-radius: 6px;
         margin: 6px 0; white-space: pre-wrap; }
.note { color: #556; font-size: 13px; }
.working { color: #3b5b9a; font-size: 14px; padding: 10px 0; display: flex; align-items: center; gap: 10px; }
.spinner { width: 16px; height: 16px; border: 3px solid #c9d3e6; border-top-color: #3b5b9a; border-radius: 50%;
           animation: spin 0.8s linear infinite; }
@keyframes spin { to { transform: rotate(360deg); } }
label { font-size: 13px; color: #445; }
fieldset { border: 1px solid #dde; border-radius: 6px; margin: 6px 0; }
input[type=text], input[type=number] { padding: 4px 6px; border: 1px solid #ccd; border-radius: 4px; }
button { padding: 5px 12px; border-radius: 4px; border: 1px solid #3b5b9a; background: #3b5b9a; color: #fff;
         cursor: pointer; margin: 4px 4px 4px 0; }
button.secondary { background: #fff; color: #3b5b9a; }
pre { background: #f7f7fa; padding: 8px; border-radius: 4px; font-size: 12px; overflow-x: auto; }
"""

INDEX = """<!DOCTYPE html>
<html><head>{%metas%}<title>{%title%}</title>{%favicon%}{%css%}<style>""" + CSS + """</style></head>
<body>{%app_entry%}<footer>{%config%}{%scripts%}{%renderer%}</footer></body></html>"""


def shell(pages: Sequence[Page], run_options: list[dict[str, str]], run_value: str | None) -> html.Div:
    """Navigation bar (a link per page, in order, the "count warm-up and partial steps" box and the
    run menu) above the current page."""
    links = [dcc.Link(p.title, href=p.path, id=p.nav_id) for p in pages]
    return html.Div([
        html.Div([html.Span("whatif", className="brand"), *links,
                  dcc.Checklist(id=COUNT_ALL, options=[{"label": " count warm-up and partial steps", "value": "all"}],
                                value=[], className="count-all", persistence=True,
                                inputStyle={"marginRight": "4px"}),
                  dcc.Dropdown(id="run", options=run_options, value=run_value, clearable=False,
                               placeholder="pick a run", className="run", persistence=True)], className="nav"),
        html.Div(dash.page_container, className="page"),
    ])


def card(label: str, value: Any, id: str | None = None) -> html.Div:
    kw: dict[str, Any] = {"id": id} if id else {}
    return html.Div([html.Div(label, className="label"), html.Div(value, className="value", **kw)], className="card")


def error(message: str) -> html.Div:
    return html.Div(message, className="error", role="alert")


def error_box(id: str) -> html.Div:
    """Where a guarded callback writes its error message."""
    return html.Div(id=id)


NAME_WIDTH = 48
"""Characters a name keeps in a table cell (the middle elided: :func:`whatif.report.diff_text.short_name`)."""


def _numeric(rows: list[dict[str, Any]], column: str) -> bool:
    """Whether the first row that has ``column`` holds a number there."""
    value = next((r[column] for r in rows if r.get(column) is not None), None)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def name_cells(rows: list[dict[str, Any]], names: Sequence[str],
               width: int = NAME_WIDTH) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``rows`` with the ``names`` columns shortened from the middle to ``width`` characters, and
    the DataTable ``tooltip_data`` holding the full names of the shortened cells; different names
    get different labels (:func:`~whatif.report.diff_text.short_names`).

    >>> name_cells([{"n": 1, "name": "a" * 60}], ["name"], 9)[0]
    [{'n': 1, 'name': 'aaaa…aaaa'}]
    """
    shown = [dict(r) for r in rows]
    for c in names:
        at = [i for i, r in enumerate(rows) if r.get(c) is not None]
        for i, label in zip(at, short_names([str(rows[i][c]) for i in at], width)):
            shown[i][c] = label
    tips = [{c: {"value": str(r[c]), "type": "text"} for c in names
             if r.get(c) is not None and str(r[c]) != s[c]} for r, s in zip(rows, shown)]
    return shown, tips


def table(id: str, rows: list[dict[str, Any]], columns: Sequence[str] | None = None, page_size: int = 12,
          names: Sequence[str] = (), name_width: int = NAME_WIDTH, numbers: Sequence[str] = (),
          **kwargs: Any) -> dash_table.DataTable:  # type: ignore[name-defined]  # see below
    """A sortable, filterable table of ``rows`` (numbers stay numbers, so sorting is numeric).

    Numbers come first (right-aligned), then text, then the ``names`` columns (kernels, ops, runs),
    shortened from the middle to ``name_width`` characters with the full name in the cell's tooltip
    (text left-aligned). Cells wrap instead of clipping. A column is numeric when its first value is
    a number, or when listed in ``numbers`` (a table whose rows get their numbers later: the Runs
    table before any run is analysed)."""
    given = list(columns or (rows[0].keys() if rows else []))
    numeric = {c for c in given if c in numbers or _numeric(rows, c)}
    cols = ([c for c in given if c in numeric and c not in names]
            + [c for c in given if c not in numeric and c not in names] + [c for c in given if c in names])
    shown, tips = name_cells(rows, names, name_width)
    # dash/dash_table/__init__.py is `# type: ignore`d as a whole, so mypy sees none of its names
    return dash_table.DataTable(  # type: ignore[attr-defined]
        id=id, data=shown, columns=[{"name": c, "id": c, "type": "numeric" if c in numeric else "text"}
                                    for c in cols],
        sort_action="native", filter_action="native", page_size=page_size,
        **({"tooltip_data": tips, "tooltip_duration": None} if any(tips) else {}),
        style_table={"overflowX": "auto"},
        style_cell={"fontSize": 12, "padding": "3px 6px", "whiteSpace": "normal", "height": "auto",
                    "overflowWrap": "anywhere"},
        style_cell_conditional=[{"if": {"column_id": c}, "textAlign": "left"} for c in cols if c not in numeric]
        + [{"if": {"column_id": c}, "minWidth": 160} for c in names] + kwargs.pop("style_cell_conditional", []),
        style_header={"fontWeight": 600, "backgroundColor": "#eef1f6"}, **kwargs)


def loading(*children: Any, id: str | None = None) -> dcc.Loading:
    kw: dict[str, Any] = {"id": id} if id else {}
    return dcc.Loading(list(children), type="default", delay_show=150, **kw)


def guarded(n_outputs: int, poll: int | None = None,
            clear: Mapping[int, Any] | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a callback whose last output is an error box: any exception becomes its message
    there, one line without the exception's class (:func:`_message`), so the app never dies on bad
    input. The other outputs are left as they were, except output ``poll``, a poller's
    ``disabled``, set to stop polling, and the outputs ``clear`` maps to the value that empties
    them (a result the error invalidates: ``{0: None}``)."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def inner(*args: Any) -> Any:
            try:
                out = fn(*args)
            except dash.exceptions.PreventUpdate:
                raise
            except Exception as exc:  # noqa: BLE001 - shown to the user, logged in full
                log.warning("callback %s failed:\n%s", fn.__name__, traceback.format_exc())
                box = error(_message(exc))
                return (*_left_on_error(n_outputs - 1, poll, clear), box) if n_outputs > 1 else box
            if n_outputs == 1:
                return out
            return (*out, None) if len(out) == n_outputs - 1 else out
        return inner
    return wrap


def _message(exc: Exception) -> str:
    """What the page says of a callback's error: its message, in one line, without the exception's
    class (the server log has that and the traceback).

    >>> _message(ValueError("no scenario saved yet")), _message(KeyError("no run selected"))
    ('no scenario saved yet', 'no run selected')
    >>> _message(AssertionError())
    'unexpected error (the server log has the details)'
    """
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    return " ".join(text.split()) or "unexpected error (the server log has the details)"


def _left_on_error(n: int, poll: int | None, clear: Mapping[int, Any] | None) -> list[Any]:
    """The ``n`` outputs before the error box of a callback that failed.

    >>> rest = _left_on_error(3, poll=1, clear={0: None})
    >>> rest[:2], rest[2] is dash.no_update
    ([None, True], True)
    """
    rest: list[Any] = [dash.no_update] * n
    if poll is not None:
        rest[poll] = True
    for i, value in (clear or {}).items():
        rest[i] = value
    return rest


def ms(ns: float) -> float:
    """Nanoseconds to milliseconds, rounded for tables."""
    return round(float(ns) / 1e6, 3)
