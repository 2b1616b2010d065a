"""Build the task graph of a trace: Daydream's and Lumos's rules on real Kineto traces.

Tasks: runtime/driver calls and operator work on CPU threads (with the CPU time between them
kept as gaps), kernels/copies/memsets/collectives on GPU streams, step markers, one origin per
rank. Edges: thread order, stream order, launch -> GPU work by correlation (CUDA/HIP graph
launches reach all their kernels), synchronization (:mod:`.syncs`), cross-stream event waits,
cross-thread flows, and cross-rank collectives (:mod:`.collectives`).

Every anomaly is counted in ``graph.report`` rather than dropped silently. The graph is acyclic
by construction; every replay verifies it (and :func:`~whatif.depgraph.graph.check_acyclic` does
on demand), naming a task on the cycle if a transform ever creates one.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
import pandas as pd

from whatif.core.kernels import is_collective
from whatif.tracer.kinds import GPU_ACTIVITY_KINDS, EventKind, codes
from whatif.tracer.kineto import step_number
from whatif.tracer.trace import Trace

from .collectives import link_collectives
from .graph import EdgeKind, ResourceKind, TaskGraph, TaskKind, task_kind_codes
from .hierarchy import build_hierarchy
from .schema import check_schema
from .state import Resources, SyncContext, TaskColumns
from .syncs import add_sync_edges

LAUNCH_QUANTILE = 0.05  # a launch latency this low is "the stream was idle, the launch was the bottleneck"


def _consecutive_pairs(group: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(prev, cur) task pairs that follow each other within the same group, in ``order``."""
    g = group[order]
    same = g[1:] == g[:-1]
    return order[:-1][same], order[1:][same]


