"""The JSON Schema of the ``whatif.report`` v1 document, and a small validator for the subset of
JSON Schema it uses (``type``, ``const``, ``enum``, ``properties``, ``required``,
``additionalProperties``, ``items``, ``minimum``), so validation needs no extra dependency.
The same dict validates with the ``jsonschema`` package (draft 2020-12).

>>> errors(REPORT_SCHEMA["properties"]["status"], "maybe")
["$: 'maybe' is not one of passed, failed"]
"""
from __future__ import annotations

from typing import Any

import msgspec

from whatif.documents import ReportDocument

_INT = {"type": "integer"}
_NUM = {"type": "number"}
_STR = {"type": "string"}
_OPT_STR = {"type": ["string", "null"]}
_BREAKDOWN = {"type": "object", "additionalProperties": {"type": "integer"}}
_STAT = {"type": ["object", "null"], "additionalProperties": {"type": ["number", "null"]}}


def _obj(props: dict[str, Any], required: list[str] | None = None, extra: bool = True) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": extra}


def _list(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": item}


_PATH = _list(_obj({"rank": _INT, "step": _INT, "breakdown_ns": _BREAKDOWN}))
_TOP = _list(_obj({"name": _STR, "count": _INT, "gpu_ns": _INT, "cpu_ns": _INT}))

PREDICTION_SCHEMA: dict[str, Any] = _obj({
    "schema": {"const": "whatif.prediction"},
    "version": {"const": 1},
    "source": _STR,
    "device": _OPT_STR,
    "baseline": _obj({
        "mean_step_ns": _INT,
        "steps": _list(_obj({"rank": _INT, "step": _INT, "measured_ns": _INT, "predicted_ns": _INT})),
        "critical_path": _PATH,
    }),
    "scenarios": _list(_obj({
        "name": _STR, "source": _OPT_STR, "transforms": _list(_STR), "mean_step_ns": _INT, "speedup": _NUM,
        "steps": _list(_obj({"rank": _INT, "step": _INT, "baseline_ns": _INT, "predicted_ns": _INT,
                             "speedup": _NUM})),
        "waterfall": _list(_obj({"transform": _STR, "mean_step_ns": _INT, "speedup": _NUM})),
        "changes": _list(_obj({"transform": _STR, "action": _STR, "tasks": _INT, "before_ns": _INT,
                               "after_ns": _INT, "reason": _STR})),
        "critical_path": _PATH,
    })),
})

_SUGGEST = _obj({
    "schema": {"const": "whatif.suggest"},
    "version": {"const": 1},
    "source": _STR,
    "device": _OPT_STR,
    "baseline_mean_step_ns": _INT,
    "suggestions": _list(_obj({"rank": _INT, "transform": _STR, "setting": _STR, "params": {"type": "object"},
                               "headline": {"type": "object"}, "saved_ns_per_step": _INT, "where": _list(_STR),
                               "others": {"type": "object", "additionalProperties": _NUM}})),
    "skipped": _list(_obj({"transform": _STR, "reason": _STR})),
})

_OPS = _obj({
    "schema": {"const": "whatif.ops"},
    "version": {"const": 1},
    "source": _STR,
    "by": _STR,
    "devices": _list(_STR),
    "short_ns": _INT,
    "gpu_total_ns": _INT,
    "rows": _list(_obj({"op": _STR, "kernel": _STR, "shapes": _STR, "dtype": _STR, "kernel_class": _STR,
                        "count": _INT, "kernels": _INT, "total_ns": _INT, "mean_ns": _NUM,
                        "flops": {"type": ["number", "null"]}, "bytes": {"type": ["number", "null"]},
                        "intensity": {"type": ["number", "null"]}, "achieved_tflops": {"type": ["number", "null"]},
                        "achieved_tbps": {"type": ["number", "null"]},
                        "roofline_tflops": {"type": ["number", "null"]},
                        "roofline_pct": {"type": ["number", "null"]}, "bound": _STR})),
})

_REPORT_PROPERTIES: dict[str, Any] = {
    "schema": {"const": "whatif.report"},
    "version": {"const": 1},
    "whatif_version": _STR,
    "source": _STR,
    "device": _OPT_STR,
    "status": {"enum": ["passed", "failed"]},
    "rows": _list(_obj({
        "name": _STR,
        "kind": {"enum": ["baseline", "scenario"]},
        "mean_step_ns": _INT,
        "measured_step_ns": {"type": ["integer", "null"]},
        "speedup": _NUM,
        "ttft_ms": _STAT,
        "tpot_ms": _STAT,
        "contributors": _list(_obj({"transform": _STR, "delta_ns": _INT})),
        "critical_path_shift": _list(_obj({"category": _STR, "delta_ns": _INT})),
        "baseline_report_step_ns": {"type": ["integer", "null"]},
    })),
    "checks": _list(_obj({
        "kind": {"enum": ["threshold", "regression"]},
        "name": _STR,
        "status": {"enum": ["passed", "failed", "skipped"]},
        "values": {"type": "object", "additionalProperties": _NUM},
        "message": _STR,
    })),
    "baseline_report": {"type": ["object", "null"], "properties": {
        "path": _OPT_STR, "source": _OPT_STR, "max_regression": {"type": ["number", "null"]}}},
    "fidelity": {"type": ["object", "null"], "properties": {
        "median_abs_error": {"type": ["number", "null"]}, "max_abs_error": {"type": ["number", "null"]}}},
    "top_kernels": _TOP,
    "top_ops": _TOP,
    "top_layers": _TOP,
    "prediction": PREDICTION_SCHEMA,
    "suggestions": _SUGGEST,
    "ops": _OPS,
}
OPTIONAL_SECTIONS = ("suggestions", "ops")  # ``whatif report --suggest`` / ``--ops``
REPORT_SCHEMA: dict[str, Any] = _obj(_REPORT_PROPERTIES,
                                     required=[k for k in _REPORT_PROPERTIES if k not in OPTIONAL_SECTIONS])

_TYPES: dict[str, Any] = {"object": dict, "array": list, "string": str, "null": type(None), "boolean": bool}


def _is(value: Any, type_name: str) -> bool:
    if type_name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if type_name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES[type_name])


