"""The tasks of a trace, before any edge: runtime/driver calls and operator work on CPU threads,
step markers, kernels/copies/memsets/collectives on GPU streams, WAIT tasks of blocking copies,
one origin per rank. :func:`initial_state` returns them as the :class:`~.state.BuildState` the
rules (:mod:`.rules`) then link."""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import pandas as pd

from whatif.core.heap import release_freed_memory
from whatif.core.kernels import is_collective
from whatif.tracer.kinds import GPU_ACTIVITY_KINDS, EventKind, codes
from whatif.tracer.kineto import step_number
from whatif.tracer.trace import Trace, name_texts, per_name

from .graph import CPU_KINDS, ResourceKind, TaskKind, kind_codes, task_kind_codes
from .hierarchy import CpuHierarchy, build_hierarchy, inherit
from .rules.sync_lookup import COPY_CALL, PAGEABLE_COPY, SYNCHRONOUS_COPY
from .state import BlockingCopies, BuildState, Resources, TaskColumns

THREAD_TASK_KINDS = CPU_KINDS | {TaskKind.MARKER}
"""Tasks placed on a CPU thread: its own work and the step markers."""


@dataclass
class _CpuTasks:
    """Positions (in the hierarchy's rows) and task ids of the CPU tasks."""

    call_pos: np.ndarray         # outermost calls
    call_ids: np.ndarray
    call_task_of_pos: np.ndarray  # per hierarchy row: the task of its outermost call, -1
    nested: np.ndarray           # every call row (outer or nested)
    begin_ids: np.ndarray
    end_ids: np.ndarray


class _Ends:
    """Each event's end (start + duration), computed for the rows asked: no event-length array."""

    __slots__ = ("_dur", "_ts")

    def __init__(self, ts_ns: np.ndarray, dur_ns: np.ndarray) -> None:
        self._ts, self._dur = ts_ns, dur_ns

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        return self._ts[rows] + self._dur[rows]


