"""What-if builder: pick transforms from the registry (forms generated from their typed
parameters), compose a scenario, predict; see the speedup per transform (waterfall), the change
log and the new critical path; save and load the TOML scenario files the CLI reads."""
from __future__ import annotations

import copy
from typing import Any

import dash
from dash import ALL, Input, Output, State, dcc, html

from whatif import figures
from whatif.analysis import scenario_cost_model
from whatif.predictors.cost_models import COST_MODELS, CostConfig
from whatif.transforms import registry
from whatif.transforms.scenario import build_transform, scenario_from_dict

from ..forms import params_from_form, spec_from_toml, spec_to_toml, transform_form
from ..layout import COUNT_ALL, card, error_box, guarded, loading, ms, table
from ..state import get_store, step_options
from ..uploads import decode
from . import Page

MAX_SCENARIO_BYTES = 256 * 1024
EMPTY: dict[str, Any] = {"name": "my scenario", "transform": []}
PROMPT = "Add a transform and press Predict."


def layout(**_: Any) -> html.Div:
    names = registry.names()
    return html.Div([
        html.H2("What-if builder"),
        html.Div([
            html.Div([
                html.H4("1. Add transforms"),
                dcc.Dropdown(id="wb-transform", options=[{"label": f"{n}: {registry.get(n).description}", "value": n}
                                                         for n in names],
                             value="scale" if "scale" in names else (names[0] if names else None), clearable=False),
                html.Div(id="wb-form"),
                html.Button("Add to scenario", id="wb-add"),
                html.Button("Remove last", id="wb-pop", className="secondary"),
                html.Button("Clear", id="wb-clear", className="secondary"),
                error_box("wb-spec-error"),
                html.H4("2. Scenario"),
                html.Label("name "), dcc.Input(id="wb-name", type="text", value=EMPTY["name"]),
                html.Label("cost model "),
                dcc.Dropdown(id="wb-cost-model", options=COST_MODELS.names(), value=_default_cost_model(),
                             clearable=False),
                html.Pre(id="wb-toml"),
                html.Button("Predict", id="wb-predict"),
                html.Button("Save scenario (TOML)", id="wb-save", className="secondary"),
                dcc.Upload(id="wb-upload", max_size=MAX_SCENARIO_BYTES, children=html.Button(
                    "Load scenario (TOML)", className="secondary"), style={"display": "inline-block"}),
                dcc.Download(id="wb-download"),
                html.Div(id="wb-saved", className="note"),
                error_box("wb-save-error"),
            ], className="panel", style={"flex": "0 1 460px"}),
            html.Div([
                html.H4("3. Prediction"),
                error_box("wb-error"),
                loading(html.Div(id="wb-result", children=prompt())),
                loading(html.Div(id="wb-critical")),
                error_box("wb-critical-error"),
            ], className="panel"),
        ], className="row"),
        dcc.Store(id="wb-spec", data=copy.deepcopy(EMPTY)),
        dcc.Store(id="wb-last"),
    ])


def prompt() -> html.P:
    """What the prediction panel shows until Predict is pressed for the scenario as it is now."""
    return html.P(PROMPT, className="note")


def _default_cost_model() -> str:
    return str(CostConfig().cost_model.value)


def _with_header(spec: dict[str, Any], name: str | None, cost_model: str | None) -> dict[str, Any]:
    """``spec`` named ``name`` and priced by ``cost_model`` (the scenario file's ``cost_model`` key)."""
    return {**spec, "name": name or "scenario", "cost_model": cost_model or _default_cost_model()}


def _form_values() -> dict[str, Any]:
    """Values of the generated controls, keyed by their ``name``."""
    return {s["id"]["name"]: s.get("value") for s in (dash.ctx.states_list[0] if dash.ctx.states_list else [])}


