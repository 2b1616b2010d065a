"""Scripted reports (Markdown, JSON, HTML, JUnit) of what-if predictions, with thresholds for CI,
and the prediction-vs-actual diff of two traces. Schema: docs/report-schema.md."""
from .api import (
           FORMATS,
           Report,
           build_report,
           parse_formats,
           parse_percent,
           render,
           write_report,
)
from .document import ReportError, load_report, report_document
from .schema import REPORT_SCHEMA, validate
from .thresholds import METRICS, CheckResult, Threshold, ThresholdError, evaluate, parse

__all__ = ["FORMATS", "METRICS", "REPORT_SCHEMA", "CheckResult", "Report", "ReportError", "Threshold",
           "ThresholdError", "build_report", "evaluate", "load_report", "parse", "parse_formats", "parse_percent",
           "render", "report_document", "validate", "write_report"]
