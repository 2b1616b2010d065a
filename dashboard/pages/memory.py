"""Memory: the selected run's memory timeline (the ``whatif memory`` document, docs/memory.md):
allocated and reserved bytes of one device over time with the peak marked, the operators that held
memory at the peak, and allocated bytes per step. Needs a trace recorded with ``profile_memory``
(``whatif record --memory``); without one the page says so."""
from __future__ import annotations

from typing import Any

import dash
import plotly.graph_objects as go
from dash import Input, Output, State, dcc, html

from whatif.breakdown import step_label
from whatif.documents import MemoryDevice, MemoryDocument
from whatif.memory import memory
from whatif.report.diff_text import short_name

from ..jobs import Pending, poller, watch, working
from ..layout import card, error_box, guarded, loading, table
from ..state import get_store
from . import Page

NO_RECORDS = ("No allocator records in this run: record it with profile_memory (whatif record --memory, or "
              "torch.profiler.profile(profile_memory=True)).")


def layout(**_: Any) -> html.Div:
    return html.Div([
        html.H2("Memory"),
        html.P("Every allocation and free the profiler recorded (profile_memory). Allocated is what tensors hold; "
               "reserved is what the caching allocator took from the device. At the peak, each block still "
               "allocated is matched by address to the operator that allocated it.", className="note"),
        dcc.Dropdown(id="mem-device", clearable=False, placeholder="device", style={"maxWidth": "320px"}),
        error_box("mem-error"), error_box("mem-body-error"), loading(html.Div(id="mem-body"), id="mem-loading"),
        poller("mem"),
    ])


def document(run_id: str | None) -> MemoryDocument:
    """The run's memory document (computed once)."""
    run = get_store().get(run_id)
    analysis = run.analysis
    with run.lock:
        if "memory" not in run.cache:
            run.cache["memory"] = memory(analysis.trace, analysis.graph)
        return run.cache["memory"]  # type: ignore[no-any-return]


def device_key(d: MemoryDevice) -> str:
    return f"{d.rank}/{d.device}"


def mib(nbytes: int | None) -> float | None:
    return None if nbytes is None else round(nbytes / 2**20, 1)


def timeline_figure(doc: MemoryDocument, device: MemoryDevice) -> go.Figure:
    """Allocated (and reserved) MiB against ms from the device's first record, as steps; the peak marked."""
    series = next(s for s in doc.timeline if s.rank == device.rank and s.device == device.device)
    x = [(t - device.first_ns) / 1e6 for t in series.ts_ns]
    fig = go.Figure()
    fig.add_scatter(x=x, y=[b / 2**20 for b in series.allocated_bytes], name="allocated", line_shape="hv",
                    line=dict(color="#4c78a8"))
    if series.reserved_bytes is not None:
        fig.add_scatter(x=x, y=[b / 2**20 for b in series.reserved_bytes], name="reserved", line_shape="hv",
                        line=dict(color="#f58518", dash="dot"))
    peak_ms = (device.peak_ns - device.first_ns) / 1e6
    fig.add_scatter(x=[peak_ms], y=[device.peak_allocated_bytes / 2**20], mode="markers+text", name="peak",
                    marker=dict(color="#c0392b", size=10), text=[f"peak {mib(device.peak_allocated_bytes):,} MiB"],
                    textposition="top center")
    fig.update_layout(xaxis_title="ms from the first record", yaxis_title="MiB", height=360,
                      margin=dict(l=60, r=20, t=30, b=50), legend=dict(orientation="h", y=1.12))
    return fig


def body(run_id: str | None, key: str | None) -> html.Div:
    doc = document(run_id)
    if not doc.devices:
        return html.Div(NO_RECORDS, className="note", id="mem-empty")
    device = next((d for d in doc.devices if device_key(d) == key), doc.devices[0])
    ops = [{"held at peak MiB": mib(o.held_at_peak_bytes), "allocated MiB": mib(o.allocated_bytes),
            "freed MiB": mib(o.freed_bytes), "allocated − freed MiB": mib(o.net_bytes), "allocations": o.allocations,
            "op": short_name(o.op, 70)}
           for o in doc.ops if o.rank == device.rank and o.device == device.device]
    steps = [{"step": step_label(s.step, s.excluded), "peak MiB": mib(s.peak_allocated_bytes),
              "start MiB": mib(s.start_allocated_bytes), "end MiB": mib(s.end_allocated_bytes),
              "allocated MiB": mib(s.allocated_bytes), "records": s.records}
             for s in doc.steps if s.rank == device.rank and s.device == device.device]
    unrecorded = device.held_at_peak_unrecorded_bytes
    return html.Div([
        html.Div([card("peak allocated (MiB)", f"{mib(device.peak_allocated_bytes):,}", id="mem-peak"),
                  card("peak reserved (MiB)", f"{mib(device.peak_reserved_bytes):,}"
                       if device.peak_reserved_bytes is not None else "not recorded", id="mem-reserved"),
                  card("at", f"step {device.peak_step if device.peak_step >= 0 else '-'} · "
                       f"{short_name(device.peak_op, 36)}", id="mem-at"),
                  card("of the peak, allocated before the recording (MiB)",
                       f"{mib(unrecorded):,}" if unrecorded is not None else "unknown", id="mem-unrecorded")],
                 className="cards"),
        html.P(f"{device.device} of rank {device.rank}: {device.records:,} records; baseline {device.baseline}"
               + (" (the trace has sizes only: bytes counted from 0 at the first record)"
                  if device.baseline == "relative" else ""), className="note"),
        html.Div([dcc.Graph(id="mem-timeline", figure=timeline_figure(doc, device))], className="panel"),
        html.Div([html.H4("Operators by memory held at the peak"), table("mem-ops", ops)], className="panel"),
        html.Div([html.H4("Allocated memory per step"), table("mem-steps", steps)], className="panel"),
    ])


def register(app: dash.Dash) -> None:
    watch(app, "mem", lambda: get_store().jobs)

    @app.callback(Output("mem-device", "options"), Output("mem-device", "value"), Output("mem-body", "children"),
                  Output("mem-poll", "disabled"), Output("mem-waiting", "data"), Output("mem-error", "children"),
                  Input("run", "value"), Input("mem-ready", "data"))
    @guarded(6, poll=3)
    def devices(run_id: str | None, _: str | None) -> tuple[Any, ...]:
        """The run's devices once its memory document is made (on the job threads); until then,
        the working state."""
        if not run_id:
            raise dash.exceptions.PreventUpdate
        run = get_store().get(run_id)
        doc = get_store().jobs.result(("memory", run.id), lambda: document(run_id))
        if isinstance(doc, Pending):
            return [], None, working(f"reading the allocator records of {run.label}"), False, doc.token
        options = [{"label": f"rank {d.rank} · {d.device}", "value": device_key(d)} for d in doc.devices]
        if not options:  # no device to pick: the page says why
            return [], None, body(run_id, None), True, dash.no_update
        return options, options[0]["value"], dash.no_update, True, dash.no_update

    @app.callback(Output("mem-body", "children", allow_duplicate=True), Output("mem-body-error", "children"),
                  Input("mem-device", "value"), State("run", "value"), prevent_initial_call=True)
    @guarded(2)
    def show(key: str | None, run_id: str | None) -> tuple[html.Div]:
        if not run_id or not key:
            raise dash.exceptions.PreventUpdate
        return (body(run_id, key),)


PAGE = Page(path="/memory", title="Memory", order=27, layout=layout, register_callbacks=register)
