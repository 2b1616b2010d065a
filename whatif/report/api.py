"""Reports from Python: one call from a :class:`~whatif.api.Prediction` (or a saved prediction
document) to the report document and its files.

>>> from whatif.report import FORMATS
>>> FORMATS
('md', 'json', 'html', 'junit')
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whatif.api import Prediction
from whatif.core.output import write_output
from whatif.documents import OpsDocument, PredictionDocument, ReportDocument, RowServing, SuggestDocument, to_json
from whatif.summary import analysis_document, prediction_document

from .document import ReportError, failures, load_report, load_serving, report_document, serving_by_row
from .html import render_html
from .junit import render_junit
from .markdown import render_markdown
from .thresholds import Threshold, parse

FORMATS = ("md", "json", "html", "junit")
FILE_NAMES = {"md": "report.md", "json": "report.json", "html": "report.html", "junit": "junit.xml"}


@dataclass
class Report:
    """A written report: the ``whatif.report`` document and the files, by format."""

    document: ReportDocument
    files: dict[str, Path] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.document.status == "passed"

    @property
    def failures(self) -> list[str]:
        """One line per failed check: ``<check>: <values>``."""
        return [f"{c.name} ({c.message})" for c in failures(self.document)]


def parse_formats(text: str | Iterable[str]) -> list[str]:
    """``"md,json"`` or ``["md", "json"]`` -> validated list, in the order given, without repeats."""
    items = [f.strip() for f in (text.split(",") if isinstance(text, str) else text) if f.strip()]
    unknown = [f for f in items if f not in FORMATS]
    if unknown or not items:
        raise ReportError(f"unknown report format {unknown[0] if unknown else text!r} (formats: {', '.join(FORMATS)})")
    return list(dict.fromkeys(items))


def parse_percent(text: str | float) -> float:
    """``"5%"`` or ``0.05`` -> 0.05."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        raw = text.strip()
        try:
            value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
        except ValueError:
            raise ReportError(f"--max-regression {text!r}: expected a percentage like 5% "
                              "or a fraction like 0.05") from None
        if not raw.endswith("%") and value >= 1:
            raise ReportError(f"--max-regression {text!r}: write {raw}% for a percentage (a bare number is a fraction)")
    if value < 0:
        raise ReportError(f"--max-regression {text!r}: must be >= 0")
    return value


def _prediction_doc(prediction: Prediction) -> PredictionDocument:
    """``prediction_document(prediction)``, computed once per prediction (the critical paths of
    every scenario step are the slow part); the document is immutable, so it is shared."""
    key = tuple(id(r) for r in prediction.scenarios)
    cached = prediction.__dict__.get("_report_document")
    if cached is None or cached[0] != key:
        cached = (key, prediction_document(prediction))
        prediction.__dict__["_report_document"] = cached
    return cached[1]  # type: ignore[no-any-return]


Serving = str | Path | Mapping[str, RowServing | Mapping[str, Any]]


def build_report(prediction: Prediction | PredictionDocument, fail_if: Sequence[str | Threshold] = (),
                 baseline: str | Path | ReportDocument | PredictionDocument | None = None,
                 max_regression: str | float | None = None, top: int = 10,
                 serving: Serving | None = None, suggestions: SuggestDocument | None = None,
                 ops: OpsDocument | None = None) -> ReportDocument:
    """The ``whatif.report`` document of a prediction (a :class:`Prediction` or a
    ``whatif.prediction`` document), with the ``fail_if`` thresholds and, given a baseline report
    (path or document) and ``max_regression`` (``"5%"``), the regression checks. ``serving``:
    TTFT/TPOT statistics per row name, ``{"baseline": {"ttft_ms": {"mean": ..., "p99": ...}}}`` (or
    :class:`~whatif.documents.RowServing` values), or the path of a ``whatif serve --json`` document
    made with the same scenarios. ``suggestions``: a ``whatif.suggest`` document of the same trace
    (:func:`whatif.suggest.suggest`), shown as "what to try next". ``ops``: a ``whatif.ops`` document
    of the same trace (:func:`whatif.ops.ops_table`), shown as the per-op roofline table."""
    thresholds = [parse(t) if isinstance(t, str) else t for t in fail_if]  # usage errors before any work
    limit = None if max_regression is None else parse_percent(max_regression)
    files = [f for r in prediction.baseline.trace.ranks for f in r.files] if isinstance(prediction, Prediction) else []
    rows = (load_serving(serving, files) if isinstance(serving, (str, Path))
            else serving_by_row(serving) if serving else None)
    base_path = str(baseline) if isinstance(baseline, (str, Path)) else None
    base_doc = load_report(baseline) if isinstance(baseline, (str, Path)) else baseline
    if isinstance(prediction, Prediction):
        pred_doc, analysis = _prediction_doc(prediction), analysis_document(prediction.baseline, top=top)
    else:
        pred_doc, analysis = prediction, None
    return report_document(pred_doc, analysis, thresholds, base_doc, limit, base_path, rows, suggestions, ops)


def render(report: ReportDocument, fmt: str) -> str:
    """One format of a report document as text."""
    if fmt == "json":
        return to_json(report) + "\n"
    return {"md": render_markdown, "html": render_html, "junit": render_junit}[fmt](report)


def write_report(prediction: Prediction | PredictionDocument, out_dir: str | Path = "whatif-report",
                 formats: str | Iterable[str] = FORMATS, fail_if: Sequence[str | Threshold] = (),
                 baseline: str | Path | ReportDocument | PredictionDocument | None = None,
                 max_regression: str | float | None = None, step_summary: bool = True,
                 serving: Serving | None = None, suggestions: SuggestDocument | None = None,
                 ops: OpsDocument | None = None) -> Report:
    """Build the report and write ``report.md``, ``report.json``, ``report.html`` and/or
    ``junit.xml`` into ``out_dir``. With ``step_summary`` and ``$GITHUB_STEP_SUMMARY`` set, the
    Markdown is appended there too. Returns the document and the paths; check ``.passed``."""
    fmts = parse_formats(formats)
    doc = build_report(prediction, fail_if, baseline, max_regression, serving=serving, suggestions=suggestions, ops=ops)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReportError(f"{out}: cannot create the output folder ({exc.strerror})") from None
    files = {}
    for fmt in fmts:
        path = out / FILE_NAMES[fmt]
        write_output(path, render(doc, fmt).encode("utf-8"))
        files[fmt] = path
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary and summary:
        try:
            with open(summary, "a", encoding="utf-8") as fh:
                fh.write(render(doc, "md") + "\n")
        except OSError as exc:
            raise ReportError(f"{summary}: cannot append the step summary ({exc.strerror})") from None
    return Report(document=doc, files=files)
