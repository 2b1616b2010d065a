"""A live ``recording ... 12.3 s, step 17`` line on stderr, only when stderr is a terminal."""
from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

REFRESH_S = 0.5


class ProgressLine:
    """Redraws one status line every :data:`REFRESH_S` seconds from a daemon thread."""

    def __init__(self, label: str, steps: Callable[[], int], stream: TextIO | None = None,
                 enabled: bool = True) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._label = label
        self._steps = steps
        self._enabled = enabled and self._stream.isatty()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_s = 0.0

    def start(self) -> None:
        self._start_s = time.monotonic()
        if self._enabled:
            self._thread = threading.Thread(target=self._run, name="whatif-progress", daemon=True)
            self._thread.start()

    def _line(self) -> str:
        return f"whatif record: {self._label}  {time.monotonic() - self._start_s:7.1f} s  step {self._steps()}"

    def _run(self) -> None:
        while not self._stop.wait(REFRESH_S):
            self._stream.write("\r\x1b[2K" + self._line() + "\r")
            self._stream.flush()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._stream.write("\r\x1b[2K")
            self._stream.flush()
            self._thread = None
