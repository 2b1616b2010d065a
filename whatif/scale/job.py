"""Rank-parallel analysis of a job of many ranks (issue 15): its rank files split into rank
groups, each group read, built and replayed in its own process (or Ray actor), the groups
coupled only where the ranks are, at their collectives.

The protocol (:func:`replay_job`):

1. **Read.** Every group reads its files (:func:`partition`: contiguous runs of the folder's
   sorted files, balanced by bytes) and returns their rank facts; the coordinator assigns every
   file's rank exactly as a one-process load does (:func:`~whatif.tracer.trace.assign_ranks`).
   A group keeps its trace in the trace cache (docs/scale.md), keyed by its files and its place
   in the job; when every group finds its entry, the ranks come from the entries, and when one
   does not, every group's files are parsed (ranks are assigned over all files at once).
2. **Build.** Every group makes its trace and tasks and runs the build steps before the
   collectives, returning its collective kernels; the coordinator matches them across all
   groups and aligns the clocks (:func:`~whatif.depgraph.rules.collectives.plan_collectives`),
   then each group finishes its build with its part of that plan. A group's graph is then the
   one-process graph's restriction to its ranks (every other edge rule links tasks of one rank).
3. **Replay.** A collective's barrier starts when its last member arrives, and every group
   holds the barriers it takes part in (:class:`~whatif.predictors.replay.ReplayEngine`):
   each group replays until it has reached every collective it can, the coordinator releases
   every collective that all its groups have reached, at its last arrival, and the groups go on:
   conservative, in rounds (as many as the longest chain of collectives, each round one message
   per group). Without shared resources the times a list scheduler gives do not depend on the
   order it takes ready tasks in, so every task's start and end equal the one-process replay's
   exactly (``tests/test_scale.py`` compares them task by task).

Graphs with shared resources (the links and units some transforms add) are not replayed this
way: their tasks are served in the global order of their ready times, which rank groups cannot
see; :func:`replay_job` analyzes traces as recorded.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import numpy as np
import pandas as pd

from whatif.core.errors import TraceError
from whatif.depgraph.rules.collectives import CollectiveCalls, CollectivePlan, plan_collectives
from whatif.tracer import cache
from whatif.tracer.trace import assign_ranks, trace_files

from .group import Arrived, GroupResult, Read, Stage
from .pool import InlinePool, Pool, ProcessPool
from .ray_backend import RayTarget


class Backend(Enum):
    INLINE = "inline"        # every group in this process, one after the other
    PROCESSES = "processes"  # one local process per group
    RAY = "ray"              # one Ray actor per group


@dataclass(frozen=True)
class ParallelOptions:
    """How a job is split and where its groups run.

    ``groups``: rank groups (0: :func:`default_groups`); more groups than cores bound each
    process's memory by fewer ranks. ``backend``: where they run;
    ``ray_address``: the Ray cluster for ``Backend.RAY`` (None: a local one, or
    ``WHATIF_RAY_ADDRESS``, :func:`~whatif.scale.ray_backend.ray_target`)."""

    groups: int = 0
    backend: Backend = Backend.PROCESSES
    ray_address: str | None = None


@dataclass(frozen=True)
class JobReplay:
    """A rank-parallel replay of a job: its ranks and groups, sizes, the replay's step times (the
    one-process :func:`~whatif.predictors.steps.step_times` rows, rank by rank), the rounds of
    collective releases, wall seconds per stage (and ``coordinator_cpu``, this process's CPU time
    across them: rank assignment, the collective plan, the rounds), and per group its seconds and
    peak memory;
    ``task_times`` when asked for (:func:`~whatif.scale.group.task_times`, every group's)."""

    path: Path
    groups: list[GroupResult]
    collectives: int
    rounds: int
    seconds: dict[str, float]
    task_times: pd.DataFrame | None = field(default=None, repr=False)

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(sorted(r for g in self.groups for r in g.ranks))

    @property
    def tasks(self) -> int:
        return sum(g.tasks for g in self.groups)

    @property
    def edges(self) -> int:
        return sum(g.edges for g in self.groups)

    @property
    def events(self) -> int:
        return sum(g.events for g in self.groups)

    @property
    def steps(self) -> pd.DataFrame:
        frames = [g.steps for g in self.groups if len(g.steps)]
        if not frames:
            return self.groups[0].steps if self.groups else pd.DataFrame()
        return pd.concat(frames, ignore_index=True).sort_values(["rank", "step"], kind="stable").reset_index(drop=True)


GROUP_TEXT_BYTES = 256 * 2**20
"""Trace text per rank group by default. A group's peak resident memory is about 4.2 bytes per
byte of trace text it reads (generated A100 jobs: 16 ranks, 124 MB of JSON, 650 MiB peak, of
which ~125 MiB is the interpreter and libraries), so 256 MiB of text keeps a group near 1.2 GiB."""


def text_bytes(path: Path) -> int:
    """The bytes of trace text in ``path``: a gzip file's uncompressed size (its trailer's
    ISIZE, modulo 4 GiB as gzip keeps it), else the file's size.

    >>> import gzip, tempfile
    >>> f = Path(tempfile.mkdtemp()) / "t.json.gz"
    >>> _ = f.write_bytes(gzip.compress(b"x" * 1000))
    >>> text_bytes(f)
    1000
    """
    size = path.stat().st_size
    if path.suffix == ".gz" and size >= 18:
        with path.open("rb") as f:
            f.seek(-4, 2)
            return int.from_bytes(f.read(4), "little") or size
    return size


def default_groups(paths: list[Path]) -> int:
    """Rank groups for ``paths`` when none are asked for: one per CPU core, more when the trace
    text exceeds :data:`GROUP_TEXT_BYTES` per group, at most one per file."""
    text = sum(text_bytes(p) for p in paths)
    return max(1, min(len(paths), max(os.cpu_count() or 1, -(-text // GROUP_TEXT_BYTES))))


def partition(paths: list[Path], groups: int) -> list[list[Path]]:
    """``paths`` (in order) as at most ``groups`` contiguous runs of about equal bytes; never an
    empty run.

    >>> [len(c) for c in partition([Path(f"/nonexistent/{i}") for i in range(5)], 2)]
    [2, 3]
    """
    if groups < 1:
        raise ValueError("groups must be at least 1")
    sizes = np.asarray([p.stat().st_size if p.exists() else 1 for p in paths], dtype=np.float64)
    groups = min(groups, len(paths))
    if groups <= 1:
        return [list(paths)]
    edges = np.cumsum(sizes) - sizes / 2  # each file's middle byte
    cut = np.minimum((edges / sizes.sum() * groups).astype(np.int64), groups - 1)
    cut = np.maximum.accumulate(np.minimum(cut, np.arange(len(paths))))  # non-decreasing, room for each
    out = [[p for p, c in zip(paths, cut) if c == k] for k in range(groups)]
    return [c for c in out if c]


def _pool(chunks: list[list[Path]], options: ParallelOptions) -> Pool:
    if options.backend is Backend.INLINE:
        return InlinePool(chunks)
    if options.backend is Backend.RAY:
        from .ray_pool import RayPool
        return RayPool(chunks, RayTarget(options.ray_address))
    return ProcessPool(chunks)


def replay_job(path: str | Path, options: ParallelOptions = ParallelOptions(), with_tasks: bool = False,
               progress: Callable[[str], None] | None = None) -> JobReplay:
    """Read, build and replay the job at ``path`` rank-parallel (see the module docstring).

    Parameters
    ----------
    path : a folder of per-rank traces (or one trace file: one group).
    options : groups and backend (:class:`ParallelOptions`).
    with_tasks : also return every task's times (for comparing with a one-process replay).
    progress : called with a line saying what runs now.

    Raises
    ------
    TraceError
        A file cannot be read or analyzed, ranks are inconsistent, or one rank's files (its
        processes) fall in two groups (use fewer groups).
    GraphError
        The graph has a cycle (a collective is never reached by all its ranks).

    >>> job = replay_job("../shared/traces/hta/sampled_world128", ParallelOptions(groups=2))  # doctest: +SKIP
    >>> job.ranks, job.collectives  # doctest: +SKIP
    ((0, 1), 10)
    """
    path = Path(path)
    say = progress or (lambda _line: None)
    files = trace_files(path)
    chunks = partition(files, options.groups or default_groups(files))
    with _pool(chunks, options) as pool:
        t0, c0 = time.perf_counter(), time.process_time()
        say(f"reading {len(files)} files in {len(chunks)} rank groups")
        places = _places(chunks)
        use_cache = cache.enabled()
        reads: list[Read] = pool.each(Stage.READ, [(p, use_cache) for p in places])
        if not all(r.ranks is not None for r in reads):  # some group parsed: every file's facts are needed
            reads = pool.each(Stage.READ, [(p, False) for p in places])
        if all(r.ranks is not None for r in reads):
            ranks = [x for r in reads for x in (r.ranks or [])]
        else:
            ranks = assign_ranks([f for r in reads for f in (r.facts or [])])
        per_group = _ranks_per_group(path, chunks, ranks)
        t1 = time.perf_counter()
        say(f"building the graphs of {len(set(ranks))} ranks")
        calls = CollectiveCalls.concat(pool.each(Stage.BUILD, [(r,) for r in per_group]))
        plan = plan_collectives(calls)
        pool.each(Stage.LINK, [(plan.for_owner(calls, i),) for i in range(len(chunks))])
        t2 = time.perf_counter()
        say(f"replaying: {len(plan.members)} collectives across the groups")
        rounds = _replay_rounds(pool, plan, calls, len(chunks))
        results: list[GroupResult] = pool.each(Stage.FINISH, [(with_tasks,)] * len(chunks))
        t3 = time.perf_counter()
    seconds = {"read": t1 - t0, "build": t2 - t1, "replay": t3 - t2, "coordinator_cpu": time.process_time() - c0}
    times = pd.concat([r.task_times for r in results if r.task_times is not None], ignore_index=True) \
        if with_tasks else None
    return JobReplay(path=path, groups=results, collectives=len(plan.members), rounds=rounds, seconds=seconds,
                     task_times=times)


def _places(chunks: list[list[Path]]) -> list[str]:
    """Each group's place in its job (what else, besides its files, decides its ranks): its first
    file's index, its files and the job's."""
    total, at, out = sum(len(c) for c in chunks), 0, []
    for c in chunks:
        out.append(f"files {at}..{at + len(c) - 1} of {total}")
        at += len(c)
    return out


def _ranks_per_group(path: Path, chunks: list[list[Path]], ranks: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    owner: dict[int, int] = {}
    at = 0
    for i, chunk in enumerate(chunks):
        mine = ranks[at:at + len(chunk)]
        at += len(chunk)
        for r in set(mine):
            if owner.setdefault(r, i) != i:
                raise TraceError(path, f"rank {r}'s files (its processes) fall in rank groups {owner[r]} and {i}: "
                                       f"use fewer groups")
        out.append(mine)
    return out


def _replay_rounds(pool: Pool, plan: CollectivePlan, calls: CollectiveCalls, groups: int) -> int:
    """Replay every group until each collective is reached by all its groups, release it at its
    last arrival, and go on; returns the number of rounds that released collectives."""
    holders = [sorted(set(calls.owner[m].tolist())) for m in plan.members]
    waiting = [set(h) for h in holders]
    ready = np.full(len(plan.members), np.iinfo(np.int64).min, dtype=np.int64)
    arrived: list[list[Arrived]] = pool.each(Stage.ADVANCE, [([],)] * groups)
    rounds = 0
    while True:
        releases: list[list[Arrived]] = [[] for _ in range(groups)]
        for i, reached in enumerate(arrived):
            for a in reached:
                ready[a.group] = max(int(ready[a.group]), a.ready_ns)
                waiting[a.group].discard(i)
                if not waiting[a.group]:
                    for j in holders[a.group]:
                        releases[j].append(Arrived(a.group, int(ready[a.group])))
        if not any(releases):
            return rounds
        rounds += 1
        arrived = pool.each(Stage.ADVANCE, [(r,) for r in releases])
