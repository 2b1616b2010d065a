"""Denoising steps found by a serving-engine adapter, as the replay sees them: each step's span
(measured and replayed), its CPU-only time and GPU work, and what :func:`fit_dit_model` needs to
fit a :class:`~.iteration_model.DitStepModel` from one trace without a serving log.

A step's span runs from the first to the last end of its tasks (:func:`~.engines.iteration_of_tasks`:
its CPU calls, and the GPU work they launched); the gap before it is the time since the previous
step's span ended (0 for the first), the loop's work between steps.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from whatif.core.kernels import is_attention
from whatif.depgraph.graph import GPU_WORK_KINDS, TaskGraph
from whatif.predictors.replay import Replay

from .engines import FoundIterations, iteration_of_tasks, iteration_spans
from .iteration_costs import cpu_only_replay
from .iteration_model import DitStepWork
from .logs import ServingLogError


def step_spans(graph: TaskGraph, found: FoundIterations, start_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
    """Per found iteration, ``[first start, last end]`` over its measured tasks under the task times
    ``start_ns``/``end_ns`` (a replay's, or the measured ones), shape ``(iterations, 2)``; a row of
    ``-1`` for an iteration that holds no task."""
    measured = graph.tasks["measured_start_ns"].to_numpy() >= 0
    member = np.where(measured, iteration_of_tasks(graph, found), -1)
    return iteration_spans(member, start_ns, end_ns, len(found.iterations))


def measured_spans(graph: TaskGraph, found: FoundIterations) -> np.ndarray:
    """:func:`step_spans` under the measured task times."""
    t = graph.tasks
    start = t["measured_start_ns"].to_numpy()
    return step_spans(graph, found, start, start + t["dur_ns"].to_numpy())


def replayed_spans(rp: Replay, found: FoundIterations) -> np.ndarray:
    """:func:`step_spans` under the replay's task times."""
    return step_spans(rp.graph, found, rp.start_ns, rp.end_ns)


def span_ns(spans: np.ndarray) -> np.ndarray:
    """Each iteration's span length, ns (0 for an iteration with no task).

    >>> span_ns(np.array([[10, 35], [-1, -1]])).tolist()
    [25, 0]
    """
    return np.where(spans[:, 0] >= 0, spans[:, 1] - spans[:, 0], 0)


def gpu_work(graph: TaskGraph, found: FoundIterations) -> tuple[np.ndarray, np.ndarray]:
    """Per found iteration, the summed durations of its attention GPU work and of its other GPU
    work (kernels, copies, memsets, collectives), ns."""
    t = graph.tasks
    index = iteration_of_tasks(graph, found)
    gpu = np.isin(t["kind"].to_numpy(), [int(k) for k in GPU_WORK_KINDS]) & (index >= 0)
    names = t["name"].astype(str).to_numpy()[gpu]
    attention = {n: is_attention(n) for n in np.unique(names).tolist()}
    dur = t["dur_ns"].to_numpy()[gpu].astype(float)
    attn = np.array([attention[n] for n in names.tolist()], dtype=bool)
    n = len(found.iterations)
    return (np.bincount(index[gpu], weights=np.where(attn, dur, 0.0), minlength=n),
            np.bincount(index[gpu], weights=np.where(attn, 0.0, dur), minlength=n))


@dataclass(frozen=True)
class DitFitInputs:
    """What :func:`~.iteration_model.fit_dit_model` takes, from found denoising steps: ``iters``
    (per step: ``rank``, ``step``, ``phase``, ``cycle_ns`` the replayed span, ``pre_gap_ns``, ``attn_ns``,
    ``excluded_reason``, ``included``), ``compositions`` ((model batch, latent tokens) per step) and
    ``work`` (CPU-only time, attention and other GPU work per step)."""

    iters: pd.DataFrame
    compositions: list[tuple[int, int]]
    work: DitStepWork


def dit_fit_inputs(rp: Replay, found: FoundIterations) -> DitFitInputs:
    """The inputs of :func:`~.iteration_model.fit_dit_model` for the denoising steps ``found`` in
    the graph of ``rp``: ``fit_dit_model(x.iters, x.compositions, x.work)``.

    Raises
    ------
    ServingLogError
        ``found`` holds no denoising steps, or a step holds no task of the graph.
    """
    if found.kind != "dit":
        raise ServingLogError(f"{found.adapter}: found {found.kind} iterations, not denoising steps")
    spans = replayed_spans(rp, found)
    if (spans[:, 0] < 0).any():
        empty = int(np.argmax(spans[:, 0] < 0))
        raise ServingLogError(f"{found.adapter}: denoising step {empty} holds no task of the graph")
    gaps = np.concatenate([[0], np.maximum(spans[1:, 0] - spans[:-1, 1], 0)])
    attn, rest = gpu_work(rp.graph, found)
    cpu = span_ns(replayed_spans(cpu_only_replay(rp), found)).astype(float)
    its = found.iterations
    iters = pd.DataFrame({"rank": [i.rank for i in its], "step": np.arange(len(its)), "phase": "denoise",
                          "cycle_ns": span_ns(spans), "pre_gap_ns": gaps, "attn_ns": attn,
                          "excluded_reason": pd.Series([None] * len(its), dtype=object), "included": True})
    compositions = [(i.dit.model_batch, i.dit.tokens) for i in its if i.dit is not None]
    work = DitStepWork(cpu_ns=cpu, attn_ns=attn, rest_ns=rest)
    return DitFitInputs(iters=iters, compositions=compositions, work=work)
