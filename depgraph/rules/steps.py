"""Steps: every task belongs to a (rank, step), and each step has a measured window."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..state import BuildState
from .attribution import LauncherAttribution
from .base import Adjustment
from .collectives import CollectiveSplit
from .forkjoin import polling_threads


def other_process_tasks(state: BuildState) -> np.ndarray:
    """Per task: whether it runs in, or was launched from, a process of a several-process rank
    (``whatif record`` following children) other than the one whose ``ProfilerStep#N`` are the
    rank's steps: a front-end beside its engine core, a DataLoader worker beside the training loop."""
    other = np.zeros(len(state.tasks), dtype=bool)
    several = [info.rank for info in state.trace.ranks if len(info.files) > 1]
    if not several:
        return other
    event = state.column("event")
    pid_of_event = state.trace.events["pid"].to_numpy()
    owner = np.full(len(state.tasks), -1, dtype=np.int64)
    cpu = state.cpu_ids[event[state.cpu_ids] >= 0]
    owner[cpu] = pid_of_event[event[cpu]]
    launched = np.flatnonzero(state.launch_of >= 0)
    owner[launched] = owner[state.launch_of[launched]]
    ranks = state.column("rank")
    marker_rank = ranks[state.begin_ids]
    for r in several:
        stepping = np.unique(owner[state.begin_ids[marker_rank == r]])
        other |= (ranks == r) & (owner >= 0) & ~np.isin(owner, stepping)
    return other


class StepWindows(Adjustment):
    """Tasks outside any step annotation (other threads, unlaunched GPU work, collective arrivals)
    get the step whose window [begin, next begin) holds their start; a polling thread's
    (:func:`~.forkjoin.polling_threads`, a watchdog on a timer) do not: they do none of the step's
    work, and their timer, not the program, sets when they run, so they cannot complete a step.
    Nor do the tasks of a rank's other processes (:func:`other_process_tasks`): they run beside
    the steps, not in them."""

    needs = (LauncherAttribution, CollectiveSplit)

    def apply(self, state: BuildState) -> None:
        step = state.column("step").astype(np.int64).copy()
        ranks = state.column("rank")
        start = state.start_ns
        begin_ids, end_ids = state.begin_ids, state.end_ids
        resource = state.column("resource")
        cpu = state.cpu_ids
        polling = polling_threads(state, {th: cpu[resource[cpu] == th] for th in np.unique(resource[cpu]).tolist()})
        outside = ~np.isin(resource, np.asarray(sorted(polling), dtype=np.int64)) & ~other_process_tasks(state)
        b_rank = ranks[begin_ids]
        for r in np.unique(b_rank):
            sel = begin_ids[b_rank == r]
            sel = sel[np.argsort(start[sel], kind="stable")]
            begins = start[sel]
            numbers = step[sel]
            last_end = start[end_ids[b_rank == r]].max()
            todo = np.flatnonzero((ranks == r) & (step < 0) & outside & (start >= begins[0]) & (start < last_end))
            step[todo] = numbers[np.searchsorted(begins, start[todo], side="right") - 1]
        state.tasks["step"] = step


class SingleStep(Adjustment):
    """A rank without step annotations is one step, number 0, spanning its window."""

    def apply(self, state: BuildState) -> None:
        ranks = state.column("rank")
        stepped = set(ranks[state.begin_ids].tolist())
        for r in state.origin_of_rank:
            if r not in stepped:
                state.set_column("step", np.flatnonzero(ranks == r), 0)


def steps_table(state: BuildState) -> pd.DataFrame:
    """Per (rank, step): its begin/end marker tasks and measured window (the latest end of a task
    of the step). A rank without step annotations: its origin and the end of its last task."""
    ranks = state.column("rank")
    start, stop = state.start_ns, state.end_ns
    step = state.column("step")
    last_end = pd.Series(stop).groupby([ranks, step]).max()
    rows = []
    for b, e in zip(state.begin_ids.tolist(), state.end_ids.tolist()):
        r, k = int(ranks[b]), int(step[b])
        rows.append((r, k, b, e, int(start[b]), int(max(stop[e], last_end[(r, k)]))))
    stepped = {row[0] for row in rows}
    for r, origin in state.origin_of_rank.items():
        if r not in stepped:
            rows.append((r, 0, origin, -1, int(start[origin]), int(stop[ranks == r].max())))
    frame = pd.DataFrame(rows, columns=["rank", "step", "begin_task", "end_task", "measured_begin_ns",
                                        "measured_end_ns"])
    return frame.sort_values(["rank", "measured_begin_ns"], kind="stable").reset_index(drop=True)