class _TaskMaker:
    """Adds the tasks of one trace to a :class:`TaskColumns`, group by group."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        ev = trace.events
        self.ev = ev
        self.ts = ev["ts_ns"].to_numpy()
        self.end = _Ends(self.ts, ev["dur_ns"].to_numpy())
        self.kinds = ev["kind"].to_numpy()
        self.names = ev["name"]
        self.rank = ev["rank"].to_numpy()
        self.hier: CpuHierarchy = build_hierarchy(ev)
        release_freed_memory(len(ev))  # the nesting's temporaries
        self.res = Resources()
        self.tasks = TaskColumns()
        self.report: Counter[str] = Counter()
        self.gpu_resource = np.empty(0, dtype=np.int64)  # per GPU task (gpu_tasks)
        self.thread_label = {(info.rank, pid, tid): label
                             for info in trace.ranks for (pid, tid), label in info.thread_names.items()}
        h_rows = self.hier.rows
        self.h_names = name_texts(self.names, h_rows)
        self.h_res = _resource_ids(self._thread_resource, self.rank[h_rows], ev["pid"].to_numpy()[h_rows],
                                   ev["tid"].to_numpy()[h_rows])

    def _thread_resource(self, r: int, pid: int, tid: int) -> int:
        label = self.thread_label.get((r, pid, tid)) or f"thread {tid}"
        return self.res.get(r, ResourceKind.THREAD, -1, (pid << 32) ^ (tid & 0xFFFFFFFF), label)

    def _cpu_cols(self, pos: np.ndarray, kind: TaskKind, start: np.ndarray, stop: np.ndarray,
                  tie: int) -> dict[str, np.ndarray]:
        hier = self.hier
        rows = hier.rows[pos]
        return dict(event=rows, kind=np.full(len(pos), int(kind), dtype=np.int8), resource=self.h_res[pos],
                    rank=self.rank[rows], dur_ns=stop - start, measured_start_ns=start, measured_end_ns=stop,
                    step=hier.step[pos], phase=hier.phase[pos], layer=hier.layer[pos], op=hier.op[pos],
                    name=self.h_names[pos], tie=np.full(len(pos), tie, dtype=np.int8))

    def cpu_tasks(self) -> _CpuTasks:
        """Step markers, calls (a call nested in another is part of it) and operator work."""
        hier, ts, end = self.hier, self.ts, self.end
        h_rows = hier.rows
        h_kind = self.kinds[h_rows]
        h_parent = hier.parent
        is_call = np.isin(h_kind, [int(EventKind.RUNTIME), int(EventKind.DRIVER)])
        outer_call = np.full(len(h_rows), -1, dtype=np.int64)
        for i in np.flatnonzero(is_call).tolist():
            top, p = i, h_parent[i]
            while p >= 0:
                if is_call[p]:
                    top = p
                p = h_parent[p]
            outer_call[i] = top
        call_pos = np.flatnonzero(is_call & (outer_call == np.arange(len(h_rows))))
        self.report["cpu_calls_nested_merged"] = int(is_call.sum() - len(call_pos))
        nested = np.flatnonzero(is_call)
        outer_of_nested = outer_call[nested]
        del outer_call

        # CPU_WORK tasks: the outermost operators with no call and no step/phase below them. Python
        # frames do not count as enclosing operators (they interleave with ops, with_stack traces).
        not_python = np.where(h_kind != int(EventKind.PYTHON), np.arange(len(h_rows), dtype=np.int64), -1)
        op_parent_arr = np.where(h_parent >= 0, inherit(not_python, h_parent)[np.maximum(h_parent, 0)], -1)
        descend = hier.has_call | hier.has_structure
        parent_ok = np.ones(len(h_rows), dtype=bool)
        has_parent = op_parent_arr >= 0
        parent_ok[has_parent] = descend[op_parent_arr[has_parent]]
        work_pos = np.flatnonzero(np.isin(h_kind, [int(EventKind.CPU_OP), int(EventKind.ANNOTATION)])
                                  & ~hier.has_call & ~hier.has_structure & parent_ok)
        del not_python, op_parent_arr, descend, parent_ok, has_parent

        is_step = per_name(self.names, lambda n: step_number(n) is not None)[h_rows]
        step_ann = np.flatnonzero(is_step & (h_kind == int(EventKind.ANNOTATION)))

        s_rows = h_rows[step_ann]
        begin_ids = self.tasks.add(**self._cpu_cols(step_ann, TaskKind.MARKER, ts[s_rows], ts[s_rows], 1))
        end_ids = self.tasks.add(**self._cpu_cols(step_ann, TaskKind.MARKER, end[s_rows], end[s_rows], 0))
        call_rows = h_rows[call_pos]
        call_ids = self.tasks.add(**self._cpu_cols(call_pos, TaskKind.CPU_CALL, ts[call_rows], end[call_rows], 2))
        w_rows = h_rows[work_pos]
        self.tasks.add(**self._cpu_cols(work_pos, TaskKind.CPU_WORK, ts[w_rows], end[w_rows], 2))

        call_task_of_pos = np.full(len(h_rows), -1, dtype=np.int64)
        call_task_of_pos[call_pos] = call_ids
        call_task_of_pos[nested] = call_task_of_pos[outer_of_nested]
        return _CpuTasks(call_pos=call_pos, call_ids=call_ids, call_task_of_pos=call_task_of_pos, nested=nested,
                         begin_ids=begin_ids, end_ids=end_ids)

    def gpu_tasks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """GPU work on streams (collective kernels are COMM): (event rows, task kinds, task ids)."""
        ev, ts, end, rank = self.ev, self.ts, self.end, self.rank
        g_rows = np.flatnonzero(np.isin(self.kinds, codes(GPU_ACTIVITY_KINDS)))
        g_res = _resource_ids(lambda r, d, s: self.res.get(r, ResourceKind.STREAM, d, s, f"GPU {d} stream {s}"),
                              rank[g_rows], ev["device"].to_numpy()[g_rows], ev["stream"].to_numpy()[g_rows])
        g_kind = task_kind_codes(self.kinds[g_rows])
        is_comm = per_name(self.names, is_collective)[g_rows]
        g_kind[is_comm & (g_kind == int(TaskKind.KERNEL))] = int(TaskKind.COMM)
        ng = len(g_rows)
        self.gpu_resource = g_res
        gpu_ids = self.tasks.add(event=g_rows, kind=g_kind, resource=g_res, rank=rank[g_rows],
                                 dur_ns=end[g_rows] - ts[g_rows], measured_start_ns=ts[g_rows],
                                 measured_end_ns=end[g_rows], step=np.full(ng, -1, dtype=np.int64),
                                 phase=[None] * ng, layer=[None] * ng, op=[None] * ng,
                                 name=name_texts(self.names, g_rows), tie=np.full(ng, 2, dtype=np.int8))
        return g_rows, g_kind, gpu_ids

    def launchers(self, cpu: _CpuTasks, g_rows: np.ndarray) -> np.ndarray:
        """Per GPU task: the call task with its (rank, correlation), -1."""
        corr = self.ev["correlation"].to_numpy()
        call_events = self.hier.rows[cpu.nested]
        call_map = pd.Series(cpu.call_task_of_pos[cpu.nested],
                             index=pd.MultiIndex.from_arrays([self.rank[call_events], corr[call_events]]))
        call_map = call_map[corr[call_events] >= 0]
        call_map = call_map[~call_map.index.duplicated(keep="first")]
        keys = pd.MultiIndex.from_arrays([self.rank[g_rows], corr[g_rows]])
        launcher = call_map.reindex(keys).to_numpy()
        return np.where(np.isnan(launcher), -1, launcher).astype(np.int64)

    def blocking_copies(self, cpu: _CpuTasks, g_rows: np.ndarray, g_kind: np.ndarray, gpu_ids: np.ndarray,
                        launcher: np.ndarray) -> BlockingCopies:
        """Copy calls held by their copy (:func:`held_copies`): each one's waiting part, from its
        copy's start to its return, becomes a WAIT task (:class:`~.rules.BlockingCallIssue` then
        moves the split to the call's own cost)."""
        ts, end = self.ts, self.end
        call_rows = self.hier.rows[cpu.call_pos]
        copy_sel = np.flatnonzero((launcher >= 0) & (g_kind == int(TaskKind.MEMCPY)))
        copy_sel = copy_sel[np.unique(launcher[copy_sel], return_index=True)[1]]  # one copy per call
        prev_row = _stream_predecessor(self.gpu_resource, ts[g_rows], end[g_rows])
        b_calls = launcher[copy_sel]
        first_call = int(cpu.call_ids[0]) if len(cpu.call_ids) else 0
        b_rows = call_rows[b_calls - first_call]  # call task ids are contiguous
        c_rows = g_rows[copy_sel]
        p_sel = prev_row[copy_sel]
        held = held_copies(self.h_names[cpu.call_pos[b_calls - first_call]],
                           name_texts(self.names, c_rows), ts[b_rows], end[b_rows], ts[c_rows],
                           end[c_rows], np.where(p_sel >= 0, end[g_rows[np.maximum(p_sel, 0)]], -1))
        copy_sel, b_calls, b_rows, c_rows, p_sel, held = (
            x[held != int(Held.NOT)] for x in (copy_sel, b_calls, b_rows, c_rows, p_sel, held))
        waits_on = np.where(held == int(Held.UNTIL_COPY_DONE), gpu_ids[copy_sel],
                            gpu_ids[np.maximum(p_sel, 0)])
        issue_end = np.minimum(end[b_rows], np.maximum(ts[b_rows], ts[c_rows]))
        b_pos = cpu.call_pos[b_calls - first_call]
        wait_ids = self.tasks.add(**self._cpu_cols(b_pos, TaskKind.WAIT, issue_end, end[b_rows], 3))
        self.report["blocking_copies"] = len(wait_ids)
        self.report["copy_calls_held_until_copy_done"] = int((held == int(Held.UNTIL_COPY_DONE)).sum())
        self.report["copy_calls_held_until_stream_reached_copy"] = int((held == int(Held.UNTIL_STREAM_REACHED)).sum())
        return BlockingCopies(copy=gpu_ids[copy_sel], wait=wait_ids, call=b_calls, issue_end_ns=issue_end,
                              waits_on=waits_on)

    def origins(self) -> dict[int, int]:
        """One ORIGIN task per rank with tasks, at its first measured start."""
        tasks = self.tasks
        ranks = sorted({int(r) for r in self.ev["rank"].unique()})
        origin_ts = (pd.Series(np.concatenate([np.asarray(p) for p in tasks.parts["measured_start_ns"]]))
                     .groupby(np.concatenate([np.asarray(p) for p in tasks.parts["rank"]])).min()
                     if tasks.size else pd.Series(dtype=np.int64))
        ranks = [r for r in ranks if r in origin_ts.index]
        o_res = [self.res.get(r, ResourceKind.VIRTUAL, -1, 0, "origin", ordered=False) for r in ranks]
        o_ts = np.asarray([int(origin_ts[r]) for r in ranks], dtype=np.int64)
        no = len(ranks)
        origin_ids = tasks.add(event=np.full(no, -1, dtype=np.int64),
                               kind=np.full(no, int(TaskKind.ORIGIN), dtype=np.int8),
                               resource=np.asarray(o_res, dtype=np.int64), rank=np.asarray(ranks, dtype=np.int64),
                               dur_ns=np.zeros(no, dtype=np.int64), measured_start_ns=o_ts, measured_end_ns=o_ts,
                               step=np.full(no, -1, dtype=np.int64), phase=[None] * no, layer=[None] * no,
                               op=[None] * no, name=["origin"] * no, tie=np.zeros(no, dtype=np.int8))
        return dict(zip(ranks, origin_ids.tolist()))


