"""The analysis and prediction documents (:mod:`whatif.documents`; ``docs/analysis-schema.md``,
``docs/prediction-schema.md``) of an analysis or prediction, and their text form."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from msgspec import UnsetType

from whatif.api import Analysis, Prediction, ScenarioResult
from whatif.core.steps import INCLUDE_HINT, Exclusion, excluded_group
from whatif.depgraph.graph import GPU_WORK_KINDS, Change, TaskKind, kind_codes
from whatif.documents import (
    UNSET,
    AnalysisDocument,
    BaselinePrediction,
    BaselineStep,
    Cap,
    ChangeEntry,
    CriticalPathEntry,
    Fidelity,
    PredictionDocument,
    RankEntry,
    ScenarioHeadline,
    ScenarioPrediction,
    ScenarioStep,
    StepBreakdown,
    StepFidelity,
    TopEntry,
    UtilizationEntry,
    WaterfallEntry,
    counted,
    mean_breakdown_ns,
    top_tables,
)
from whatif.predictors.bounds import speedup_cap, unchanged_parts, unexplained_wait_ns
from whatif.predictors.steps import critical_path

GPU_KINDS = kind_codes(GPU_WORK_KINDS)
CPU_KINDS = (int(TaskKind.CPU_CALL), int(TaskKind.CPU_WORK), int(TaskKind.WAIT))



def change_document(change: Change) -> ChangeEntry:
    """One change-log entry as the prediction document writes it (``docs/prediction-schema.md``)."""
    return ChangeEntry(transform=change.transform, action=change.action, target=change.target.name.lower(),
                       count=change.count, tasks=change.tasks, before_ns=change.before_ns,
                       after_ns=change.after_ns, reason=change.reason)


def _top(tasks: pd.DataFrame, by: str, limit: int) -> list[TopEntry]:
    """Measured time per value of ``by``: GPU and CPU time, task count; largest first."""
    sel = tasks[tasks[by].notna() & (tasks["measured_start_ns"] >= 0)]
    if sel.empty:
        return []
    dur = (sel["measured_end_ns"] - sel["measured_start_ns"]).to_numpy()
    kinds = sel["kind"].to_numpy()
    frame = pd.DataFrame({"key": sel[by].astype(str).to_numpy(),
                          "gpu_ns": np.where(np.isin(kinds, GPU_KINDS), dur, 0),
                          "cpu_ns": np.where(np.isin(kinds, CPU_KINDS), dur, 0)})
    agg = frame.groupby("key", sort=False).agg(tasks=("gpu_ns", "size"), gpu_ns=("gpu_ns", "sum"),
                                               cpu_ns=("cpu_ns", "sum"))
    agg["total_ns"] = agg["gpu_ns"] + agg["cpu_ns"]
    agg = agg.sort_values(["total_ns", "tasks"], ascending=False, kind="stable").head(limit)
    return [TopEntry(name=str(k), count=int(r.tasks), gpu_ns=int(r.gpu_ns), cpu_ns=int(r.cpu_ns))
            for k, r in agg.iterrows()]


def excluded_marks(steps: pd.DataFrame) -> list[str | UnsetType]:
    """Per row of a step-times frame: the ``excluded`` field of its document entry (the reason's
    name when the step does not count, else unset)."""
    return [UNSET if inc or reason is None else reason.value
            for inc, reason in zip(steps["included"].tolist(), steps["excluded_reason"].tolist())]


def excluded_line(entries: list[StepFidelity] | list[BaselineStep]) -> str | None:
    """``excluded from means: step 0 (warm-up: the first step ... holds start-up, 68.701 ms); ...``,
    None when every step counts."""
    groups: dict[tuple[int, str], list[StepFidelity | BaselineStep]] = {}
    for s in entries:
        if s.excluded is not UNSET:
            groups.setdefault((s.step, str(s.excluded)), []).append(s)
    parts = [excluded_group(step, Exclusion(why), [s.measured_ns / 1e6 for s in g], [s.rank for s in g])
             for (step, why), g in groups.items()]
    if not parts:
        return None
    return "excluded from means: " + "; ".join(parts) + f" ({INCLUDE_HINT})"


def analysis_document(analysis: Analysis, top: int = 10) -> AnalysisDocument:
    """The ``whatif.analysis`` v1 document of an analysis (means over the steps
    ``analysis.options`` counts; every step listed, the others marked ``excluded``)."""
    g = analysis.graph
    steps = analysis.steps
    marks = excluded_marks(steps)
    t = g.tasks
    kernels = t[t["kind"].isin(GPU_KINDS)]
    abs_err = steps["error"].abs()
    return AnalysisDocument(
        source=analysis.trace.source,
        ranks=[RankEntry(rank=r.rank, path=str(r.path), gpu=r.gpu_name, world_size=r.world_size)
               for r in analysis.trace.ranks],
        tasks=g.num_tasks,
        edges=g.num_edges,
        resources=len(g.resources),
        graph_report={k: int(v) for k, v in sorted(g.report.items())},
        steps=[StepFidelity(rank=int(rank), step=int(step), measured_ns=int(measured), predicted_ns=int(predicted),
                            error=round(float(error), 6), excluded=mark)
               for rank, step, measured, predicted, error, mark in zip(*_columns(steps, STEP_COLUMNS), marks)],
        fidelity=Fidelity(median_abs_error=round(float(abs_err.median()), 6) if len(steps) else None,
                          max_abs_error=round(float(abs_err.max()), 6) if len(steps) else None),
        critical_path=[CriticalPathEntry(rank=cp.rank, step=cp.step, length_ns=cp.length_ns, tasks=len(cp.tasks),
                                         breakdown_ns=cp.breakdown_ns, excluded=marks[i])
                       for i, cp in ((i, analysis.critical_path(i)) for i in range(len(steps)))],
        top_kernels=_top(kernels, "name", top),
        top_ops=_top(t, "op", top),
        top_layers=_top(t, "layer", top),
        utilization=[UtilizationEntry(rank=int(rank), resource=str(name), busy_ns=int(busy),
                                      utilization=round(float(share), 4))
                     for rank, name, busy, share in zip(*_columns(analysis.utilization,
                                                                  ("rank", "name", "busy_ns", "utilization")))
                     if busy > 0],
    )


STEP_COLUMNS = ("rank", "step", "measured_ns", "predicted_ns", "error")


def _columns(frame: pd.DataFrame, names: tuple[str, ...]) -> list[list[Any]]:
    """The columns ``names`` of ``frame`` as lists of Python scalars (to zip row by row)."""
    return [frame[n].to_numpy().tolist() for n in names]


def console() -> Any:
    """A rich console: the terminal's width on a terminal, 150 columns when piped (CI logs)."""
    import sys

    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 150)


