"""Recording each example workload with `whatif record` (CPU) gives a run folder that
`whatif analyze` reads with its steps and phases."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from whatif.api import analyze

pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # each case records an example in a subprocess, then analyzes it
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

CASES = {
    "llm_serve": (["--device", "cpu", "--num-requests", "3", "--rate", "inf", "--output-min", "4",
                   "--output-max", "6", "--layers", "2"], {"prefill", "decode"}, 4),
    "dit_serve": (["--device", "cpu", "--num-requests", "2", "--steps", "3", "--rate", "inf", "--layers", "2"],
                  {"denoise"}, 3),
    "train": (["--device", "cpu", "--steps", "3", "--layers", "1"], set(), 3),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_recorded_example_analyzes_with_steps_and_phases(tmp_path: Path, name: str) -> None:
    args, phases, min_steps = CASES[name]
    out = tmp_path / name
    proc = subprocess.run([sys.executable, "-m", "whatif.cli", "record", "-o", str(out), "--no-summary",
                           str(EXAMPLES / f"{name}.py"), "--", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "rank0.pt.trace.json.gz").exists() and (out / "meta.jsonc").exists()
    a = analyze(out)
    assert len(a.steps) >= min_steps
    assert phases <= set(a.graph.tasks["phase"].dropna().astype(str))
    assert a.steps["error"].abs().max() < 0.01
