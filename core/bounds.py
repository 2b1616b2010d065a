"""Numeric bounds declared once, in a config dataclass field's metadata (``minimum``,
``exclusive_minimum``, ``maximum``, ``allow_inf``), and checked wherever a value enters: at parse
time by the command line (``whatif/commands/_values.py``) and at construction by the dataclass
itself (:func:`check_fields`), so a Python caller meets the same refusal as a CLI user.

>>> Bounds(int, minimum=1).describe()
'an integer >= 1'
>>> Bounds(float, exclusive_minimum=0, allow_inf=True).holds(float("inf"))
True
>>> Bounds(float, minimum=0).holds(float("nan"))
False
"""
from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from whatif.core.errors import WhatifError

BOUND_KEYS = ("minimum", "exclusive_minimum", "maximum", "allow_inf")
GUARD_MAXIMUM = 1e15
"""A maximum at or above this is no real limit: it keeps sums inside int64 (a duration of 36 years
in us, ``MAX_DURATION_NS // 1000``; an integer a float64 holds exactly). Listings leave it out."""


@dataclass(frozen=True)
class Bounds:
    """The values a number may take: ``kind`` (int or float), finite unless ``allow_inf`` (then
    +inf stands for "unbounded"), within the bounds."""

    kind: type = float
    minimum: float | None = None
    exclusive_minimum: float | None = None
    maximum: float | None = None
    allow_inf: bool = False

    @classmethod
    def of(cls, kind: type, metadata: Mapping[str, Any]) -> Bounds:
        return cls(kind, metadata.get("minimum"), metadata.get("exclusive_minimum"), metadata.get("maximum"),
                   bool(metadata.get("allow_inf")))

    def describe(self, guards: bool = True) -> str:
        """The values it allows, ``a finite number >= 0 and <= 4096``; ``guards=False`` (listings) leaves
        out a maximum of at least :data:`GUARD_MAXIMUM`.

        >>> Bounds(float, minimum=0, maximum=1 << 50).describe(guards=False)
        'a finite number >= 0'
        """
        parts = [f">= {_show(self.minimum)}"] if self.minimum is not None else []
        parts += [f"> {_show(self.exclusive_minimum)}"] if self.exclusive_minimum is not None else []
        shown = self.maximum is not None and (guards or self.maximum < GUARD_MAXIMUM)
        parts += [f"<= {_show(self.maximum)}"] if shown and self.maximum is not None else []
        what = "an integer" if self.kind is int else ("a number" if self.allow_inf else "a finite number")
        return what + (" " + " and ".join(parts) if parts else "") + (" (or inf)" if self.allow_inf else "")

    def holds(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, int if self.kind is int else (int, float)):
            return False
        if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
            return self.allow_inf and value > 0
        return ((self.minimum is None or value >= self.minimum)
                and (self.exclusive_minimum is None or value > self.exclusive_minimum)
                and (self.maximum is None or value <= self.maximum))


    def refusal(self, value: Any) -> str | None:
        """Why ``value`` is refused (``must be an integer >= 1, got 0``), None when it holds."""
        return None if self.holds(value) else f"must be {self.describe()}, got {value!r}"


def _show(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


def check_fields(obj: Any, error: type[Exception] = WhatifError) -> None:
    """Raise ``error`` naming the first field of dataclass instance ``obj`` whose value breaks the
    bounds its metadata declares (None passes only where the field's type allows it).

    >>> from dataclasses import field
    >>> @dataclass
    ... class Knobs:
    ...     slots: int = field(default=8, metadata={"minimum": 1})
    >>> check_fields(Knobs(slots=0))
    Traceback (most recent call last):
    whatif.core.errors.WhatifError: slots must be an integer >= 1, got 0
    """
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        if not any(k in f.metadata for k in BOUND_KEYS):
            continue
        value, hint = obj.__dict__[f.name], hints[f.name]
        if value is None and type(None) in typing.get_args(hint):
            continue
        kind = next((t for t in (int, float) if t is hint or t in typing.get_args(hint)), float)
        why = Bounds.of(kind, f.metadata).refusal(value)
        if why:
            raise error(f"{f.name} {why}")
