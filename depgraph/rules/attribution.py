"""GPU work belongs where its launch was made: the launch call's step, phase, layer and op."""
from __future__ import annotations

from ..state import BuildState
from .base import Adjustment


class LauncherAttribution(Adjustment):
    """GPU tasks take ``step``/``phase``/``layer``/``op`` from the call that launched them."""

    def apply(self, state: BuildState) -> None:
        launcher = state.launch_of[state.gpu_ids]
        launched = launcher >= 0
        gpu, call = state.gpu_ids[launched], launcher[launched]
        for column in ("step", "phase", "layer", "op"):
            state.copy_rows(column, gpu, call)
