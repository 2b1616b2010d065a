"""A copy call held by its copy (:func:`~whatif.depgraph.tasks.held_copies`: ``cudaMemcpy``,
``cudaMemcpyAsync`` to pageable memory, ``.item()``/``.cpu()``, ``hipMemcpy``,
``hipMemcpyWithStream``...) is two tasks: the call's own part, which queues the copy, then its
WAIT task (made with the tasks), which lasts until what it waits on is done (:mod:`.sync`).

Held on a busy stream, the call waited for the stream's earlier work before the copy could
start; the trace shows only when the copy started. So the call's own part is not its measured
start-to-copy-start time but its *own cost*: the median of that time over the rank's same-name
copy calls that did not wait (their copy's stream predecessor had ended before they started;
async calls that returned before their copy began count with their whole duration), taken for
calls of the same name launching copies of the same name, else of the same name, else over all
the rank's launching calls; the shorter of it and the measured time. The rest joins the WAIT
task, whose end the replay recomputes from the GPU. A held call with no such evidence keeps its
measured split, and is counted (``copy_calls_wait_unattributed``, ``..._ns``).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from whatif.tracer.trace import per_name

from ..state import BuildState
from .base import Adjustment
from .order import stream_pairs
from .sync_lookup import COPY_CALL


class BlockingCallIssue(Adjustment):
    """The call of a held copy ends, and lasts, at its own cost; its WAIT task starts there."""

    def apply(self, state: BuildState) -> None:
        b = state.blocking
        start = state.start_ns
        issue_ns = b.issue_end_ns - start[b.call]
        busy = _stream_busy_at_call(state, b.copy, b.call)
        typical_ns = own_cost_ns(state)[b.call]
        known = typical_ns >= 0
        own_ns = np.where(busy & known, np.minimum(issue_ns, typical_ns), issue_ns)
        unattributed = busy & ~known
        rep = state.report
        rep["copy_calls_stream_wait_ns"] = int((issue_ns - own_ns).sum())
        rep["copy_calls_wait_unattributed"] = int(unattributed.sum())
        rep["copy_calls_wait_unattributed_ns"] = int(issue_ns[unattributed].sum())
        issue_end = start[b.call] + own_ns
        state.set_column("measured_end_ns", b.call, issue_end)
        state.set_column("dur_ns", b.call, own_ns)
        state.set_column("measured_start_ns", b.wait, issue_end)
        state.set_column("dur_ns", b.wait, state.end_ns[b.wait] - issue_end)
        state.blocking = replace(b, issue_end_ns=issue_end)


def _stream_busy_at_call(state: BuildState, copy: np.ndarray, call: np.ndarray) -> np.ndarray:
    """Per copy: whether the work before it on its stream ended after its call started."""
    prev, cur = stream_pairs(state)
    prev_end = np.full(len(state.tasks), np.iinfo(np.int64).min, dtype=np.int64)
    prev_end[cur] = state.end_ns[prev]
    return prev_end[copy] > state.start_ns[call]


def own_cost_ns(state: BuildState) -> np.ndarray:
    """Per task: the typical own cost of its call (see the module docstring), -1 where none is
    known or the task is no launching call."""
    b = state.blocking
    start, end = state.start_ns, state.end_ns
    gpu = state.gpu_ids[state.launch_of[state.gpu_ids] >= 0]
    call = state.launch_of[gpu]
    first = np.unique(call, return_index=True)[1]
    gpu, call = gpu[first], call[first]
    name = state.tasks["name"]
    codes = name.cat.codes.to_numpy()  # grouped by code: one per distinct name
    sample = (end[call] - start[call]).astype(np.float64)
    held = np.zeros(len(state.tasks), dtype=bool)
    held[b.call] = True
    issue = np.zeros(len(state.tasks), dtype=np.int64)
    issue[b.call] = b.issue_end_ns - start[b.call]
    busy = np.zeros(len(state.tasks), dtype=bool)
    busy[b.call] = _stream_busy_at_call(state, b.copy, b.call)
    sample = np.where(held[call], issue[call], sample)
    ok = ~busy[call]
    frame = pd.DataFrame({"rank": state.column("rank")[call], "call": codes[call], "copy": codes[gpu],
                          "own": np.where(ok, sample, np.nan)})
    is_copy = per_name(name, lambda n: COPY_CALL.search(n) is not None)[call]
    out = np.full(len(state.tasks), -1.0)
    levels = (["rank", "call", "copy"], ["rank", "call"], ["rank"])
    typical = np.full(len(frame), np.nan)
    for keys in levels:
        median = frame.groupby(keys)["own"].transform("median").to_numpy()
        typical = np.where(np.isnan(typical), median, typical)
    typical = np.where(is_copy, typical, np.nan)
    out[call] = np.where(np.isnan(typical), -1.0, typical)
    return np.round(out).astype(np.int64)
