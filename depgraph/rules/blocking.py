"""A copy call that returns only after its copy (``cudaMemcpy`` to pageable memory) is two tasks:
the call issues the copy, then its WAIT task (made with the tasks) waits for it."""
from __future__ import annotations

from ..state import BuildState
from .base import Adjustment


class BlockingCallIssue(Adjustment):
    """The call of a blocking copy ends, and lasts, until its copy is queued."""

    def apply(self, state: BuildState) -> None:
        b = state.blocking
        issue_dur_ns = b.issue_end_ns - state.start_ns[b.call]
        state.set_column("measured_end_ns", b.call, b.issue_end_ns)
        state.set_column("dur_ns", b.call, issue_dur_ns)
