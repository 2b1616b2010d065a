"""Compare two traces of the same program (before and after a change, or the same program on two
GPUs): step times, GPU work per op with the two op trees aligned (:mod:`whatif.optree`), by
kernel name (added, removed, slower, faster; meaningful on one vendor) and by kernel class, and
the critical-path breakdown; given a prediction made on *before*, how far each scenario's
prediction is from what *after* measured. The result is the ``whatif.diff`` v1 document
(docs/report-schema.md)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from whatif import __version__
from whatif.api import Analysis
from whatif.core.kernels import classify_kernel
from whatif.documents import PredictionDocument, ReportDocument, counted
from whatif.optree import OneSidedOp, OpAlignment, OpSide, align_ops, counted_gpu_tasks, counted_rows

from .document import CATEGORIES, prediction_of

SCHEMA = "whatif.diff"
VERSION = 1


def _steps(a: Analysis) -> dict[str, Any]:
    ns = a.steps["measured_ns"].to_numpy(dtype=float)[counted_rows(a)]
    return {"count": int(len(ns)),
            "mean_ns": int(ns.mean()) if len(ns) else 0,
            "median_ns": int(np.median(ns)) if len(ns) else 0,
            "min_ns": int(ns.min()) if len(ns) else 0,
            "max_ns": int(ns.max()) if len(ns) else 0,
            "steps": [{"rank": int(r["rank"]), "step": int(r["step"]), "measured_ns": int(r["measured_ns"]),
                       **({} if r["included"] else {"excluded": r["excluded_reason"].value})}
                      for r in a.steps.to_dict("records")]}


def gpu_work(a: Analysis) -> pd.DataFrame:
    """Measured GPU time and count per kernel name, per counted step (work attributed to a step
    that counts; the whole trace when it has no step markers). Columns ``name``, ``count``, ``ns``."""
    sel, n = counted_gpu_tasks(a)
    frame = pd.DataFrame({"name": sel["name"].astype(str).to_numpy(),
                          "ns": (sel["measured_end_ns"] - sel["measured_start_ns"]).to_numpy()})
    agg = frame.groupby("name", sort=True).agg(count=("ns", "size"), ns=("ns", "sum")).reset_index()
    agg["count"] = agg["count"] / n
    agg["ns"] = agg["ns"] / n
    return agg


def _kernel_rows(before: pd.DataFrame, after: pd.DataFrame, tolerance: float) -> pd.DataFrame:
    m = before.merge(after, on="name", how="outer", suffixes=("_before", "_after")).fillna(0.0)
    m["delta_ns"] = m["ns_after"] - m["ns_before"]
    rel = np.where(m["ns_before"] > 0, m["delta_ns"] / m["ns_before"].where(m["ns_before"] > 0, 1), np.inf)
    m["change"] = np.select(
        [m["count_before"] == 0, m["count_after"] == 0, rel > tolerance, rel < -tolerance],
        ["added", "removed", "slower", "faster"], "same")
    return m


def _kernel_entry(r: Any) -> dict[str, Any]:
    return {"name": r.name, "count_before": round(float(r.count_before), 3),
            "count_after": round(float(r.count_after), 3), "ns_before": int(round(r.ns_before)),
            "ns_after": int(round(r.ns_after)), "delta_ns": int(round(r.delta_ns))}


def _classes_ns(side: OpSide) -> dict[str, int]:
    return {c.value: int(round(ns)) for c, ns in sorted(side.classes.items(), key=lambda kv: (-kv[1], kv[0].value))}


def _one_sided(o: OneSidedOp) -> dict[str, Any]:
    return {"name": o.name, "shapes": o.shapes, "under": o.under, "count": round(o.side.count, 3),
            "ns": int(round(o.side.ns)), "classes": _classes_ns(o.side)}


def ops_section(al: OpAlignment) -> dict[str, Any]:
    """The ``ops`` part of the document: each side's GPU time per step split into matched and
    one-sided work (``matched_ns + unmatched_ns == gpu_ns``), every matched group and every
    one-sided group, largest first."""
    def side(i: int) -> dict[str, Any]:
        total, matched = int(round(al.total_ns[i])), int(round(al.matched_ns[i]))
        return {"gpu_ns": total, "matched_ns": matched, "unmatched_ns": total - matched,
                "matched_share": round(matched / total, 6) if total else None,
                "matched_op_ns": int(round(al.matched_op_ns[i])), "ops": al.ops[i]}

    return {
        "before": side(0), "after": side(1), "ops_matched": al.ops_matched,
        "matched": [{"kind": m.kind.name.lower(), "name": m.name, "shapes": m.shapes,
                     "count_before": round(m.before.count, 3), "count_after": round(m.after.count, 3),
                     "ns_before": int(round(m.before.ns)), "ns_after": int(round(m.after.ns)),
                     "ratio": round(m.after.ns / m.before.ns, 6) if m.before.ns else None,
                     "classes_before": _classes_ns(m.before), "classes_after": _classes_ns(m.after)}
                    for m in al.matched],
        "only_before": [_one_sided(o) for o in al.only_before],
        "only_after": [_one_sided(o) for o in al.only_after],
    }


def _breakdown(a: Analysis) -> dict[str, int]:
    paths = [a.critical_path(int(i)) for i in np.flatnonzero(counted_rows(a))]
    n = max(len(paths), 1)
    return {c: int(round(sum(p.breakdown_ns.get(c, 0) for p in paths) / n)) for c in CATEGORIES}


def _classes(frame: pd.DataFrame) -> dict[str, int]:
    cls = frame["name"].map(lambda n: classify_kernel(n).value)
    return {str(k): int(round(v)) for k, v in frame.groupby(cls)["ns"].sum().items()}


def compare_prediction(prediction: ReportDocument | PredictionDocument, before: dict[str, Any],
                       after: dict[str, Any], after_path: dict[str, int]) -> dict[str, Any]:
    """Each scenario's predicted mean step time and speedup against the measured *after* trace."""
    pred = prediction_of(prediction)
    base = pred.baseline
    measured = [s.measured_ns for s in counted(base.steps)]
    same = [(s.rank, s.step, s.measured_ns) for s in base.steps] == \
        [(s["rank"], s["step"], s["measured_ns"]) for s in before["steps"]]
    actual = after["mean_ns"] / before["mean_ns"] if after["mean_ns"] else 0.0
    out = []
    for s in pred.scenarios:
        paths = counted(s.critical_path)
        n = max(len(paths), 1)
        predicted_path = {c: int(round(sum(p.breakdown_ns.get(c, 0) for p in paths) / n)) for c in CATEGORIES}
        # the scenario's speedup applied to the measured before: what whatif promised for after
        # (none from a speedup of 0 or infinity: a degenerate baseline or scenario, or an edited file)
        promised_ns = int(round(before["mean_ns"] / s.speedup)) if 0 < s.speedup < math.inf else None
        out.append({
            "name": s.name,
            "predicted_speedup": s.speedup,
            "actual_speedup": round(1 / actual, 6) if actual else None,
            "predicted_step_ns": promised_ns,
            "actual_step_ns": after["mean_ns"],
            "error": round(promised_ns / after["mean_ns"] - 1, 6) if after["mean_ns"] and promised_ns else None,
            "critical_path": [{"category": c, "predicted_ns": predicted_path[c], "actual_ns": after_path[c]}
                              for c in CATEGORIES],
        })
    return {"source": pred.source, "same_trace_as_before": same,
            "baseline_measured_ns": int(sum(measured) / len(measured)) if measured else 0, "scenarios": out}


