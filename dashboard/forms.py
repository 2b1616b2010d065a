"""Forms generated from a transform's typed parameters (``registry.parameters``), the values
read back into scenario parameters, and scenario specs written as the TOML files the CLI reads.

>>> spec = {"name": "half cpu", "transform": [{"name": "scale", "factor": 0.5, "select": {"kind": "cpu"}}]}
>>> print(spec_to_toml(spec))
name = "half cpu"
<BLANKLINE>
[[transform]]
name = "scale"
factor = 0.5
select = { kind = "cpu" }
<BLANKLINE>
"""
from __future__ import annotations

import enum
import json
import math
import re
import sys
import types
import typing
from typing import Any

from dash import dcc, html
from dash.development.base_component import Component

from whatif.core.kernels import KernelClass
from whatif.transforms import registry
from whatif.transforms.select import KIND_ALIASES, Selector

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

SELECTOR_FIELDS = ("kind", "name", "layer", "op", "phase", "step", "rank", "resource", "kernel_class")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _base(hint: Any) -> tuple[Any, bool]:
    """(the non-None type of an Optional/Union hint, whether None is allowed)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return (args[0] if len(args) == 1 else hint), len(args) < len(typing.get_args(hint))
    return hint, False


def _text(value: Any) -> str:
    if value is None or value == {} or value == []:
        return ""
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return str(value)


def _selector_fields(pname: str, default: Any) -> html.Fieldset:
    cur = default.as_dict() if isinstance(default, Selector) else {}
    items = []
    for f in SELECTOR_FIELDS:
        id_ = {"type": "wb-param", "name": f"{pname}.{f}"}
        ctrl: Component
        if f == "kind":
            ctrl = dcc.Dropdown(id=id_, options=sorted(KIND_ALIASES), value=cur.get(f), placeholder="any kind",
                                style={"minWidth": 160})
        elif f == "kernel_class":
            ctrl = dcc.Dropdown(id=id_, options=sorted(c.value for c in KernelClass), value=cur.get(f),
                                placeholder="any class", style={"minWidth": 160})
        else:
            hint = "regex" if f in ("name", "layer", "op", "resource") else "e.g. 1, 2"
            ctrl = dcc.Input(id=id_, type="text", value=_text(cur.get(f)), placeholder=hint, debounce=True)
        items.append(html.Div([html.Label(f), ctrl], style={"display": "inline-block", "margin": "2px 8px 2px 0",
                                                            "verticalAlign": "top"}))
    return html.Fieldset([html.Legend(f"{pname}: which tasks (all fields must hold)"), *items])


def transform_form(name: str) -> list[Any]:
    """Controls for every parameter of transform ``name``; ids ``{"type": "wb-param", "name": …}``
    (``param.field`` for the fields of a selection)."""
    cls = registry.get(name)
    out: list[Any] = [html.P(cls.description, className="note")]
    for p in registry.parameters(name):
        hint, _ = _base(p.type)
        help_text = f"{p.name} ({p.type_name}{', required' if p.required else ''}): {p.help}"
        id_ = {"type": "wb-param", "name": p.name}
        if hint is Selector:
            out.append(_selector_fields(p.name, p.default))
            continue
        ctrl: Component
        if hint is bool:
            ctrl = dcc.Dropdown(id=id_, options=[{"label": "true", "value": "true"},
                                                 {"label": "false", "value": "false"}],
                                value=None if p.default is None else str(bool(p.default)).lower(), clearable=True)
        elif p.choices is not None:  # Literal or Enum: its values (an Enum's member values)
            ctrl = dcc.Dropdown(id=id_, options=[{"label": str(c), "value": c} for c in p.choices],
                                value=p.default_value)
        elif hint in (int, float):  # no min/max/step: a browser sends a value outside them as empty (the default)
            ctrl = dcc.Input(id=id_, type="number", value=p.default, step="any", debounce=True)
        else:
            ctrl = dcc.Input(id=id_, type="text", value=_text(p.default), debounce=True,
                             placeholder="TOML value" if hint is not str else "")
        out.append(html.Div([html.Label(help_text), html.Br(), ctrl], style={"margin": "4px 0"}))
    return out


def _parse_text(raw: str, hint: Any) -> Any:
    """A text field's value: strings as typed, anything else as a TOML value (data only)."""
    if hint is str:
        return raw
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        if typing.get_origin(hint) is list or hint is Any:
            return [tomllib.loads(f"v = {x.strip()}")["v"] if re.fullmatch(r"-?\d+(\.\d+)?", x.strip()) else x.strip()
                    for x in raw.split(",") if x.strip()]
        return raw


