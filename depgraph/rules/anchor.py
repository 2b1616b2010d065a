"""Anchors: the only measured start a replay reads is each rank's origin."""
from __future__ import annotations

import numpy as np

from ..graph import EdgeKind, TaskKind
from ..state import BuildState, EdgeSet
from .base import EdgeRule


class AnchorRoots(EdgeRule):
    """ANCHOR edges: the rank's ORIGIN -> every other task with no predecessor; latency = its
    measured offset. Runs last: a root is a task no other rule gave a predecessor."""

    kind = EdgeKind.ANCHOR
    runs_last = True

    def edges(self, state: BuildState) -> EdgeSet:
        dst = np.concatenate([found.dst for found in state.edges.values()]) if state.edges \
            else np.empty(0, dtype=np.int64)
        indeg = np.bincount(dst, minlength=len(state.tasks))
        roots = np.flatnonzero((indeg == 0) & (state.column("kind") != int(TaskKind.ORIGIN)))
        origin = np.asarray([state.origin_of_rank[int(r)] for r in state.column("rank")[roots]], dtype=np.int64)
        start = state.start_ns
        state.report["roots_anchored"] = len(roots)
        return EdgeSet.of(self.kind, origin, roots, start[roots] - start[origin])
