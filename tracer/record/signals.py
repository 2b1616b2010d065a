"""SIGINT and SIGTERM while recording (docs/recording.md, "Signals").

While the program runs, SIGINT raises ``KeyboardInterrupt`` (as under ``python``) and SIGTERM
raises :class:`ProgramTerminated`; both end the program with status 128 + the signal number and
the trace is still written. From the moment the program has ended, a first signal is *deferred*
(one line on stderr; the trace and ``meta.jsonc`` are finished, then whatif exits with 128 + the
signal number) and a second one raises :class:`RecordingAborted`: nothing more is written and
no temp file stays behind. ``meta.jsonc`` says how the run ended (:class:`RunEnd`).

A signal inherited as ignored (SIGINT in a background job of a non-interactive shell) stays
ignored, as under ``python``. A program that installs its own handler keeps it while it runs.
"""
from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any, TextIO

HANDLED = (signal.SIGINT, signal.SIGTERM)


def exit_status(signum: int) -> int:
    """The shell's exit status for a process ended by ``signum``.

    >>> exit_status(signal.SIGTERM)
    143
    """
    return 128 + int(signum)


class ProgramTerminated(BaseException):
    """SIGTERM while the program runs: unwinds the program like ``KeyboardInterrupt`` does."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class RecordingAborted(BaseException):
    """A second signal while the trace was being written: whatif stops without writing more."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"second {signal.Signals(signum).name} while writing the trace: recording aborted, "
                         "nothing more written")
        self.signum = signum


@dataclass(frozen=True)
class RunEnd:
    """How a recorded run ended, for ``meta.jsonc``: ``signal`` is the first SIGINT/SIGTERM whatif
    received (``None``: none), ``during`` is ``"program"`` or ``"write"``."""

    signal: str | None = None
    during: str | None = None

    def as_meta(self) -> dict[str, Any]:
        return {"signal": self.signal, "during": self.during}


class SignalGuard:
    """Installs the handlers of :data:`HANDLED` (main thread only; elsewhere it does nothing).

    ``terminate``: what SIGTERM does while the program runs, instead of raising
    :class:`ProgramTerminated` (a traced child ends at once, :mod:`.children`); should it return,
    the exception is raised.

    Use: :meth:`install` before tracing starts, :meth:`defer` as soon as the program has ended,
    :meth:`restore` when whatif is done.
    """

    def __init__(self, stderr: TextIO | None = None, terminate: Callable[[int], None] | None = None) -> None:
        self._stderr = stderr
        self._terminate = terminate                  # SIGTERM while the program runs: called instead of raising
        self._previous: dict[int, Any] = {}
        self._writing = False
        self._shielded = False
        self._held: int | None = None                # a signal received inside :meth:`shielded`
        self.first: tuple[int, str] | None = None    # (signal number, "program" | "write")
        self.pending: int | None = None              # a signal deferred during the write

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in HANDLED:
            previous = signal.getsignal(signum)
            self._previous[signum] = previous
            if previous is not signal.SIG_IGN:
                signal.signal(signum, self._handle)

    def defer(self) -> None:
        """From now on a first signal is deferred and a second aborts (handlers re-installed, in
        case the program replaced them)."""
        self._writing = True
        for signum, previous in self._previous.items():
            if previous is not signal.SIG_IGN:
                signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def shielded(self, call: Callable[[], None]) -> Callable[[], None]:
        """``call`` made uninterruptible: a signal while it runs is raised when it returns. For
        whatif's own calls into the profiler from the program (a step boundary), which a signal
        cut in half would leave unable to stop and write the trace."""
        def run() -> None:
            if self._shielded:
                call()
                return
            self._shielded = True
            try:
                call()
            finally:
                self._shielded = False
                held, self._held = self._held, None
            if held is not None:
                self._interrupt(held)
        return run

    def _interrupt(self, signum: int) -> None:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self._terminate is not None:
            self._terminate(signum)
        raise ProgramTerminated(signum)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.first is None:
            self.first = (signum, "write" if self._writing else "program")
        if not self._writing:
            if self._shielded:
                self._held = self._held or signum
                return
            self._interrupt(signum)
        if self.pending is not None:
            raise RecordingAborted(signum)
        self.pending = signum
        print(f"whatif: {signal.Signals(signum).name} received while writing the trace; finishing it "
              "(send it again to abort)", file=self._stderr or sys.stderr)

    def end(self) -> RunEnd:
        if self.first is None:
            return RunEnd()
        signum, during = self.first
        return RunEnd(signal=signal.Signals(signum).name, during=during)

    def status(self, program_status: int) -> int:
        """whatif's exit status: the program's, unless a signal was deferred during the write."""
        return exit_status(self.pending) if self.pending is not None else program_status
