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


class OutputExistsError(RecordError):
    """The output folder already holds a recording and ``--force`` was not given."""

    def __init__(self, path: str | Path, what: str) -> None:
        super().__init__(f"{path}: output folder already holds {what} (use -f/--force to overwrite)")


class BackendUnavailableError(RecordError):
    """The chosen tracing backend cannot run on this machine."""


class OptionError(RecordError):
    """An option value that cannot be used (e.g. ``--step-on`` naming nothing importable)."""