def errors(schema: dict[str, Any], value: Any, where: str = "$") -> list[str]:
    """Every place ``value`` breaks ``schema``, as ``$.path: problem`` lines (empty when valid)."""
    out: list[str] = []
    if "const" in schema and value != schema["const"]:
        return [f"{where}: expected {schema['const']!r}, got {value!r}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{where}: {value!r} is not one of {', '.join(map(str, schema['enum']))}"]
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else types
        if not any(_is(value, t) for t in names):
            return [f"{where}: expected {' or '.join(names)}, got {type(value).__name__}"]
    if "minimum" in schema and isinstance(value, (int, float)) and value < schema["minimum"]:
        out.append(f"{where}: {value} < minimum {schema['minimum']}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        out += [f"{where}: missing key {k!r}" for k in schema.get("required", []) if k not in value]
        extra = schema.get("additionalProperties", True)
        for k, v in value.items():
            if k in props:
                out += errors(props[k], v, f"{where}.{k}")
            elif extra is False:
                out.append(f"{where}: unexpected key {k!r}")
            elif isinstance(extra, dict):
                out += errors(extra, v, f"{where}.{k}")
    if isinstance(value, list) and "items" in schema:
        for i, v in enumerate(value):
            out += errors(schema["items"], v, f"{where}[{i}]")
    return out


def validate(doc: ReportDocument | dict[str, Any]) -> None:
    """Raise ``ValueError`` listing the first problems when ``doc`` (a report, or its parsed JSON)
    is not a valid ``whatif.report`` v1."""
    problems = errors(REPORT_SCHEMA, msgspec.to_builtins(doc) if isinstance(doc, ReportDocument) else doc)
    if problems:
        raise ValueError(f"not a valid whatif.report v1 document: {'; '.join(problems[:5])}")
