"""``whatif suggest``: every registered optimization whose needs the trace meets, tried alone at
its candidate settings, predicted by the replay, and ranked by predicted mean-step speedup — the
way torch.profiler's pattern matcher reports every anti-pattern, but each priced end to end.

A transform is skipped, with the reason, when its needs are unmet (:mod:`whatif.transforms.needs`),
when it has no setting to suggest on its own (``Transform.candidates`` is empty: a device, a
degree, a factor only the user can choose), or when every setting is refused by the transform
(e.g. "no chains of memory-bound kernels"). Extra scenarios (``-s``) are ranked with the rest.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np

from whatif.analysis import Analysis, analyze, make_context, predict, scenario_cost_model
from whatif.core.errors import WhatifError
from whatif.depgraph.graph import TaskGraph
from whatif.documents import ScenarioHeadline, SkippedSuggestion, SuggestDocument, Suggestion
from whatif.predictors.cost_models import CostModelName
from whatif.report.diff_text import short_names
from whatif.summary import mean_counted_step_ns, scenario_headline
from whatif.transforms import registry
from whatif.transforms.base import Transform, TransformContext, TransformError
from whatif.transforms.needs import unmet
from whatif.transforms.scenario import Scenario, ScenarioStepError, load_scenario

TOP_WHERE = 3


@dataclass(frozen=True)
class Tried:
    """One setting predicted: its label, headline numbers, and where it acts."""

    setting: str
    params: dict[str, Any]
    headline: ScenarioHeadline
    where: list[str]


def suggest(path_or_analysis: str | Path | Analysis, extra: Sequence[Scenario | str | Path] = (), *,
            cost_model: str | Enum = CostModelName.TRACE,
            progress: Callable[[str], None] | None = None) -> SuggestDocument:
    """Try every registered optimization (and ``extra`` scenarios) on a trace and rank them.

    Parameters
    ----------
    path_or_analysis : a trace, folder or run folder, or its :class:`Analysis`.
    extra : scenarios (objects or TOML files) ranked with the suggestions.
    cost_model : what prices the transforms (``trace``: calibrated on the trace's own kernels).
    progress : called with a short label before each prediction.

    Raises
    ------
    WhatifError
        The trace or an extra scenario cannot be read.

    >>> from whatif.api import analyze
    >>> doc = suggest("sample_traces/llm_serve")             # doctest: +SKIP
    >>> doc.suggestions[0].headline.speedup > 1               # doctest: +SKIP
    True
    """
    extras = [s if isinstance(s, Scenario) else load_scenario(s) for s in extra]
    for s in extras:
        scenario_cost_model(s, cost_model)
    base = path_or_analysis if isinstance(path_or_analysis, Analysis) else analyze(path_or_analysis)
    ctx = make_context(base.trace, cost_model)
    tried: list[tuple[str, list[Tried]]] = []
    skipped: list[SkippedSuggestion] = []
    for name in registry.names():
        cls = registry.get(name)
        outcome = _try_transform(base, ctx, cls, progress)
        if isinstance(outcome, str):
            skipped.append(SkippedSuggestion(transform=name, reason=outcome))
        else:
            tried.append((name, outcome))
    for s in extras:
        if progress:
            progress(s.name)
        try:
            result = predict(base, [s], cost_model=cost_model).scenarios[0]
        except WhatifError as exc:
            skipped.append(SkippedSuggestion(transform=s.name, reason=str(exc)))
            continue
        tried.append((s.name, [Tried(s.name, {}, scenario_headline(base, result),
                                     _where(base.graph, s.transforms, ctx))]))
    return SuggestDocument(source=str(base.trace.source), device=ctx.device,
                           baseline_mean_step_ns=mean_counted_step_ns(base.steps),
                           suggestions=_ranked(tried), skipped=skipped)


def _try_transform(base: Analysis, ctx: TransformContext, cls: type[Transform],
                   progress: Callable[[str], None] | None) -> list[Tried] | str:
    """Each candidate setting predicted alone, or why the transform was not predicted."""
    need = unmet(cls.requires, base.graph, ctx.device)
    if need is not None:
        return f"needs {need.value}"
    try:
        candidates = cls.candidates(base.graph, ctx)
    except TransformError as exc:   # the trace is not one the transform is for, and it says why
        return str(exc).removeprefix(f"{cls.name}: ")
    if not candidates:
        return "needs a choice only you can make (a device, a degree, a factor): try it with whatif predict -s"
    out, refusals = [], []
    for t in candidates:
        if progress:
            progress(t.setting())
        try:
            result = predict(base, [Scenario(name=t.setting(), transforms=[t])], ctx).scenarios[0]
        except ScenarioStepError as exc:   # the listing names the transform: its message's own prefix goes
            refusals.append(exc.reason.removeprefix(f"{t.name}: "))
            continue
        out.append(Tried(t.setting(), t.changed_params(), scenario_headline(base, result),
                         _where(base.graph, [t], ctx)))
    return out or _first_reason(refusals)


def _first_reason(refusals: list[str]) -> str:
    reason = refusals[0]
    return reason + (f" (and {len(refusals) - 1} other setting(s) refused)" if len(refusals) > 1 else "")


def _ranked(tried: list[tuple[str, list[Tried]]]) -> list[Suggestion]:
    best = []
    for name, settings in tried:
        top = max(settings, key=lambda s: (s.headline.speedup, s.setting))
        best.append((name, top, {s.setting: s.headline.speedup for s in settings if s is not top}))
    best.sort(key=lambda b: (-b[1].headline.speedup, b[0]))
    return [Suggestion(rank=i + 1, transform=name, setting=top.setting, params=top.params, headline=top.headline,
                       saved_ns_per_step=top.headline.baseline_mean_step_ns - top.headline.mean_step_ns,
                       where=top.where, others=others)
            for i, (name, top, others) in enumerate(best)]


def _where(graph: TaskGraph, transforms: Sequence[Transform], ctx: TransformContext) -> list[str]:
    """What the transforms change (their ``match`` on the baseline graph): the task names with the
    most recorded time, summed over the trace, largest first."""
    ids = np.unique(np.concatenate([t.match(graph, ctx) for t in transforms])) if transforms else np.array([], int)
    if len(ids) == len(graph.tasks) and transforms:   # a transform that cannot tell: no "where"
        return []
    names = graph.tasks["name"].astype(str).to_numpy()[ids]
    durs = graph.tasks["dur_ns"].to_numpy()[ids]
    total: Counter[str] = Counter()
    for name, d in zip(names, durs):
        total[name] += int(d)
    top = total.most_common(TOP_WHERE)
    return [f"{label} ({ns / 1e6:.2f} ms)" for label, (_, ns) in zip(short_names([n for n, _ in top], 48), top)]