def ms_text(ns: float) -> str:
    """Nanoseconds as milliseconds in text tables: ``1,234.568``."""
    return f"{ns / 1e6:,.3f}"


def mib_text(nbytes: float) -> str:
    """Bytes as MiB in text tables: ``1,024.0``.

    >>> mib_text(3 * 2**20 + 2**19), mib_text(-2**20)
    ('3.5', '-1.0')
    """
    return f"{nbytes / 2**20:,.1f}"


def render_text(doc: AnalysisDocument, console: Any, steps: bool = False, notes: Sequence[str] = ()) -> None:
    """Print the summary with rich tables on ``console`` (a :class:`rich.console.Console`):
    compact by default (step statistics, the mean critical path over the counted steps); with
    ``steps`` one row per step in both tables. ``notes`` (what the step times hold that a reader
    would not guess, e.g. :func:`~whatif.predictors.serving.engines.xdit.capture_notes`) follow
    the step times, one ``note:`` line each."""
    from rich.table import Table

    ranks = ", ".join(f"rank {r.rank} ({r.gpu or 'GPU unknown'})" for r in doc.ranks)
    console.print(f"[bold]{doc.source}[/bold]: {ranks}; {doc.tasks:,} tasks, {doc.edges:,} edges")
    if steps:
        table = Table(title="Steps: measured vs replayed", title_justify="left")
        for col in ("rank", "step", "measured ms", "replayed ms", "error"):
            table.add_column(col, justify="right", no_wrap=True)
        table.add_column("counted", no_wrap=True)
        for s in doc.steps:
            table.add_row(str(s.rank), str(s.step), ms_text(s.measured_ns), ms_text(s.predicted_ns),
                          f"{s.error * 100:+.2f}%", "yes" if s.excluded is UNSET else f"no: {s.excluded}")
        console.print(table)
    else:
        kept = counted(doc.steps)
        measured = [s.measured_ns for s in kept]
        console.print(f"steps: {len(doc.steps)} ({len(kept)} counted); measured mean "
                      f"{ms_text(doc.mean_measured_step_ns)} ms"
                      + (f" (min {ms_text(min(measured))}, max {ms_text(max(measured))})" if measured else "")
                      + f", replayed mean {ms_text(doc.mean_predicted_step_ns)} ms; --steps shows every step")
    line = excluded_line(doc.steps)
    if line:
        console.print(line)
    for note in notes:
        console.print(f"note: {note}")
    fid = doc.fidelity
    if fid.median_abs_error is not None and fid.max_abs_error is not None:
        console.print(f"replay error: median {fid.median_abs_error * 100:.2f}%, worst {fid.max_abs_error * 100:.2f}%")
    cats = list(doc.critical_path[0].breakdown_ns) if doc.critical_path else []
    cp = Table(title="Critical path breakdown (ms" + (")" if steps else ", mean per step)"),
               title_justify="left")
    if steps:
        cp.add_column("rank", justify="right")
        cp.add_column("step", justify="right")
    for c in cats:
        cp.add_column(c, justify="right", no_wrap=True)
    if steps:
        for p in counted(doc.critical_path):
            cp.add_row(str(p.rank), str(p.step), *(ms_text(p.breakdown_ns[c]) for c in cats))
    elif doc.critical_path:
        mean = mean_breakdown_ns(counted(doc.critical_path))
        cp.add_row(*(ms_text(mean.get(c, 0)) for c in cats))
    console.print(cp)
    for rows, what, cpu in top_tables(doc):
        title = f"Top {what}"
        if not rows:
            continue
        tab = Table(title=title, title_justify="left")
        tab.add_column("name", overflow="ellipsis", no_wrap=True, max_width=44)
        # tasks: an op's CPU call, its launches and kernels each count
        for col in ("tasks", "GPU ms", *(["CPU ms"] if cpu else [])):
            tab.add_column(col, justify="right", no_wrap=True)
        for r in rows:   # the document holds the --top rows
            tab.add_row(r.name, str(r.count), ms_text(r.gpu_ns), *([ms_text(r.cpu_ns)] if cpu else []))
        console.print(tab)
    notable = {k: v for k, v in doc.graph_report.items() if v and k not in ("roots_anchored",)}
    if notable:
        console.print("graph: " + ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in notable.items()))


