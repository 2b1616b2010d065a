"""Scenarios: a named, ordered list of transforms with parameters, from a TOML file or Python.

```toml
name = "fused and bf16"          # optional; defaults to the file name
cost_model = "datasheet"         # optional; which cost model prices it (default: --cost-model, else trace)
device_spec = "my_gpu.toml"      # optional; GPUs described by spec files (docs/device-specs.md), a
                                 # path or a list, relative to this file: gpu(device = "MY_GPU") finds them
collectives_measured = "all_reduce_perf.txt"   # optional; nccl-tests outputs of the cluster (a path or
                                 # a list, relative to this file): collectives are calibrated on them

[[transform]]
name = "fuse"

[[transform]]
name = "scale"
factor = 0.5
select = { kind = "kernel", name = "gemm" }
```

Every problem is reported as ``FILE:LINE: problem`` (unknown transform, unknown or mistyped
parameter, a value outside a ``Literal`` or ``Enum`` parameter's choices, bad selection). An
``Enum`` parameter takes a member's name or value (``"FAST"`` or ``"fast"``).
"""
from __future__ import annotations

import enum
import math
import re
import sys
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whatif.core import limits
from whatif.core.errors import TraceError, WhatifError
from whatif.depgraph.graph import GraphError, TaskGraph
from whatif.hardware.device_spec import DeviceSpecError, load_device_spec
from whatif.hardware.devices import Device, registered
from whatif.tracer.measured_collectives import read_nccl_tests

from . import registry
from .base import Transform, TransformContext, TransformError
from .placement import Placement
from .select import SelectionError, Selector

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class ScenarioError(WhatifError):
    """A scenario file that cannot be used; the message names the file and line."""


@dataclass
class Scenario:
    """``cost_model``: the name of the cost model that prices it (checked against the registry of
    ``whatif.predictors.cost_models`` by the front door, which builds the context), or None;
    ``devices``: the GPUs of its ``device_spec`` files, known by name while it applies;
    ``collective_points``: the measured collectives of its ``collectives_measured`` files
    (``(kind, bytes, ranks, dur_ns, ranks_per_machine)``), which the front door gives the cost
    model that prices it (:meth:`~whatif.transforms.base.CostModel.measure_collectives`)."""

    name: str
    transforms: list[Transform] = field(default_factory=list)
    source: str | None = None
    cost_model: str | None = None
    devices: tuple[Device, ...] = ()
    collective_points: tuple[tuple, ...] = ()

    def apply(self, graph: TaskGraph, ctx: TransformContext | None = None) -> list[TaskGraph]:
        """The graph after each transform in turn (the input graph is left unchanged)."""
        ctx = ctx or TransformContext()
        out, g = [], graph
        with registered(*self.devices):
            for t in self.transforms:
                try:
                    g = t.apply(g, ctx)
                except (TransformError, SelectionError, GraphError) as exc:
                    raise ScenarioStepError(self.name, t.label(), str(exc)) from None
                out.append(g)
        return out


class ScenarioStepError(TransformError):
    """A scenario's transform refused the graph: ``reason`` is the transform's own message."""

    def __init__(self, scenario: str, transform: str, reason: str) -> None:
        super().__init__(f"scenario {scenario!r}, {transform}: {reason}")
        self.reason = reason


def scenario_placement(transforms: Sequence[Transform], graphs_before: Sequence[TaskGraph],
                       ctx: TransformContext) -> Placement:
    """Where one replica's bytes live after ``transforms`` in turn (:mod:`whatif.transforms.placement`),
    each seeing the graph it was applied to (``graphs_before[i]``)."""
    p = Placement()
    for t, g in zip(transforms, graphs_before):
        p = t.placement(p, g, ctx)
    return p


