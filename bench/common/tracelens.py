"""TraceLens (AMD-AGI/TraceLens; not the unrelated PyPI package ``tracelens``) for the benches and
slow tests that compare with it: its source comes from a checkout (``--tracelens DIR`` or
``$WHATIF_TRACELENS``), its dependencies from pip into a throw-away venv: :func:`tracelens_python`."""
from __future__ import annotations

import os
import subprocess
import venv
from pathlib import Path

TRACELENS_DEPS = ("pandas", "tqdm", "openpyxl", "tabulate", "orjson", "PyYAML")
"""What ``TraceLens.Reporting.generate_perf_report_pytorch`` imports (not its JAX/xprof extras)."""
TRACELENS_HOME = Path.home() / ".cache" / "whatif-bench" / "tracelens"
_PROBE = "import TraceLens.Reporting.generate_perf_report_pytorch"


def tracelens_source(given: str | None = None) -> Path | None:
    """The TraceLens checkout: ``given``, else ``$WHATIF_TRACELENS``; None when neither names a
    folder holding the ``TraceLens`` package."""
    path = given or os.environ.get("WHATIF_TRACELENS")
    if not path or not (Path(path) / "TraceLens" / "__init__.py").is_file():
        return None
    return Path(path)


def tracelens_python(source: Path, home: Path = TRACELENS_HOME) -> Path | None:
    """A python that imports TraceLens from ``source`` (with ``PYTHONPATH=source``): a venv under
    ``home`` with its dependencies (made, or completed, with pip); None when pip cannot."""
    py = home / "bin" / "python"
    if not py.exists():
        venv.create(home, with_pip=True)
    env = {**os.environ, "PYTHONPATH": str(source)}
    if subprocess.run([py, "-c", _PROBE], capture_output=True, env=env).returncode != 0:
        done = subprocess.run([py, "-m", "pip", "install", "-q", *TRACELENS_DEPS], capture_output=True)
        if done.returncode != 0:
            return None
    return py