def _speedup(base_ns: float, new_ns: float) -> float:
    return round(float(base_ns) / float(new_ns), 6) if new_ns > 0 else float("inf")


def mean_counted_step_ns(steps: pd.DataFrame) -> int:
    """The mean predicted step over the steps that count (0 without steps)."""
    return int(steps["predicted_ns"].to_numpy()[_counted_rows(steps)].mean()) if len(steps) else 0


def _counted_rows(steps: pd.DataFrame) -> np.ndarray:
    """Rows of a step-times frame that count in means (all of them when none does)."""
    inc = steps["included"].to_numpy(dtype=bool)
    return inc if inc.any() else np.ones(len(steps), dtype=bool)


def scenario_cap(base: Analysis, result: ScenarioResult, speedup: float) -> Cap | None:
    """Why ``result``'s speedup is capped (work it left unchanged), over the counted steps."""
    rows = _counted_rows(base.steps)
    cap = speedup_cap(base.bounds[rows], base.steps["predicted_ns"][rows],
                      unchanged_parts(base.graph, result.graph),
                      held_ns=unexplained_wait_ns(base.graph) // max(len(base.steps), 1))
    if cap is None:
        return None
    return Cap(speedup_cap=cap.speedup_cap, part=cap.part.value, floor_ns=cap.floor_ns,
               binding=cap.binding(speedup), reason=cap.line(speedup))


def scenario_headline(base: Analysis, result: ScenarioResult) -> ScenarioHeadline:
    """A scenario's mean step, speedup, per-transform waterfall, change log and cap (no per-step
    critical paths, which take seconds on 100 k-task graphs), over the steps ``base.options`` counts."""
    rows = _counted_rows(base.steps)
    n = max(int(rows.sum()), 1)
    base_total = float(base.steps["predicted_ns"].to_numpy()[rows].sum())
    waterfall = []
    for t, r in zip(result.scenario.transforms, result.replays):
        total = float(result.steps_of(r)["predicted_ns"].to_numpy()[rows].sum())
        waterfall.append(WaterfallEntry(transform=t.label(), mean_step_ns=int(total / n),
                                        speedup=_speedup(base_total, total)))
    total = float(result.steps["predicted_ns"].to_numpy()[rows].sum())
    speedup = _speedup(base_total, total)
    return ScenarioHeadline(name=result.scenario.name, transforms=[t.label() for t in result.scenario.transforms],
                            mean_step_ns=int(total / n), baseline_mean_step_ns=int(base_total / n),
                            speedup=speedup, waterfall=waterfall,
                            changes=[change_document(c) for c in result.graph.changes],
                            cap=scenario_cap(base, result, speedup))


def _scenario_document(base: Analysis, result: ScenarioResult) -> ScenarioPrediction:
    head = scenario_headline(base, result)
    base_steps = base.steps
    steps = result.steps
    marks = excluded_marks(base_steps)
    return ScenarioPrediction(
        name=head.name,
        source=result.scenario.source,
        transforms=head.transforms,
        mean_step_ns=head.mean_step_ns,
        speedup=head.speedup,
        steps=[ScenarioStep(rank=int(rank), step=int(step), baseline_ns=int(base_ns), predicted_ns=int(p),
                            speedup=_speedup(base_ns, p), excluded=mark)
               for rank, step, base_ns, p, mark in zip(*_columns(base_steps, ("rank", "step", "predicted_ns")),
                                                       steps["predicted_ns"].to_numpy().tolist(), marks)],
        waterfall=head.waterfall,
        changes=head.changes,
        critical_path=[StepBreakdown(rank=cp.rank, step=cp.step, breakdown_ns=cp.breakdown_ns, excluded=marks[i])
                       for i, cp in ((i, critical_path(result.replay, i)) for i in range(len(steps)))],
        cap=head.cap,
    )


def baseline_document(analysis: Analysis) -> BaselinePrediction:
    """The ``baseline`` entry of the prediction documents of ``analysis``."""
    steps = analysis.steps
    marks = excluded_marks(steps)
    return BaselinePrediction(
        mean_step_ns=mean_counted_step_ns(steps),
        steps=[BaselineStep(rank=int(rank), step=int(step), measured_ns=int(measured), predicted_ns=int(predicted),
                            excluded=mark)
               for rank, step, measured, predicted, mark in zip(*_columns(steps, STEP_COLUMNS[:4]), marks)],
        critical_path=[StepBreakdown(rank=cp.rank, step=cp.step, breakdown_ns=cp.breakdown_ns, excluded=marks[i])
                       for i, cp in ((i, analysis.critical_path(i)) for i in range(len(steps)))],
    )


def prediction_document(pred: Prediction, baseline: BaselinePrediction | None = None) -> PredictionDocument:
    """The ``whatif.prediction`` v1 document (docs/prediction-schema.md); ``baseline``: the
    :func:`baseline_document` of ``pred.baseline`` when it is at hand already."""
    base = pred.baseline
    return PredictionDocument(
        source=base.trace.source,
        device=base.trace.gpu_name,
        baseline=baseline or baseline_document(base),
        scenarios=[_scenario_document(base, r) for r in pred.scenarios],
    )


def render_prediction(doc: PredictionDocument, console: Any, notes: Sequence[str] = ()) -> None:
    """Print a prediction document: one table of scenarios, then what each changed; ``notes`` (as
    :func:`render_text`'s) follow the baseline's step time."""
    from rich.table import Table

    base = doc.baseline
    console.print(f"[bold]{doc.source}[/bold] ({doc.device or 'GPU unknown'}): baseline mean step "
                  f"{ms_text(base.mean_step_ns)} ms over {len(counted(base.steps))} of {len(base.steps)} steps")
    line = excluded_line(base.steps)
    if line:
        console.print(line)
    for note in notes:
        console.print(f"note: {note}")
    table = Table(title="Predicted step time per scenario", title_justify="left")
    table.add_column("scenario", overflow="ellipsis", no_wrap=True, max_width=40)
    for col in ("mean step ms", "speedup"):
        table.add_column(col, justify="right", no_wrap=True)
    cats = list(base.critical_path[0].breakdown_ns) if base.critical_path else []
    for c in cats:
        table.add_column(f"{c} ms", justify="right", no_wrap=True)

    def breakdown(paths: list[StepBreakdown]) -> list[str]:
        mean = mean_breakdown_ns(paths)
        return [ms_text(mean.get(c, 0)) for c in cats]

    table.add_row("baseline", ms_text(base.mean_step_ns), "1.000x", *breakdown(base.critical_path))
    for s in doc.scenarios:
        table.add_row(s.name, ms_text(s.mean_step_ns), f"{s.speedup:.3f}x", *breakdown(s.critical_path))
    console.print(table)
    for s in doc.scenarios:
        console.print(f"[bold]{s.name}[/bold]")
        if s.cap is not None:
            console.print(f"  {s.cap.reason}")
        for w in s.waterfall:
            console.print(f"  after {w.transform}: {ms_text(w.mean_step_ns)} ms ({w.speedup:.3f}x)")
        for change in s.changes:
            delta = (change.after_ns - change.before_ns) / 1e6
            quantity = "edge latency" if change.target == "edges" else "task time"
            console.print(f"    {change.transform}: {change.action} {change.touched}, {quantity} {delta:+,.3f} ms")
