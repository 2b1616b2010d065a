"""Where the third-party data lives (../shared next to the repo) and a skip helper."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(__file__).resolve().parents[2] / "shared"
TRACES = SHARED / "traces"
VIDUR = SHARED / "perfdata" / "vidur"


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"third-party data not found at {path} (needs ../shared next to the repo)")
    return path


def bench_module(name: str):
    """Import a bench script (bench/ is not a package) by file name."""
    sys.path.insert(0, str(REPO / "bench"))
    import importlib
    return importlib.import_module(name)
