"""The ``whatif.report`` document (docs/report-schema.md): a ``whatif.prediction`` document plus a
summary row per scenario, the checks (thresholds, regression against a baseline report) and the
baseline's top kernels/ops/layers. Key order and list order are fixed so CI can diff two reports.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

import msgspec

from whatif import __version__
from whatif.core.errors import WhatifError
from whatif.documents import (
    PREDICTION_SCHEMA,
    REPORT_SCHEMA,
    UNSET,
    AnalysisDocument,
    BaselinePrediction,
    BaselineReportRef,
    Check,
    Contributor,
    DocumentError,
    LatencyStats,
    NotJsonError,
    OpsDocument,
    PathShift,
    PredictionDocument,
    ReportDocument,
    ReportRow,
    RowServing,
    ScenarioPrediction,
    StepBreakdown,
    SuggestDocument,
    counted,
    from_json,
    mean_breakdown_ns,
)

from .thresholds import CheckResult, Threshold, evaluate

R = TypeVar("R", BaselinePrediction, ScenarioPrediction)

VERSION = 1
CATEGORIES = ("cpu", "launch", "gpu", "comm", "sync", "idle")
Row = BaselinePrediction | ScenarioPrediction


class ReportError(WhatifError):
    """A report input that cannot be used (a usage or input error: exit 2)."""


class _Unreadable(ReportError):
    """The file is missing, unreadable or not JSON (as opposed to JSON of the wrong shape)."""


def _mean_breakdown(paths: list[StepBreakdown]) -> dict[str, int]:
    mean = mean_breakdown_ns(paths) if paths else dict.fromkeys(CATEGORIES, 0.0)
    return {c: int(round(v)) for c, v in mean.items()}


def contributors(baseline_ns: int, scenario: ScenarioPrediction) -> list[Contributor]:
    """Each transform's effect on the mean step time (ns, negative = faster), largest effect first."""
    out, prev = [], baseline_ns
    for i, w in enumerate(scenario.waterfall):
        out.append((Contributor(transform=w.transform, delta_ns=int(w.mean_step_ns - prev)), i))
        prev = w.mean_step_ns
    out.sort(key=lambda c: (-abs(c[0].delta_ns), c[1]))
    return [c for c, _ in out]


def path_shift(before: list[StepBreakdown], after: list[StepBreakdown]) -> list[PathShift]:
    """Mean critical-path time per category, after minus before (ns), largest change first."""
    b, a = _mean_breakdown(before), _mean_breakdown(after)
    shift = [PathShift(category=c, delta_ns=a.get(c, 0) - b.get(c, 0)) for c in b]
    return sorted(shift, key=lambda s: (-abs(s.delta_ns), list(b).index(s.category)))


def _serving_stats(entry: Row, metric: Literal["ttft_ms", "tpot_ms"]) -> LatencyStats | None:
    return entry.serving.stats(metric) if isinstance(entry.serving, RowServing) else None


def _row(entry: Row, baseline: BaselinePrediction, old: PredictionDocument | None) -> ReportRow:
    is_base = isinstance(entry, BaselinePrediction)
    # over the steps that count, as the mean step and the measured_step_ms threshold
    measured = [s.measured_ns for s in counted(entry.steps)] if isinstance(entry, BaselinePrediction) else []
    prev = old.row(entry.name) if old is not None else None
    return ReportRow(
        name=entry.name,
        kind="baseline" if is_base else "scenario",
        mean_step_ns=int(entry.mean_step_ns),
        measured_step_ns=int(sum(measured) / len(measured)) if measured else None,
        speedup=entry.speedup,
        ttft_ms=_serving_stats(entry, "ttft_ms"),
        tpot_ms=_serving_stats(entry, "tpot_ms"),
        contributors=contributors(baseline.mean_step_ns, entry) if isinstance(entry, ScenarioPrediction) else [],
        critical_path_shift=path_shift(baseline.critical_path, entry.critical_path)
        if isinstance(entry, ScenarioPrediction) else [],
        baseline_report_step_ns=int(prev.mean_step_ns) if prev is not None else None,
    )


def _check(c: CheckResult) -> Check:
    status: Literal["passed", "failed", "skipped"] = "skipped" if c.failed is None else (
        "failed" if c.failed else "passed")
    return Check(kind=c.kind, name=c.name, status=status, values=c.values, message=c.message)


