"""Marks a program puts in its own trace: steps and phases.

``phase(name)`` opens a ``record_function`` named ``phase:<name>`` so the trace carries
prefill / decode / denoise phases; ``step()`` ends one step (an iteration of a training or
serving loop) for whatever recorder is active. Both are no-ops when nothing records, and
``phase`` works without torch installed.

>>> with phase("prefill"):
...     step()
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

PHASE_PREFIX = "phase:"
_step_hooks: list[Callable[[], None]] = []


def add_step_hook(hook: Callable[[], None]) -> None:
    """Called by a recorder: run ``hook`` at every :func:`step`."""
    _step_hooks.append(hook)


def remove_step_hook(hook: Callable[[], None]) -> None:
    if hook in _step_hooks:
        _step_hooks.remove(hook)


def step() -> None:
    """End the current step (e.g. one optimizer step or one serving iteration)."""
    for hook in list(_step_hooks):
        hook()


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Annotate the enclosed code as phase ``name`` (``prefill``, ``decode``, ``denoise``...)."""
    try:
        from torch.profiler import record_function
    except ImportError:
        yield
        return
    with record_function(f"{PHASE_PREFIX}{name}"):
        yield