def _selector_value(raw: Any, field: str) -> Any:
    if raw in (None, "", []):
        return None
    if field in ("step", "rank"):
        nums = [int(x) for x in str(raw).replace(" ", "").split(",") if x]
        return nums[0] if len(nums) == 1 else nums
    if field == "phase" and "," in str(raw):
        return [x.strip() for x in str(raw).split(",") if x.strip()]
    return raw


def params_from_form(name: str, values: dict[str, Any]) -> dict[str, Any]:
    """Scenario parameters of transform ``name`` from form values keyed by control name; empty
    fields are left out (the transform's default applies). Values are passed as typed, for
    :func:`~whatif.transforms.scenario.build_transform` to refuse with its message.

    >>> params_from_form("scale", {"factor": -1})
    {'factor': -1.0}
    >>> params_from_form("tensor_parallel", {"degree": 2.5})
    {'degree': 2.5}
    """
    out: dict[str, Any] = {}
    for p in registry.parameters(name):
        hint, _ = _base(p.type)
        if hint is Selector:
            sel = {f: v for f in SELECTOR_FIELDS
                   if (v := _selector_value(values.get(f"{p.name}.{f}"), f)) is not None}
            if sel:
                out[p.name] = sel
            continue
        raw = values.get(p.name)
        if raw is None or raw == "":
            continue
        if hint is bool:
            out[p.name] = raw in (True, "true")
        elif p.choices is not None:  # a dropdown's value is the choice itself (build_transform checks it)
            out[p.name] = raw
        elif hint is float:
            out[p.name] = float(raw)
        elif hint is int:
            out[p.name] = int(raw) if float(raw).is_integer() else float(raw)
        elif isinstance(raw, str):
            out[p.name] = _parse_text(raw, hint)
        else:
            out[p.name] = raw
    return out


def _toml_value(v: Any) -> str:
    if isinstance(v, enum.Enum):
        return _toml_value(v.value)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "nan" if math.isnan(v) else ("inf" if v == math.inf else "-inf" if v == -math.inf else repr(v))
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + " }" if v else "{}"
    if isinstance(v, Selector):
        return _toml_value(v.as_dict())
    raise TypeError(f"cannot write {type(v).__name__} {v!r} to TOML")


def _toml_key(k: str) -> str:
    return k if _BARE_KEY.match(k) else json.dumps(k)


def spec_to_toml(spec: dict[str, Any]) -> str:
    """A scenario spec (``name``, ``description``, ``cost_model``, ``transform`` list) as a scenario TOML file."""
    lines = [f"{k} = {_toml_value(spec[k])}" for k in ("name", "description", "cost_model") if spec.get(k)]
    for t in spec.get("transform", []):
        lines += ["", "[[transform]]", f"name = {_toml_value(t['name'])}"]
        lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in t.items() if k != "name"]
    return "\n".join(lines) + "\n"


def spec_from_toml(text: str, default_name: str = "scenario") -> dict[str, Any]:
    """Parse scenario TOML text into a spec (validated later, by ``scenario_from_dict``)."""
    data = tomllib.loads(text)
    data.setdefault("name", default_name)
    return data
