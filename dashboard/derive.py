"""Views derived from an analysis for the pages: per-phase breakdowns, task details, and the
small sub-graphs the Graph page draws (a task's neighbourhood, a step's critical path)."""
from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from whatif.depgraph.graph import (
    GPU_WORK_KINDS,
    EdgeKind,
    TaskGraph,
    TaskKind,
    kind_codes,
)
from whatif.documents import CriticalPathEntry, counted, mean_breakdown_ns
from whatif.figures import PhaseBreakdown
from whatif.predictors.replay import Replay
from whatif.predictors.steps import CATEGORIES, critical_path
from whatif.report.diff_text import short_name

GPU = kind_codes(GPU_WORK_KINDS)


def step_phases(graph: TaskGraph) -> list[str]:
    """Per row of ``graph.steps``: the phase holding most of the step's task time ("-" if none)."""
    t = graph.tasks
    frame = pd.DataFrame({"rank": t["rank"].to_numpy(), "step": t["step"].to_numpy(),
                          "phase": t["phase"].astype(object).fillna("-").to_numpy(), "dur": t["dur_ns"].to_numpy()})
    frame = frame[frame["phase"] != "-"]
    best: dict[tuple[int, int], str] = {}
    if len(frame):
        agg = frame.groupby(["rank", "step", "phase"], sort=False)["dur"].sum().reset_index()
        agg = agg.sort_values("dur", ascending=False, kind="stable").drop_duplicates(["rank", "step"])
        best = {(int(r), int(s)): str(p) for r, s, p in zip(agg["rank"], agg["step"], agg["phase"])}
    steps = graph.steps
    return [best.get((int(r), int(s)), "-") for r, s in zip(steps["rank"], steps["step"])]


def phase_rows(graph: TaskGraph, paths: list[CriticalPathEntry]) -> list[PhaseBreakdown]:
    """Mean critical-path breakdown of the counted steps of each phase (``paths``: a document's
    ``critical_path`` list, one entry per step row; excluded steps are left out, see
    :func:`whatif.documents.counted`); steps without a phase annotation are the phase ``no phase``."""
    groups: dict[str, list[CriticalPathEntry]] = {}
    keep = {(p.rank, p.step) for p in counted(paths)}
    for phase, p in zip(step_phases(graph), paths):
        if (p.rank, p.step) in keep:
            groups.setdefault(phase, []).append(p)
    return [PhaseBreakdown("no phase" if phase == "-" else phase, len(ps), mean_breakdown_ns(ps))
            for phase, ps in groups.items()]


def step_row(graph: TaskGraph, task: int) -> int | None:
    """Row of ``graph.steps`` that task ``task`` belongs to."""
    t = graph.tasks
    rank, step = int(t["rank"].to_numpy()[task]), int(t["step"].to_numpy()[task])
    hit = np.flatnonzero((graph.steps["rank"].to_numpy() == rank) & (graph.steps["step"].to_numpy() == step))
    return int(hit[0]) if len(hit) else None


def critical_tasks(replay: Replay, row: int, cache: dict[Hashable, Any]) -> set[int]:
    """Tasks on the critical path of step row ``row`` (cached in ``cache``)."""
    key = f"cp:{id(replay)}:{row}"
    if key not in cache:
        cache[key] = set(critical_path(replay, row).tasks)
    return cache[key]


def _task_label(graph: TaskGraph, v: int) -> str:
    t = graph.tasks
    return f"#{v} {TaskKind(int(t['kind'].to_numpy()[v])).name.lower()} {str(t['name'].iat[v])[:70]}"


def task_details(graph: TaskGraph, replay: Replay | None, task: int, cache: dict[Hashable, Any],
                 limit: int = 12, t0_ns: int = 0) -> dict[str, Any]:
    """What the timeline shows for a clicked task: attributes, times (``t0_ns``: time zero of the
    timeline), dependencies, and whether it is on its step's critical path."""
    t = graph.tasks
    if not 0 <= task < len(t):
        raise IndexError(f"task {task} does not exist (the graph has {len(t):,} tasks)")
    row = t.iloc[task]
    e = graph.edges
    src, dst, kind, lat = (e[c].to_numpy() for c in ("src", "dst", "kind", "lat_ns"))

    def deps(mask: np.ndarray, other: np.ndarray) -> list[dict[str, Any]]:
        idx = np.flatnonzero(mask)[:limit]
        return [{"task": int(other[i]), "edge": EdgeKind(int(kind[i])).name.lower(),
                 "lat_us": round(float(lat[i]) / 1e3, 3), "label": _task_label(graph, int(other[i]))} for i in idx]

    out: dict[str, Any] = {
        "task": task, "name": str(row["name"]), "kind": TaskKind(int(row["kind"])).name.lower(),
        "resource": str(graph.resources["name"].iat[int(row["resource"])]), "rank": int(row["rank"]),
        "step": int(row["step"]), "phase": None if pd.isna(row["phase"]) else str(row["phase"]),
        "layer": None if pd.isna(row["layer"]) else str(row["layer"]),
        "op": None if pd.isna(row["op"]) else str(row["op"]),
        "measured_us": round((int(row["measured_end_ns"]) - int(row["measured_start_ns"])) / 1e3, 3)
        if int(row["measured_start_ns"]) >= 0 else None,
        "duration_us": round(int(row["dur_ns"]) / 1e3, 3),
        "predecessors": deps(dst == task, src), "successors": deps(src == task, dst),
        "n_predecessors": int((dst == task).sum()), "n_successors": int((src == task).sum()),
    }
    if replay is not None:
        out["predicted_start_ms"] = round((int(replay.start_ns[task]) - t0_ns) / 1e6, 6)
        out["predicted_us"] = round(int(replay.end_ns[task] - replay.start_ns[task]) / 1e3, 3)
        r = step_row(graph, task)
        out["critical"] = r is not None and task in critical_tasks(replay, r, cache)
    return out


