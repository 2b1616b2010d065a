"""Shared fixtures. Third-party traces live in ../shared/traces beside the repo (never copied in).

The transform registry is process-wide: a test that registers a transform must ask for the
``transform_registry`` fixture (which restores it), and :func:`_no_transform_leaks` fails any
test that leaves the registry changed.

``WHATIF_CHECK_SCHEMA=1`` is set for the whole run (CLI subprocesses inherit it): every graph the
builder makes and every transform returns is checked against ``whatif.depgraph.schema``.
``WHATIF_NO_CACHE=1`` too: no test reads or writes the user's trace cache (``~/.cache/whatif``), and
a test that patches a reader or a limit sees its file parsed; ``tests/test_trace_cache.py`` turns
the cache on in a temporary folder.

Property-based tests (hypothesis) draw the same examples on every run (profile ``deterministic``),
so CI passes or fails the same way twice; ``HYPOTHESIS_PROFILE=explore`` draws new ones each run
(the way to hunt for new failures; bench/fuzz.py is the long campaign)."""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import settings

settings.register_profile("deterministic", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))

os.environ["WHATIF_CHECK_SCHEMA"] = "1"  # every built and transformed graph is checked against its schema
os.environ["WHATIF_NO_CACHE"] = "1"  # every load parses its files; tests/test_trace_cache.py turns the cache on

SHARED = Path(__file__).resolve().parents[2] / "shared"
SHARED_TRACES = SHARED / "traces"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """Path of ../shared/traces; skips the test with the reason when it is absent."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"third-party traces not found at {SHARED_TRACES} (../shared is absent)")
    return SHARED_TRACES


def _loaded_registry() -> ModuleType:
    from whatif.transforms import registry
    registry.names()  # built-ins and entry points loaded first: they belong to the snapshot
    return registry


@pytest.fixture
def transform_registry() -> Iterator[ModuleType]:
    """``whatif.transforms.registry``, put back as it was after the test: what the test registers
    (with ``@register`` or through entry points) does not outlive it."""
    registry = _loaded_registry()
    saved, loaded = dict(registry._REGISTRY), registry._loaded
    yield registry
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)
    registry._loaded = loaded


@pytest.fixture(autouse=True)
def _no_transform_leaks() -> Iterator[None]:
    """Fail (at teardown) a test that left a transform registered, removed or replaced; the
    registry is restored first so that the leak does not spread to later tests."""
    registry = _loaded_registry()
    before = dict(registry._REGISTRY)
    yield
    after = dict(registry._REGISTRY)
    if after != before:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(before)
        changed = sorted(n for n in before.keys() | after.keys() if before.get(n) is not after.get(n))
        pytest.fail(f"the test changed the transform registry ({', '.join(changed)}); "
                    "register transforms under the transform_registry fixture", pytrace=False)
