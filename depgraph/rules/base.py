"""What a build step is: an :class:`EdgeRule` returns the edges of one kind; an
:class:`Adjustment` rewrites what earlier steps made (a duration, a latency, an attribution) or
adds tasks. Each declares the steps it reads (``needs``); :data:`whatif.depgraph.rules.RULES`
is checked to run them first."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from ..graph import EdgeKind
from ..state import BuildState, EdgeSet


class BuildStep(ABC):
    """One step of the build pipeline."""

    needs: ClassVar[tuple[type[BuildStep], ...]] = ()
    runs_last: ClassVar[bool] = False

    @abstractmethod
    def run(self, state: BuildState) -> None:
        """Apply this step to ``state``."""


class EdgeRule(BuildStep):
    """A dependency rule: reads the state, returns its edges (all of ``kind``)."""

    kind: ClassVar[EdgeKind]

    @abstractmethod
    def edges(self, state: BuildState) -> EdgeSet:
        """This rule's edges."""

    def run(self, state: BuildState) -> None:
        found = self.edges(state)
        if found.kind is not self.kind:
            raise TypeError(f"{type(self).__name__} declares {self.kind.name} edges but returned {found.kind.name}")
        state.edges[type(self)] = found


class Adjustment(BuildStep):
    """Rewrites durations, latencies or attribution that earlier steps made, or adds tasks."""

    @abstractmethod
    def apply(self, state: BuildState) -> None:
        """Rewrite ``state`` in place."""

    def run(self, state: BuildState) -> None:
        self.apply(state)


def check_order(steps: tuple[BuildStep, ...]) -> None:
    """Raise ``ValueError`` unless each step is declared once, after the steps it needs, and a
    step that runs last is last."""
    seen: set[type[BuildStep]] = set()
    for i, step in enumerate(steps):
        kind = type(step)
        if kind in seen:
            raise ValueError(f"{kind.__name__} is declared twice")
        if kind.runs_last and i != len(steps) - 1:
            raise ValueError(f"{kind.__name__} runs last, but {type(steps[i + 1]).__name__} follows it")
        missing = [n.__name__ for n in kind.needs if n not in seen]
        if missing:
            raise ValueError(f"{kind.__name__} runs before {', '.join(missing)}, which it needs")
        seen.add(kind)
