"""One function over many items, in chunks, on workers that are each set up once: in this
process, on local processes (``concurrent.futures``), or on Ray actors.

A worker runs ``setup(state)`` once (the state is shipped once per worker: inherited or pickled
by the process pool's initializer, ``ray.put`` once and handed to every actor), then
``work(worker, chunk)`` for each chunk it is given. Results come back in the items' order, however
the chunks finish, so every backend gives the same list.

>>> def setup(offset):
...     return offset
>>> def work(offset, chunk):
...     return [offset + x for x in chunk]
>>> map_chunks(setup, 10, work, [1, 2, 3], Execution(jobs=1))
[11, 12, 13]
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .ray_backend import RayTarget, connected

S = TypeVar("S")
W = TypeVar("W")
I = TypeVar("I")  # noqa: E741
R = TypeVar("R")

CHUNKS_PER_WORKER = 4  # more chunks than workers, so that a slow chunk does not leave the others idle


@dataclass(frozen=True)
class Execution:
    """Where the work runs: ``jobs`` local processes (0: one per CPU core, 1: in this process),
    or, with ``ray`` set, that many Ray actors (0: one per CPU of the cluster); ``ray_cpus``: the
    CPUs of a local Ray cluster started for the work (None: all)."""

    jobs: int = field(default=0, metadata={"minimum": 0, "help": "worker processes (0: one per CPU core; "
                                                                 "1: in this process; with --ray: actors, "
                                                                 "0: one per CPU of the cluster)"})
    ray: RayTarget | None = None
    ray_cpus: int | None = None

    def local_workers(self) -> int:
        return self.jobs or os.cpu_count() or 1


def chunked(items: Sequence[I], workers: int) -> list[list[I]]:
    """``items`` cut into about ``CHUNKS_PER_WORKER`` chunks per worker, in order.

    >>> chunked(list(range(10)), 1)
    [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    """
    size = max(1, math.ceil(len(items) / (max(workers, 1) * CHUNKS_PER_WORKER)))
    return [list(items[i:i + size]) for i in range(0, len(items), size)]


def map_chunks(setup: Callable[[S], W], state: S, work: Callable[[W, list[I]], list[R]], items: Sequence[I],
               execution: Execution, progress: Callable[[int], None] | None = None) -> list[R]:
    """``work``'s results for every item, in the items' order (see the module docstring);
    ``progress(done)`` is called with the number of items done after each chunk. ``setup`` and
    ``work`` must be module-level functions (they are pickled by reference)."""
    report = progress or (lambda _done: None)
    if not items:
        return []
    if execution.ray is not None:
        return _on_ray(setup, state, work, items, execution, report)
    workers = min(execution.local_workers(), len(items))
    if workers <= 1:
        worker = setup(state)
        out: list[R] = []
        for chunk in chunked(items, 1):
            out += work(worker, chunk)
            report(len(out))
        return out
    chunks = chunked(items, workers)
    results: dict[int, list[R]] = {}
    done = 0
    with ProcessPoolExecutor(max_workers=workers, initializer=_init_process, initargs=(setup, state)) as pool:
        futures = {pool.submit(_run_in_process, work, chunk): i for i, chunk in enumerate(chunks)}
        for future in as_completed(futures):
            results[futures[future]] = future.result()
            done += len(results[futures[future]])
            report(done)
    return [r for i in range(len(chunks)) for r in results[i]]


_PROCESS_WORKER: Any = None


def _init_process(setup: Callable[[Any], Any], state: Any) -> None:
    global _PROCESS_WORKER
    _PROCESS_WORKER = setup(state)


def _run_in_process(work: Callable[[Any, list[Any]], list[Any]], chunk: list[Any]) -> list[Any]:
    return work(_PROCESS_WORKER, chunk)


class _RayWorker:
    """A Ray actor holding one set-up worker (``setup`` ran once, on the state from the object store)."""

    def __init__(self, setup: Callable[[Any], Any], state: Any) -> None:
        self.worker = setup(state)

    def run(self, index: int, work: Callable[[Any, list[Any]], list[Any]], chunk: list[Any]) -> tuple[int, list[Any]]:
        return index, work(self.worker, chunk)


def _on_ray(setup: Callable[[S], W], state: S, work: Callable[[W, list[I]], list[R]], items: Sequence[I],
            execution: Execution, report: Callable[[int], None]) -> list[R]:
    assert execution.ray is not None
    with connected(execution.ray, num_cpus=execution.ray_cpus) as ray:
        workers = min(execution.jobs or max(1, int(ray.cluster_resources().get("CPU", 1))), len(items))
        actor = ray.remote(num_cpus=1)(_RayWorker)
        state_ref = ray.put(state)
        actors = [actor.remote(setup, state_ref) for _ in range(workers)]
        chunks = chunked(items, workers)
        pending: dict[Any, Any] = {}
        queue = list(enumerate(chunks))
        idle = list(actors)
        results: dict[int, list[R]] = {}
        done = 0
        while queue or pending:
            while idle and queue:
                a = idle.pop()
                i, chunk = queue.pop(0)
                pending[a.run.remote(i, work, chunk)] = a
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                idle.append(pending.pop(ref))
                i, out = ray.get(ref)
                results[i] = out
                done += len(out)
                report(done)
        for a in actors:
            ray.kill(a)
    return [r for i in range(len(chunks)) for r in results[i]]