def _read(path: Path, what: str, doc_type: object) -> Any:
    """The document of ``doc_type`` in ``path``; a missing, unreadable or malformed file is a
    one-line ReportError naming it."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise _Unreadable(f"{path}: no such {what} file") from None
    except OSError as exc:
        raise _Unreadable(f"{path}: not a JSON {what} document ({exc})") from None
    try:
        return from_json(text, doc_type)
    except NotJsonError as exc:
        raise _Unreadable(f"{path}: not a JSON {what} document ({str(exc).removeprefix('not JSON (')[:-1]})") \
            from None
    except DocumentError as exc:
        raise ReportError(f"{path}: not a {what} document ({exc})") from None


class _Header(msgspec.Struct, frozen=True):
    """What a document says it is."""

    schema: str = ""
    version: int | str | None = None


def _header(path: Path, what: str, expected: str) -> _Header:
    """The ``schema`` and ``version`` of the JSON document at ``path``; a file that is no JSON
    object is a ReportError saying it is not an ``expected`` document."""
    try:
        head: _Header = _read(path, what, _Header)
    except _Unreadable:
        raise
    except ReportError:
        raise ReportError(f"{path}: not a {expected} document") from None
    return head


def load_report(path: str | Path) -> ReportDocument | PredictionDocument:
    """Read a ``whatif.report`` (or ``whatif.prediction``) JSON file; one-line errors name the file."""
    path = Path(path)
    head = _header(path, "report", "whatif.report or whatif.prediction")
    if head.schema not in (REPORT_SCHEMA, PREDICTION_SCHEMA):
        raise ReportError(f"{path}: not a whatif.report or whatif.prediction document")
    if head.version != VERSION:
        raise ReportError(f"{path}: {head.schema} version {head.version!r} is not supported (expected {VERSION})")
    return _read(path, head.schema, ReportDocument | PredictionDocument)  # type: ignore[no-any-return]


class _ServingRow(msgspec.Struct, frozen=True):
    """What a report reads of a scenario of a ``whatif serve --json`` document."""

    name: str
    ttft_ms: LatencyStats | None = None
    tpot_ms: LatencyStats | None = None


class _ServingRows(msgspec.Struct, frozen=True):
    source: str = ""
    scenarios: list[_ServingRow] = msgspec.field(default_factory=list)


def load_serving(path: str | Path, trace_files: Sequence[Path] = ()) -> dict[str, RowServing]:
    """TTFT/TPOT per scenario name (``"baseline"`` included) from a ``whatif serve --json`` document
    (only ``schema``, ``source`` and the scenarios' ``name``, ``ttft_ms``, ``tpot_ms`` are read).

    Raises
    ------
    ReportError : not a serving document; or, given the report's ``trace_files``, one served from
        another trace (its ``source`` neither one of them nor their folder).
    """
    path = Path(path)
    if not _header(path, "serving", "whatif.serving").schema.startswith("whatif.serving"):
        raise ReportError(f"{path}: not a whatif.serving document (write one with whatif serve --json)")
    doc: _ServingRows = _read(path, "whatif.serving", _ServingRows)
    if trace_files and doc.source and not _same_trace(Path(doc.source), trace_files):
        raise ReportError(f"{path}: serving metrics of {doc.source}, not of the report's trace "
                          f"{trace_files[0] if len(trace_files) == 1 else trace_files[0].parent} "
                          f"(run whatif serve --json on the same trace)")
    return {s.name: RowServing(ttft_ms=s.ttft_ms, tpot_ms=s.tpot_ms) for s in doc.scenarios}


def _same_trace(source: Path, trace_files: Sequence[Path]) -> bool:
    """Whether a document's ``source`` names these trace files: one of them, or their folder; a
    relative ``source`` (as its command was given it, from a folder this one may not be in) by its
    last part alone."""
    try:
        named = source.resolve()
        files = {f.resolve() for f in trace_files}
    except OSError:
        return True   # cannot tell: not refused
    if named in files or all(f.parent == named for f in files):
        return True
    return not source.is_absolute() and source.name in {f.name for f in files} | {f.parent.name for f in files}


def prediction_of(doc: ReportDocument | PredictionDocument) -> PredictionDocument:
    """The ``whatif.prediction`` document inside a report (or the document itself)."""
    return doc.prediction if isinstance(doc, ReportDocument) else doc


def regression_checks(prediction: PredictionDocument, baseline_report: ReportDocument | PredictionDocument,
                      max_regression: float) -> list[CheckResult]:
    """One check per row (the baseline, then each scenario): mean step time may grow by at most
    ``max_regression`` (0.05 = 5 %) over the same row of ``baseline_report``."""
    old = prediction_of(baseline_report)
    limit = f"{max_regression * 100:g}%"
    out = []
    for entry in prediction.rows():
        name = entry.name
        label = f"step_ms({name}) regression <= {limit}"
        prev = old.row(name)
        if prev is None:
            out.append(CheckResult("regression", label, None, {}, "not in the baseline report"))
            continue
        before, now = prev.mean_step_ns, entry.mean_step_ns
        change = now / before - 1 if before > 0 else 0.0
        values = {"baseline_step_ms": round(before / 1e6, 6), "step_ms": round(now / 1e6, 6),
                  "change": round(change, 6)}
        out.append(CheckResult("regression", label, change > max_regression, values,
                               f"step_ms({name}) {before / 1e6:.3f} -> {now / 1e6:.3f} ms ({change * 100:+.2f}%, "
                               f"limit +{limit})"))
    return out


def serving_by_row(serving: Mapping[str, RowServing | Mapping[str, Any]]) -> dict[str, RowServing]:
    """Serving metrics by row name, typed: each value a :class:`RowServing` or its JSON form
    ``{"ttft_ms": {"mean": ..., "p99": ...}, "tpot_ms": {...}}`` (a ``DocumentError`` names a wrong key)."""
    try:
        return {name: s if isinstance(s, RowServing) else msgspec.convert(s, RowServing) for name, s in serving.items()}
    except msgspec.ValidationError as exc:
        raise ReportError(f"serving metrics: {exc}") from None


def with_serving(prediction: PredictionDocument, serving: Mapping[str, RowServing]) -> PredictionDocument:
    """A copy of ``prediction`` whose baseline/scenarios carry ``serving`` metrics, given by row name
    (``"baseline"`` or a scenario name; the statistics of ``whatif serve``). Names that are not rows
    are ignored; none matching is an error."""
    names = [r.name for r in prediction.rows()]
    if not set(serving) & set(names):
        raise ReportError(f"the serving metrics name none of the report's rows ({', '.join(names)}); "
                          f"they have {', '.join(sorted(serving)) or 'none'}")

    def add(entry: R) -> R:
        return msgspec.structs.replace(entry, serving=serving[entry.name]) if entry.name in serving else entry

    return msgspec.structs.replace(prediction, baseline=add(prediction.baseline),
                                   scenarios=[add(s) for s in prediction.scenarios])


def report_document(prediction: PredictionDocument, analysis: AnalysisDocument | None = None,
                    thresholds: Sequence[Threshold | str] = (),
                    baseline_report: ReportDocument | PredictionDocument | None = None,
                    max_regression: float | None = None, baseline_path: str | None = None,
                    serving: Mapping[str, RowServing] | None = None,
                    suggestions: SuggestDocument | None = None, ops: OpsDocument | None = None) -> ReportDocument:
    """The ``whatif.report`` v1 document.

    ``prediction``: a ``whatif.prediction`` document; ``analysis``: the baseline's
    ``whatif.analysis`` document (for top kernels/ops/layers; optional); ``thresholds``:
    ``--fail-if`` expressions; ``baseline_report`` + ``max_regression``: the regression check;
    ``serving``: TTFT/TPOT per row (see :func:`with_serving`), when the prediction has none;
    ``suggestions``: the baseline's ``whatif.suggest`` document, ranked optimizations to try next;
    ``ops``: the baseline's ``whatif.ops`` document, the per-op roofline table.
    """
    if serving:
        prediction = with_serving(prediction, serving)
    checks = [evaluate(t, prediction) for t in thresholds]
    if max_regression is not None:
        if baseline_report is None:
            raise ReportError("--max-regression needs --baseline REPORT.json")
        checks += regression_checks(prediction, baseline_report, max_regression)
    base = prediction.baseline
    old = prediction_of(baseline_report) if baseline_report is not None else None
    rows = [_row(entry, base, old) for entry in prediction.rows()]
    failed = [c for c in checks if c.failed]
    return ReportDocument(
        whatif_version=__version__,
        source=prediction.source,
        device=prediction.device,
        status="failed" if failed else "passed",
        rows=rows,
        checks=[_check(c) for c in checks],
        baseline_report=None if baseline_report is None else BaselineReportRef(
            path=baseline_path, source=baseline_report.source, max_regression=max_regression),
        fidelity=analysis.fidelity if analysis is not None else None,
        top_kernels=analysis.top_kernels if analysis is not None else [],
        top_ops=analysis.top_ops if analysis is not None else [],
        top_layers=analysis.top_layers if analysis is not None else [],
        prediction=prediction,
        suggestions=UNSET if suggestions is None else suggestions,
        ops=UNSET if ops is None else ops,
    )


def failures(report: ReportDocument) -> list[Check]:
    """The failed checks of a report, in order."""
    return [c for c in report.checks if c.status == "failed"]
