"""Steps: every task belongs to a (rank, step), and each step has a measured window."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..state import BuildState
from .attribution import LauncherAttribution
from .base import Adjustment
from .collectives import CollectiveSplit
from .forkjoin import polling_threads


class StepWindows(Adjustment):
    """Tasks outside any step annotation (other threads, unlaunched GPU work, collective arrivals)
    get the step whose window [begin, next begin) holds their start; a polling thread's
    (:func:`~.forkjoin.polling_threads`, a watchdog on a timer) do not: they do none of the step's
    work, and their timer, not the program, sets when they run, so they cannot complete a step."""

    needs = (LauncherAttribution, CollectiveSplit)

    def apply(self, state: BuildState) -> None:
        step = state.column("step").astype(np.int64).copy()
        ranks = state.column("rank")
        start = state.start_ns
        begin_ids, end_ids = state.begin_ids, state.end_ids
        resource = state.column("resource")
        cpu = state.cpu_ids
        polling = polling_threads(state, {th: cpu[resource[cpu] == th] for th in np.unique(resource[cpu]).tolist()})
        outside = ~np.isin(resource, np.asarray(sorted(polling), dtype=np.int64))
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
