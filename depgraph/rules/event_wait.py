"""Stream waits: ``cudaStreamWaitEvent`` makes the first work launched on the waiting stream
after the call wait for the work the named ``cudaEventRecord`` captured on another stream."""
from __future__ import annotations

from ..graph import EdgeKind
from ..state import BuildState, EdgeSet
from .base import EdgeRule
from .blocking import BlockingCallIssue
from .sync_lookup import STREAM_WAIT, SyncLookup


class EventWaits(EdgeRule):
    """EVENT_WAIT edges: recorded work -> the first work after the wait on the waiting stream; latency 0."""

    kind = EdgeKind.EVENT_WAIT
    needs = (BlockingCallIssue,)

    def edges(self, state: BuildState) -> EdgeSet:
        look = SyncLookup(state)
        rep = state.report
        src: list[int] = []
        dst: list[int] = []
        for c in look.calls_named(STREAM_WAIT):
            rec = look.record_of(c)
            if rec is None:
                rep["stream_waits_without_sync_record"] += 1
                continue
            rank = int(look.ranks[c])
            waiting = look.index.find(rank, rec.device, rec.stream)
            first = look.index.first_after(waiting, int(state.start_ns[c])) if waiting is not None else -1
            recorded = look.record_target(rank, rec, int(state.start_ns[first])) if first >= 0 else -1
            if recorded < 0 or first < 0:
                rep["stream_waits_with_nothing_to_wait_for"] += 1
                continue
            src.append(recorded)
            dst.append(first)
        rep["stream_waits_linked"] = len(src)
        return EdgeSet.of(self.kind, src, dst, [0] * len(src))
