"""HolisticTraceAnalysis in a throw-away venv (never in whatif's own), for the benches and slow
tests that compare with it: :func:`hta_python`."""
from __future__ import annotations

import subprocess
import venv
from pathlib import Path

HTA_SPEC = ("HolisticTraceAnalysis==0.5.0", "pandas<3")
"""HTA 0.5.0 (its critical path calls ``DataFrame.drop(axis=, columns=)``, which pandas 3 refuses)."""
HTA_HOME = Path.home() / ".cache" / "whatif-bench" / "hta"
_PROBE = "import hta, pandas; assert int(pandas.__version__.split('.')[0]) < 3"


def hta_python(given: str | None = None, home: Path = HTA_HOME) -> Path | None:
    """A python with HolisticTraceAnalysis 0.5.0: the one ``given``, else a venv under ``home``
    (made, or completed, with pip); None when pip cannot install it (no network)."""
    if given:
        return Path(given)
    py = home / "bin" / "python"
    if not py.exists():
        venv.create(home, with_pip=True)
    if subprocess.run([py, "-c", _PROBE], capture_output=True).returncode != 0:
        done = subprocess.run([py, "-m", "pip", "install", "-q", *HTA_SPEC], capture_output=True)
        if done.returncode != 0:
            return None
    return py
