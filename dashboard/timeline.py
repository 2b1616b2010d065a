"""Timeline data: one lane per resource, measured or replayed task times, and the view of a
time window: busy fraction per bin when the window holds many tasks, exact slices otherwise.

A view is a plain dict (see :func:`view`) that :func:`whatif.figures.timeline_figure` draws;
building one for a 100 k-task graph takes a few milliseconds (numpy, no Python loop per task).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from whatif.depgraph.graph import (
    LOCAL_GPU_WORK_KINDS,
    EdgeKind,
    TaskGraph,
    TaskKind,
    kind_codes,
)
from whatif.predictors.replay import Replay

CATEGORIES = ("cpu", "launch", "gpu", "comm", "sync")
ZERO_LENGTH = (int(TaskKind.ORIGIN), int(TaskKind.MARKER), int(TaskKind.ARRIVE), int(TaskKind.BARRIER))
MAX_EXACT = 4000   # tasks of a panel's window drawn one by one; above this, bins
BINS = 480         # bins across the window when aggregating


@dataclass
class Lanes:
    """The resources that hold tasks, in display order, with their labels."""

    resources: np.ndarray  # resource id per lane
    labels: list[str]
    lane_of: np.ndarray    # lane per resource id (-1: not shown)


@dataclass
class Timeline:
    """Tasks of one graph laid on lanes, with times in ns relative to ``t0``."""

    name: str
    graph: TaskGraph
    ids: np.ndarray     # task id
    lane: np.ndarray
    start: np.ndarray   # ns since t0
    end: np.ndarray
    category: np.ndarray  # index into CATEGORIES


def lanes(graph: TaskGraph) -> Lanes:
    """Lanes of the resources that hold non-zero-length tasks, ordered by rank, then threads
    before streams before virtual resources."""
    t = graph.tasks
    res = graph.resources
    used = np.zeros(len(res), dtype=bool)
    shown = ~t["kind"].isin(ZERO_LENGTH).to_numpy()
    used[t["resource"].to_numpy()[shown]] = True
    ids = np.flatnonzero(used)
    order = np.lexsort((ids, res["kind"].to_numpy()[ids], res["rank"].to_numpy()[ids]))
    ids = ids[order]
    multi = res["rank"].nunique() > 1
    labels = [(f"r{int(res['rank'].to_numpy()[i])} " if multi else "") + str(res["name"].iat[i]) for i in ids.tolist()]
    lane_of = np.full(len(res), -1, dtype=np.int64)
    lane_of[ids] = np.arange(len(ids))
    return Lanes(resources=ids, labels=labels, lane_of=lane_of)


def _categories(graph: TaskGraph) -> np.ndarray:
    t = graph.tasks
    kinds = t["kind"].to_numpy()
    e = graph.edges
    launches = np.zeros(len(t), dtype=bool)
    if len(e):
        launches[e["src"].to_numpy()[e["kind"].to_numpy() == int(EdgeKind.LAUNCH)]] = True
    cat = np.zeros(len(t), dtype=np.int8)  # cpu
    cat[(kinds == int(TaskKind.CPU_CALL)) & launches] = 1
    cat[np.isin(kinds, kind_codes(LOCAL_GPU_WORK_KINDS))] = 2
    cat[kinds == int(TaskKind.COMM)] = 3
    cat[kinds == int(TaskKind.WAIT)] = 4
    return cat


def origin_ns(graph: TaskGraph) -> int:
    """Time zero of the timelines: the earliest measured start."""
    m = graph.tasks["measured_start_ns"].to_numpy()
    m = m[m >= 0]
    return int(m.min()) if len(m) else 0


def build(name: str, graph: TaskGraph, lanes_: Lanes, t0: int, replay: Replay | None = None) -> Timeline:
    """The measured timeline of ``graph`` (``replay`` None) or the replayed one."""
    t = graph.tasks
    if replay is None:
        start = t["measured_start_ns"].to_numpy()
        end = t["measured_end_ns"].to_numpy()
    else:
        start, end = replay.start_ns, replay.end_ns
    res = t["resource"].to_numpy()
    lane_of = lanes_.lane_of
    lane = np.where(res < len(lane_of), lane_of[np.minimum(res, len(lane_of) - 1)], -1)
    keep = (lane >= 0) & (start >= 0) & (end > start) & ~t["kind"].isin(ZERO_LENGTH).to_numpy()
    ids = np.flatnonzero(keep)
    order = np.argsort(start[ids], kind="stable")
    ids = ids[order]
    return Timeline(name=name, graph=graph, ids=ids, lane=lane[ids], start=start[ids] - t0, end=end[ids] - t0,
                    category=_categories(graph)[ids])


def extent_ns(*timelines: Timeline) -> tuple[int, int]:
    lo = min((int(tl.start.min()) for tl in timelines if len(tl.start)), default=0)
    hi = max((int(tl.end.max()) for tl in timelines if len(tl.end)), default=1)
    return lo, max(hi, lo + 1)


def _busy_bins(tl: Timeline, sel: np.ndarray, x0: int, x1: int, nlanes: int, bins: int) -> np.ndarray:
    """Busy fraction of every (lane, bin) over [x0, x1): overlap of the tasks with each bin."""
    width = (x1 - x0) / bins
    s = np.clip(tl.start[sel], x0, x1).astype(np.float64)
    e = np.clip(tl.end[sel], x0, x1).astype(np.float64)
    lane = tl.lane[sel]
    b0 = np.minimum(((s - x0) / width).astype(np.int64), bins - 1)
    b1 = np.minimum(((e - x0) / width).astype(np.int64), bins - 1)
    busy = np.zeros(nlanes * bins)
    same = b0 == b1
    np.add.at(busy, lane[same] * bins + b0[same], e[same] - s[same])
    d = ~same
    if d.any():
        lo_edge = x0 + (b0[d] + 1) * width
        hi_edge = x0 + b1[d] * width
        np.add.at(busy, lane[d] * bins + b0[d], lo_edge - s[d])
        np.add.at(busy, lane[d] * bins + b1[d], e[d] - hi_edge)
        full = np.zeros(nlanes * bins + 1)  # difference array of whole bins in between
        np.add.at(full, lane[d] * bins + b0[d] + 1, 1.0)
        np.add.at(full, lane[d] * bins + b1[d], -1.0)
        busy += np.cumsum(full)[:-1] * width
    return np.clip(busy.reshape(nlanes, bins) / width, 0.0, 1.0)


def panel(tl: Timeline, x0: int, x1: int, nlanes: int, max_exact: int = MAX_EXACT, bins: int = BINS) -> dict[str, Any]:
    """One panel of a view: ``mode`` ``"bins"`` (``x`` bin centres in ms, ``z`` busy fraction per
    lane and bin) or ``"exact"`` (per category: ``start``/``end`` in ms, ``lane``, ``id``, ``name``)."""
    sel = np.flatnonzero((tl.start < x1) & (tl.end > x0))
    out: dict[str, Any] = {"name": tl.name, "tasks": int(len(sel))}
    if len(sel) > max_exact:
        width = (x1 - x0) / bins
        out.update(mode="bins", x=((x0 + (np.arange(bins) + 0.5) * width) / 1e6).tolist(),
                   z=np.round(_busy_bins(tl, sel, x0, x1, nlanes, bins), 3).tolist())
        return out
    names = tl.graph.tasks["name"].to_numpy()
    segments = {}
    for ci, cat in enumerate(CATEGORIES):
        pick = sel[tl.category[sel] == ci]
        if len(pick):
            ids = tl.ids[pick]
            segments[cat] = {"start": np.round(tl.start[pick] / 1e6, 6).tolist(),
                             "end": np.round(tl.end[pick] / 1e6, 6).tolist(),
                             "lane": tl.lane[pick].tolist(), "id": ids.tolist(),
                             "name": [str(n)[:80] for n in names[ids]]}
    out.update(mode="exact", segments=segments)
    return out


def view(timelines: list[Timeline], lanes_: Lanes, window_ns: tuple[int, int] | None = None,
         max_exact: int = MAX_EXACT, bins: int = BINS) -> dict[str, Any]:
    """The view of ``window_ns`` (default: everything): lanes, x range in ms, one panel per timeline."""
    x0, x1 = window_ns or extent_ns(*timelines)
    x0, x1 = int(x0), int(max(x1, x0 + 1))
    n = len(lanes_.labels)
    return {"lanes": lanes_.labels, "range_ms": [x0 / 1e6, x1 / 1e6],
            "panels": [panel(tl, x0, x1, n, max_exact, bins) for tl in timelines]}


def window_from_relayout(relayout: dict[str, Any] | None, current: tuple[int, int] | None) -> tuple[int, int] | None:
    """The x window (ns) a plotly ``relayoutData`` asks for; None for 'everything'."""
    if not relayout:
        return current
    for axis in ("xaxis", "xaxis2", "xaxis3"):
        if relayout.get(f"{axis}.autorange"):
            return None
        lo, hi = relayout.get(f"{axis}.range[0]"), relayout.get(f"{axis}.range[1]")
        if lo is None and isinstance(relayout.get(f"{axis}.range"), list):
            lo, hi = relayout[f"{axis}.range"]
        if lo is not None and hi is not None:
            return int(float(lo) * 1e6), int(float(hi) * 1e6)
    return current
