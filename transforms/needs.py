"""What a trace must hold for a transform to be worth trying: each :class:`Need` is one fact about
the graph and its context, checked by one function (an enum-keyed table). Transforms declare
theirs in ``Transform.requires``; ``whatif suggest`` lists a transform whose needs are unmet as
skipped, naming the need.

>>> Need.COLLECTIVES.value
'collective kernels (NCCL/RCCL)'
"""
from __future__ import annotations

from collections.abc import Callable
from enum import Enum

import numpy as np

from whatif.depgraph.graph import TaskGraph, TaskKind
from whatif.hardware.devices import find_device


class Need(Enum):
    """A precondition; the value says what the trace must hold."""

    GPU_KERNELS = "GPU kernels"
    KNOWN_GPU = "a GPU of the catalog (`whatif devices`)"
    COLLECTIVES = "collective kernels (NCCL/RCCL)"


def _has_kind(graph: TaskGraph, *kinds: TaskKind) -> bool:
    return bool(np.isin(graph.tasks["kind"].to_numpy(), [int(k) for k in kinds]).any())


_CHECKS: dict[Need, Callable[[TaskGraph, str | None], bool]] = {
    Need.GPU_KERNELS: lambda g, device: _has_kind(g, TaskKind.KERNEL),
    Need.KNOWN_GPU: lambda g, device: find_device(device) is not None,
    Need.COLLECTIVES: lambda g, device: _has_kind(g, TaskKind.COMM),
}


def unmet(needs: tuple[Need, ...], graph: TaskGraph, device: str | None) -> Need | None:
    """The first of ``needs`` that ``graph``, recorded on GPU ``device``, does not meet, or None."""
    return next((n for n in needs if not _CHECKS[n](graph, device)), None)
