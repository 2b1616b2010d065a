"""The ``torch`` backend: ``torch.profiler`` (Kineto; on NVIDIA GPUs Kineto uses CUPTI).

If the program starts its own ``torch.profiler.profile``, whatif steps aside: its own profiler
is stopped and discarded, and the program's profiler (with the program's schedule and options)
runs; each of its cycles is also saved into the run folder, and the program's
``on_trace_ready`` still runs.
"""
from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.profiler

from .errors import RecordError
from .options import RecordOptions
from .trace_file import read_kineto_export


def gpu_tracing_available() -> bool:
    """Whether Kineto can record CUDA activity here (a CUDA build with a visible GPU, in a process
    that may use it: a child forked after its parent initialized CUDA may not)."""
    return torch.cuda.is_available() and not torch.cuda._is_in_bad_fork()


class TorchSession:
    """One recording with torch.profiler; completed cycles land in :attr:`cycles`."""

    name = "torch"

    def __init__(self, options: RecordOptions, scratch_dir: Path) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if gpu_tracing_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.gpu = gpu_tracing_available()
        self.cycles: list[dict[str, Any]] = []
        self.program_profiler_used = False
        self._scratch_dir = scratch_dir
        self._exports = itertools.count(1)
        self._original_profile: type[torch.profiler.profile] | None = None
        self._running = False
        self._on_yield: Callable[[], None] | None = None
        self.profiler = torch.profiler.profile(
            activities=activities, schedule=options.schedule, on_trace_ready=self._collect,
            record_shapes=options.record_shapes, with_stack=options.with_stack,
            profile_memory=options.profile_memory)

    def start(self, on_yield: Callable[[], None]) -> None:
        """Start recording; ``on_yield`` runs when the program starts a profiler of its own."""
        self._on_yield = on_yield
        self._install_program_profiler_hook()
        self.profiler.start()
        self._running = True

    def step(self) -> None:
        if self._running:
            self.profiler.step()

    def stop(self) -> None:
        """Stop recording (idempotent); the last cycle is collected."""
        if self._running:
            self._running = False
            self.profiler.stop()
        self._uninstall_program_profiler_hook()

    def disown(self) -> None:
        """In a forked child: forget the parent's profiler (it cannot be stopped or exported
        here) and give ``torch.profiler.profile`` back, so that the child starts its own."""
        self._running = False
        self._uninstall_program_profiler_hook()

    def _collect(self, prof: torch.profiler.profile) -> None:
        tmp = self._scratch_dir / f".whatif-export-{os.getpid()}-{next(self._exports)}.tmp"
        try:
            prof.export_chrome_trace(str(tmp))
            self.cycles.append(read_kineto_export(tmp))
        except (OSError, ValueError) as exc:
            raise RecordError(f"{tmp}: torch.profiler could not export the trace ({exc})") from None

    # -- the program's own profiler -----------------------------------------------------------
    def _yield_to(self, program_profiler: torch.profiler.profile) -> None:
        if self._running:
            self._running = False
            self.profiler.on_trace_ready = None
            self.profiler.stop()
            self.cycles.clear()
        self.program_profiler_used = True
        if self._on_yield is not None:
            self._on_yield()
        user_handler = program_profiler.on_trace_ready
        collect = self._collect

        def on_trace_ready(prof: torch.profiler.profile) -> None:
            collect(prof)
            if user_handler is not None:
                user_handler(prof)

        program_profiler.on_trace_ready = on_trace_ready

    def _install_program_profiler_hook(self) -> None:
        original = torch.profiler.profile
        session = self

        class ProgramProfile(original):  # type: ignore[misc, valid-type]
            def start(self) -> None:
                session._yield_to(self)
                super().start()

        ProgramProfile.__name__ = ProgramProfile.__qualname__ = "profile"
        ProgramProfile.__module__ = original.__module__
        self._original_profile = original
        torch.profiler.profile = ProgramProfile  # type: ignore[misc]
        torch.profiler.profiler.profile = ProgramProfile  # type: ignore[misc]

    def _uninstall_program_profiler_hook(self) -> None:
        if self._original_profile is not None:
            torch.profiler.profile = self._original_profile  # type: ignore[misc]
            torch.profiler.profiler.profile = self._original_profile  # type: ignore[misc]
            self._original_profile = None