def initial_state(trace: Trace) -> BuildState:
    """The tasks of ``trace`` (all ranks) and what the rules look up, with no edges yet."""
    maker = _TaskMaker(trace)
    release_freed_memory(len(trace.events))
    cpu = maker.cpu_tasks()
    release_freed_memory(len(trace.events))
    g_rows, g_kind, gpu_ids = maker.gpu_tasks()
    launcher = maker.launchers(cpu, g_rows)
    release_freed_memory(len(trace.events))
    blocking = maker.blocking_copies(cpu, g_rows, g_kind, gpu_ids, launcher)
    origin_of_rank = maker.origins()
    call_task_of_event = np.full(len(trace.events), -1, dtype=np.int64)
    call_task_of_event[maker.hier.rows[cpu.nested]] = cpu.call_task_of_pos[cpu.nested]
    columns, resources, report = maker.tasks, maker.res, maker.report
    del maker  # the CPU hierarchy goes before the task table is assembled
    release_freed_memory(len(trace.events))

    t = columns.frame()
    del columns
    thread_tie = t.pop("tie").to_numpy()
    launch_of = np.full(len(t), -1, dtype=np.int64)
    launch_of[gpu_ids] = launcher
    cpu_ids = np.flatnonzero(np.isin(t["kind"].to_numpy(), kind_codes(THREAD_TASK_KINDS)))
    return BuildState(trace=trace, tasks=t, thread_tie=thread_tie, resources=resources, report=report,
                      call_ids=cpu.call_ids, gpu_ids=gpu_ids, cpu_ids=cpu_ids, begin_ids=cpu.begin_ids,
                      end_ids=cpu.end_ids, launch_of=launch_of, call_task_of_event=call_task_of_event,
                      blocking=blocking, origin_of_rank=origin_of_rank)


