"""Run the docstring examples of every whatif module (networkx style: small, runnable)."""
from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import whatif

MODULES = sorted(
    m.name for m in pkgutil.walk_packages(whatif.__path__, "whatif.")
    if not m.name.startswith(("whatif.dashboard", "whatif.tracer.record")))
for sub in ("core", "hardware", "tracer", "depgraph", "transforms", "predictors"):
    pkg = importlib.import_module(f"whatif.{sub}")
    MODULES += sorted(m.name for m in pkgutil.walk_packages(pkg.__path__, f"whatif.{sub}.")
                      if not m.name.startswith("whatif.tracer.record"))


@pytest.mark.parametrize("name", sorted(set(MODULES)))
def test_doctests(name: str) -> None:
    try:
        module = importlib.import_module(name)
    except ImportError as exc:  # optional extras (torch, dash) may be missing; whatif's own modules may not
        if (exc.name or "").startswith("whatif"):
            raise
        pytest.skip(f"{name} needs an optional dependency: {exc}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
