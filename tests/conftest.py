"""Shared fixtures. Third-party traces live in ../shared/traces beside the repo (never copied in)."""
from __future__ import annotations

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"
SHARED_TRACES = SHARED / "traces"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    """Path of ../shared/traces; skips the test with the reason when it is absent."""
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"third-party traces not found at {SHARED_TRACES} (../shared is absent)")
    return SHARED_TRACES
