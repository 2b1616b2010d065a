"""The ``whatif.report`` document (docs/report-schema.md): a ``whatif.prediction`` document plus a
summary row per scenario, the checks (thresholds, regression against a baseline report) and the
baseline's top kernels/ops/layers. Key order and list order are fixed so CI can diff two reports.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from whatif import __version__
from whatif.core.errors import WhatifError

from .thresholds import CheckResult, Threshold, evaluate

SCHEMA = "whatif.report"
VERSION = 1
CATEGORIES = ("cpu", "launch", "gpu", "comm", "sync", "idle")


class ReportError(WhatifError):
    """A report input that cannot be used (a usage or input error: exit 2)."""


def _mean_breakdown(paths: list[dict[str, Any]]) -> dict[str, int]:
    n = max(len(paths), 1)
    cats = list(paths[0]["breakdown_ns"]) if paths else list(CATEGORIES)
    return {c: int(round(sum(p["breakdown_ns"].get(c, 0) for p in paths) / n)) for c in cats}


def contributors(baseline_ns: int, scenario: dict[str, Any]) -> list[dict[str, Any]]:
    """Each transform's effect on the mean step time (ns, negative = faster), largest effect first."""
    out, prev = [], baseline_ns
    for i, w in enumerate(scenario["waterfall"]):
        out.append({"transform": w["transform"], "delta_ns": int(w["mean_step_ns"] - prev), "order": i})
        prev = w["mean_step_ns"]
    out.sort(key=lambda c: (-abs(c["delta_ns"]), c["order"]))
    return [{"transform": c["transform"], "delta_ns": c["delta_ns"]} for c in out]


