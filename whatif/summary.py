"""The analysis summary: a versioned JSON document (``docs/analysis-schema.md``) and its text form."""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from whatif.api import Analysis, Prediction, ScenarioResult
from whatif.depgraph.graph import GPU_WORK_KINDS, Change, TaskKind, kind_codes
from whatif.predictors.steps import critical_path, step_times

SCHEMA = "whatif.analysis"
VERSION = 1
GPU_KINDS = kind_codes(GPU_WORK_KINDS)
CPU_KINDS = (int(TaskKind.CPU_CALL), int(TaskKind.CPU_WORK), int(TaskKind.WAIT))



def change_document(change: Change) -> dict[str, Any]:
    """One change-log entry as the prediction document writes it (``docs/prediction-schema.md``)."""
    return {"transform": change.transform, "action": change.action, "target": change.target.name.lower(),
            "count": change.count, "tasks": change.tasks, "before_ns": change.before_ns,
            "after_ns": change.after_ns, "reason": change.reason}

def _top(tasks: pd.DataFrame, by: str, limit: int) -> list[dict[str, Any]]:
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
    return [{"name": k, "count": int(r.tasks), "gpu_ns": int(r.gpu_ns), "cpu_ns": int(r.cpu_ns)}
            for k, r in agg.iterrows()]


def analysis_document(analysis: Analysis, top: int = 10) -> dict[str, Any]:
    """The ``whatif.analysis`` v1 document of an analysis (stable key order)."""
    g = analysis.graph
    steps = analysis.steps
    t = g.tasks
    kernels = t[t["kind"].isin(GPU_KINDS)]
    abs_err = steps["error"].abs()
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "source": analysis.trace.source,
        "ranks": [{"rank": r.rank, "path": str(r.path), "gpu": r.gpu_name, "world_size": r.world_size}
                  for r in analysis.trace.ranks],
        "tasks": g.num_tasks,
        "edges": g.num_edges,
        "resources": len(g.resources),
        "graph_report": {k: int(v) for k, v in sorted(g.report.items())},
        "steps": [{"rank": int(r["rank"]), "step": int(r["step"]), "measured_ns": int(r["measured_ns"]),
                   "predicted_ns": int(r["predicted_ns"]), "error": round(float(r["error"]), 6)}
                  for r in _records(steps)],
        "fidelity": {"median_abs_error": round(float(abs_err.median()), 6) if len(steps) else None,
                     "max_abs_error": round(float(abs_err.max()), 6) if len(steps) else None},
        "critical_path": [{"rank": cp.rank, "step": cp.step, "length_ns": cp.length_ns,
                           "tasks": len(cp.tasks), "breakdown_ns": cp.breakdown_ns}
                          for cp in (analysis.critical_path(i) for i in range(len(steps)))],
        "top_kernels": _top(kernels, "name", top),
        "top_ops": _top(t, "op", top),
        "top_layers": _top(t, "layer", top),
        "utilization": [{"rank": int(u["rank"]), "resource": str(u["name"]), "busy_ns": int(u["busy_ns"]),
                         "utilization": round(float(u["utilization"]), 4)}
                        for u in _records(analysis.utilization) if u["busy_ns"] > 0],
    }


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows of ``frame`` as plain dicts (cells as Python or NumPy scalars)."""
    return [{str(k): v for k, v in row.items()} for row in frame.to_dict("records")]


def console() -> Any:
    """A rich console: the terminal's width on a terminal, 150 columns when piped (CI logs)."""
    import sys

    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 150)


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.3f}"


def render_text(doc: dict[str, Any], console: Any) -> None:
    """Print the summary with rich tables on ``console`` (a :class:`rich.console.Console`)."""
    from rich.table import Table

    ranks = ", ".join(f"rank {r['rank']} ({r['gpu'] or 'GPU unknown'})" for r in doc["ranks"])
    console.print(f"[bold]{doc['source']}[/bold]: {ranks}; {doc['tasks']:,} tasks, {doc['edges']:,} edges")
    table = Table(title="Steps: measured vs replayed", title_justify="left")
    for col in ("rank", "step", "measured ms", "replayed ms", "error"):
        table.add_column(col, justify="right", no_wrap=True)
    for s in doc["steps"]:
        table.add_row(str(s["rank"]), str(s["step"]), _ms(s["measured_ns"]), _ms(s["predicted_ns"]),
                      f"{s['error'] * 100:+.2f}%")
    console.print(table)
    fid = doc["fidelity"]
    if fid["median_abs_error"] is not None:
        console.print(f"replay error: median {fid['median_abs_error'] * 100:.2f}%, "
                      f"worst {fid['max_abs_error'] * 100:.2f}%")
    cp = Table(title="Critical path breakdown (ms)", title_justify="left")
    cp.add_column("rank", justify="right")
    cp.add_column("step", justify="right")
    cats = list(doc["critical_path"][0]["breakdown_ns"]) if doc["critical_path"] else []
    for c in cats:
        cp.add_column(c, justify="right", no_wrap=True)
    for p in doc["critical_path"]:
        cp.add_row(str(p["rank"]), str(p["step"]), *(_ms(p["breakdown_ns"][c]) for c in cats))
    console.print(cp)
    for key, title in (("top_kernels", "Top kernels"), ("top_ops", "Top ops"), ("top_layers", "Top layers")):
        rows = doc[key]
        if not rows:
            continue
        tab = Table(title=title, title_justify="left")
        tab.add_column("name", overflow="ellipsis", no_wrap=True, max_width=44)
        for col in ("count", "GPU ms", "CPU ms"):
            tab.add_column(col, justify="right", no_wrap=True)
        for r in rows[:8]:
            tab.add_row(r["name"], str(r["count"]), _ms(r["gpu_ns"]), _ms(r["cpu_ns"]))
        console.print(tab)
    notable = {k: v for k, v in doc["graph_report"].items() if v and k not in ("roots_anchored",)}
    if notable:
        console.print("graph: " + ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in notable.items()))