LABEL_CHARS = 28
"""Characters of a task name a graph node shows (the middle elided)."""


def _node(graph: TaskGraph, v: int, replay: Replay | None, classes: str = "") -> dict[str, Any]:
    t = graph.tasks
    k = TaskKind(int(t["kind"].to_numpy()[v]))
    dur = int(replay.end_ns[v] - replay.start_ns[v]) if replay is not None else int(t["dur_ns"].to_numpy()[v])
    group = "gpu" if int(k) in GPU else ("cpu" if k in (TaskKind.CPU_CALL, TaskKind.CPU_WORK, TaskKind.WAIT)
                                         else "other")
    name = str(t["name"].iat[v])
    return {"data": {"id": str(v), "label": f"{short_name(name, LABEL_CHARS)}\n{dur / 1e3:,.1f} us", "task": v,
                     "name": name},
            "classes": f"{group} {classes}".strip()}


def neighbourhood(graph: TaskGraph, replay: Replay | None, task: int, depth: int = 1,
                  max_nodes: int = 80) -> list[dict[str, Any]]:
    """Cytoscape elements: ``task`` and the tasks within ``depth`` edges of it (either direction)."""
    n = len(graph.tasks)
    if not 0 <= task < n:
        raise IndexError(f"task {task} does not exist (the graph has {n:,} tasks)")
    e = graph.edges
    src, dst, kind = e["src"].to_numpy(), e["dst"].to_numpy(), e["kind"].to_numpy()
    seen, frontier = {task}, deque([(task, 0)])
    while frontier and len(seen) < max_nodes:
        v, d = frontier.popleft()
        if d >= depth:
            continue
        for u in np.concatenate([dst[src == v], src[dst == v]]).tolist():
            if u not in seen and len(seen) < max_nodes:
                seen.add(int(u))
                frontier.append((int(u), d + 1))
    nodes = [_node(graph, v, replay, "selected" if v == task else "") for v in sorted(seen)]
    ids = np.fromiter(seen, dtype=np.int64)
    mask = np.isin(src, ids) & np.isin(dst, ids)
    edges = [{"data": {"source": str(s), "target": str(d), "label": EdgeKind(int(k)).name.lower()}}
             for s, d, k in zip(src[mask], dst[mask], kind[mask])]
    return nodes + edges


PATH_NODES = 24
"""Most segments a drawn critical path has (:func:`path_segments`)."""
PATH_COLUMNS = 6
"""Segments per row of a drawn critical path: rows read left to right, top to bottom."""
SLOWEST = 5
"""Segments of a drawn critical path highlighted as the slowest."""
X_GAP, Y_GAP = 215, 120  # model units between segment centres; the page draws them at zoom ~1


def path_segments(tasks: Sequence[int], resource: np.ndarray, kind: np.ndarray, start_ns: np.ndarray,
                  end_ns: np.ndarray, max_segments: int = PATH_NODES) -> list[list[int]]:
    """The tasks of a critical path (in path order) cut into at most ``max_segments`` runs of
    consecutive tasks: a task per segment at first, then, while there are too many, the two
    neighbouring segments that take least time together are merged, neighbours of one kind on one
    resource first; so a long path keeps its slow segments apart and lumps the many short ones.

    >>> res, kind = np.array([0, 0, 1, 1, 0]), np.zeros(5, int)
    >>> start, end = np.array([0, 1, 2, 10, 11]), np.array([1, 2, 10, 11, 30])
    >>> path_segments([0, 1, 2, 3, 4], res, kind, start, end, 3)
    [[0, 1], [2, 3], [4]]
    >>> path_segments([0, 1, 2, 3, 4], res, kind, start, end, 2)
    [[0, 1, 2, 3], [4]]
    """
    segments = [[int(v)] for v in tasks]
    if len(segments) <= max(1, max_segments):
        return segments
    first = np.asarray(tasks, dtype=np.int64)
    lo, hi = start_ns[first].astype(np.int64), end_ns[first].astype(np.int64)
    res, knd = resource[first].astype(np.int64), kind[first].astype(np.int64)  # -1: mixed
    apart = int(hi.max() - lo.min()) + 1  # added to a pair on two resources or kinds: merged last
    while len(segments) > max(1, max_segments):
        same = (res[:-1] == res[1:]) & (knd[:-1] == knd[1:]) & (res[:-1] >= 0)
        cost = (hi[:-1] - lo[:-1]) + (hi[1:] - lo[1:]) + np.where(same, 0, apart)
        i = int(np.argmin(cost))
        segments[i:i + 2] = [segments[i] + segments[i + 1]]
        hi[i] = hi[i + 1]
        if not same[i]:
            res[i] = knd[i] = -1
        lo, hi, res, knd = (np.delete(a, i + 1) for a in (lo, hi, res, knd))
    return segments


