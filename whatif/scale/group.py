"""One rank group of a job: the files of some ranks read, their graph built and replayed in one
process, and what crosses to the other groups (collectives) exchanged through the coordinator
(:mod:`whatif.scale.job`).

A group goes through :class:`Stage` in order: ``READ`` its files (their rank facts go to the
coordinator, which assigns every file's rank), ``BUILD`` the graph up to the collectives (its
collective kernels go to the coordinator, which matches them across all groups and aligns the
clocks), ``LINK`` (its part of that plan: the rest of the build; the barriers of collectives are
*held* by its :class:`~whatif.predictors.replay.ReplayEngine`), ``ADVANCE`` as often as needed
(release the barriers every group has reached, replay on to the next ones), and ``FINISH``
(its replay's step times and, on request, every task's times keyed so that they can be compared
with a one-process replay).
"""
from __future__ import annotations

import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

import numpy as np
import pandas as pd

from whatif.core.errors import WhatifError
from whatif.depgraph.build import assemble, split_rules
from whatif.depgraph.graph import TaskGraph, TaskKind
from whatif.depgraph.rules import ClockAlignment
from whatif.depgraph.rules.collectives import CollectiveCalls
from whatif.depgraph.schema import check_schema
from whatif.depgraph.state import BuildState, LocalCollectives
from whatif.depgraph.tasks import initial_state
from whatif.predictors.replay import HeldTask, ReplayEngine
from whatif.predictors.steps import step_times
from whatif.tracer.readers import FileTrace
from whatif.tracer.trace import FileFacts, Trace, cache_trace, cached_trace, read_usable, trace_of_files

BEFORE_COLLECTIVES, FROM_COLLECTIVES = split_rules(ClockAlignment)


class Stage(Enum):
    READ = "read"
    BUILD = "build"
    LINK = "link"
    ADVANCE = "advance"
    FINISH = "finish"


@dataclass(frozen=True)
class Read:
    """What a group read: its files' rank facts when it parsed them, else (a cached trace) the
    rank of each of its files."""

    facts: list[FileFacts] | None
    ranks: list[int] | None


@dataclass(frozen=True)
class Arrived:
    """A collective (``group``: its index in the job's plan) that every member of this rank
    group has reached; ``ready_ns``: when the last of them arrived."""

    group: int
    ready_ns: int


@dataclass(frozen=True)
class GroupResult:
    """What a rank group reports at the end: its ranks, sizes (``tasks`` without its copies of
    barriers that another group's rank holds), the replay's step times
    (:func:`~whatif.predictors.steps.step_times` rows of its ranks), wall and CPU seconds per stage, peak
    resident memory, and with ``tasks`` every task's times (:func:`task_times`)."""

    ranks: tuple[int, ...]
    tasks: int
    edges: int
    events: int
    steps: pd.DataFrame
    seconds: dict[str, float]
    cpu_seconds: dict[str, float]
    peak_mib: float
    task_times: pd.DataFrame | None


