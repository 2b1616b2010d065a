"""Command-line options generated from a config dataclass, so that each default, type and help
text is written once, in the dataclass.

A field becomes ``--field-name`` (``_`` -> ``-``) of the field's type; its metadata may say:

* ``help``: the help text (the field's default, unless None or False, is appended unless the
  text mentions a default);
* ``flag`` / ``aliases``: the option's name when it differs / other names it also answers to;
* ``choices``: the allowed values (a sequence, or a function returning one, e.g. a registry's names);
* ``parse``: a function from the text to the value (``ValueError`` becomes a usage error);
* ``repeatable``: the option may be given several times (``parse`` makes each item; a mapping field
  gets the ``dict`` of the ``(key, value)`` items);
* ``cli_scale``: the field's value is the option's times this (an option in us, a field in ns);
* ``metavar``: the placeholder in the help (default: the option's name in capitals);
* ``minimum`` / ``exclusive_minimum`` / ``maximum`` / ``allow_inf``: bounds of a number, checked
  when the command line is parsed (floats must be finite unless ``allow_inf``).

Options left out on the command line are left out of the constructor call too, so the
dataclass's own default applies.

>>> import argparse
>>> from dataclasses import dataclass, field
>>> @dataclass
... class Knobs:
...     max_seqs: int = field(default=8, metadata={"help": "slots", "aliases": ("--max-batch",)})
...     delay_ns: float = field(default=0.0, metadata={"help": "delay (us)", "flag": "--delay-us", "cli_scale": 1e3})
...     fast: bool | None = field(default=None, metadata={"help": "fast mode (default: as recorded)"})
>>> p = argparse.ArgumentParser()
>>> add_dataclass_arguments(p, Knobs)
>>> from_args(Knobs, p.parse_args(["--max-batch", "4", "--delay-us", "2", "--no-fast"]))
Knobs(max_seqs=4, delay_ns=2000.0, fast=False)
>>> from_args(Knobs, p.parse_args([]))
Knobs(max_seqs=8, delay_ns=0.0, fast=None)
"""
from __future__ import annotations

import argparse
import collections.abc
import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from ._values import number


def _dest(f: dataclasses.Field) -> str:
    return f"_dc_{f.name}"


def _flag(f: dataclasses.Field) -> str:
    return str(f.metadata.get("flag") or "--" + f.name.replace("_", "-"))


def _base(hint: Any) -> tuple[Any, bool]:
    """(the type without ``None``, whether ``None`` is allowed); ``str | Path`` counts as ``Path``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        if Path in args:
            return Path, optional
        return (args[0] if len(args) == 1 else hint), optional
    return hint, False


def _show(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, tuple):
        return ":".join(map(str, value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def _checked(parse: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    def inner(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    inner.__name__ = name  # argparse names the type in its "invalid ... value" messages
    return inner


def add_dataclass_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type,
                            exclude: Collection[str] = ()) -> None:
    """One option per field of dataclass ``cls`` (except ``exclude``), as described above."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in exclude or not f.init:
            continue
        meta = f.metadata
        hint, optional = _base(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else None
        scale = meta.get("cli_scale")
        help_text = str(meta.get("help", ""))
        if default is not None and default is not False and "default" not in help_text:
            shown = default / scale if scale else default
            help_text = f"{help_text} (default {_show(shown)})".lstrip()
        kw: dict[str, Any] = {"dest": _dest(f), "default": argparse.SUPPRESS, "help": help_text}
        choices = meta.get("choices")
        if choices is not None:
            kw["choices"] = list(choices() if callable(choices) else choices)
        if "metavar" in meta:
            kw["metavar"] = meta["metavar"]
        elif choices is None and hint is not bool:
            kw["metavar"] = _flag(f).lstrip("-").replace("-", "_").upper()
        if "parse" in meta:
            kw["type"] = _checked(meta["parse"], f.name)
        elif hint is bool:
            kw["action"] = argparse.BooleanOptionalAction if optional else "store_true"
        elif hint in (int, float):
            kw["type"] = number(hint, minimum=meta.get("minimum"), exclusive_minimum=meta.get("exclusive_minimum"),
                                maximum=meta.get("maximum"), allow_inf=bool(meta.get("allow_inf")))
        elif hint in (str, Path):
            kw["type"] = hint
        elif isinstance(hint, type) and issubclass(hint, enum.Enum):
            kw["type"] = str  # the dataclass turns the name into its member
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: no command-line form for {hint!r} (give metadata 'parse')")
        if meta.get("repeatable"):
            kw["action"] = "append"
        parser.add_argument(_flag(f), *meta.get("aliases", ()), **kw)


def from_args(cls: type, args: argparse.Namespace, exclude: Collection[str] = (), **extra: Any) -> Any:
    """An instance of ``cls`` from the options :func:`add_dataclass_arguments` added (given ones
    only; the rest keep their dataclass defaults), plus ``extra`` keyword arguments."""
    given = vars(args)
    hints = typing.get_type_hints(cls)
    kwargs = dict(extra)
    for f in dataclasses.fields(cls):
        if f.name in exclude or _dest(f) not in given:
            continue
        value = given[_dest(f)]
        scale = f.metadata.get("cli_scale")
        if scale and value is not None:
            value = value * scale
        if f.metadata.get("repeatable") and typing.get_origin(_base(hints[f.name])[0]) in (
                dict, collections.abc.Mapping):
            value = dict(value)
        kwargs[f.name] = value
    return cls(**kwargs)
