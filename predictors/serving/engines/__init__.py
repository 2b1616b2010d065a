"""Serving-engine adapters: one module per engine family, each registering an
:class:`~.base.EngineAdapter` that finds the model iterations of a trace (see :mod:`.base`).

Every module of this package is imported once, when the registry is first asked, so adding an
engine is one file here plus its test; third-party adapters register the same way.
"""
from __future__ import annotations

import importlib
import pkgutil

from whatif.depgraph.graph import TaskGraph

from ..logs import ServingLogError
from .base import (
    CompositionSource,
    DitBatch,
    EngineAdapter,
    FoundIteration,
    FoundIterations,
    IterationPhase,
    iteration_of_tasks,
    iteration_spans,
)

__all__ = ["CompositionSource", "DitBatch", "EngineAdapter", "FoundIteration", "FoundIterations", "IterationPhase",
           "adapters", "find_iterations", "iteration_of_tasks", "iteration_spans", "register"]

_REGISTRY: dict[str, type[EngineAdapter]] = {}
_LOADED = False


def register(cls: type[EngineAdapter]) -> type[EngineAdapter]:
    """Class decorator: add an adapter under its ``name`` (a second class of the same name is refused)."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"two serving-engine adapters named {cls.name!r}")
    _REGISTRY[cls.name] = cls
    return cls


def adapters() -> list[type[EngineAdapter]]:
    """Every registered adapter, in the order they are tried (``order``, then name)."""
    global _LOADED
    if not _LOADED:
        for mod in pkgutil.iter_modules(__path__):
            if mod.name != "base":
                importlib.import_module(f"{__name__}.{mod.name}")
        _LOADED = True
    return sorted(_REGISTRY.values(), key=lambda c: (c.order, c.name))


def find_iterations(graph: TaskGraph, engine: str | None = None) -> FoundIterations:
    """The iterations of ``graph`` found by the first adapter that recognises its trace (``engine``:
    that adapter only).

    Raises
    ------
    ServingLogError
        ``engine`` is not a registered adapter, or no adapter finds iterations (the message names
        the adapters tried).
    """
    known = adapters()
    if engine is not None:
        chosen = [c for c in known if c.name == engine]
        if not chosen:
            raise ServingLogError(f"unknown serving engine {engine!r} (known: {', '.join(c.name for c in known)})")
        known = chosen
    for cls in known:
        found = cls().find(graph)
        if found is not None:
            return found
    raise ServingLogError(f"no serving log found and no serving-engine adapter finds iterations in "
                          f"{graph.trace.source if graph.trace else 'the graph'} (tried: "
                          f"{', '.join(c.name for c in known) or 'none'}); pass --iterations-log FILE (the --log of "
                          "examples/llm_serve.py or dit_serve.py for this recording)")
