"""Errors of ``whatif record`` that the CLI prints as one line and answers with exit code 2."""
from __future__ import annotations

from pathlib import Path

from whatif.core.errors import WhatifError


class RecordError(WhatifError):
    """Base class of recorder errors (bad options, missing script, unusable output folder)."""


class ScriptNotFoundError(RecordError):
    """The script to record does not exist or is not a file."""

    def __init__(self, path: str | Path, problem: str = "no such script") -> None:
        super().__init__(f"{path}: {problem}")


class NoScriptError(RecordError):
    """``whatif record`` was given neither a script nor ``-m module``."""

    def __init__(self) -> None:
        super().__init__("no script given (usage: whatif record [options] script.py [args...], "
                         "or -m module [args...])")


class NotAScriptError(RecordError):
    """The script exists but Python cannot compile it (not Python source, a binary file)."""

    def __init__(self, path: str | Path, problem: str) -> None:
        super().__init__(f"{path}: not a Python script ({problem})")


class OutputExistsError(RecordError):
    """The output folder already holds a recording and ``--force`` was not given."""

    def __init__(self, path: str | Path, what: str) -> None:
        super().__init__(f"{path}: output folder already holds {what} (use -f/--force to overwrite)")


class BackendUnavailableError(RecordError):
    """The chosen tracing backend cannot run on this machine."""


class OptionError(RecordError):
    """An option value that cannot be used (e.g. ``--step-on`` naming nothing importable)."""
