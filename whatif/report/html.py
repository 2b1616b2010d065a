"""The HTML report: one self-contained file (plotly.js inlined, no network), with the figures of
the dashboard (:mod:`whatif.figures`) and the tables of the Markdown report."""
from __future__ import annotations

import html
from typing import Any

import plotly.graph_objects as go

from whatif import figures
from whatif.documents import LatencyStats, OpsDocument, ReportDocument, SuggestDocument, counted, top_tables
from whatif.summary import excluded_line

from .markdown import ICON, OPS_HEADER, OPS_ROWS, SUGGEST_ROWS, ms, ops_caption, ops_cells

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; font-size: 0.9rem; }
th, td { border: 1px solid #ddd; padding: 0.25rem 0.5rem; text-align: left; vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
code { font-size: 0.85em; } .failed { color: #b00020; } .passed { color: #1b7f3b; }
details { margin: 0.5rem 0; } summary { cursor: pointer; }
"""


def report_figures(report: ReportDocument) -> list[tuple[str, go.Figure]]:
    """``(div id, figure)`` for every figure of the report, in page order."""
    pred = report.prediction
    base = pred.baseline
    out = [("fig-scenarios", figures.scenarios_figure(pred)),
           ("fig-steps", figures.step_times_figure(base.steps)),
           ("fig-baseline-path", figures.breakdown_figure(base.critical_path, "Baseline: critical path per step"))]
    for i, s in enumerate(pred.scenarios):
        out.append((f"fig-waterfall-{i}", figures.waterfall_figure(base.mean_step_ns, s)))
        out.append((f"fig-path-{i}", figures.breakdown_figure(s.critical_path, f"{s.name}: critical path per step")))
    rows, what, cpu = top_tables(report)[0]
    if rows:
        out.append(("fig-top-kernels", figures.top_table_figure(rows, f"Baseline: top {what}", cpu)))
    return out


def _td(text: Any, num: bool = False) -> str:
    return f"<td{' class=num' if num else ''}>{html.escape(str(text))}</td>"


def _table(header: list[str], rows: list[str]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _mean_cell(stats: LatencyStats | None) -> str:
    return _td("-" if stats is None else f"{stats.get('mean') or 0:,.2f}", True)


def _summary(report: ReportDocument) -> str:
    serving = any(r.ttft_ms is not None or r.tpot_ms is not None for r in report.rows)
    header = ["scenario", "predicted step ms", "speedup"] + (["TTFT ms", "TPOT ms"] if serving else []) + \
        ["top contributors"]
    rows = []
    for r in report.rows:
        cells = _td(r.name) + _td(ms(r.mean_step_ns), True) + _td(f"{r.speedup:.3f}x", True)
        if serving:
            cells += _mean_cell(r.ttft_ms) + _mean_cell(r.tpot_ms)
        cells += _td("; ".join(f"{c.transform} {ms(c.delta_ns, True)} ms" for c in r.contributors[:3]))
        rows.append(f"<tr>{cells}</tr>")
    return _table(header, rows)


def _checks(report: ReportDocument) -> str:
    rows = [f"<tr class={c.status}>{_td(ICON[c.status] + ' ' + c.status)}{_td(c.name)}"
            f"{_td(c.message)}</tr>" for c in report.checks]
    return "<h2>Checks</h2>" + _table(["status", "check", "values"], rows) if rows else ""


def _suggestions(report: ReportDocument) -> str:
    doc = report.suggestions
    if not isinstance(doc, SuggestDocument):
        return ""
    rows = [f"<tr>{_td(s.setting)}{_td(f'{s.headline.speedup:.3f}x', True)}{_td(ms(s.saved_ns_per_step), True)}"
            f"{_td('; '.join(s.where) or '-')}{_td(s.headline.cap.reason if s.headline.cap else '-')}</tr>"
            for s in doc.suggestions[:SUGGEST_ROWS]]
    skipped = "".join(f"<li>{html.escape(k.transform)}: {html.escape(k.reason)}</li>" for k in doc.skipped)
    return ("<h2>What to try next (whatif suggest)</h2>"
            + (_table(["optimization, alone", "predicted speedup", "saved ms/step", "acts on", "cap"], rows) if rows
               else "<p>No optimization whatif knows applies to this trace.</p>")
            + (f"<details><summary>Not tried: {len(doc.skipped)} transform(s)</summary><ul>{skipped}</ul></details>"
               if skipped else ""))


def _ops(report: ReportDocument) -> str:
    doc = report.ops
    if not isinstance(doc, OpsDocument):
        return ""
    rows = ["<tr>" + "".join(_td(c, i >= 3 and i < 8) for i, c in enumerate(ops_cells(r))) + "</tr>"
            for r in doc.rows[:OPS_ROWS]]
    return ("<h2>Where the GPU time goes, per op (whatif ops)</h2>"
            f"<p>{html.escape(ops_caption(doc).replace('`', ''))}</p>" + _table(OPS_HEADER, rows))


def render_html(report: ReportDocument) -> str:
    """The whole page; plotly.js is inlined once, before the first figure."""
    divs = []
    for i, (div_id, fig) in enumerate(report_figures(report)):
        fig.update_layout(height=380)
        divs.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0), div_id=div_id,
                                config={"displaylogo": False, "responsive": True}))
    base = report.prediction.baseline
    title = f"whatif report: {report.source}"
    status = f"<p class={report.status}><b>{report.status}</b> · {html.escape(report.device or 'GPU unknown')}" \
             f" · {len(counted(base.steps))} of {len(base.steps)} steps · baseline mean step " \
             f"{ms(base.mean_step_ns)} ms</p>"
    notes = [excluded_line(base.steps)] + [f"{s.name}: {s.cap.reason}" for s in report.prediction.scenarios
                                          if s.cap is not None]
    status += "".join(f"<p>{html.escape(n)}</p>" for n in notes if n)
    return (f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>{status}{_summary(report)}"
            f"{_checks(report)}{_suggestions(report)}{_ops(report)}<h2>Figures</h2>{''.join(divs)}"
            f"<p>whatif {html.escape(report.whatif_version)}</p></body></html>\n")