def build_graph(trace: Trace) -> TaskGraph:
    """Build the dependency graph of ``trace`` (all ranks). See the module docstring."""
    ev = trace.events
    report: Counter[str] = Counter()
    ts = ev["ts_ns"].to_numpy()
    end = ts + ev["dur_ns"].to_numpy()
    kinds = ev["kind"].to_numpy()
    names = ev["name"]
    rank_col = ev["rank"].to_numpy()
    hier = build_hierarchy(ev)
    res = Resources()
    tasks = TaskColumns()

    thread_label = {}
    for info in trace.ranks:
        for (pid, tid), label in info.thread_names.items():
            thread_label[(info.rank, pid, tid)] = label

    def thread_resource(r: int, pid: int, tid: int) -> int:
        label = thread_label.get((r, pid, tid)) or f"thread {tid}"
        return res.get(r, ResourceKind.THREAD, -1, (pid << 32) ^ (tid & 0xFFFFFFFF), label)

    # ---- CPU tasks -----------------------------------------------------------------------
    h_rows = hier.rows
    h_kind = kinds[h_rows]
    h_parent = hier.parent
    h_names = np.asarray(names.cat.categories.astype(str), dtype=object)[names.cat.codes.to_numpy()[h_rows]]
    pid_col = ev["pid"].to_numpy()
    tid_col = ev["tid"].to_numpy()
    h_res = _resource_ids(thread_resource, rank_col[h_rows], pid_col[h_rows], tid_col[h_rows])

    is_call = np.isin(h_kind, [int(EventKind.RUNTIME), int(EventKind.DRIVER)])
    # A call nested in another call (e.g. a driver call inside a runtime call) is part of it.
    outer_call = np.full(len(h_rows), -1, dtype=np.int64)
    for i in np.flatnonzero(is_call).tolist():
        top, p = i, h_parent[i]
        while p >= 0:
            if is_call[p]:
                top = p
            p = h_parent[p]
        outer_call[i] = top
    call_pos = np.flatnonzero(is_call & (outer_call == np.arange(len(h_rows))))
    report["cpu_calls_nested_merged"] = int(is_call.sum() - len(call_pos))

    # CPU_WORK tasks: the outermost operators with no call and no step/phase below them. Python
    # frames do not count as enclosing operators (they interleave with ops, with_stack traces).
    is_python = (h_kind == int(EventKind.PYTHON)).tolist()
    op_parent = h_parent.tolist()
    for i, p in enumerate(op_parent):
        if p >= 0 and is_python[p]:
            op_parent[i] = op_parent[p]
    op_parent_arr = np.asarray(op_parent, dtype=np.int64)
    descend = hier.has_call | hier.has_structure
    parent_ok = np.ones(len(h_rows), dtype=bool)
    has_parent = op_parent_arr >= 0
    parent_ok[has_parent] = descend[op_parent_arr[has_parent]]
    work_pos = np.flatnonzero(np.isin(h_kind, [int(EventKind.CPU_OP), int(EventKind.ANNOTATION)])
                              & ~hier.has_call & ~hier.has_structure & parent_ok)

    is_step = _per_name(names, lambda n: step_number(n) is not None)[h_rows]
    step_ann = np.flatnonzero(is_step & (h_kind == int(EventKind.ANNOTATION)))

    def cpu_cols(pos: np.ndarray, kind: TaskKind, start: np.ndarray, stop: np.ndarray, tie: int) -> dict:
        rows = h_rows[pos]
        return dict(event=rows, kind=np.full(len(pos), int(kind), dtype=np.int8), resource=h_res[pos],
                    rank=rank_col[rows], dur_ns=stop - start, measured_start_ns=start, measured_end_ns=stop,
                    step=hier.step[pos], phase=hier.phase[pos], layer=hier.layer[pos], op=hier.op[pos],
                    name=h_names[pos], tie=np.full(len(pos), tie, dtype=np.int8))

    s_rows = h_rows[step_ann]
    begin_ids = tasks.add(**cpu_cols(step_ann, TaskKind.MARKER, ts[s_rows], ts[s_rows], 1))
    end_ids = tasks.add(**cpu_cols(step_ann, TaskKind.MARKER, end[s_rows], end[s_rows], 0))
    call_rows = h_rows[call_pos]
    call_ids = tasks.add(**cpu_cols(call_pos, TaskKind.CPU_CALL, ts[call_rows], end[call_rows], 2))
    w_rows = h_rows[work_pos]
    tasks.add(**cpu_cols(work_pos, TaskKind.CPU_WORK, ts[w_rows], end[w_rows], 2))

    # Every call event (outer or nested) -> the task of its outermost call.
    call_task_of_pos = np.full(len(h_rows), -1, dtype=np.int64)
    call_task_of_pos[call_pos] = call_ids
    nested = np.flatnonzero(is_call)
    call_task_of_pos[nested] = call_task_of_pos[outer_call[nested]]

    # ---- GPU tasks -----------------------------------------------------------------------
    g_rows = np.flatnonzero(np.isin(kinds, codes(GPU_ACTIVITY_KINDS)))
    device_col = ev["device"].to_numpy()
    stream_col = ev["stream"].to_numpy()
    g_res = _resource_ids(lambda r, d, s: res.get(r, ResourceKind.STREAM, d, s, f"GPU {d} stream {s}"),
                          rank_col[g_rows], device_col[g_rows], stream_col[g_rows])
    g_names = names.iloc[g_rows].astype(str).tolist()
    g_kind = task_kind_codes(kinds[g_rows])
    is_comm = _per_name(names, is_collective)[g_rows]
    g_kind[is_comm & (g_kind == int(TaskKind.KERNEL))] = int(TaskKind.COMM)
    ng = len(g_rows)
    gpu_ids = tasks.add(event=g_rows, kind=g_kind, resource=g_res, rank=rank_col[g_rows],
                        dur_ns=end[g_rows] - ts[g_rows], measured_start_ns=ts[g_rows], measured_end_ns=end[g_rows],
                        step=np.full(ng, -1, dtype=np.int64), phase=[None] * ng, layer=[None] * ng, op=[None] * ng,
                        name=g_names, tie=np.full(ng, 2, dtype=np.int8))

    # ---- launches: GPU work -> its call, by correlation -----------------------------------
    corr_col = ev["correlation"].to_numpy()
    call_events = h_rows[nested]
    call_map = pd.Series(call_task_of_pos[nested],
                         index=pd.MultiIndex.from_arrays([rank_col[call_events], corr_col[call_events]]))
    call_map = call_map[corr_col[call_events] >= 0]
    call_map = call_map[~call_map.index.duplicated(keep="first")]
    g_corr = corr_col[g_rows]
    keys = pd.MultiIndex.from_arrays([rank_col[g_rows], g_corr])
    launcher = call_map.reindex(keys).to_numpy()
    launcher = np.where(np.isnan(launcher), -1, launcher).astype(np.int64)
    has_launch = launcher >= 0

    # ---- blocking copies: the call returns after its own copy; its waiting part is a WAIT task
    def call_row_of(task: np.ndarray) -> np.ndarray:
        return call_rows[task - call_ids[0]]  # call task ids are contiguous

    copy_sel = np.flatnonzero(has_launch & (g_kind == int(TaskKind.MEMCPY)))
    if len(copy_sel):
        copy_sel = copy_sel[end[call_row_of(launcher[copy_sel])] >= end[g_rows[copy_sel]]]
    b_calls = launcher[copy_sel]
    b_rows = call_row_of(b_calls) if len(b_calls) else np.empty(0, dtype=np.int64)
    issue_end = np.minimum(end[b_rows], np.maximum(ts[b_rows], ts[g_rows[copy_sel]]))
    b_pos = call_pos[b_calls - call_ids[0]] if len(b_calls) else np.empty(0, dtype=np.int64)
    wait_ids = tasks.add(**cpu_cols(b_pos, TaskKind.WAIT, issue_end, end[b_rows], 3))
    blocking = list(zip(gpu_ids[copy_sel].tolist(), wait_ids.tolist()))
    report["blocking_copies"] = len(blocking)

    # ---- origins -------------------------------------------------------------------------
    ranks = sorted({int(r) for r in trace.events["rank"].unique()})
    origin_ts = (pd.Series(np.concatenate([np.asarray(p) for p in tasks.parts["measured_start_ns"]]))
                 .groupby(np.concatenate([np.asarray(p) for p in tasks.parts["rank"]])).min()
                 if tasks.size else pd.Series(dtype=np.int64))
    ranks = [r for r in ranks if r in origin_ts.index]
    o_res = [res.get(r, ResourceKind.VIRTUAL, -1, 0, "origin", ordered=False) for r in ranks]
    o_ts = np.asarray([int(origin_ts[r]) for r in ranks], dtype=np.int64)
    no = len(ranks)
    origin_ids = tasks.add(event=np.full(no, -1, dtype=np.int64), kind=np.full(no, int(TaskKind.ORIGIN), dtype=np.int8),
                           resource=np.asarray(o_res, dtype=np.int64), rank=np.asarray(ranks, dtype=np.int64),
                           dur_ns=np.zeros(no, dtype=np.int64), measured_start_ns=o_ts, measured_end_ns=o_ts,
                           step=np.full(no, -1, dtype=np.int64), phase=[None] * no, layer=[None] * no, op=[None] * no,
                           name=["origin"] * no, tie=np.zeros(no, dtype=np.int8))
    t = tasks.frame()
    t["name"] = pd.Categorical(t["name"])
    origin_of_rank = dict(zip(ranks, origin_ids.tolist()))

    start_m = t["measured_start_ns"].to_numpy().astype(np.int64)
    end_m = t["measured_end_ns"].to_numpy().astype(np.int64)
    dur = t["dur_ns"].to_numpy().astype(np.int64).copy()
    end_m[b_calls] = issue_end  # the issuing part of a blocking copy call ends when the copy is queued
    dur[b_calls] = issue_end - start_m[b_calls]
    t["measured_end_ns"] = end_m
    resource = t["resource"].to_numpy().astype(np.int64)
    task_kind = t["kind"].to_numpy()
    edges: list[tuple[np.ndarray, np.ndarray, np.ndarray, int]] = []

    # ---- thread order (gap = CPU time between tasks) --------------------------------------
    cpu_task = np.isin(task_kind, [int(TaskKind.MARKER), int(TaskKind.CPU_CALL), int(TaskKind.CPU_WORK),
                                   int(TaskKind.WAIT)])
    cpu_ids = np.flatnonzero(cpu_task)
    order = cpu_ids[np.lexsort((end_m[cpu_ids], t["tie"].to_numpy()[cpu_ids], start_m[cpu_ids], resource[cpu_ids]))]
    prev, cur = _consecutive_pairs(resource, order)
    gap = start_m[cur] - end_m[prev]
    report["cpu_overlaps_clipped"] = int((gap < 0).sum())
    edges.append((prev, cur, np.maximum(gap, 0), EdgeKind.THREAD))

    report["gpu_tasks_without_launch"] = int((~has_launch).sum())
    launched_calls = np.unique(launcher[has_launch])
    is_launch_name = np.fromiter((("Launch" in n) or ("Memcpy" in n) or ("Memset" in n)
                                  for n in t["name"].iloc[call_ids].tolist()), dtype=bool, count=len(call_ids))
    report["launch_calls_without_gpu_task"] = int(is_launch_name.sum() - np.isin(call_ids[is_launch_name],
                                                                                 launched_calls).sum())
    graph_launch = np.fromiter(("GraphLaunch" in n for n in t["name"].iloc[call_ids].tolist()), dtype=bool,
                               count=len(call_ids))
    report["graph_launches"] = int(graph_launch.sum())

    # GPU tasks inherit step/phase/layer/op from the call that launched them.
    step_arr = t["step"].to_numpy().astype(np.int64).copy()
    phase, layer, op = (np.asarray(t[c].tolist(), dtype=object) for c in ("phase", "layer", "op"))
    g_l, c_l = gpu_ids[has_launch], launcher[has_launch]
    step_arr[g_l] = step_arr[c_l]
    for col in (phase, layer, op):
        col[g_l] = col[c_l]

    # ---- stream order and launch latencies ------------------------------------------------
    order = gpu_ids[np.lexsort((end_m[gpu_ids], start_m[gpu_ids], resource[gpu_ids]))]
    prev, cur = _consecutive_pairs(resource, order)
    prev_of = np.full(len(t), -1, dtype=np.int64)
    prev_of[cur] = prev
    launch_of = np.full(len(t), -1, dtype=np.int64)
    launch_of[gpu_ids] = launcher
    lg = gpu_ids[has_launch]
    lc = launcher[has_launch]
    launch_gap = start_m[lg] - end_m[lc]
    # Per rank: the launch latency of an idle stream (low quantile) and the idle time between
    # back-to-back queued kernels (median).
    rank_t = t["rank"].to_numpy().astype(np.int64)
    l_floor = {r: (int(np.quantile(launch_gap[rank_t[lg] == r], LAUNCH_QUANTILE)) if (rank_t[lg] == r).any() else 0)
               for r in ranks}
    rank_keys = np.asarray(sorted(l_floor), dtype=np.int64)
    floors = np.asarray([l_floor[r] for r in sorted(l_floor)], dtype=np.int64)
    floor_of = floors[np.searchsorted(rank_keys, rank_t[lg])] if len(lg) else np.empty(0, dtype=np.int64)
    p = prev_of[lg]
    has_prev = p >= 0
    queued = np.zeros(len(lg), dtype=bool)
    queued[has_prev] = end_m[lc[has_prev]] + floor_of[has_prev] <= end_m[p[has_prev]]
    launch_lat = np.where(queued, np.minimum(launch_gap, floor_of), launch_gap)
    edges.append((lc, lg, launch_lat, EdgeKind.LAUNCH))
    report["gpu_tasks_launch_bound"] = int((~queued).sum())
    report["gpu_tasks_queued"] = int(queued.sum())

    q = start_m[cur] - end_m[prev]
    report["gpu_overlaps_clipped"] = int((q < 0).sum())
    q = np.maximum(q, 0)
    cur_launch_bound = np.zeros(len(t), dtype=bool)
    cur_launch_bound[lg[~queued]] = True
    queued_q = q[~cur_launch_bound[cur]]
    q0 = int(np.median(queued_q)) if len(queued_q) else 0
    stream_lat = np.where(cur_launch_bound[cur], np.minimum(q, q0), q)
    edges.append((prev, cur, stream_lat, EdgeKind.STREAM))

    ctx = SyncContext(trace=trace, tasks=t, call_ids=call_ids, gpu_ids=gpu_ids, launch_of=launch_of,
                      prev_of=prev_of, call_task_of_event=_event_to_task(len(ev), h_rows[nested],
                                                                         call_task_of_pos[nested]),
                      start_m=start_m, end_m=end_m, dur=dur, blocking=blocking, report=report)
    edges.extend(add_sync_edges(ctx))
    flows = _flow_edges(trace, t, cpu_ids, start_m, end_m, report)
    # A thread woken by a flow (the autograd thread starting backward) was idle, not working:
    # its wait is the flow's measured offset, and its thread gap becomes 0.
    thread_src, thread_dst, thread_lat, _ = edges[0]
    thread_lat[np.isin(thread_dst, flows[1])] = 0
    edges.append(flows)
    edges.append(_fork_joins(thread_src, thread_dst, thread_lat, start_m, end_m, resource,
                             t["rank"].to_numpy(), report))

    edge_frame = _edge_frame(edges)
    tasks_frame = t.drop(columns=["tie"])
    tasks_frame["dur_ns"] = dur
    tasks_frame["step"] = step_arr
    tasks_frame["phase"] = pd.Categorical(phase)
    tasks_frame["layer"] = pd.Categorical(layer)
    tasks_frame["op"] = pd.Categorical(op)

    graph = TaskGraph(tasks=tasks_frame, edges=edge_frame, resources=res.frame(), steps=pd.DataFrame(),
                      trace=trace, report=dict(report))
    graph = link_collectives(graph, origin_of_rank, res)
    graph.resources = res.frame()
    graph.tasks["step"] = _window_steps(graph, begin_ids, end_ids)
    graph.steps = _steps_table(graph, begin_ids, end_ids, origin_of_rank)
    _anchor_roots(graph, origin_of_rank)
    return check_schema(graph)