def _choice(value: Any, hint: Any, where: str) -> Any:
    """``value`` as a member of a ``Literal`` (one of its values, of the same type) or of an Enum
    (a member, its name or its value)."""
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        if isinstance(value, hint):
            return value
        if isinstance(value, str) and value in hint.__members__:
            return hint[value]
        found = next((m for m in hint if type(m.value) is type(value) and m.value == value), None)
        if found is not None:
            return found
        allowed = [m.value for m in hint]
    else:
        allowed = list(typing.get_args(hint))
        if any(type(a) is type(value) and a == value for a in allowed):
            return value
    raise ScenarioError(f"{where}: must be one of {', '.join(map(str, allowed))} (got {value!r})")


def _coerce(value: Any, hint: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin is typing.Literal or (isinstance(hint, type) and issubclass(hint, enum.Enum)):
        return _choice(value, hint, where)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        errors = []
        for a in args:
            try:
                return _coerce(value, a, where)
            except ScenarioError as exc:
                errors.append(str(exc))
        raise ScenarioError(errors[0])
    if hint is Selector:
        if not isinstance(value, dict):
            raise ScenarioError(f"{where}: expected a table like {{ kind = \"kernel\" }}, got {value!r}")
        try:
            return Selector.from_mapping(value)
        except SelectionError as exc:
            raise ScenarioError(f"{where}: {exc}") from None
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ScenarioError(f"{where}: must be a finite number (got {value!r})")
        return float(value)
    if hint is int and type(value) is int and abs(value) > limits.MAX_INT_PARAMETER:
        raise ScenarioError(f"{where}: must be an integer within ±2**53 (got {value!r})")
    if hint in (int, str, bool) and type(value) is hint:
        return value
    if origin is list and isinstance(value, list):
        (inner,) = typing.get_args(hint) or (Any,)
        return [_coerce(v, inner, where) for v in value]
    if origin is dict and isinstance(value, dict):
        return value
    if hint is Any:
        return value
    name = getattr(hint, "__name__", str(hint))
    raise ScenarioError(f"{where}: expected {name}, got {type(value).__name__} {value!r}")


def _parameter(raw: Any, spec: registry.Parameter, where: str) -> Any:
    """``raw`` coerced to the parameter's type, refused outside its declared bounds (``minimum``,
    ``exclusive_minimum``, ``maximum`` in the field's metadata)."""
    value = _coerce(raw, spec.type, where)
    why = spec.bound_error(value)
    if why:
        raise ScenarioError(f"{where}: {why}")
    return value


def build_transform(name: str, params: dict[str, Any], where: str = "") -> Transform:
    """A transform from its registry name and parameters (as read from TOML), validated."""
    prefix = f"{where}: " if where else ""
    try:
        cls = registry.get(name)
    except TransformError as exc:
        raise ScenarioError(f"{prefix}{exc}") from None
    specs = {p.name: p for p in registry.parameters(name)}
    unknown = sorted(set(params) - set(specs))
    if unknown:
        raise ScenarioError(f"{prefix}{name}: unknown parameter {unknown[0]!r} (parameters: "
                            f"{', '.join(specs) or 'none'})")
    missing = [p for p, s in specs.items() if s.required and p not in params]
    if missing:
        raise ScenarioError(f"{prefix}{name}: missing parameter {missing[0]!r}")
    kwargs = {k: _parameter(v, specs[k], f"{where or name}: {name}.{k}".lstrip(": ")) for k, v in params.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError, TransformError) as exc:
        raise ScenarioError(f"{prefix}{name}: {str(exc).removeprefix(f'{name}: ')}") from None


def _transform_lines(text: str) -> list[int]:
    """Line numbers (1-based) of each ``[[transform]]`` header."""
    return [i + 1 for i, line in enumerate(text.splitlines()) if re.match(r"\s*\[\[\s*transform\s*\]\]", line)]


BASELINE_NAME = "baseline"   # the row of the recorded trace in every result


def check_distinct_names(scenarios: Sequence[Scenario]) -> None:
    """Refuse two scenarios of one name, or one named ``baseline`` (the recorded trace's row): every
    result (tables, JSON documents, reports, diffs) is keyed by the name.

    Raises
    ------
    ScenarioError
        Naming the second scenario's file (or ``<scenario>``) and the first's.
    """
    seen = {BASELINE_NAME: "the recorded trace (the baseline row)"}
    for s in scenarios:
        where = s.source or "<scenario>"
        if s.name in seen and seen[s.name] == where != "<scenario>":
            raise ScenarioError(f"{where}: this scenario is given twice")
        if s.name in seen:
            raise ScenarioError(f"{where}: scenario name {s.name!r} is also that of {seen[s.name]}: give each "
                                f"scenario its own (name = \"...\" in the file)")
        seen[s.name] = where


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file. Raises :class:`ScenarioError` (``FILE:LINE: problem``)."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ScenarioError(f"{path}: no such scenario file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{path}: cannot be read ({exc})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: not valid TOML ({exc})") from None
    return scenario_from_dict(data, source=str(path), default_name=path.stem, lines=_transform_lines(text))


def scenario_from_dict(data: dict[str, Any], *, source: str = "<scenario>", default_name: str = "scenario",
                       lines: list[int] | None = None) -> Scenario:
    unknown = sorted(set(data) - {"name", "description", "cost_model", "device_spec", "collectives_measured",
                                  "transform"})
    if unknown:
        raise ScenarioError(f"{source}: unknown top-level key {unknown[0]!r} (expected name, description, "
                            f"cost_model, device_spec, collectives_measured, [[transform]] tables)")
    devices = _device_specs(data.get("device_spec", []), source)
    points = _collective_points(data.get("collectives_measured", []), source)
    cost_model = data.get("cost_model")
    if cost_model is not None and not isinstance(cost_model, str):
        raise ScenarioError(f"{source}: cost_model must be a name like \"trace\", got {cost_model!r}")
    items = data.get("transform", [])
    if not isinstance(items, list) or not items:
        raise ScenarioError(f"{source}: no [[transform]] tables")
    transforms = []
    for i, item in enumerate(items):
        line = lines[i] if lines and i < len(lines) else None
        where = f"{source}:{line}" if line else f"{source}: transform #{i + 1}"
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ScenarioError(f"{where}: a [[transform]] needs name = \"<transform>\"")
        params = {k: v for k, v in item.items() if k != "name"}
        transforms.append(build_transform(item["name"], params, where))
    name = data.get("name", default_name)
    return Scenario(name=str(name), transforms=transforms, source=source, cost_model=cost_model, devices=devices,
                    collective_points=points)


def _relative_paths(key: str, value: Any, source: str) -> list[Path]:
    """A scenario's path-or-list-of-paths key, relative to the scenario file."""
    paths = [value] if isinstance(value, str) else value
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise ScenarioError(f"{source}: {key} must be a path or a list of paths, not {value!r}")
    base = Path(source).parent if source != "<scenario>" else Path()
    return [base / p for p in paths]


def _collective_points(value: Any, source: str) -> tuple[tuple, ...]:
    """The measured collectives of a scenario's ``collectives_measured`` nccl-tests files."""
    try:
        return tuple(pt for path in _relative_paths("collectives_measured", value, source)
                     for pt in read_nccl_tests(path).points())
    except TraceError as exc:
        raise ScenarioError(f"{source}: collectives_measured: {exc}") from None


def _device_specs(value: Any, source: str) -> tuple[Device, ...]:
    """The devices of a scenario's ``device_spec`` (a path or a list of paths, relative to the
    scenario file); ScenarioError naming the scenario and the spec's problem."""
    try:
        return tuple(load_device_spec(p) for p in _relative_paths("device_spec", value, source))
    except DeviceSpecError as exc:
        raise ScenarioError(f"{source}: device_spec: {exc}") from None
