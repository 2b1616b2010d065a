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
from collections.abc import Callable

from whatif.core.bounds import Bounds


def number(kind: type = float, *, minimum: float | None = None, exclusive_minimum: float | None = None,
           maximum: float | None = None, allow_inf: bool = False) -> Callable[[str], float]:
    """A parser of ``kind`` (int or float) values within the bounds (:class:`~whatif.core.bounds.Bounds`:
    floats finite unless ``allow_inf``, +inf then standing for "unbounded")."""
    bounds = Bounds(kind, minimum, exclusive_minimum, maximum, allow_inf)

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not bounds.holds(value):
            raise argparse.ArgumentTypeError(f"must be {bounds.describe()}, got {text!r}")
        return value

    parse.__name__ = kind.__name__
    return parse


positive_float = number(float, exclusive_minimum=0)
nonnegative_float = number(float, minimum=0)
positive_int = number(int, minimum=1)
nonnegative_int = number(int, minimum=0)
port = number(int, minimum=1, maximum=65535)