def _resource_ids(make: Callable[[int, int, int], int], a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Resource id per row of the key columns (a, b, c), calling ``make`` once per distinct key."""
    if len(a) == 0:
        return np.empty(0, dtype=np.int64)
    frame = pd.DataFrame({"a": a, "b": b, "c": c})
    codes = frame.groupby(["a", "b", "c"], sort=True).ngroup().to_numpy()  # sorted keys: deterministic ids
    first = np.unique(codes, return_index=True)[1]
    ids = np.asarray([make(int(x), int(y), int(z)) for x, y, z in zip(a[first], b[first], c[first])], dtype=np.int64)
    return ids[codes]


def _per_name(names: pd.Series, predicate: Callable[[str], bool]) -> np.ndarray:
    """``predicate`` of every event's name, evaluated once per distinct name (names are categorical)."""
    cat = names.cat
    per_category = np.fromiter((predicate(str(n)) for n in cat.categories), dtype=bool, count=len(cat.categories))
    return per_category[cat.codes.to_numpy()]


def _event_to_task(num_events: int, event_rows: np.ndarray, task_ids: np.ndarray) -> np.ndarray:
    out = np.full(num_events, -1, dtype=np.int64)
    out[event_rows] = task_ids
    return out


def _flow_edges(trace: Trace, t: pd.DataFrame, cpu_ids: np.ndarray, start_m: np.ndarray, end_m: np.ndarray,
                report: Counter) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Cross-thread dependencies from flow events (``fwdbwd``: forward op -> its backward op).

    The edge carries the measured offset from the source task's end to the target's start."""
    empty = np.empty(0, dtype=np.int64)
    if not trace.flows:
        return empty, empty, empty, EdgeKind.FLOW
    ranks = t["rank"].to_numpy()
    pid_tid: dict[tuple[int, int, int], list[int]] = {}
    ev = trace.events
    rows = t["event"].to_numpy()[cpu_ids]
    valid = rows >= 0
    for tid_, r, p, th in zip(cpu_ids[valid], ranks[cpu_ids][valid], ev["pid"].to_numpy()[rows[valid]],
                              ev["tid"].to_numpy()[rows[valid]]):
        pid_tid.setdefault((int(r), int(p), int(th)), []).append(int(tid_))
    by_thread = {k: np.asarray(sorted(v, key=lambda i: (start_m[i], end_m[i])), dtype=np.int64)
                 for k, v in pid_tid.items()}
    starts = {k: start_m[v] for k, v in by_thread.items()}
    pairs: dict[tuple[int, str, int], dict[str, tuple[int, int, int, int]]] = {}
    for r, fl in trace.flows:
        pairs.setdefault((r, fl.category, fl.flow_id), {})[fl.phase] = (fl.pid, fl.tid, fl.ts_ns, r)
    src, dst = [], []
    for (_, _, _), ends in pairs.items():
        if "s" not in ends or "f" not in ends:
            report["flows_unmatched"] += 1
            continue
        (sp, st, sts, r), (fp, ft, fts, _) = ends["s"], ends["f"]
        a, b = by_thread.get((r, sp, st)), by_thread.get((r, fp, ft))
        if a is None or b is None or (sp, st) == (fp, ft):
            continue
        i = np.searchsorted(starts[(r, sp, st)], sts, side="right") - 1
        j = np.searchsorted(starts[(r, fp, ft)], fts, side="left")
        if i < 0 or j >= len(b) or end_m[a[i]] > start_m[b[j]]:
            report["flows_unmatched"] += 1
            continue
        src.append(a[i])
        dst.append(b[j])
    # Several flows may reach one task: keep, per target, the source that ends last.
    s, d = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    keep = np.lexsort((end_m[s], d))
    last = np.ones(len(keep), dtype=bool)
    last[:-1] = d[keep][1:] != d[keep][:-1]
    s, d = s[keep][last], d[keep][last]
    report["flows_cross_thread"] = len(s)
    return s, d, start_m[d] - end_m[s], EdgeKind.FLOW


def _fork_joins(src: np.ndarray, dst: np.ndarray, lat: np.ndarray, start_m: np.ndarray, end_m: np.ndarray,
                resource: np.ndarray, ranks: np.ndarray, report: Counter) -> tuple[np.ndarray, np.ndarray,
                                                                                 np.ndarray, int]:
    """Cross-thread waits the trace shows by timing (Lumos's CPU inter-thread dependencies).

    When thread A sits idle between tasks ``u`` and ``v`` while thread B runs a burst of tasks
    ``f..l`` entirely inside that gap (e.g. the main thread blocked in ``backward()`` while
    autograd's thread runs the backward ops), A was waiting for B: ``u`` forks ``f`` and ``l``
    joins ``v``. Both edges carry their measured offsets; A's gap keeps only the part before the
    burst and B's idle gap before ``f`` becomes 0, so the waits are recomputed in every replay.
    ``lat`` (the THREAD latencies) is updated in place.
    """
    fork_s, fork_d, join_s, join_d = [], [], [], []
    threads = np.unique(resource[src]) if len(src) else np.empty(0, dtype=np.int64)
    by_thread = {}
    for th in threads.tolist():
        sel = np.flatnonzero(resource[src] == th)
        order = sel[np.argsort(start_m[dst[sel]], kind="stable")]
        tasks = np.concatenate([src[order][:1], dst[order]])
        by_thread[th] = (order, tasks)
    thread_rank = {th: int(ranks[by_thread[th][1][0]]) for th in by_thread}
    pred_edge = np.full(len(start_m), -1, dtype=np.int64)
    pred_edge[dst] = np.arange(len(dst))
    for a, (a_edges, _) in by_thread.items():
        gap_lo, gap_hi = end_m[src[a_edges]], start_m[dst[a_edges]]
        for b, (_, b_tasks) in by_thread.items():
            if a == b or thread_rank[a] != thread_rank[b]:
                continue
            b_start, b_end = start_m[b_tasks], np.maximum.accumulate(end_m[b_tasks])
            first = np.searchsorted(b_start, gap_lo, side="left")
            last = np.searchsorted(b_end, gap_hi, side="right") - 1
            hit = np.flatnonzero((last >= first) & (first < len(b_tasks)))
            if not len(hit):
                continue
            e_idx = a_edges[hit]
            fst, lst = b_tasks[first[hit]], b_tasks[last[hit]]
            fork_s.append(src[e_idx])
            fork_d.append(fst)
            join_s.append(lst)
            join_d.append(dst[e_idx])
            lat[e_idx] = np.maximum(np.minimum(lat[e_idx], start_m[fst] - end_m[src[e_idx]]), 0)
            woken = pred_edge[fst]
            lat[woken[woken >= 0]] = 0
    if not fork_s:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty, empty, EdgeKind.FLOW
    fs, fd = np.concatenate(fork_s), np.concatenate(fork_d)
    js, jd = np.concatenate(join_s), np.concatenate(join_d)
    report["thread_forks_joins"] = len(fs)
    s_all, d_all = np.concatenate([fs, js]), np.concatenate([fd, jd])
    return s_all, d_all, np.maximum(start_m[d_all] - end_m[s_all], 0), EdgeKind.FLOW


def _edge_frame(edges: list[tuple[np.ndarray, np.ndarray, np.ndarray, int]]) -> pd.DataFrame:
    if not edges:
        return pd.DataFrame({"src": np.empty(0, np.int64), "dst": np.empty(0, np.int64),
                             "lat_ns": np.empty(0, np.int64), "kind": np.empty(0, np.int8)})
    return pd.DataFrame({
        "src": np.concatenate([np.asarray(e[0], dtype=np.int64) for e in edges]),
        "dst": np.concatenate([np.asarray(e[1], dtype=np.int64) for e in edges]),
        "lat_ns": np.concatenate([np.asarray(e[2], dtype=np.int64) for e in edges]),
        "kind": np.concatenate([np.full(len(e[0]), int(e[3]), dtype=np.int8) for e in edges]),
    })


def _window_steps(graph: TaskGraph, begin_ids: np.ndarray, end_ids: np.ndarray) -> np.ndarray:
    """Tasks outside any step annotation (other threads, unlaunched GPU work) get the step whose
    window [begin, next begin) holds their start."""
    t = graph.tasks
    step = t["step"].to_numpy().astype(np.int64).copy()
    ranks = t["rank"].to_numpy()
    start = t["measured_start_ns"].to_numpy()
    b_rank = ranks[begin_ids]
    for r in np.unique(b_rank):
        sel = begin_ids[b_rank == r]
        sel = sel[np.argsort(start[sel], kind="stable")]
        begins = start[sel]
        numbers = step[sel]
        last_end = start[end_ids[b_rank == r]].max()
        todo = np.flatnonzero((ranks == r) & (step < 0) & (start >= begins[0]) & (start < last_end))
        step[todo] = numbers[np.searchsorted(begins, start[todo], side="right") - 1]
    return step


def _steps_table(graph: TaskGraph, begin_ids: np.ndarray, end_ids: np.ndarray,
                 origin_of_rank: dict[int, int]) -> pd.DataFrame:
    t = graph.tasks
    ranks = t["rank"].to_numpy()
    start = t["measured_start_ns"].to_numpy()
    stop = t["measured_end_ns"].to_numpy()
    step = t["step"].to_numpy()
    last_end = pd.Series(stop).groupby([ranks, step]).max()  # latest task end per (rank, step)
    rows = []
    for b, e in zip(begin_ids.tolist(), end_ids.tolist()):
        r, k = int(ranks[b]), int(step[b])
        rows.append((r, k, b, e, int(start[b]), int(max(stop[e], last_end[(r, k)]))))
    stepped = {row[0] for row in rows}
    for r, origin in origin_of_rank.items():
        if r not in stepped:  # no step annotations: one step spanning the rank's window
            in_rank = ranks == r
            rows.append((r, 0, origin, -1, int(start[origin]), int(stop[in_rank].max())))
            graph.tasks.loc[in_rank, "step"] = 0
    frame = pd.DataFrame(rows, columns=["rank", "step", "begin_task", "end_task", "measured_begin_ns",
                                        "measured_end_ns"])
    return frame.sort_values(["rank", "measured_begin_ns"], kind="stable").reset_index(drop=True)


def _anchor_roots(graph: TaskGraph, origin_of_rank: dict[int, int]) -> None:
    """Tasks with no predecessor start at their measured offset from their rank's origin."""
    t, e = graph.tasks, graph.edges
    indeg = np.bincount(e["dst"].to_numpy(), minlength=len(t))
    kinds = t["kind"].to_numpy()
    roots = np.flatnonzero((indeg == 0) & (kinds != int(TaskKind.ORIGIN)))
    origin = np.asarray([origin_of_rank[int(r)] for r in t["rank"].to_numpy()[roots]], dtype=np.int64)
    start = t["measured_start_ns"].to_numpy()
    lat = start[roots] - start[origin]
    graph.report["roots_anchored"] = len(roots)
    graph.edges = pd.concat([e, pd.DataFrame({"src": origin, "dst": roots.astype(np.int64), "lat_ns": lat,
                                              "kind": np.full(len(roots), int(EdgeKind.ANCHOR), dtype=np.int8)})],
                            ignore_index=True)