def diff_document(before: Analysis, after: Analysis, prediction: ReportDocument | PredictionDocument | None = None,
                  top: int = 10,
                  tolerance: float = 0.05) -> dict[str, Any]:
    """The ``whatif.diff`` v1 document. Kernel and op times are per step (``*_ns`` = measured GPU time per
    step, ``count_*`` = launches per step) so traces with different step counts compare;
    ``tolerance``: relative change below which a kernel counts as ``same``."""
    b_steps, a_steps = _steps(before), _steps(after)
    b_gpu, a_gpu = gpu_work(before), gpu_work(after)
    rows = _kernel_rows(b_gpu, a_gpu, tolerance)
    kernels: dict[str, Any] = {}
    for change in ("added", "removed", "slower", "faster"):
        sel = rows[rows["change"] == change]
        sel = sel.assign(mag=sel["delta_ns"].abs()).sort_values(["mag", "name"], ascending=[False, True], kind="stable")
        kernels[change] = {"names": int(len(sel)), "delta_ns": int(round(sel["delta_ns"].sum())),
                           "top": [_kernel_entry(r) for r in sel.head(top).itertuples()]}
    kernels["same"] = {"names": int((rows["change"] == "same").sum()),
                       "delta_ns": int(round(rows.loc[rows["change"] == "same", "delta_ns"].sum())), "top": []}
    b_cls, a_cls = _classes(b_gpu), _classes(a_gpu)
    b_path, a_path = _breakdown(before), _breakdown(after)
    doc = {
        "schema": SCHEMA,
        "version": VERSION,
        "whatif_version": __version__,
        "before": {"source": before.trace.source, "device": _device(before), **b_steps},
        "after": {"source": after.trace.source, "device": _device(after), **a_steps},
        "speedup": round(b_steps["mean_ns"] / a_steps["mean_ns"], 6) if a_steps["mean_ns"] else None,
        "median_speedup": round(b_steps["median_ns"] / a_steps["median_ns"], 6) if a_steps["median_ns"] else None,
        "gpu_ns_per_step": {"before": int(round(b_gpu["ns"].sum())), "after": int(round(a_gpu["ns"].sum()))},
        "ops": ops_section(align_ops(before, after)),
        "kernels": kernels,
        "kernel_classes": [{"class": c, "ns_before": b_cls.get(c, 0), "ns_after": a_cls.get(c, 0),
                            "delta_ns": a_cls.get(c, 0) - b_cls.get(c, 0)}
                           for c in sorted(set(b_cls) | set(a_cls),
                                           key=lambda c: (-max(b_cls.get(c, 0), a_cls.get(c, 0)), c))],
        "critical_path": [{"category": c, "before_ns": b_path[c], "after_ns": a_path[c],
                           "delta_ns": a_path[c] - b_path[c]}
                          for c in CATEGORIES],
        "prediction": None if prediction is None else compare_prediction(prediction, b_steps, a_steps, a_path),
    }
    return doc


def _device(a: Analysis) -> str | None:
    return a.trace.gpu_name
