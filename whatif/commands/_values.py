"""Command-line numbers checked at parse time: a bad value is a usage error naming the option
(exit 2), never accepted to fail later. The same bounds serve hand-written options and the
options generated from config dataclasses (field metadata ``minimum``, ``exclusive_minimum``,
``maximum``, ``allow_inf``).

>>> positive_float("2.5"), port("8050")
(2.5, 8050)
>>> positive_float("nan")
Traceback (most recent call last):
argparse.ArgumentTypeError: must be a finite number > 0, got 'nan'
"""
from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def number(kind: type = float, *, minimum: float | None = None, exclusive_minimum: float | None = None,
           maximum: float | None = None, allow_inf: bool = False) -> Callable[[str], float]:
    """A parser of ``kind`` (int or float) values within the bounds (floats finite unless
    ``allow_inf``: +inf then stands for "unbounded")."""
    bounds = []
    if minimum is not None:
        bounds.append(f">= {minimum:g}")
    if exclusive_minimum is not None:
        bounds.append(f"> {exclusive_minimum:g}")
    if maximum is not None:
        bounds.append(f"<= {maximum:g}")
    what = ("an integer" if kind is int else ("a number" if allow_inf else "a finite number")) + \
        (" " + " and ".join(bounds) if bounds else "") + (" (or inf)" if allow_inf else "")

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        ok = not (isinstance(value, float) and (math.isnan(value) or (math.isinf(value) and not (
            allow_inf and value > 0))))
        ok = ok and (minimum is None or value >= minimum) and (exclusive_minimum is None or value > exclusive_minimum)
        ok = ok and (maximum is None or value <= maximum or (allow_inf and math.isinf(value)))
        if not ok:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    parse.__name__ = kind.__name__
    return parse


positive_float = number(float, exclusive_minimum=0)
nonnegative_float = number(float, minimum=0)
positive_int = number(int, minimum=1)
nonnegative_int = number(int, minimum=0)
port = number(int, minimum=1, maximum=65535)