@dataclass
class RankGroup:
    """The state of one rank group between the coordinator's calls; :meth:`call` runs a stage."""

    index: int
    paths: list[Path]
    files: list[FileTrace] = field(default_factory=list)
    facts: list[FileFacts] = field(default_factory=list)
    key: str | None = None  # the cache key of this group's trace (None: not cached)
    trace: Trace | None = None
    state: BuildState | None = None
    graph: TaskGraph | None = None
    engine: ReplayEngine | None = None
    barrier_of_group: dict[int, int] = field(default_factory=dict)  # plan group -> held barrier task
    reached: dict[int, HeldTask] = field(default_factory=dict)       # plan group -> this group's arrival
    seconds: dict[str, float] = field(default_factory=dict)      # wall, per stage
    cpu_seconds: dict[str, float] = field(default_factory=dict)  # this process's CPU, per stage

    def call(self, stage: Stage, *args: object) -> object:
        """Run ``stage`` with its arguments (the one entry point every backend calls)."""
        t0, c0 = time.perf_counter(), time.process_time()
        run: dict[Stage, Callable[..., object]] = {Stage.READ: self.read, Stage.BUILD: self.build,
                                                   Stage.LINK: self.link, Stage.ADVANCE: self.advance,
                                                   Stage.FINISH: self.finish}
        try:
            return run[stage](*args)
        finally:
            self.seconds[stage.value] = self.seconds.get(stage.value, 0.0) + time.perf_counter() - t0
            self.cpu_seconds[stage.value] = self.cpu_seconds.get(stage.value, 0.0) + time.process_time() - c0

    def read(self, place: str, use_cache: bool) -> Read:
        """With ``use_cache``, this group's trace from the cache (keyed by its files and
        ``place``, its place in the job), and the ranks it holds; else (or without an entry) its
        files parsed, and their rank facts. Parsed once: a second call returns the same facts."""
        if use_cache and not self.facts:
            self.key, self.trace = cached_trace(self.paths, salt=f"rank group {place}")
            if self.trace is not None:
                rank_of = {p: info.rank for info in self.trace.ranks for p in info.files}
                return Read(facts=None, ranks=[rank_of[p] for p in self.paths])
        if not self.facts:
            self.trace = None
            self.files = read_usable(self.paths)
            self.facts = [FileFacts.of(ft) for ft in self.files]
        return Read(facts=self.facts, ranks=None)

    def build(self, ranks: list[int]) -> CollectiveCalls:
        """The trace of this group's files with the ranks the coordinator assigned (kept in the
        cache when it was parsed), its tasks and every build step before the collectives;
        returns its collective kernels."""
        if self.trace is None:
            self.trace = trace_of_files(self.files, ranks)
            self.files = []
            if self.key is not None:
                cache_trace(self.key, self.trace, self.paths)
        state = initial_state(self.trace)
        for step in BEFORE_COLLECTIVES:
            step.run(state)
        self.state = state
        return CollectiveCalls.of(state, owner=self.index)

    def link(self, local: LocalCollectives) -> int:
        """The rest of the build with this group's part of the job's collective plan; the
        barriers are held by the replay engine. Returns the number of tasks."""
        state = self._state()
        state.collective_plan = local
        for step in FROM_COLLECTIVES:
            step.run(state)
        self.graph = check_schema(assemble(state))
        barriers = np.unique(state.arrivals.barrier)  # one per local group, in the plan's order
        self.barrier_of_group = dict(zip(local.group.tolist(), barriers.tolist()))
        self.engine = ReplayEngine(self.graph, held=barriers)
        self.state = None
        return len(self.graph.tasks)

    def advance(self, releases: list[Arrived]) -> list[Arrived]:
        """Release the barriers of ``releases`` (every group's members have arrived), replay on;
        returns the collectives this group has now reached."""
        engine = self._engine()
        for r in releases:
            mine = self.reached.pop(r.group)
            # The barrier's start is set by this group's last arrival when that is the job's last.
            engine.release(self.barrier_of_group[r.group], r.ready_ns,
                           by_edge=mine.by_edge if mine.ready_ns == r.ready_ns else -1)
        group_of = {b: g for g, b in self.barrier_of_group.items()}
        out = []
        for h in engine.run():
            self.reached[group_of[h.task]] = h
            out.append(Arrived(group_of[h.task], h.ready_ns))
        return out

    def finish(self, with_tasks: bool) -> GroupResult:
        engine, graph, trace = self._engine(), self.graph, self.trace
        assert graph is not None and trace is not None
        replayed = engine.result()
        ranks = tuple(r.rank for r in trace.ranks)
        steps = step_times(replayed)
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t = graph.tasks
        copies = int(((t["kind"] == int(TaskKind.BARRIER)) & ~t["rank"].isin(ranks)).sum())
        return GroupResult(ranks=ranks, tasks=len(t) - copies, edges=len(graph.edges), events=len(trace.events),
                           steps=steps, seconds=dict(self.seconds), cpu_seconds=dict(self.cpu_seconds),
                           peak_mib=peak_kib / 1024,
                           task_times=task_times(graph, replayed.start_ns, replayed.end_ns) if with_tasks else None)

    def _state(self) -> BuildState:
        if self.state is None:
            raise WhatifError(f"rank group {self.index}: linked before it was built")
        return self.state

    def _engine(self) -> ReplayEngine:
        if self.engine is None:
            raise WhatifError(f"rank group {self.index}: replayed before it was linked")
        return self.engine


def task_times(graph: TaskGraph, start_ns: np.ndarray, end_ns: np.ndarray) -> pd.DataFrame:
    """Every task's replayed times under a key that names the same task in a one-process graph
    and in a rank group's: ``rank``, ``kind``, ``event_in_rank`` (the row of its event among its
    rank's events, -1 for none) and ``nth`` (its place among the tasks of the same three, by
    measured start then id). Barriers are kept by the group that holds their rank only.

    >>> import pandas as pd
    >>> from whatif.depgraph.graph import TaskGraph
    >>> tasks = pd.DataFrame({"rank": [0, 0, 1], "kind": [1, 1, 1], "event": [0, 0, 3], "measured_start_ns": [5, 2, 1]})
    >>> g = TaskGraph(tasks=tasks, edges=pd.DataFrame(), resources=pd.DataFrame(), steps=pd.DataFrame())
    >>> task_times(g, np.array([10, 20, 30]), np.array([11, 21, 31])).to_dict("list")["nth"]
    [0, 1, 0]
    """
    t = graph.tasks
    ranks = t["rank"].to_numpy().astype(np.int64)
    event = t["event"].to_numpy().astype(np.int64)
    first_event: dict[int, int] = {}
    if graph.trace is not None and len(graph.trace.events):
        ev_rank = graph.trace.events["rank"].to_numpy()
        starts = np.flatnonzero(np.r_[True, ev_rank[1:] != ev_rank[:-1]])
        first_event = {int(ev_rank[i]): int(i) for i in starts}
    base = np.asarray([first_event.get(int(r), 0) for r in ranks], dtype=np.int64)
    frame = pd.DataFrame({"rank": ranks, "kind": t["kind"].to_numpy().astype(np.int64),
                          "event_in_rank": np.where(event >= 0, event - base, -1),
                          "measured_start_ns": t["measured_start_ns"].to_numpy().astype(np.int64),
                          "id": np.arange(len(t)), "start_ns": start_ns, "end_ns": end_ns})
    if graph.trace is not None:
        held = {r.rank for r in graph.trace.ranks}
        frame = frame[(frame["kind"] != int(TaskKind.BARRIER)) | frame["rank"].isin(held)]
    frame = frame.sort_values(["rank", "kind", "event_in_rank", "measured_start_ns", "id"], kind="stable")
    frame["nth"] = frame.groupby(["rank", "kind", "event_in_rank"]).cumcount()
    return frame[["rank", "kind", "event_in_rank", "nth", "start_ns", "end_ns"]].reset_index(drop=True)