class Held(IntEnum):
    """How a copy call was held by its copy (:func:`held_copies`)."""

    NOT = 0
    UNTIL_COPY_DONE = 1       # returned after its copy ended: waits for the copy
    UNTIL_STREAM_REACHED = 2  # its copy began before it returned and ended after: waits for the stream


def held_copies(call_name: np.ndarray, copy_name: np.ndarray, call_start_ns: np.ndarray, call_end_ns: np.ndarray,
                copy_start_ns: np.ndarray, copy_end_ns: np.ndarray, prev_end_ns: np.ndarray) -> np.ndarray:
    """Per copy call (a :data:`~.rules.sync_lookup.COPY_CALL` and the copy it launched): a
    :class:`Held` code. A call is held when its copy began before it returned and either it
    returned after the copy ended, or the call is synchronous
    (:data:`~.rules.sync_lookup.SYNCHRONOUS_COPY`), or the copy involves pageable memory
    (:data:`~.rules.sync_lookup.PAGEABLE_COPY`): such a call waits until its stream reaches the
    copy. Held until its copy is done if it returned after the copy ended, else until its
    stream reached the copy (``prev_end_ns``: the end of the copy's predecessor on its stream,
    -1 without one, and then the call is not counted as held).

    >>> held_copies(np.array(["cudaMemcpyAsync"] * 3), np.array(["Memcpy DtoH (Device -> Pageable)",
    ...     "Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD (Pinned -> Device)"]), np.array([0, 0, 0]),
    ...     np.array([100, 100, 100]), np.array([90, 90, 90]), np.array([95, 120, 120]),
    ...     np.array([80, 80, 80])).tolist()
    [1, 2, 0]
    """
    names = [str(n) for n in call_name]
    is_copy_call = np.fromiter((COPY_CALL.search(n) is not None for n in names), dtype=bool, count=len(names))
    synchronous = np.fromiter((SYNCHRONOUS_COPY.search(n) is not None for n in names), dtype=bool, count=len(names))
    pageable = np.fromiter((PAGEABLE_COPY.search(str(n)) is not None for n in copy_name), dtype=bool,
                           count=len(copy_name))
    began_before_return = copy_start_ns < call_end_ns
    done_before_return = copy_end_ns <= call_end_ns
    out = np.full(len(names), int(Held.NOT), dtype=np.int8)
    out[is_copy_call & began_before_return & done_before_return] = int(Held.UNTIL_COPY_DONE)
    out[is_copy_call & began_before_return & ~done_before_return & (synchronous | pageable)
        & (prev_end_ns >= 0)] = int(Held.UNTIL_STREAM_REACHED)
    return out