def segment_times_ns(segments: Sequence[Sequence[int]], end_ns: np.ndarray, length_ns: int) -> list[int]:
    """Per segment of a critical path (in path order): the time it adds to the path, from the end
    of the segment before it to its own end (the first from the step's begin, ``length_ns`` before
    the last end). A task that waits, such as a CPU thread blocked in a synchronize while the GPU
    work it waits for is on the path, adds only what it runs past that work, as in the path's
    breakdown (:func:`whatif.predictors.steps.critical_path`); so the times sum to ``length_ns``.

    >>> segment_times_ns([[0], [1, 2], [3]], np.array([10, 50, 60, 64]), 60)
    [6, 50, 4]
    """
    ends = np.array([int(end_ns[g[-1]]) for g in segments], dtype=np.int64)
    if not len(ends):
        return []
    begin = int(ends[-1]) - int(length_ns)
    return np.diff(np.concatenate([[begin], ends])).astype(int).tolist()


def critical_path_elements(replay: Replay, row: int, max_nodes: int = PATH_NODES) -> list[dict[str, Any]]:
    """Cytoscape elements of the critical path of step row ``row``, placed left to right in rows of
    :data:`PATH_COLUMNS` (preset positions): one node per segment of :func:`path_segments`, the
    :data:`SLOWEST` slowest of class ``slow``. A segment's time is what it adds to the path
    (:func:`segment_times_ns`), so the times sum to the step."""
    graph = replay.graph
    t = graph.tasks
    res = t["resource"].to_numpy()
    path = critical_path(replay, row)
    segments = path_segments(path.tasks, res, t["kind"].to_numpy(), replay.start_ns, replay.end_ns, max_nodes)
    times = segment_times_ns(segments, replay.end_ns, path.length_ns)
    slow = set(sorted(range(len(segments)), key=lambda i: (-times[i], i))[:SLOWEST])
    elements: list[dict[str, Any]] = []
    for i, (g, time_ns) in enumerate(zip(segments, times)):
        node = _node(graph, g[0], replay, "critical")
        if len(g) > 1:
            longest = max(g, key=lambda v: (int(replay.end_ns[v] - replay.start_ns[v]), -v))
            names = ", ".join(dict.fromkeys(str(t["name"].iat[v]) for v in g))
            where = str(graph.resources["name"].iat[int(res[g[0]])]) if len(set(res[g].tolist())) == 1 \
                else "several resources"
            top = short_name(str(t["name"].iat[longest]), LABEL_CHARS)
            node["data"].update(name=names, label=f"{len(g)} tasks on {short_name(where, 22)}\n"
                                                  f"{top}\n{time_ns / 1e3:,.1f} us")
            node["classes"] = "group critical"
        else:
            own_ns = int(replay.end_ns[g[0]] - replay.start_ns[g[0]])
            if own_ns != time_ns:   # a wait: it ran beside the work before it on the path
                node["data"]["label"] = f"{short_name(str(t['name'].iat[g[0]]), LABEL_CHARS)}\n" \
                                        f"{time_ns / 1e3:,.1f} us on the path\n(ran {own_ns / 1e3:,.1f} us)"
        node["data"].update(id=f"g{i}", time_us=round(time_ns / 1e3, 3))
        node["position"] = {"x": (i % PATH_COLUMNS) * X_GAP, "y": (i // PATH_COLUMNS) * Y_GAP}
        if i in slow:
            node["classes"] += " slow"
        elements.append(node)
        if i:
            wrap = " wrap" if i % PATH_COLUMNS == 0 else ""
            elements.append({"data": {"source": f"g{i - 1}", "target": f"g{i}", "label": ""}, "classes": wrap.strip()})
    return elements


def path_rows(n_segments: int) -> int:
    """Rows a critical path of ``n_segments`` segments is drawn on."""
    return max(1, -(-n_segments // PATH_COLUMNS))


def slowest_steady_step(steps: pd.DataFrame) -> int | None:
    """Row of ``steps`` (a graph's step table) with the longest measured time among the steps that
    count by default (:mod:`whatif.core.steps`: not the warm-up, not a partial last step); among all
    steps when none counts; None when there are none."""
    if not len(steps):
        return None
    measured = steps["measured_ns"].to_numpy()
    counted = np.flatnonzero(steps["included"].to_numpy().astype(bool))
    rows = counted if len(counted) else np.arange(len(steps))
    return int(rows[int(np.argmax(measured[rows]))])


def breakdown_row(breakdown: dict[str, float]) -> dict[str, float]:
    return {f"{c} ms": round(breakdown.get(c, 0) / 1e6, 3) for c in CATEGORIES}
