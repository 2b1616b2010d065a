"""Compute slowed by the collective part it runs beside, kept right whatever a later transform does.

``overlap`` splits each region's compute segment into nano-batches and its collective into
parts. A compute nano-batch that runs beside a collective part is slowed by ``1 + (φ − 1)·f``, f
the fraction of its time beside the part, ``min(1, part / nano-batch)``: nano-batch 1 of a region
beside the previous region's last part (none for a step's first region, or without a split),
nano-batches 2..n beside their own region's parts (:func:`beside_fractions`).

f is a ratio of durations, so a later transform that changes them changes it: a GPU move speeds
the compute and not the NVLink parts. The slowdown is therefore kept as state, not baked into a
duration: :func:`set_beside` records the regions (``cost_beside_*`` columns,
:mod:`whatif.depgraph.schema`); every transform's ``apply`` runs on the kernels without it
(:func:`lift_beside`) and ends by putting it back at the durations it leaves
(:func:`slow_beside`), so ``overlap`` then ``gpu`` prices what ``gpu`` then ``overlap`` does.
The later nano-batches are :func:`~whatif.transforms.edit.set_follows` tasks of nano-batch 1, at
the ratio of their slowdown to its.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from whatif.depgraph.graph import TaskGraph, TaskKind
from whatif.depgraph.schema import (
    BESIDE_AFTER_COLUMN,
    BESIDE_PHI_COLUMN,
    BESIDE_REGION_COLUMN,
    BESIDE_SLOWED_COLUMN,
    FOLLOWS_COLUMN,
)

from .edit import follow_kernels, set_duration, set_state


def beside_fractions(seg_ns: np.ndarray, own_part_ns: np.ndarray,
                     prev_part_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per region: the fraction of its nano-batch 1 beside the previous region's last part
    (``prev_part_ns``, NaN: none, it waits for the whole collective) and of each of its nano-batches
    2..n beside its own part: ``min(1, part / nano-batch)``.

    >>> beside_fractions(np.array([100.0, 100.0]), np.array([50, 300]), np.array([np.nan, 50]))
    (array([0. , 0.5]), array([0.5, 1. ]))
    """
    seg = np.maximum(np.asarray(seg_ns, dtype=float), 1.0)
    prev = np.asarray(prev_part_ns, dtype=float)
    later = np.minimum(1.0, np.asarray(own_part_ns, dtype=float) / seg)
    first = np.where(np.isfinite(prev), np.minimum(1.0, np.nan_to_num(prev) / seg), 0.0)
    return first, later


def set_beside(graph: TaskGraph, *, segments: Sequence[np.ndarray], followers: Sequence[np.ndarray],
               parts: Sequence[np.ndarray], after: Sequence[int], phi: float, reason: str) -> TaskGraph:
    """Record overlap regions and slow their compute (:func:`slow_beside`). Region i: its nano-batch
    1 kernels ``segments[i]`` (at their durations without interference), its later nano-batches
    ``followers[i]`` (``set_follows`` tasks of ``segments[i]``), its collective parts ``parts[i]``,
    and ``after[i]``, the index of the region whose last part its nano-batch 1 runs beside (-1:
    none); ``phi`` the interference factor at full overlap."""
    t = graph.tasks
    base = int(np.nanmax(t[BESIDE_REGION_COLUMN].to_numpy(dtype=float))) + 1 \
        if BESIDE_REGION_COLUMN in t and t[BESIDE_REGION_COLUMN].notna().any() else 0
    members = [np.concatenate([s, f, p]).astype(np.int64) for s, f, p in zip(segments, followers, parts)]
    ids = np.concatenate(members)
    region = np.concatenate([np.full(len(m), base + i, dtype=float) for i, m in enumerate(members)])
    order = np.argsort(ids)
    g = set_state(graph, ids[order], BESIDE_REGION_COLUMN, region[order], reason=reason)
    seg = np.concatenate(list(segments)).astype(np.int64)
    prev = np.concatenate([np.full(len(s), base + a if a >= 0 else np.nan) for s, a in zip(segments, after)])
    order = np.argsort(seg)
    g = set_state(g, seg[order], BESIDE_AFTER_COLUMN, prev[order], reason=reason)
    g = set_state(g, np.sort(seg), BESIDE_PHI_COLUMN, float(phi), reason=reason)
    g = set_state(g, np.sort(seg), BESIDE_SLOWED_COLUMN, 1.0, reason=reason)
    return slow_beside(g)


