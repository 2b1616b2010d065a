"""Compare: several scenarios side by side on one run: mean step time and speedup, critical-path
breakdown, time per step; and, for a run with a serving log, the predicted serving metrics
(TTFT, TPOT, e2e, throughput) per scenario and latency-vs-throughput curves (``whatif.serving``)."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import dash
from dash import Input, Output, State, dcc, html

from whatif import figures
from whatif.documents import DitScenarioServing, LlmScenarioServing, LlmScheduler, mean_breakdown_ns
from whatif.predictors.serving.logs import LlmConfig, read_log
from whatif.serving import Workload

from ..derive import breakdown_row
from ..layout import COUNT_ALL, error_box, guarded, loading, ms, table
from ..state import Run, get_store, step_options
from . import Page

NO_LOG = ("No serving log for this run: whatif serve looks for the --log file named in the run folder's meta.jsonc "
          "(or a file of that name inside the folder), so TTFT/TPOT are not predicted here.")
NO_SCENARIO = "no scenario saved yet: save one in the What-if builder"
NONE_TICKED = "no scenario selected: tick one above"
DEFAULT_RATE = 10.0  # req/s, when the serving log names no rate
SWEEP_FACTORS = (0.25, 0.5, 1.0, 2.0, 4.0)  # latency-vs-throughput rates, relative to the workload's
LLM_COLUMNS = [("TTFT mean ms", "ttft_ms", "mean"), ("TTFT p99 ms", "ttft_ms", "p99"),
               ("TPOT mean ms", "tpot_ms", "mean"), ("TPOT p99 ms", "tpot_ms", "p99"),
               ("e2e mean ms", "e2e_ms", "mean")]
DIT_COLUMNS = [("latency mean ms", "latency_ms", "mean"), ("latency p99 ms", "latency_ms", "p99"),
               ("queue mean ms", "queue_ms", "mean")]


def layout(**_: Any) -> html.Div:
    return html.Div([
        html.H2("Compare scenarios"),
        html.Div([
            html.P("Scenarios saved or loaded in the What-if builder for the selected run:", className="note"),
            dcc.Checklist(id="cmp-scenarios", options=[], value=[], inline=True,
                          inputStyle={"marginRight": 4}, labelStyle={"marginRight": 14}),
            html.P(id="cmp-none", className="note"),
            html.Button("Compare", id="cmp-run"),
        ], className="panel"),
        error_box("cmp-error"),
        loading(html.Div(id="cmp-body")),
        html.Div([
            html.H4("Serving"),
            html.Div(id="cmp-serving-note", className="note"),
            html.Div([html.Label("arrival rate (req/s) "),  # no min: a browser sends -1 as empty (the default)
                      dcc.Input(id="cmp-rate", type="number", step="any", debounce=True, style={"width": 90})]),
            error_box("cmp-serving-error"),
            loading(html.Div(id="cmp-serving-body")),
        ], id="cmp-serving", className="panel"),
    ])


def default_workload(run: Run) -> Workload | None:
    """The recorded workload (rate, request count and token ranges of the serving log's config, where
    it has them; else 10 req/s x the Workload's default count), or ``None`` without a serving log."""
    path = run.serving_log
    if path is None:
        return None
    c = read_log(path).config
    rate = c.rate
    w = Workload(rate=float(rate) if isinstance(rate, (int, float)) and 0 < rate < math.inf else DEFAULT_RATE,
                 num_requests=c.num_requests)  # None: Workload's default
    ranges = c.token_ranges() if isinstance(c, LlmConfig) else None
    if ranges is not None:
        w = replace(w, prompt_tokens=ranges[0], output_tokens=ranges[1])
    return w


def serving_body(run_id: str | None, names: list[str], rate: float | None,
                 count_all: list[str] | None = None) -> html.Div:
    """Serving metrics per scenario (baseline first) and the latency-vs-throughput figure."""
    run = get_store().get(run_id)
    workload = default_workload(run)
    if workload is None:
        return html.Div()  # the note above says why
    if rate is not None:
        if not rate > 0:
            raise ValueError(f"arrival rate must be > 0 req/s, got {rate}")
        workload = replace(workload, rate=float(rate))
    missing = [n for n in names if n not in run.scenarios]
    if missing:
        raise KeyError(f"no scenario {missing[0]!r} on this run")
    assert workload.rate is not None
    rates = [round(workload.rate * f, 6) for f in SWEEP_FACTORS]
    doc, curves = run.serving([run.scenarios[n] for n in names], workload, rates, step_options(count_all))
    rows = [_serving_row(s) for s in doc.scenarios]
    w = doc.workload
    prompt, output = w.prompt_tokens, w.output_tokens
    assert isinstance(prompt, tuple) and isinstance(output, tuple)  # a drawn workload, not a file
    policy = doc.scheduler.policy if isinstance(doc.scheduler, LlmScheduler) else "dit"
    return html.Div([
        html.P(f"Predicted with whatif serve: {w.arrivals} arrivals at {w.rate_req_per_s:g} req/s x "
               f"{w.num_requests} requests, prompt {prompt[0]}-{prompt[1]} and output "
               f"{output[0]}-{output[1]} tokens, {policy} "
               f"scheduler; curves over {', '.join(f'{r:g}' for r in rates)} req/s.", className="note"),
        table("cmp-serving-table", rows, page_size=20, names=("scenario",)),
        dcc.Graph(id="cmp-serving-curves", figure=figures.serving_curves_figure(curves).update_layout(legend_y=-0.25)),
    ])


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _serving_row(s: LlmScenarioServing | DitScenarioServing) -> dict[str, Any]:
    """One row of the serving table."""
    row: dict[str, Any] = {"scenario": s.name}
    if isinstance(s, LlmScenarioServing):
        stats = [(s.ttft_ms, "mean"), (s.ttft_ms, "p99"), (s.tpot_ms, "mean"), (s.tpot_ms, "p99"), (s.e2e_ms, "mean")]
        row.update({label: _round(st.get(q), 3) for (label, _, _), (st, q) in zip(LLM_COLUMNS, stats)})  # type: ignore[arg-type]
        row["out tok/s"] = _round(s.throughput_tokens_per_s, 1)
    else:
        stats = [(s.latency_ms, "mean"), (s.latency_ms, "p99"), (s.queue_ms, "mean")]
        row.update({label: _round(st.get(q), 3) for (label, _, _), (st, q) in zip(DIT_COLUMNS, stats)})  # type: ignore[arg-type]
    row["req/s"] = _round(s.throughput_req_per_s, 3)
    return row


def body(run_id: str | None, names: list[str], count_all: list[str] | None = None) -> html.Div:
    run = get_store().get(run_id)
    missing = [n for n in names if n not in run.scenarios]
    if missing:
        raise KeyError(f"no scenario {missing[0]!r} on this run")
    doc = run.prediction([run.scenarios[n] for n in names], step_options(count_all))
    rows = [{"scenario": r.name, "mean step ms": ms(r.mean_step_ns), "speedup": round(r.speedup, 4),
             **breakdown_row({c: int(v) for c, v in mean_breakdown_ns(r.critical_path).items()})} for r in doc.rows()]
    return html.Div([
        html.Div(table("cmp-table", rows, page_size=20, names=("scenario",)), className="panel"),
        html.Div([html.Div(dcc.Graph(id="cmp-means", figure=figures.scenarios_figure(doc)), className="panel"),
                  html.Div(dcc.Graph(id="cmp-breakdown", figure=figures.scenario_breakdown_figure(doc)),
                           className="panel")], className="row"),
        html.Div(dcc.Graph(id="cmp-steps", figure=figures.step_compare_figure(doc)), className="panel"),
    ])


def chosen(run_id: str | None, names: list[str] | None) -> list[str]:
    """The scenarios to compare: ``names``, or an error saying that the run has none saved or
    none is ticked (Compare then shows only that line, neither table nor serving panel)."""
    run = get_store().get(run_id)  # no run selected: its own error
    if names:
        return names
    raise ValueError(NONE_TICKED if run.scenarios else NO_SCENARIO)


def pressed(n_clicks: int | None) -> bool:
    """Whether Compare was pressed for the run shown: the run menu resets the button (``options``),
    and a change of run empties the results whatever the order the callbacks run in."""
    return bool(n_clicks) and "run.value" not in dash.ctx.triggered_prop_ids


def register(app: dash.Dash) -> None:
    @app.callback(Output("cmp-scenarios", "options"), Output("cmp-scenarios", "value"),
                  Output("cmp-run", "n_clicks"), Output("cmp-none", "children"), Input("run", "value"))
    def options(run_id: str | None) -> tuple[list[str], list[str], None, str | None]:
        """The run's scenarios, all ticked, or a line saying it has none; Compare not pressed for
        this run yet."""
        store = get_store()
        names = list(store.runs[run_id].scenarios) if run_id in store.runs else []
        return names, names, None, NO_SCENARIO if run_id in store.runs and not names else None

    @app.callback(Output("cmp-serving-note", "children"), Output("cmp-rate", "value"), Input("run", "value"))
    def serving_defaults(run_id: str | None) -> tuple[str, float | None]:
        store = get_store()
        if run_id not in store.runs:
            return "", None
        run = store.runs[run_id]
        workload = default_workload(run)
        if workload is None:
            return NO_LOG, None
        note = (f"Serving log: {run.serving_log}. Press Compare to predict TTFT, TPOT and throughput of the "
                "baseline and the selected scenarios.")
        return note, workload.rate

    @app.callback(Output("cmp-serving-body", "children"), Output("cmp-serving-error", "children"),
                  Input("cmp-run", "n_clicks"), Input("cmp-rate", "value"), Input(COUNT_ALL, "value"),
                  Input("run", "value"), State("cmp-scenarios", "value"), prevent_initial_call=True)
    @guarded(2, clear={0: None})
    def serving(n: int | None, rate: float | None, count_all: list[str] | None, run_id: str | None,
                names: list[str] | None) -> tuple[Any]:
        if not pressed(n) or not names:  # no scenario: Compare's error says so, no baseline alone
            return (None,)
        return (serving_body(run_id, names, rate, count_all),)

    @app.callback(Output("cmp-body", "children"), Output("cmp-error", "children"), Input("cmp-run", "n_clicks"),
                  Input(COUNT_ALL, "value"), Input("run", "value"), State("cmp-scenarios", "value"),
                  prevent_initial_call=True)
    @guarded(2, clear={0: None})
    def compare(n: int | None, count_all: list[str] | None, run_id: str | None, names: list[str] | None
                ) -> tuple[Any]:
        if not pressed(n):
            return (None,)
        return (body(run_id, chosen(run_id, names), count_all),)


PAGE = Page(path="/compare", title="Compare", order=40, layout=layout, register_callbacks=register)
