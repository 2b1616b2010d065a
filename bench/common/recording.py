"""Recording our own example programs for the benches that compare a prediction with a second
recording (``whatif record`` on this machine's CPU, allocator records and shapes on)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def record_cpu(program: str, args: tuple[str, ...] | list[str], run: Path, timeout_s: int = 900) -> Path:
    """``examples/<program>`` recorded with ``--memory --record-shapes`` on the CPU into ``run``;
    exits with the command and its stderr's tail when the recording fails."""
    cmd = [sys.executable, "-m", "whatif.cli", "record", "-f", "-o", str(run), "--no-summary", "--memory",
           "--record-shapes", str(ROOT / "examples" / program), "--", "--device", "cpu", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise SystemExit(f"recording failed: {' '.join(cmd)}\n{done.stderr[-2000:]}")
    return run


def record_cpu_ranks(program: str, args: tuple[str, ...] | list[str], run: Path, ranks: int,
                     timeout_s: int = 900) -> Path:
    """As :func:`record_cpu`, with ``ranks`` processes started by torchrun (``torch.distributed.run``,
    gloo on this machine's CPU): one trace per rank in ``run``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "-m", "whatif.cli",
           "record", "-f", "-o", str(run), "--no-summary", "--memory", "--record-shapes",
           str(ROOT / "examples" / program), "--", "--device", "cpu", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise SystemExit(f"recording failed: {' '.join(cmd)}\n{done.stderr[-2000:]}")
    return run
