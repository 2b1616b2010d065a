"""The path guard: the dashboard reads files only inside its allowed folders.

The allowed folders are the paths given on the command line, their parent folders, and the
upload folder. Paths are resolved (``..`` and symlinks followed) before the check, so neither
can lead outside.

>>> import tempfile, pathlib
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> guard = PathGuard([root])
>>> guard.check(root / "a" / ".." / "b") == (root / "b").resolve()
True
>>> guard.allows("/etc/passwd")
False
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from whatif.core.errors import WhatifError


class AccessDenied(WhatifError):
    """A path outside the dashboard's allowed folders."""


class PathGuard:
    """Allow reads only under a fixed set of folders (resolved once, at start)."""

    def __init__(self, roots: Iterable[str | Path]) -> None:
        self.roots: list[Path] = []
        for root in roots:
            resolved = Path(root).expanduser().resolve()
            if resolved not in self.roots:
                self.roots.append(resolved)

    @classmethod
    def for_paths(cls, paths: Iterable[str | Path], extra: Iterable[str | Path] = ()) -> PathGuard:
        """Guard for command-line ``paths``: each path, its parent folder, and ``extra`` folders."""
        roots: list[Path] = []
        for p in paths:
            resolved = Path(p).expanduser().resolve()
            roots += [resolved, resolved.parent]
        return cls([*roots, *extra])

    def allows(self, path: str | Path) -> bool:
        try:
            self.check(path)
        except AccessDenied:
            return False
        return True

    def check(self, path: str | Path) -> Path:
        """``path`` resolved, or :class:`AccessDenied` if it lies outside every allowed folder."""
        text = os.fspath(path)
        if "\x00" in text:
            raise AccessDenied("path contains a NUL byte")
        resolved = Path(text).expanduser().resolve()
        if any(resolved == root or resolved.is_relative_to(root) for root in self.roots):
            return resolved
        raise AccessDenied(f"{text}: outside the folders this dashboard may read "
                           f"({', '.join(str(r) for r in self.roots) or 'none'})")
