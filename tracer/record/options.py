"""What to record and how: :class:`RecordOptions` and the step schedule.

The schedule counts steps (``ProfilerStep#N``) like ``torch.profiler.schedule``: skip ``wait``
steps, warm up for ``warmup`` steps, record ``active`` steps (``None``: until the program ends),
``repeat`` times. Without schedule options everything from program start to end is recorded.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from whatif.core.steps import COUNT_DEFAULT, StepOptions

from .errors import OptionError

if TYPE_CHECKING:
    from torch.profiler import ProfilerAction

BACKENDS = ("torch", "cupti")
_STEP_ON_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


@dataclass(frozen=True)
class Schedule:
    """Which steps are recorded. ``active=None`` records until the program ends."""

    wait: int = 0
    warmup: int = 0
    active: int | None = None
    repeat: int = 1

    def __post_init__(self) -> None:
        for name in ("wait", "warmup", "repeat"):
            if getattr(self, name) < 0:
                raise OptionError(f"--{name} must be >= 0, got {getattr(self, name)}")
        if self.active is not None and self.active <= 0:
            raise OptionError(f"--active must be >= 1, got {self.active}")
        if self.active is None and self.repeat > 1:
            raise OptionError("--repeat needs --active (a cycle without an end never repeats)")

    @property
    def records_from_start(self) -> bool:
        return self.wait == 0 and self.warmup == 0

    def __call__(self, step: int) -> ProfilerAction:
        """The profiler action for step number ``step`` (0-based), as torch.profiler expects."""
        from torch.profiler import ProfilerAction
        if self.active is None:
            if step < self.wait:
                return ProfilerAction.NONE
            return ProfilerAction.WARMUP if step < self.wait + self.warmup else ProfilerAction.RECORD
        cycle = self.wait + self.warmup + self.active
        if self.repeat > 0 and step >= cycle * self.repeat:
            return ProfilerAction.NONE
        pos = step % cycle
        if pos < self.wait:
            return ProfilerAction.NONE
        if pos < self.wait + self.warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD_AND_SAVE if pos == cycle - 1 else ProfilerAction.RECORD


@dataclass
class RecordOptions:
    """Options of one recording (the ``whatif record`` command line, parsed)."""

    output: Path
    force: bool = False
    schedule: Schedule = field(default_factory=Schedule)
    record_shapes: bool = False
    with_stack: bool = False
    profile_memory: bool = False
    duration_s: float | None = None
    step_on: str | None = None
    backend: str = "torch"
    follow_children: bool = True  # trace the program's Python children that import torch (children.py)
    progress: bool = True
    summary: bool = True
    summary_steps: StepOptions = COUNT_DEFAULT  # which steps the printed step times count

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise OptionError(f"--backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.duration_s is not None and self.duration_s <= 0:
            raise OptionError(f"--duration must be > 0 seconds, got {self.duration_s}")
        if self.step_on is not None and not _STEP_ON_RE.match(self.step_on):
            raise OptionError(f"--step-on must look like module:function or module:Class.method, "
                              f"got {self.step_on!r}")


def default_output(target_name: str, now_s: float | None = None, world_size: int = 1) -> Path:
    """``whatif-runs/<script>-<timestamp>/``; under torchrun all ranks share the launcher's
    process id instead of a timestamp so that they land in one folder."""
    stem = re.sub(r"[^\w.-]+", "_", target_name.removesuffix(".py")) or "run"
    if world_size > 1:
        import os
        return Path("whatif-runs") / f"{stem}-torchrun{os.getppid()}"
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now_s if now_s is not None else time.time()))
    return Path("whatif-runs") / f"{stem}-{stamp}"