def lift_beside(graph: TaskGraph) -> TaskGraph:
    """``graph`` with its nano-batch kernels at their durations without interference (the graph
    itself when none holds any): what a transform reprices before :func:`slow_beside` puts the
    interference back. ``rint(rint(d·k)/k) = d`` for a slowdown k ≥ 1, so lifting returns the
    durations exactly."""
    if BESIDE_SLOWED_COLUMN not in graph.tasks:
        return graph
    slowed = graph.tasks[BESIDE_SLOWED_COLUMN].to_numpy(dtype=float)
    idx = np.flatnonzero(np.isfinite(slowed) & (slowed != 1.0))
    if not len(idx):
        return graph
    dur = graph.tasks["dur_ns"].to_numpy()[idx]
    g = set_duration(graph, idx, np.rint(dur / slowed[idx]).astype(np.int64),
                     reason="nano-batch compute without the collective part beside it, for this transform to "
                            "reprice; put back at the durations it leaves")
    return set_state(g, idx, BESIDE_SLOWED_COLUMN, 1.0, reason="interference lifted")


def slow_beside(graph: TaskGraph) -> TaskGraph:
    """``graph`` with each region's nano-batch 1 kernels slowed by ``1 + (φ − 1)·f_first`` and its
    later nano-batches at ``(1 + (φ − 1)·f_later) / (1 + (φ − 1)·f_first)`` times them
    (:func:`beside_fractions` at the durations now); the graph itself when nothing changes."""
    t = graph.tasks
    if BESIDE_SLOWED_COLUMN not in t:
        return graph
    region = t[BESIDE_REGION_COLUMN].to_numpy(dtype=float)
    slowed = t[BESIDE_SLOWED_COLUMN].to_numpy(dtype=float)
    dur = t["dur_ns"].to_numpy()
    seg = np.flatnonzero(np.isfinite(region) & np.isfinite(slowed))
    if not len(seg):
        return graph
    part = np.flatnonzero(np.isfinite(region) & (t["kind"].to_numpy() == int(TaskKind.COMM)))
    follows = t[FOLLOWS_COLUMN].to_numpy(dtype=float) if FOLLOWS_COLUMN in t else np.full(len(t), np.nan)
    follower = np.flatnonzero(np.isfinite(region) & np.isfinite(follows))
    bare = np.rint(dur[seg] / slowed[seg])
    per = pd.DataFrame({"region": region[seg], "bare": bare, "phi": t[BESIDE_PHI_COLUMN].to_numpy(dtype=float)[seg],
                        "after": t[BESIDE_AFTER_COLUMN].to_numpy(dtype=float)[seg]}).groupby("region", sort=True)
    regions = per.agg(seg_ns=("bare", "sum"), phi=("phi", "first"), after=("after", "first"))
    part_ns = pd.Series(dur[part], index=region[part]).groupby(level=0).max()
    first, later = beside_fractions(regions["seg_ns"].to_numpy(), part_ns.reindex(regions.index).fillna(0).to_numpy(),
                                    part_ns.reindex(regions["after"].to_numpy()).to_numpy())
    k_first = pd.Series(1 + (regions["phi"].to_numpy() - 1) * first, index=regions.index)
    k_later = pd.Series(1 + (regions["phi"].to_numpy() - 1) * later, index=regions.index)
    k = k_first.reindex(region[seg]).to_numpy()
    new = np.rint(bare * k).astype(np.int64)
    g = graph
    changed = new != dur[seg]
    if changed.any():
        g = set_duration(g, seg[changed], new[changed],
                         reason="nano-batch 1 slowed where it runs beside the previous region's last collective part")
    moved = k != slowed[seg]
    if moved.any():
        g = set_state(g, seg[moved], BESIDE_SLOWED_COLUMN, k[moved], reason="interference beside collective parts")
    ratio = (k_later / k_first).reindex(region[follower]).to_numpy()
    off = ratio != follows[follower]
    if off.any():
        g = set_state(g, follower[off], FOLLOWS_COLUMN, ratio[off],
                      reason="later nano-batches beside their own region's collective parts")
    return follow_kernels(g)