def _stream_predecessor(resource: np.ndarray, start_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
    """Per GPU task (positions of the arrays): the position of the task before it on its stream
    (in :func:`~.rules.order.stream_pairs` order), -1."""
    order = np.lexsort((end_ns, start_ns, resource))
    prev = np.full(len(order), -1, dtype=np.int64)
    same = resource[order][1:] == resource[order][:-1]
    prev[order[1:][same]] = order[:-1][same]
    return prev


def _resource_ids(make: Callable[[int, int, int], int], a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Resource id per row of the key columns (a, b, c), calling ``make`` once per distinct key,
    in sorted key order (deterministic ids). One sort; a key column at a time is gathered.

    >>> made = []
    >>> _resource_ids(lambda *k: made.append(k) or len(made) - 1, np.array([1, 0, 1]), np.array([5, 5, 5]),
    ...               np.array([2, 9, 2])).tolist(), made
    ([1, 0, 1], [(0, 5, 9), (1, 5, 2)])
    """
    if len(a) == 0:
        return np.empty(0, dtype=np.int64)
    order = np.lexsort((c, b, a))
    new = np.zeros(len(order), dtype=bool)
    new[0] = True
    for key in (a, b, c):
        ordered = key[order]
        new[1:] |= ordered[1:] != ordered[:-1]
        del ordered
    first = order[new]
    ids = np.asarray([make(int(x), int(y), int(z)) for x, y, z in zip(a[first], b[first], c[first])], dtype=np.int64)
    out = np.empty(len(order), dtype=np.int64)
    out[order] = ids[np.cumsum(new) - 1]
    return out