PREDICTION_SCHEMA = "whatif.prediction"


def _speedup(base_ns: float, new_ns: float) -> float:
    return round(float(base_ns) / float(new_ns), 6) if new_ns > 0 else float("inf")


def _scenario_document(base_steps: pd.DataFrame, result: ScenarioResult) -> dict[str, Any]:
    steps = result.steps
    base_total = float(base_steps["predicted_ns"].sum())
    waterfall = []
    for t, r in zip(result.scenario.transforms, result.replays):
        total = float(step_times(r)["predicted_ns"].sum())
        waterfall.append({"transform": t.label(), "mean_step_ns": int(total / max(len(steps), 1)),
                          "speedup": _speedup(base_total, total)})
    total = float(steps["predicted_ns"].sum())
    return {
        "name": result.scenario.name,
        "source": result.scenario.source,
        "transforms": [t.label() for t in result.scenario.transforms],
        "mean_step_ns": int(total / max(len(steps), 1)),
        "speedup": _speedup(base_total, total),
        "steps": [{"rank": int(b["rank"]), "step": int(b["step"]), "baseline_ns": int(b["predicted_ns"]),
                   "predicted_ns": int(p), "speedup": _speedup(b["predicted_ns"], p)}
                  for b, p in zip(_records(base_steps), steps["predicted_ns"].to_numpy())],
        "waterfall": waterfall,
        "changes": [change_document(c) for c in result.graph.changes],
        "critical_path": [{"rank": cp.rank, "step": cp.step, "breakdown_ns": cp.breakdown_ns}
                          for cp in (critical_path(result.replay, i) for i in range(len(steps)))],
    }


def prediction_document(pred: Prediction) -> dict[str, Any]:
    """The ``whatif.prediction`` v1 document (docs/prediction-schema.md)."""
    base = pred.baseline
    steps = base.steps
    return {
        "schema": PREDICTION_SCHEMA,
        "version": VERSION,
        "source": base.trace.source,
        "device": next((r.gpu_name for r in base.trace.ranks if r.gpu_name), None),
        "baseline": {
            "mean_step_ns": int(steps["predicted_ns"].mean()) if len(steps) else 0,
            "steps": [{"rank": int(s["rank"]), "step": int(s["step"]), "measured_ns": int(s["measured_ns"]),
                       "predicted_ns": int(s["predicted_ns"])} for s in _records(steps)],
            "critical_path": [{"rank": cp.rank, "step": cp.step, "breakdown_ns": cp.breakdown_ns}
                              for cp in (base.critical_path(i) for i in range(len(steps)))],
        },
        "scenarios": [_scenario_document(steps, r) for r in pred.scenarios],
    }


def render_prediction(doc: dict[str, Any], console: Any) -> None:
    """Print a prediction document: one table of scenarios, then what each changed."""
    from rich.table import Table

    console.print(f"[bold]{doc['source']}[/bold] ({doc['device'] or 'GPU unknown'}): baseline mean step "
                  f"{_ms(doc['baseline']['mean_step_ns'])} ms over {len(doc['baseline']['steps'])} steps")
    table = Table(title="Predicted step time per scenario", title_justify="left")
    table.add_column("scenario", overflow="ellipsis", no_wrap=True, max_width=40)
    for col in ("mean step ms", "speedup"):
        table.add_column(col, justify="right", no_wrap=True)
    cats = list(doc["baseline"]["critical_path"][0]["breakdown_ns"]) if doc["baseline"]["critical_path"] else []
    for c in cats:
        table.add_column(f"{c} ms", justify="right", no_wrap=True)

    def breakdown(paths: list[dict[str, Any]]) -> list[str]:
        n = max(len(paths), 1)
        return [_ms(sum(p["breakdown_ns"][c] for p in paths) / n) for c in cats]

    base = doc["baseline"]
    table.add_row("baseline", _ms(base["mean_step_ns"]), "1.000x", *breakdown(base["critical_path"]))
    for s in doc["scenarios"]:
        table.add_row(s["name"], _ms(s["mean_step_ns"]), f"{s['speedup']:.3f}x", *breakdown(s["critical_path"]))
    console.print(table)
    for s in doc["scenarios"]:
        console.print(f"[bold]{s['name']}[/bold]")
        for w in s["waterfall"]:
            console.print(f"  after {w['transform']}: {_ms(w['mean_step_ns'])} ms ({w['speedup']:.3f}x)")
        for c in s["changes"]:
            delta = (c["after_ns"] - c["before_ns"]) / 1e6
            console.print(f"    {c['action']} {c['tasks']:,} tasks, task time {delta:+,.3f} ms")
