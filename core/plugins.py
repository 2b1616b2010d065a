"""Loading a registry's plugins once: its built-in modules (which register themselves on import),
then the objects third-party packages name in an entry-point group. A plugin that fails to load
or is refused is one :class:`~whatif.core.errors.WhatifError` naming its entry point, and the
registry stays unloaded, so the next use tries again and says the same.

Used by every registry: transforms, trace readers, cost models, serving policies and routers.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import Any

from .errors import WhatifError


def load_plugins(builtin_modules: Sequence[str], group: str | None, accept: Callable[[Any], object], *,
                 what: str, error: Callable[[str], WhatifError] = WhatifError,
                 missing_builtins_ok: bool = False) -> None:
    """Import ``builtin_modules``, then pass every object of entry-point ``group`` to ``accept``.

    Raises ``error(message)`` (one line naming the entry point) when loading or accepting a
    plugin fails; ``missing_builtins_ok`` skips a built-in module that is not installed.
    """
    for module in builtin_modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if not (missing_builtins_ok and exc.name == module):
                raise
    if group is None:
        return
    for ep in entry_points(group=group):
        try:
            accept(ep.load())
        except Exception as exc:  # noqa: BLE001 - any failure of third-party code
            raise error(f"{what} plugin {ep.name!r} ({ep.value}, entry point group {group}): "
                        f"{type(exc).__name__}: {exc}") from None
