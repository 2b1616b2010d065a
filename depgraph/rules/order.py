"""Program order on a resource: consecutive tasks of a thread or a stream."""
from __future__ import annotations

import numpy as np

from ..state import BuildState


def consecutive_pairs(group: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(prev, cur) task pairs that follow each other within the same group, in ``order``.

    >>> [p.tolist() for p in consecutive_pairs(np.array([0, 0, 1, 1]), np.array([1, 0, 2, 3]))]
    [[1, 2], [0, 3]]
    """
    g = group[order]
    same = g[1:] == g[:-1]
    return order[:-1][same], order[1:][same]


def stream_pairs(state: BuildState) -> tuple[np.ndarray, np.ndarray]:
    """(prev, cur) GPU tasks that follow each other on a stream (by measured start, then end)."""
    gpu = state.gpu_ids
    resource = state.column("resource")
    start, end = state.start_ns, state.end_ns
    return consecutive_pairs(resource, gpu[np.lexsort((end[gpu], start[gpu], resource[gpu]))])