def _checked(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` after validating every transform (raises the scenario parser's message)."""
    for i, t in enumerate(spec.get("transform", [])):
        build_transform(t["name"], {k: v for k, v in t.items() if k != "name"}, f"transform #{i + 1}")
    return spec


def register(app: dash.Dash) -> None:
    @app.callback(Output("wb-form", "children"), Input("wb-transform", "value"))
    def form(name: str | None) -> list[Any]:
        return transform_form(name) if name else []

    @app.callback(Output("wb-spec", "data"), Output("wb-name", "value"), Output("wb-cost-model", "value"),
                  Output("wb-saved", "children", allow_duplicate=True),
                  Output("wb-save-error", "children", allow_duplicate=True),
                  Output("wb-spec-error", "children"), Input("wb-add", "n_clicks"), Input("wb-pop", "n_clicks"),
                  Input("wb-clear", "n_clicks"), Input("wb-upload", "contents"),
                  State({"type": "wb-param", "name": ALL}, "value"), State("wb-transform", "value"),
                  State("wb-spec", "data"), State("wb-name", "value"), State("wb-cost-model", "value"),
                  State("wb-upload", "filename"), State("run", "value"), prevent_initial_call=True)
    @guarded(6)
    def edit(_a: int | None, _p: int | None, _c: int | None, upload: str | None, _values: list[Any],
             name: str | None, spec: dict[str, Any] | None, scenario_name: str | None, cost_model: str | None,
             filename: str | None, run_id: str | None) -> tuple[Any, ...]:
        spec = copy.deepcopy(spec or EMPTY)
        trigger = dash.ctx.triggered_id
        if trigger == "wb-add":
            if not name:
                raise ValueError("pick a transform first")
            params = params_from_form(name, _form_values())
            build_transform(name, params)  # validate now: the message names the bad parameter
            spec["transform"].append({"name": name, **params})
        elif trigger == "wb-pop":
            spec["transform"] = spec["transform"][:-1]
        elif trigger == "wb-clear":
            spec["transform"] = []
        elif trigger == "wb-upload":
            if not upload:
                raise dash.exceptions.PreventUpdate
            stem = (filename or "scenario").rsplit(".", 1)[0]
            loaded = spec_from_toml(decode(upload, MAX_SCENARIO_BYTES).decode("utf-8"), default_name=stem)
            scenario_cost_model(scenario_from_dict(loaded, source=filename or "upload", default_name=stem))  # validate
            if run_id in get_store().runs:  # a loaded scenario can be compared right away
                get_store().runs[run_id].scenarios[str(loaded["name"])] = loaded
            return loaded, str(loaded["name"]), loaded.get("cost_model") or _default_cost_model(), None, None
        return spec, scenario_name, cost_model, None, None  # the note of a save is about the scenario before

    @app.callback(Output("wb-toml", "children"), Input("wb-spec", "data"), Input("wb-name", "value"),
                  Input("wb-cost-model", "value"))
    def show(spec: dict[str, Any] | None, name: str | None, cost_model: str | None) -> str:
        spec = _with_header(spec or EMPTY, name, cost_model)
        return spec_to_toml(spec) if spec["transform"] else "(no transforms yet)"

    @app.callback(Output("wb-result", "children"), Output("wb-last", "data"), Output("wb-error", "children"),
                  Input("wb-predict", "n_clicks"), Input(COUNT_ALL, "value"), Input("run", "value"),
                  Input("wb-spec", "data"), Input("wb-cost-model", "value"), State("wb-name", "value"),
                  State("wb-last", "data"), prevent_initial_call=True)
    @guarded(3, clear={0: None, 1: None})
    def run_prediction(_n: int | None, count_all: list[str] | None, run_id: str | None, spec: dict[str, Any],
                       cost_model: str | None, name: str | None, last: dict[str, Any] | None) -> tuple[Any, ...]:
        """The prediction on Predict, again when the steps counted change; back to the prompt when
        the run or the scenario changes (a prediction shown is always the one of what is on screen)."""
        trigger = dash.ctx.triggered_id
        if trigger != "wb-predict" and not (trigger == COUNT_ALL and last):
            return prompt(), None
        run = get_store().get(run_id)
        spec = _with_header(spec, name, cost_model)
        if not spec["transform"]:
            raise ValueError("the scenario has no transforms: add one first")
        doc = run.quick_document(_checked(spec), step_options(count_all))
        changes = [{"transform": c.transform, "action": c.action, "tasks": c.tasks,
                    "before ms": ms(c.before_ns), "after ms": ms(c.after_ns), "reason": c.reason}
                   for c in doc.changes]
        result = html.Div([
            html.Div([card("baseline mean step (ms)", f"{doc.baseline_mean_step_ns / 1e6:,.3f}"),
                      card("predicted mean step (ms)", f"{doc.mean_step_ns / 1e6:,.3f}", id="wb-mean"),
                      card("speedup", f"{doc.speedup:.3f}x", id="wb-speedup")], className="cards"),
            html.P(doc.cap.reason if doc.cap is not None else "", id="wb-cap"),
            dcc.Graph(id="wb-waterfall", figure=figures.waterfall_figure(doc.baseline_mean_step_ns, doc)),
            html.H4("Changed tasks (change log)"),
            table("wb-changes", changes, page_size=8, names=("reason",), name_width=120),
        ])
        return result, spec

    @app.callback(Output("wb-critical", "children"), Output("wb-critical-error", "children"),
                  Input("wb-last", "data"), State("run", "value"), State(COUNT_ALL, "value"),
                  prevent_initial_call=True)
    @guarded(2)
    def critical(spec: dict[str, Any] | None, run_id: str | None, count_all: list[str] | None) -> tuple[Any]:
        """The new critical path (per-step breakdowns take longer, so they follow the headline);
        nothing when no prediction is shown."""
        if not spec:
            return (None,)
        doc = get_store().get(run_id).prediction([spec], step_options(count_all))
        sc = doc.scenarios[0]
        return (html.Div([
            html.H4("New critical path"),
            html.Div([dcc.Graph(id="wb-cp-compare", figure=figures.scenario_breakdown_figure(doc)),
                      dcc.Graph(id="wb-cp-steps", figure=figures.breakdown_figure(
                          sc.critical_path, title=f"{sc.name}: critical path per step"))], className="row"),
        ]),)

    @app.callback(Output("wb-download", "data"), Output("wb-saved", "children"), Output("wb-save-error", "children"),
                  Input("wb-save", "n_clicks"), State("run", "value"), State("wb-spec", "data"),
                  State("wb-name", "value"), State("wb-cost-model", "value"), prevent_initial_call=True)
    @guarded(3)
    def save(_n: int | None, run_id: str | None, spec: dict[str, Any], name: str | None,
             cost_model: str | None) -> tuple[Any, ...]:
        spec = _checked(_with_header(spec, name, cost_model))
        if not spec["transform"]:
            raise ValueError("the scenario has no transforms: add one first")
        text = spec_to_toml(spec)
        where = ""
        if run_id in get_store().runs:
            get_store().runs[run_id].scenarios[spec["name"]] = spec
            where = "; kept for Compare and Timeline"
        filename = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in spec["name"]) + ".toml"
        return dict(content=text, filename=filename), f"saved {filename}{where}"


PAGE = Page(path="/whatif", title="What-if", order=30, layout=layout, register_callbacks=register)
