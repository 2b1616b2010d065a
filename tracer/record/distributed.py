"""Which rank this process is: from ``torch.distributed`` once initialized, else torchrun's
environment (``RANK``/``WORLD_SIZE``), else rank 0 of an unknown world size."""
from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RankInfo:
    """``distributedInfo`` as Kineto writes it (``rank``, ``world_size``, ``backend``).
    ``world_size`` is None when neither a process group nor the environment gives one (a process
    that is no member of a group, e.g. the parent of ``torch.multiprocessing.spawn`` workers): it
    is then left out of the trace, so that its file does not contradict the workers' world size.

    >>> RankInfo(0, None).as_kineto(), RankInfo(1, 2, "gloo").as_kineto()
    ({'rank': 0}, {'rank': 1, 'world_size': 2, 'backend': 'gloo'})
    """

    rank: int
    world_size: int | None
    backend: str | None = None

    @property
    def size(self) -> int:
        """The world size, 1 when unknown."""
        return self.world_size or 1

    def as_kineto(self) -> dict[str, Any]:
        info: dict[str, Any] = {"rank": self.rank}
        if self.world_size is not None:
            info["world_size"] = self.world_size
        if self.backend is not None:
            info["backend"] = self.backend
        return info


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.strip().isdigit() else default


def rank_from_env() -> RankInfo:
    """Rank and world size that torchrun (or any launcher using its variables) assigned."""
    size = _env_int("WORLD_SIZE", 0)
    return RankInfo(rank=_env_int("RANK", 0), world_size=size if size > 0 else None)


class DistributedWatcher:
    """Remembers rank, world size and backend when the program initializes its process group
    (programs often destroy it before exiting, when the trace is written)."""

    def __init__(self) -> None:
        self.seen: RankInfo | None = None
        self._original: Callable[..., Any] | None = None

    def install(self) -> None:
        import torch.distributed as dist
        if not dist.is_available():
            return
        original = dist.init_process_group
        watcher = self

        @functools.wraps(original)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            watcher.capture()
            return result

        self._original = original
        dist.init_process_group = init_process_group

    def uninstall(self) -> None:
        if self._original is not None:
            import torch.distributed as dist
            dist.init_process_group = self._original
            self._original = None

    def capture(self) -> None:
        """Read rank, world size and backend from an initialized default process group."""
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            self.seen = RankInfo(rank=dist.get_rank(), world_size=dist.get_world_size(),
                                 backend=str(dist.get_backend()))

    def current(self) -> RankInfo:
        self.capture()
        return self.seen if self.seen is not None else rank_from_env()
