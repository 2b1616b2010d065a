"""Memory: the selected run's memory timeline (the ``whatif memory`` document, docs/memory.md):
allocated and reserved bytes of one device over time with the peak marked, the operators that held
memory at the peak, and allocated bytes per step. Needs a trace recorded with ``profile_memory``
(``whatif record --memory``); without one the page says so. A scenario of the run (saved or loaded
in the What-if builder) shows the timeline its transforms predict beside the recorded one, as
``whatif memory -s`` does."""
from __future__ import annotations

from typing import Any

import dash
import plotly.graph_objects as go
from dash import Input, Output, State, dcc, html

from whatif.breakdown import step_label
from whatif.documents import MemoryDevice, MemoryDocument
from whatif.memory import memory, memory_edits
from whatif.report.diff_text import short_name

from ..jobs import Pending, poller, watch, working
from ..layout import card, error_box, guarded, loading, table
from ..state import get_store, spec_key
from . import Page

RECORDED = ""  # the scenario dropdown's value for the timeline as recorded
NO_RECORDS = ("No allocator records in this run: record it with profile_memory (whatif record --memory, or "
              "torch.profiler.profile(profile_memory=True)).")


def layout(**_: Any) -> html.Div:
    return html.Div([
        html.H2("Memory"),
        html.P("Every allocation and free the profiler recorded (profile_memory). Allocated is what tensors hold; "
               "reserved is what the caching allocator took from the device. At the peak, each block still "
               "allocated is matched by address to the operator that allocated it.", className="note"),
        html.Div([
            dcc.Dropdown(id="mem-device", clearable=False, placeholder="device", style={"minWidth": "260px"}),
            dcc.Dropdown(id="mem-scenario", clearable=False, value=RECORDED, style={"minWidth": "320px"},
                         options=[{"label": "as recorded", "value": RECORDED}]),
        ], style={"display": "flex", "gap": "12px"}),
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


def predicted(run_id: str | None, name: str) -> MemoryDocument:
    """The memory document the run's scenario ``name`` predicts (computed once per scenario spec).

    Raises
    ------
    KeyError : the run has no scenario of that name.
    TransformError : a transform of the scenario that models memory cannot apply to this trace.
    """
    run = get_store().get(run_id)
    if name not in run.scenarios:
        raise KeyError(f"no scenario {name!r} on this run")
    spec = run.scenarios[name]
    analysis = run.analysis
    with run.lock:
        key = ("memory", spec_key(spec))
        if key not in run.cache:
            edits, lines = memory_edits(analysis.graph, run.scenario(spec).transforms)
            run.cache[key] = memory(analysis.trace, analysis.graph, edits=edits, predicted=lines)
        return run.cache[key]  # type: ignore[no-any-return]


def scenario_options(run_id: str | None) -> list[dict[str, str]]:
    names = sorted(get_store().get(run_id).scenarios) if run_id else []
    return [{"label": "as recorded", "value": RECORDED}] + [{"label": f"predicted: {n}", "value": n} for n in names]


def device_key(d: MemoryDevice) -> str:
    return f"{d.rank}/{d.device}"


def mib(nbytes: int | None) -> float | None:
    return None if nbytes is None else round(nbytes / 2**20, 1)


def timeline_figure(doc: MemoryDocument, device: MemoryDevice, recorded: MemoryDocument | None = None) -> go.Figure:
    """Allocated (and reserved) MiB against ms from the device's first record, as steps; the peak
    marked. ``recorded``: the recorded document of a predicted ``doc``, drawn under it in grey."""
    series = next(s for s in doc.timeline if s.rank == device.rank and s.device == device.device)
    x = [(t - device.first_ns) / 1e6 for t in series.ts_ns]
    fig = go.Figure()
    if recorded is not None:
        was = next(s for s in recorded.timeline if s.rank == device.rank and s.device == device.device)
        fig.add_scatter(x=[(t - device.first_ns) / 1e6 for t in was.ts_ns], y=[b / 2**20 for b in was.allocated_bytes],
                        name="allocated, recorded", line_shape="hv", line=dict(color="#9e9e9e"))
    fig.add_scatter(x=x, y=[b / 2**20 for b in series.allocated_bytes],
                    name="allocated" if recorded is None else "allocated, predicted", line_shape="hv",
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


def body(run_id: str | None, key: str | None, scenario: str = RECORDED) -> html.Div:
    recorded = document(run_id)
    if not recorded.devices:
        return html.Div(NO_RECORDS, className="note", id="mem-empty")
    doc = predicted(run_id, scenario) if scenario != RECORDED else recorded
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
    was = next(d for d in recorded.devices if device_key(d) == device_key(device))
    is_prediction = doc.predicted is not None
    explained = [] if doc.predicted is None else [
        html.Div([html.H4(f"Predicted by scenario {scenario!r}: what it changes in the allocator records"),
                  html.Ul([html.Li(line) for line in doc.predicted], id="mem-predicted"),
                  html.P("The cards, the figure and the tables below are the prediction's; the grey line is the "
                         "recorded timeline.", className="note")], className="panel")]
    compared = [] if not is_prediction else [
        card("recorded peak allocated (MiB)", f"{mib(was.peak_allocated_bytes):,}", id="mem-recorded-peak"),
        card("predicted / recorded peak", f"{device.peak_allocated_bytes / was.peak_allocated_bytes:.3f}x"
             if was.peak_allocated_bytes else "-", id="mem-peak-ratio")]
    reserved = (f"{mib(device.peak_reserved_bytes):,}" if device.peak_reserved_bytes is not None
                else "not predicted" if is_prediction else "not recorded")
    return html.Div([
        *explained,
        html.Div([card("predicted peak allocated (MiB)" if is_prediction else "peak allocated (MiB)",
                       f"{mib(device.peak_allocated_bytes):,}", id="mem-peak"),
                  *compared,
                  card("peak reserved (MiB)", reserved, id="mem-reserved"),
                  card("at", f"step {device.peak_step if device.peak_step >= 0 else '-'} · "
                       f"{short_name(device.peak_op, 36)}", id="mem-at"),
                  card("of the peak, allocated before the recording (MiB)",
                       f"{mib(unrecorded):,}" if unrecorded is not None else "unknown", id="mem-unrecorded")],
                 className="cards"),
        html.P(f"{device.device} of rank {device.rank}: {device.records:,} records; baseline {device.baseline}"
               + (" (the trace has sizes only: bytes counted from 0 at the first record)"
                  if device.baseline == "relative" else ""), className="note"),
        html.Div([dcc.Graph(id="mem-timeline", figure=timeline_figure(doc, device,
                                                                      recorded if is_prediction else None))],
                 className="panel"),
        html.Div([html.H4("Operators by memory held at the peak"), table("mem-ops", ops)], className="panel"),
        html.Div([html.H4("Allocated memory per step"), table("mem-steps", steps)], className="panel"),
    ])


def register(app: dash.Dash) -> None:
    watch(app, "mem", lambda: get_store().jobs)

    @app.callback(Output("mem-device", "options"), Output("mem-device", "value"), Output("mem-scenario", "options"),
                  Output("mem-scenario", "value"), Output("mem-body", "children"),
                  Output("mem-poll", "disabled"), Output("mem-waiting", "data"), Output("mem-error", "children"),
                  Input("run", "value"), Input("mem-ready", "data"))
    @guarded(8, poll=5)
    def devices(run_id: str | None, _: str | None) -> tuple[Any, ...]:
        """The run's devices and scenarios once its memory document is made (on the job threads);
        until then, the working state."""
        if not run_id:
            raise dash.exceptions.PreventUpdate
        run = get_store().get(run_id)
        scenarios = scenario_options(run_id)
        doc = get_store().jobs.result(("memory", run.id), lambda: document(run_id))
        if isinstance(doc, Pending):
            return ([], None, scenarios, RECORDED, working(f"reading the allocator records of {run.label}"), False,
                    doc.token)
        options = [{"label": f"rank {d.rank} · {d.device}", "value": device_key(d)} for d in doc.devices]
        if not options:  # no device to pick: the page says why
            return [], None, scenarios, RECORDED, body(run_id, None), True, dash.no_update
        return options, options[0]["value"], scenarios, RECORDED, dash.no_update, True, dash.no_update

    @app.callback(Output("mem-body", "children", allow_duplicate=True), Output("mem-body-error", "children"),
                  Input("mem-device", "value"), Input("mem-scenario", "value"), State("run", "value"),
                  prevent_initial_call=True)
    @guarded(2, clear={0: None})
    def show(key: str | None, scenario: str | None, run_id: str | None) -> tuple[html.Div]:
        if not run_id or not key:
            raise dash.exceptions.PreventUpdate
        return (body(run_id, key, scenario or RECORDED),)


PAGE = Page(path="/memory", title="Memory", order=27, layout=layout, register_callbacks=register)
