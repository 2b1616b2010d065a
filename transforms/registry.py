"""Transforms by name: the built-ins, and third-party ones from the entry-point group
``whatif.transforms`` (``[project.entry-points."whatif.transforms"] mine = "pkg.mod:MyTransform"``).

>>> "scale" in names()
True
>>> [p.name for p in parameters("scale")]
['select', 'factor']
"""
from __future__ import annotations

import dataclasses
import enum
import types
import typing
from dataclasses import dataclass
from typing import Any

from whatif.core.bounds import BOUND_KEYS, Bounds
from whatif.core.plugins import load_plugins

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


def _accept(cls: object) -> None:
    if not (isinstance(cls, type) and issubclass(cls, Transform)):
        raise TypeError("not a whatif Transform class")
    register(cls)


def _load() -> None:
    global _loaded
    if _loaded:
        return
    load_plugins(BUILTIN_MODULES, ENTRY_POINT_GROUP, _accept, what="transform", error=TransformError,
                 missing_builtins_ok=True)
    _loaded = True


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
    bounds: Bounds | None = None   # a number's declared bounds (its field's metadata)

    def bound_error(self, value: Any) -> str | None:
        """Why ``value`` breaks this parameter's declared bounds, or None.

        >>> [p.bound_error(-1.0) for p in parameters("scale") if p.name == "factor"]
        ['must be a finite number >= 0, got -1.0']
        """
        optional_none = value is None and _without_none(self.type) is not self.type
        return None if self.bounds is None or optional_none else self.bounds.refusal(value)

    @property
    def choices(self) -> tuple[Any, ...] | None:
        """The allowed values of a ``Literal`` or ``Enum`` parameter (an Enum's member values;
        scenario files also take member names), else None.

        >>> [p.choices for p in parameters("scale")]
        [None, None]
        """
        hint = _without_none(self.type)
        if typing.get_origin(hint) is typing.Literal:
            return typing.get_args(hint)
        if isinstance(hint, type) and issubclass(hint, enum.Enum):
            return tuple(m.value for m in hint)
        return None

    @property
    def type_name(self) -> str:
        """The type and the values it allows, as listings show them (``float, a finite number > 0``;
        a maximum that only guards against overflow left out)."""
        if self.choices is not None:
            shown = "one of " + ", ".join(map(str, self.choices))
            return shown + " or None" if _without_none(self.type) is not self.type else shown
        name = getattr(self.type, "__name__", None) or str(self.type).replace("typing.", "")
        return f"{name}, {self.bounds.describe(guards=False)}" if self.bounds is not None else name

    @property
    def default_value(self) -> Any:
        """The default as a scenario file writes it (an Enum member's value)."""
        return self.default.value if isinstance(self.default, enum.Enum) else self.default


def _without_none(hint: Any) -> Any:
    """``X`` of ``X | None`` (``Optional[X]``); any other hint as it is."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def parameters(name: str) -> list[Parameter]:
    cls = get(name)
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]  # every registered transform is a dataclass
        if f.default is not dataclasses.MISSING:
            default, required = f.default, False
        elif f.default_factory is not dataclasses.MISSING:
            default, required = f.default_factory(), False
        else:
            default, required = None, True
        out.append(Parameter(name=f.name, type=hints.get(f.name, Any), default=default, required=required,
                             help=str(f.metadata.get("help", "")), bounds=_bounds(hints.get(f.name, Any), f.metadata)))
    return out


def _bounds(hint: Any, metadata: Any) -> Bounds | None:
    """The bounds a numeric field declares in its metadata; None when it declares none."""
    if not any(k in metadata for k in BOUND_KEYS):
        return None
    return Bounds.of(int if _without_none(hint) is int else float, metadata)
