"""Transforms by name: the built-ins, and third-party ones from the entry-point group
``whatif.transforms`` (``[project.entry-points."whatif.transforms"] mine = "pkg.mod:MyTransform"``).

>>> "scale" in names()
True
>>> [p.name for p in parameters("scale")]
['select', 'factor']
"""
from __future__ import annotations

import dataclasses
import importlib
import typing
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from .base import Transform, TransformError

ENTRY_POINT_GROUP = "whatif.transforms"
BUILTIN_MODULES = ("whatif.transforms.generic", "whatif.transforms.optimizations", "whatif.transforms.parallel")
_REGISTRY: dict[str, type[Transform]] = {}
_loaded = False


def register(cls: type[Transform]) -> type[Transform]:
    """Class decorator: make ``cls`` available under ``cls.name``."""
    if not cls.name:
        raise TypeError(f"{cls.__name__} has no name")
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} must be a dataclass (its fields are its parameters)")
    _REGISTRY[cls.name] = cls
    return cls


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in BUILTIN_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        cls = ep.load()
        if not (isinstance(cls, type) and issubclass(cls, Transform)):
            raise TransformError(f"entry point {ep.name} = {ep.value} is not a whatif Transform class")
        register(cls)


def names() -> list[str]:
    _load()
    return sorted(_REGISTRY)


def get(name: str) -> type[Transform]:
    _load()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise TransformError(f"unknown transform {name!r} (known: {', '.join(names())})") from None


@dataclass(frozen=True)
class Parameter:
    """One parameter of a transform, for CLIs, scenario validation and generated UI forms."""

    name: str
    type: Any
    default: Any
    required: bool
    help: str

    @property
    def type_name(self) -> str:
        return getattr(self.type, "__name__", None) or str(self.type).replace("typing.", "")


def parameters(name: str) -> list[Parameter]:
    cls = get(name)
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default, required = f.default, False
        elif f.default_factory is not dataclasses.MISSING:
            default, required = f.default_factory(), False
        else:
            default, required = None, True
        out.append(Parameter(name=f.name, type=hints.get(f.name, Any), default=default, required=required,
                             help=str(f.metadata.get("help", ""))))
    return out
