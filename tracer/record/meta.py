"""``meta.jsonc``: what was run, how it ended, and on what software and hardware."""
from __future__ import annotations

import datetime as dt
import os
import platform
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import torch

GIT_TIMEOUT_S = 5.0


def git_commit(folder: Path) -> dict[str, Any] | None:
    """Commit (and whether the work tree has changes) of the git repo holding ``folder``."""
    try:
        head = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=GIT_TIMEOUT_S)
        if head.returncode != 0:
            return None
        status = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=GIT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}


def nvidia_driver_version() -> str | None:
    """Kernel driver version from ``/proc/driver/nvidia/version`` (Linux), if any."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    match = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?([\d.]+)", text)
    return match.group(1) if match else None


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_names() -> list[str]:
    if torch.cuda.is_available():
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return []


def software_and_hardware() -> dict[str, Any]:
    """Versions and devices of this process (cheap: no GPU work)."""
    return {
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_driver": nvidia_driver_version(),
        "gpu_devices": device_names(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
    }


def build_meta(*, command: list[str], argv: list[str], cwd: str, exit_status: int, wall_time_s: float,
               started_at_s: float, backend: str, rank: int, world_size: int, steps: int,
               step_source: str, gpu_activity: bool, source_dir: Path, trace_files: list[str],
               options: dict[str, Any], end: dict[str, Any]) -> dict[str, Any]:
    """The ``meta.jsonc`` document; ``end``: how the run ended (:class:`~.signals.RunEnd`)."""
    return {
        "command": command,
        "argv": argv,
        "cwd": cwd,
        "exit_status": exit_status,
        "end": end,
        "wall_time_s": round(wall_time_s, 6),
        "started_at": dt.datetime.fromtimestamp(started_at_s, dt.timezone.utc).isoformat(),
        "backend": backend,
        "rank": rank,
        "world_size": world_size,
        "steps_marked": steps,
        "step_source": step_source,
        "gpu_activity_recorded": gpu_activity,
        "trace_files": trace_files,
        "options": options,
        "git": git_commit(source_dir),
        **software_and_hardware(),
    }
