"""Routers: which replica a new request (or, disaggregated, a handed-over sequence) joins.
Registered by :class:`RouterName` key like the scheduling policies (a new router is one module
with a :class:`Router` subclass, see docs/extending.md).

>>> ROUTERS.names()
('least_loaded', 'round_robin')
"""
from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from enum import Enum
from typing import ClassVar

from whatif.core.registry import EnumRegistry

from .arrivals import WorkloadError
from .scheduler import ReplicaState


class RouterName(str, Enum):
    """Keys of the built-in routers (the names ``--router`` takes)."""

    LEAST_LOADED = "least_loaded"
    ROUND_ROBIN = "round_robin"


class Router(ABC):
    """Picks one of ``replicas`` for each arriving sequence."""

    key: ClassVar[Enum]

    def __init__(self, replicas: list[ReplicaState]) -> None:
        self.replicas = replicas

    @abstractmethod
    def pick(self) -> ReplicaState:
        """The replica the next sequence joins."""


ROUTERS: EnumRegistry[type[Router]] = EnumRegistry("router", Router, entry_point_group="whatif.serving_routers",
                                                   error=WorkloadError)
register_router = ROUTERS.register


@register_router
class LeastLoaded(Router):
    """The replica with the fewest waiting and running sequences (lowest index on ties)."""

    key = RouterName.LEAST_LOADED

    def pick(self) -> ReplicaState:
        return min(self.replicas, key=lambda r: (r.load, r.index))


@register_router
class RoundRobin(Router):
    """Each replica in turn."""

    key = RouterName.ROUND_ROBIN

    def __init__(self, replicas: list[ReplicaState]) -> None:
        super().__init__(replicas)
        self._next = itertools.cycle(range(len(replicas)))

    def pick(self) -> ReplicaState:
        return self.replicas[next(self._next)]
