"""Collectives: the selected run's collectives as a whole (the ``whatif collectives`` document,
docs/collectives.md): per rank the time transferring and waiting for later peers, the calls that
cost the most waiting with their straggler, and every call's bus bandwidth."""
from __future__ import annotations

from typing import Any

import dash
import plotly.graph_objects as go
from dash import Input, Output, dcc, html

from whatif.collectives import collectives
from whatif.documents import CollectivesDocument
from whatif.report.diff_text import short_name

from ..jobs import Pending, poller, watch, working
from ..layout import card, error_box, guarded, loading, ms, table
from ..state import get_store
from . import Page


def layout(**_: Any) -> html.Div:
    return html.Div([
        html.H2("Collectives"),
        html.P("Each collective matched across the loaded ranks: the last rank to arrive is the straggler, and "
               "every other rank waits for it; busbw is nccl-tests' bus bandwidth. With one rank loaded, a call's "
               "time includes its wait for the ranks that are not.", className="note"),
        error_box("coll-error"), loading(html.Div(id="coll-body"), id="coll-loading"), poller("coll"),
    ])


def document(run_id: str | None) -> CollectivesDocument:
    """The run's collectives document (computed once)."""
    run = get_store().get(run_id)
    analysis = run.analysis
    with run.lock:
        if "collectives" not in run.cache:
            run.cache["collectives"] = collectives(analysis.trace, analysis.graph)
        return run.cache["collectives"]  # type: ignore[no-any-return]


def ranks_figure(doc: CollectivesDocument) -> go.Figure:
    x = [f"rank {r.rank}" for r in doc.ranks]
    fig = go.Figure()
    fig.add_bar(name="transfer", x=x, y=[ms(r.transfer_ns) for r in doc.ranks], marker_color="#4c78a8")
    fig.add_bar(name="waited for later ranks", x=x, y=[ms(r.waited_ns) for r in doc.ranks], marker_color="#e45756")
    fig.update_layout(barmode="stack", yaxis_title="ms", height=300, margin=dict(l=50, r=10, t=10, b=40),
                      legend=dict(orientation="h", y=1.12))
    return fig


def body(run_id: str | None) -> html.Div:
    doc = document(run_id)
    if not doc.calls:
        return html.Div("No collective kernels (NCCL/RCCL) in this run.", className="note", id="coll-empty")
    waited = sum(c.waited_ns for c in doc.calls)
    worst = max(doc.ranks, key=lambda r: (r.caused_wait_ns, -r.rank))
    calls = [{"waited ms": ms(c.waited_ns), "skew ms": ms(c.skew_ns), "transfer ms": ms(c.transfer_ns),
              "busbw GB/s": c.busbw_gbps, "MiB": None if c.message_bytes is None else round(c.message_bytes / 2**20, 3),
              "straggler": c.straggler, "ranks": len(c.ranks), "span": c.span, "kind": c.kind, "step": c.step,
              "call": f"{short_name(c.key, 60)} #{c.occurrence}"}
             for c in sorted(doc.calls, key=lambda c: (-c.waited_ns, -c.transfer_ns, c.first_arrival_ns))]
    ranks = [{"rank": r.rank, "calls": r.calls, "transfer ms": ms(r.transfer_ns), "waited ms": ms(r.waited_ns),
              "straggler calls": r.straggler_calls, "caused wait ms": ms(r.caused_wait_ns)} for r in doc.ranks]
    return html.Div([
        html.Div([card("calls", f"{len(doc.calls):,}", id="coll-calls"),
                  card("ranks with collectives", f"{len(doc.ranks):,}"),
                  card("waiting for stragglers (ms)", f"{waited / 1e6:,.3f}", id="coll-waited"),
                  card("worst straggler", f"rank {worst.rank}: {worst.caused_wait_ns / 1e6:,.3f} ms"
                       if worst.caused_wait_ns else "none", id="coll-worst")], className="cards"),
        html.Div([html.H4("Time in collectives per rank"), dcc.Graph(id="coll-ranks-figure", figure=ranks_figure(doc)),
                  table("coll-ranks", ranks)], className="panel"),
        html.Div([html.H4("Calls, by the waiting they cost"), table("coll-calls-table", calls, page_size=15)],
                 className="panel"),
    ])


def register(app: dash.Dash) -> None:
    watch(app, "coll", lambda: get_store().jobs)

    @app.callback(Output("coll-body", "children"), Output("coll-poll", "disabled"), Output("coll-waiting", "data"),
                  Output("coll-error", "children"), Input("run", "value"), Input("coll-ready", "data"))
    @guarded(4, poll=1)
    def show(run_id: str | None, _: str | None) -> tuple[Any, ...]:
        if not run_id:
            raise dash.exceptions.PreventUpdate
        run = get_store().get(run_id)
        doc = get_store().jobs.result(("collectives", run.id), lambda: document(run_id))
        if isinstance(doc, Pending):
            return working(f"matching the collectives of {run.label}"), False, doc.token
        return body(run_id), True, dash.no_update


PAGE = Page(path="/collectives", title="Collectives", order=29, layout=layout, register_callbacks=register)