def path_shift(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean critical-path time per category, after minus before (ns), largest change first."""
    b, a = _mean_breakdown(before), _mean_breakdown(after)
    shift = [{"category": c, "delta_ns": a.get(c, 0) - b.get(c, 0)} for c in b]
    return sorted(shift, key=lambda s: (-abs(s["delta_ns"]), list(b).index(s["category"])))


def _row(kind: str, entry: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    serving = entry.get("serving") or {}
    is_base = kind == "baseline"
    measured = [s["measured_ns"] for s in entry["steps"]] if is_base else []
    return {
        "name": "baseline" if is_base else entry["name"],
        "kind": kind,
        "mean_step_ns": int(entry["mean_step_ns"]),
        "measured_step_ns": int(sum(measured) / len(measured)) if measured else None,
        "speedup": 1.0 if is_base else entry["speedup"],
        "ttft_ms": serving.get("ttft_ms"),
        "tpot_ms": serving.get("tpot_ms"),
        "contributors": [] if is_base else contributors(baseline["mean_step_ns"], entry),
        "critical_path_shift": [] if is_base else path_shift(baseline["critical_path"], entry["critical_path"]),
        "baseline_report_step_ns": None,
    }


def _check(c: CheckResult) -> dict[str, Any]:
    status = "skipped" if c.failed is None else ("failed" if c.failed else "passed")
    return {"kind": c.kind, "name": c.name, "status": status, "values": c.values, "message": c.message}


def _read_json(path: Path, what: str) -> Any:
    """The parsed JSON of ``path``; a missing or unreadable file is a one-line ReportError naming it."""
    try:
        return orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise ReportError(f"{path}: no such {what} file") from None
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ReportError(f"{path}: not a JSON {what} document ({exc})") from None


def load_report(path: str | Path) -> dict[str, Any]:
    """Read a ``whatif.report`` (or ``whatif.prediction``) JSON file; one-line errors name the file."""
    path = Path(path)
    doc = _read_json(path, "report")
    if not isinstance(doc, dict) or doc.get("schema") not in (SCHEMA, "whatif.prediction"):
        raise ReportError(f"{path}: not a whatif.report or whatif.prediction document")
    if doc.get("version") != VERSION:
        raise ReportError(f"{path}: {doc['schema']} version {doc.get('version')!r} is not supported "
                          f"(expected {VERSION})")
    return doc


def load_serving(path: str | Path) -> dict[str, dict[str, Any]]:
    """TTFT/TPOT per scenario name (``"baseline"`` included) from a ``whatif serve --json`` document."""
    path = Path(path)
    doc = _read_json(path, "serving")
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith("whatif.serving"):
        raise ReportError(f"{path}: not a whatif.serving document (write one with whatif serve --json)")
    return {s["name"]: {k: s.get(k) for k in ("ttft_ms", "tpot_ms")} for s in doc.get("scenarios", [])}


def prediction_of(doc: dict[str, Any]) -> dict[str, Any]:
    """The ``whatif.prediction`` document inside a report (or the document itself)."""
    return doc["prediction"] if doc.get("schema") == SCHEMA else doc


def regression_checks(prediction: dict[str, Any], baseline_report: dict[str, Any],
                      max_regression: float) -> list[CheckResult]:
    """One check per row (the baseline, then each scenario): mean step time may grow by at most
    ``max_regression`` (0.05 = 5 %) over the same row of ``baseline_report``."""
    old = prediction_of(baseline_report)
    old_rows = {"baseline": old["baseline"], **{s["name"]: s for s in old["scenarios"]}}
    rows = [("baseline", prediction["baseline"])] + [(s["name"], s) for s in prediction["scenarios"]]
    limit = f"{max_regression * 100:g}%"
    out = []
    for name, entry in rows:
        label = f"step_ms({name}) regression <= {limit}"
        if name not in old_rows:
            out.append(CheckResult("regression", label, None, {}, "not in the baseline report"))
            continue
        before, now = old_rows[name]["mean_step_ns"], entry["mean_step_ns"]
        change = now / before - 1 if before > 0 else 0.0
        values = {"baseline_step_ms": round(before / 1e6, 6), "step_ms": round(now / 1e6, 6),
                  "change": round(change, 6)}
        out.append(CheckResult("regression", label, change > max_regression, values,
                               f"step_ms({name}) {before / 1e6:.3f} -> {now / 1e6:.3f} ms ({change * 100:+.2f}%, "
                               f"limit +{limit})"))
    return out


def with_serving(prediction: dict[str, Any], serving: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A copy of ``prediction`` whose baseline/scenarios carry ``serving`` metrics, given by row name
    (``"baseline"`` or a scenario name) as ``{"ttft_ms": {"mean", "p50", "p90", "p99"}, "tpot_ms": {...}}``
    (the statistics of ``whatif serve``). Names that are not rows are ignored; none matching is an error."""
    names = ["baseline"] + [s["name"] for s in prediction["scenarios"]]
    if not set(serving) & set(names):
        raise ReportError(f"the serving metrics name none of the report's rows ({', '.join(names)}); "
                          f"they have {', '.join(sorted(serving)) or 'none'}")

    def add(name: str, entry: dict[str, Any]) -> dict[str, Any]:
        return {**entry, "serving": serving[name]} if name in serving else entry

    return {**prediction, "baseline": add("baseline", prediction["baseline"]),
            "scenarios": [add(s["name"], s) for s in prediction["scenarios"]]}


def report_document(prediction: dict[str, Any], analysis: dict[str, Any] | None = None,
                    thresholds: Sequence[Threshold | str] = (), baseline_report: dict[str, Any] | None = None,
                    max_regression: float | None = None, baseline_path: str | None = None,
                    serving: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The ``whatif.report`` v1 document.

    ``prediction``: a ``whatif.prediction`` document; ``analysis``: the baseline's
    ``whatif.analysis`` document (for top kernels/ops/layers; optional); ``thresholds``:
    ``--fail-if`` expressions; ``baseline_report`` + ``max_regression``: the regression check;
    ``serving``: TTFT/TPOT per row (see :func:`with_serving`), when the prediction has none.
    """
    if serving:
        prediction = with_serving(prediction, serving)
    checks = [evaluate(t, prediction) for t in thresholds]
    if max_regression is not None:
        if baseline_report is None:
            raise ReportError("--max-regression needs --baseline REPORT.json")
        checks += regression_checks(prediction, baseline_report, max_regression)
    base = prediction["baseline"]
    rows = [_row("baseline", base, base)] + [_row("scenario", s, base) for s in prediction["scenarios"]]
    if baseline_report is not None:
        old = prediction_of(baseline_report)
        old_rows = {"baseline": old["baseline"], **{s["name"]: s for s in old["scenarios"]}}
        for r in rows:
            prev = old_rows.get(r["name"])
            r["baseline_report_step_ns"] = int(prev["mean_step_ns"]) if prev else None
    failed = [c for c in checks if c.failed]
    analysis = analysis or {}
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "whatif_version": __version__,
        "source": prediction["source"],
        "device": prediction["device"],
        "status": "failed" if failed else "passed",
        "rows": rows,
        "checks": [_check(c) for c in checks],
        "baseline_report": None if baseline_report is None else {
            "path": baseline_path, "source": baseline_report.get("source"), "max_regression": max_regression},
        "fidelity": analysis.get("fidelity"),
        "top_kernels": analysis.get("top_kernels", []),
        "top_ops": analysis.get("top_ops", []),
        "top_layers": analysis.get("top_layers", []),
        "prediction": prediction,
    }


def failures(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The failed checks of a report, in order."""
    return [c for c in report["checks"] if c["status"] == "failed"]
