"""Errors that whatif reports to users as one line naming the input and the problem."""
from __future__ import annotations

from pathlib import Path


class WhatifError(Exception):
    """Base class of every error whatif explains to a user (CLI exit code 2)."""


class TraceError(WhatifError):
    """A trace file or folder that cannot be used, with the reason.

    >>> str(TraceError("run/rank0.json", "not valid JSON"))
    'run/rank0.json: not valid JSON'
    """

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")

    def __reduce__(self) -> tuple[type[TraceError], tuple[str, str]]:
        """Picklable as itself (a rank group's error crosses to the coordinator's process)."""
        return (type(self), (self.path, self.problem))
