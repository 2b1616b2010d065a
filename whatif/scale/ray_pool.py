"""Rank groups as Ray actors (:class:`RayPool`): the same :class:`~whatif.scale.group.RankGroup`
code, one actor per group, on the cluster at an address (``--ray ADDRESS``,
``WHATIF_RAY_ADDRESS``) or on a local one started for the job and stopped after it. Ray is an
optional extra (:mod:`.ray_backend`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .group import RankGroup, Stage
from .pool import Pool
from .ray_backend import RayTarget, connect


class RayPool(Pool):
    """One Ray actor per rank group; :meth:`each` calls every actor at once and waits for all."""

    def __init__(self, chunks: list[list[Path]], target: RayTarget) -> None:
        self._ray, self._started = connect(target)
        # No CPU reserved: more groups than cores is how a job's memory is spread (an actor per
        # core would leave the rest unscheduled and the job waiting); spread over the nodes.
        actor = self._ray.remote(num_cpus=0, scheduling_strategy="SPREAD")(RankGroup)
        self.actors = [actor.remote(i, paths) for i, paths in enumerate(chunks)]

    def each(self, stage: Stage, args: list[tuple[Any, ...]]) -> list[Any]:
        return list(self._ray.get([a.call.remote(stage, *x) for a, x in zip(self.actors, args)]))

    def close(self) -> None:
        for a in self.actors:
            self._ray.kill(a)
        self.actors = []
        if self._started:
            self._ray.shutdown()
