"""Where the rank groups of a job run: :class:`InlinePool` (this process, one group after the
other: tests and one-worker runs), :class:`ProcessPool` (one local process per group, the
default) and :class:`RayPool` (one Ray actor per group, for a cluster). All three run the same
:class:`~whatif.scale.group.RankGroup` code through :meth:`RankGroup.call`, and
:meth:`Pool.each` gives the results in group order, so a job's result does not depend on the
backend.
"""
from __future__ import annotations

import multiprocessing as mp
import traceback
from abc import ABC, abstractmethod
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from whatif.core.errors import WhatifError

from .group import RankGroup, Stage


class Pool(ABC):
    """Rank groups, one per list of files, and a way to run a stage in all of them at once."""

    @abstractmethod
    def each(self, stage: Stage, args: list[tuple[Any, ...]]) -> list[Any]:
        """Run ``stage`` in every group (``args[i]`` for group ``i``); results in group order.

        Raises
        ------
        WhatifError
            A group failed: its error, as raised there (a :class:`WhatifError` keeps its type).
        """

    @abstractmethod
    def close(self) -> None:
        """Stop the groups (their memory is freed)."""

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InlinePool(Pool):
    """Every group in this process, one after the other."""

    def __init__(self, chunks: list[list[Path]]) -> None:
        self.groups = [RankGroup(i, paths) for i, paths in enumerate(chunks)]

    def each(self, stage: Stage, args: list[tuple[Any, ...]]) -> list[Any]:
        return [g.call(stage, *a) for g, a in zip(self.groups, args)]

    def close(self) -> None:
        self.groups = []


def _serve(conn: Connection, index: int, paths: list[Path]) -> None:
    group = RankGroup(index, paths)
    while True:
        msg = conn.recv()
        if msg is None:
            break
        stage, args = msg
        try:
            conn.send((True, group.call(stage, *args)))
        except WhatifError as exc:
            conn.send((False, exc))
        except Exception as exc:  # noqa: BLE001 - reported to the coordinator, which raises it
            conn.send((False, WhatifError(f"rank group {index} failed: {type(exc).__name__}: {exc}\n"
                                          f"{traceback.format_exc()}")))
    conn.close()


class ProcessPool(Pool):
    """One local process per group (``fork`` where the platform has it: no re-import), each
    holding only its own ranks' trace, graph and replay."""

    def __init__(self, chunks: list[list[Path]]) -> None:
        methods = mp.get_all_start_methods()
        ctx: Any = mp.get_context("fork" if "fork" in methods else "spawn")
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        for i, paths in enumerate(chunks):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(child, i, paths), daemon=True, name=f"whatif-rank-group-{i}")
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)

    def each(self, stage: Stage, args: list[tuple[Any, ...]]) -> list[Any]:
        for conn, a in zip(self.conns, args):
            conn.send((stage, a))
        out, failed = [], None
        for i, conn in enumerate(self.conns):
            try:
                ok, value = conn.recv()
            except EOFError:
                ok, value = False, WhatifError(f"rank group {i}: its process died (out of memory?)")
            if not ok and failed is None:
                failed = value
            out.append(value)
        if failed is not None:
            raise failed
        return out

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
        self.conns, self.procs = [], []
