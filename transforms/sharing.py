"""Compute kernels that share their GPU with a collective run slower: the collective's kernel holds
SMs and HBM bandwidth while it runs (NCCL's ring and tree kernels take 1 channel = 1 SM each, and
move every byte through HBM). One domain fact, used three ways:

* **Calibration** (:func:`calibrated_interference`): a trace that runs the same compute kernel both
  beside a collective and alone measures the slowdown at full overlap, φ = 1 + the median over
  kernel names of ``(median(duration beside) / median(duration alone) − 1) / median(f beside)``,
  ``f`` the fraction of the kernel's time beside a collective (names with ≥ 3 samples on each
  side, clipped to [1, 3]): the same ``g(f)`` the replay prices with. Without such pairs φ is
  :data:`DEFAULT_INTERFERENCE` (1.15, an assumption: BACKGROUND's "more than the max, less than
  the sum").
* **The replay** (:func:`shared_durations`, run by :func:`whatif.predictors.replay.replay`): a
  kernel that ran beside collectives for a fraction ``f`` of its time takes
  ``d · g(f_now) / g(f_ref)`` with ``g(f) = 1 + (φ − 1)·f``, where ``d`` is its duration in the
  graph (measured, or re-priced by a transform from the measured one), ``f_ref`` the fraction in
  the baseline's replay and ``f_now`` the fraction in this replay. A kernel whose collective
  shrinks or disappears gets faster; one a transform puts beside a collective gets slower; an
  unchanged graph replays exactly as before (``f_now = f_ref``). The replay iterates toward the
  fixed point, at most :data:`MAX_PASSES` more runs; its graph then holds the durations it ran
  with and, as their reference, the fractions it ran into, so that replaying it again changes
  nothing.
* **Opting out** (:func:`priced_by_transform`): a transform that prices the interference of the
  kernels it re-times itself (``overlap``'s nano-batches, ``sequence_parallel``'s attention blocks
  beside ring hops and torus transfers) first sets them to their time alone (``d / g(f_ref)``) and
  takes them out of the replay's re-pricing, so that it is counted once. They stay out for later
  transforms too. A scenario sets φ with the ``interference`` transform (``factor = 1``: no
  re-pricing).

The reference lives in two task columns that every primitive carries (:data:`SHARE_REF`,
:data:`SHARE_INTERFERENCE`); tasks a transform inserts have none and keep their durations.
Left out: the collectives' own slowdown beside compute (their measured time includes their peers'
arrival, so the trace cannot separate it), interference between two compute kernels on different
streams, and the number of SMs each collective holds (one φ per graph).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from whatif.core.kernels import KernelClass
from whatif.depgraph.annotate import annotate
from whatif.depgraph.graph import TaskGraph, TaskKind

from .edit import set_duration, set_state
from .select import kernel_classes

DEFAULT_INTERFERENCE = 1.15
MIN_SAMPLES = 3
MAX_INTERFERENCE = 3.0
SHARE_REF = "share_ref"
"""Task column: the fraction of the task's time beside a collective in the baseline's replay
(NaN: the replay does not re-price the task)."""
SHARE_INTERFERENCE = "share_interference"
"""Task column: φ, the slowdown of a compute kernel that runs beside a collective all its time."""
MAX_PASSES = 8
TOLERANCE = 1e-3   # the replay has converged when the re-priced durations moved by less than this, in all


def collective_mask(graph: TaskGraph) -> np.ndarray:
    """Collectives: COMM tasks and collective kernels."""
    kinds = graph.tasks["kind"].to_numpy()
    return (kinds == int(TaskKind.COMM)) | \
        ((kinds == int(TaskKind.KERNEL)) & (kernel_classes(graph) == KernelClass.COLLECTIVE.value))


def compute_mask(graph: TaskGraph) -> np.ndarray:
    """Compute kernels: kernels that are not collectives."""
    kinds = graph.tasks["kind"].to_numpy()
    return (kinds == int(TaskKind.KERNEL)) & (kernel_classes(graph) != KernelClass.COLLECTIVE.value)


def covered_fraction(graph: TaskGraph, start_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
    """Per task: the fraction of ``[start, end)`` during which a collective of the same rank runs
    (0 for tasks of no length; the collectives' own rows included).

    >>> import pandas as pd
    >>> from whatif.depgraph.graph import TaskGraph
    >>> tasks = pd.DataFrame({"kind": [4, 7, 7], "rank": [0, 0, 0], "name": ["gemm", "nccl", "nccl"],
    ...                       "op": [None, None, None]})
    >>> g = TaskGraph(tasks=tasks, edges=pd.DataFrame(), resources=pd.DataFrame(), steps=pd.DataFrame())
    >>> covered_fraction(g, np.array([0, 20, 60]), np.array([100, 40, 70])).round(2).tolist()
    [0.3, 1.0, 1.0]
    """
    start = np.asarray(start_ns, dtype=np.int64)
    end = np.asarray(end_ns, dtype=np.int64)
    out = np.zeros(len(start), dtype=float)
    coll = collective_mask(graph) & (end > start)
    if not coll.any():
        return out
    rank = graph.tasks["rank"].to_numpy()
    length = (end - start).astype(float)
    order = np.argsort(rank, kind="stable")   # one sort: each rank's tasks are a slice
    bounds = np.flatnonzero(np.r_[True, rank[order][1:] != rank[order][:-1], True])
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        ids = order[lo:hi]
        c = ids[coll[ids]]
        if not len(c):
            continue
        s, e = _union(start[c], end[c])
        before = np.concatenate(([0], np.cumsum(e - s)))   # covered length before interval i
        mine = ids[end[ids] > start[ids]]
        covered = _covered_before(end[mine], s, e, before) - _covered_before(start[mine], s, e, before)
        out[mine] = covered / length[mine]
    return out


def _union(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The disjoint, sorted intervals covering the same points as ``[s, e)``."""
    o = np.argsort(s, kind="stable")
    s, e = s[o], np.maximum.accumulate(e[o])
    new = np.concatenate(([True], s[1:] > e[:-1]))
    first = np.flatnonzero(new)
    last = np.concatenate((first[1:] - 1, [len(s) - 1]))
    return s[first], e[last]


def _covered_before(x: np.ndarray, s: np.ndarray, e: np.ndarray, before: np.ndarray) -> np.ndarray:
    """Length of the union ``[s, e)`` below each ``x``."""
    i = np.searchsorted(s, x, side="right") - 1
    j = np.maximum(i, 0)
    inside = np.clip(x - s[j], 0, e[j] - s[j])
    return np.where(i >= 0, before[j] + inside, 0).astype(float)


def calibrated_interference(graph: TaskGraph, among: np.ndarray | None = None) -> tuple[float | None, int]:
    """(φ, kernel names it was measured on) from the trace's measured intervals, over the compute
    kernels ``among`` selects (a boolean mask; all by default); (None, 0) when no compute kernel
    ran both beside a collective and alone at least :data:`MIN_SAMPLES` times each."""
    t = graph.tasks
    ms, me = t["measured_start_ns"].to_numpy(np.int64), t["measured_end_ns"].to_numpy(np.int64)
    measured = ms >= 0
    if not (collective_mask(graph) & measured).any():
        return None, 0
    fraction = covered_fraction(graph, np.where(measured, ms, 0), np.where(measured, me, 0))
    kern = compute_mask(graph) & measured & (True if among is None else np.asarray(among, dtype=bool))
    if not kern.any():
        return None, 0
    df = pd.DataFrame({"name": t["name"].astype(str).to_numpy()[kern], "dur": (me - ms)[kern],
                       "f": fraction[kern]})
    slopes = []
    for _, d in df.groupby("name"):
        a, b = d[d["f"] > 0], d.loc[d["f"] == 0, "dur"]
        if len(a) >= MIN_SAMPLES and len(b) >= MIN_SAMPLES and b.median() > 0:
            slopes.append((a["dur"].median() / b.median() - 1) / a["f"].median())
    if not slopes:
        return None, 0
    return float(np.clip(1 + np.median(slopes), 1.0, MAX_INTERFERENCE)), len(slopes)


def interference_of(graph: TaskGraph) -> float:
    """φ of ``graph``: calibrated on its trace, else :data:`DEFAULT_INTERFERENCE`."""
    got, _ = calibrated_interference(graph)
    return got if got is not None else DEFAULT_INTERFERENCE


def graph_interference(graph: TaskGraph) -> float:
    """φ the graph is priced with: the analysis' annotation (or the ``interference`` transform's),
    else :func:`interference_of` its trace."""
    if SHARE_INTERFERENCE in graph.tasks:
        phi = _column(graph, SHARE_INTERFERENCE)
        phi = phi[np.isfinite(phi)]
        if len(phi):
            return float(np.median(phi))
    return interference_of(graph)


def with_reference(graph: TaskGraph, start_ns: np.ndarray, end_ns: np.ndarray,
                   interference: float | None = None) -> TaskGraph:
    """``graph`` (modified in place and returned) with the columns the replay re-prices by: each
    compute kernel's fraction beside a collective in the replay ``(start_ns, end_ns)`` of this very
    graph, and φ (``interference``, else :func:`interference_of`). Part of building an analysis'
    baseline, before any transform (:func:`~whatif.depgraph.annotate.annotate`): every scenario's
    graph carries them.

    Raises
    ------
    ValueError
        ``interference`` is below 1."""
    phi = interference_of(graph) if interference is None else float(interference)
    if phi < 1:
        raise ValueError(f"interference must be >= 1, got {phi}")
    ref = covered_fraction(graph, start_ns, end_ns)
    subject = compute_mask(graph)
    return annotate(graph, **{SHARE_REF: np.where(subject, ref, np.nan),
                              SHARE_INTERFERENCE: np.where(subject, phi, np.nan)})


def _column(graph: TaskGraph, name: str) -> np.ndarray:
    return pd.to_numeric(graph.tasks[name], errors="coerce").to_numpy(dtype=float)


def _kernels_with(graph: TaskGraph, column: str) -> np.ndarray:
    """Ids of the compute kernels with a value in ``column``."""
    if column not in graph.tasks:
        return np.empty(0, dtype=np.int64)
    return np.flatnonzero(np.isfinite(_column(graph, column)) & compute_mask(graph))


def annotated(graph: TaskGraph) -> np.ndarray:
    """Ids of the compute kernels the analysis gave a φ (re-priced by the replay, or taken out by a
    transform that prices them)."""
    return _kernels_with(graph, SHARE_INTERFERENCE)


def repriced(graph: TaskGraph) -> np.ndarray:
    """Ids of the tasks the replay re-prices: compute kernels with a reference."""
    return _kernels_with(graph, SHARE_REF)


def shared_durations(graph: TaskGraph, start_ns: np.ndarray, end_ns: np.ndarray,
                     current_ns: np.ndarray, tolerance: float = TOLERANCE) -> np.ndarray | None:
    """Durations for the next pass of the replay: each re-priced kernel's graph duration times
    ``g(f_now) / g(f_ref)`` (module doc), ``f_now`` from the replay ``(start_ns, end_ns)``; the
    others' graph durations. None when the graph has no reference, or when the re-priced
    durations moved from ``current_ns`` (those that replay ran with) by no more than
    ``tolerance`` of their sum, in all (the replay's first re-pricing passes 0: any move counts;
    the later ones :data:`TOLERANCE`, its convergence)."""
    if SHARE_REF not in graph.tasks:
        return None
    ref, phi = _column(graph, SHARE_REF), _column(graph, SHARE_INTERFERENCE)
    subject = np.isfinite(ref) & np.isfinite(phi) & (phi > 1) & compute_mask(graph)
    if not subject.any():
        return None
    base = graph.tasks["dur_ns"].to_numpy(np.int64)
    now = covered_fraction(graph, start_ns, end_ns)
    f_now = np.where(subject, now, 0.0)
    f_ref = np.where(subject, ref, 0.0)
    k = np.where(subject, phi, 1.0) - 1
    out = np.where(subject, np.rint(base * (1 + k * f_now) / (1 + k * f_ref)), base).astype(np.int64)
    moved = float(np.abs(out - current_ns)[subject].sum())
    return out if moved > tolerance * float(current_ns[subject].sum()) else None


def priced_by_transform(graph: TaskGraph, tasks: np.ndarray, *, reason: str) -> TaskGraph:
    """``graph`` with ``tasks`` at their time alone (``d / g(f_ref)``, so that the trace's own
    interference is not kept) and out of the replay's re-pricing: called by a transform that
    prices their interference itself, before it re-prices them. Unchanged when the graph has no
    reference."""
    ids = np.unique(np.asarray(tasks, dtype=np.int64))
    if SHARE_REF not in graph.tasks or not len(ids):
        return graph
    ref, phi = _column(graph, SHARE_REF)[ids], _column(graph, SHARE_INTERFERENCE)[ids]
    g = 1 + np.where(np.isfinite(ref) & np.isfinite(phi), (phi - 1) * ref, 0.0)
    slowed = g > 1
    if slowed.any():
        dur = graph.tasks["dur_ns"].to_numpy(np.int64)[ids[slowed]]
        graph = set_duration(graph, ids[slowed], np.rint(dur / g[slowed]).astype(np.int64),
                             reason=f"{reason}: their time alone, without the trace's interference")
    return set_state(graph, ids, SHARE_REF, np.nan, reason=reason)


def settled(graph: TaskGraph, start_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
    """The re-priced tasks' reference after a replay ``(start_ns, end_ns)`` of ``graph`` whose
    durations it re-priced: the fractions it ran into (NaN for the others)."""
    out = _column(graph, SHARE_REF).copy()
    ids = repriced(graph)
    out[ids] = covered_fraction(graph, start_ns, end_ns)[ids]
    return out
