"""Views derived from an analysis for the pages: per-phase breakdowns, task details, and the
small sub-graphs the Graph page draws (a task's neighbourhood, a step's critical path)."""
from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Any

import numpy as np
import pandas as pd

from whatif.api import Analysis
from whatif.depgraph.graph import (
    GPU_WORK_KINDS,
    EdgeKind,
    TaskGraph,
    TaskKind,
    kind_codes,
)
from whatif.documents import CriticalPathEntry, mean_breakdown_ns
from whatif.figures import PhaseBreakdown
from whatif.predictors.replay import Replay
from whatif.predictors.steps import CATEGORIES, critical_path

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
    """Mean critical-path breakdown of the steps of each phase (``paths``: a document's
    ``critical_path`` list, one entry per step row)."""
    groups: dict[str, list[CriticalPathEntry]] = {}
    for phase, p in zip(step_phases(graph), paths):
        groups.setdefault(phase, []).append(p)
    return [PhaseBreakdown(phase, len(ps), mean_breakdown_ns(ps)) for phase, ps in groups.items()]


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


def _node(graph: TaskGraph, v: int, replay: Replay | None, classes: str = "") -> dict[str, Any]:
    t = graph.tasks
    k = TaskKind(int(t["kind"].to_numpy()[v]))
    dur = int(replay.end_ns[v] - replay.start_ns[v]) if replay is not None else int(t["dur_ns"].to_numpy()[v])
    group = "gpu" if int(k) in GPU else ("cpu" if k in (TaskKind.CPU_CALL, TaskKind.CPU_WORK, TaskKind.WAIT)
                                         else "other")
    return {"data": {"id": str(v), "label": f"{str(t['name'].iat[v])[:28]}\n{dur / 1e3:,.1f} us", "task": v},
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


def critical_path_elements(analysis: Analysis, replay: Replay, row: int, max_nodes: int = 60) -> list[dict[str, Any]]:
    """Cytoscape elements of the critical path of step row ``row``: consecutive tasks of one kind
    on the same resource are merged into one node (count, time), and if still too many, neighbours are merged
    further, so a long path stays readable."""
    graph = replay.graph
    path = critical_path(replay, row).tasks
    t = graph.tasks
    res = t["resource"].to_numpy()
    kinds = t["kind"].to_numpy()
    groups: list[list[int]] = []
    for v in path:
        if groups and res[groups[-1][-1]] == res[v] and kinds[groups[-1][-1]] == kinds[v]:
            groups[-1].append(v)
        else:
            groups.append([v])
    chunk = max(1, -(-len(groups) // max_nodes))
    merged = [[v for g in groups[i:i + chunk] for v in g] for i in range(0, len(groups), chunk)]
    elements: list[dict[str, Any]] = []
    for i, g in enumerate(merged):
        time_ns = int(replay.end_ns[g[-1]] - replay.start_ns[g[0]])
        if len(g) == 1:
            node = _node(graph, g[0], replay, "critical")
        else:
            names = {str(t["name"].iat[v])[:24] for v in g[:3]}
            node = {"data": {"id": f"g{i}", "task": g[0], "label": f"{len(g)} tasks: {', '.join(sorted(names))}"
                             f"\n{time_ns / 1e3:,.1f} us"}, "classes": "group critical"}
        node["data"]["id"] = f"g{i}"
        elements.append(node)
        if i:
            elements.append({"data": {"source": f"g{i - 1}", "target": f"g{i}", "label": ""}})
    return elements


def breakdown_row(breakdown: dict[str, float]) -> dict[str, float]:
    return {f"{c} ms": round(breakdown.get(c, 0) / 1e6, 3) for c in CATEGORIES}
