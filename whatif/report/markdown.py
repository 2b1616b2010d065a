"""The Markdown report: a compact table per scenario, the checks, and details in ``<details>``
blocks (GitHub renders them folded, in PR comments and in ``$GITHUB_STEP_SUMMARY``)."""
from __future__ import annotations

import re

from whatif.documents import (
    BaselinePrediction,
    LatencyStats,
    OpRow,
    OpsDocument,
    ReportDocument,
    ScenarioPrediction,
    Stat,
    SuggestDocument,
    counted,
    mean_breakdown_ns,
    top_tables,
)
from whatif.summary import excluded_line

ICON = {"passed": "✅", "failed": "❌", "skipped": "⏭️"}


def ms(ns: float | None, signed: bool = False) -> str:
    """Nanoseconds as milliseconds with 3 decimals (``-`` when missing)."""
    if ns is None:
        return "-"
    return f"{ns / 1e6:+,.3f}" if signed else f"{ns / 1e6:,.3f}"


def cell(text: str, limit: int = 60) -> str:
    """Table-safe text: pipes escaped, newlines removed, long text shortened with an ellipsis."""
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def short_label(label: str) -> str:
    """A transform label without the ``select=Selector(...)`` wrapper: ``scale(op='mm', factor=0.5)``."""
    return re.sub(r"select=Selector\((.*?)\)(?=, |\)$)", r"\1", label)


def _stat(value: LatencyStats | None, key: Stat = "mean") -> str:
    number = value.get(key) if value is not None else None
    return "-" if number is None else f"{number:,.2f}"


def _table(header: list[str], rows: list[list[str]], align: str = "") -> list[str]:
    align = align or "l" + "r" * (len(header) - 1)
    marks = {"l": "---", "r": "---:", "c": ":---:"}
    return ["| " + " | ".join(header) + " |", "| " + " | ".join(marks[a] for a in align) + " |",
            *("| " + " | ".join(r) + " |" for r in rows)]


def summary_table(report: ReportDocument) -> list[str]:
    """The scenario table; TTFT/TPOT and baseline-report columns only when there is data for them."""
    rows = report.rows
    serving = any(r.ttft_ms is not None or r.tpot_ms is not None for r in rows)
    versus = report.baseline_report is not None
    header = ["scenario", "predicted step ms", "speedup"]
    header += ["TTFT ms", "TPOT ms"] if serving else []
    header += ["vs baseline report"] if versus else []
    header += ["top contributors", "critical path shift"]
    out = []
    for r in rows:
        name = "baseline (replayed trace)" if r.kind == "baseline" else r.name
        line = [f"**{cell(name, 40)}**", ms(r.mean_step_ns), f"{r.speedup:.3f}x"]
        if serving:
            line += [_stat(r.ttft_ms), _stat(r.tpot_ms)]
        if versus:
            old = r.baseline_report_step_ns
            line.append("-" if not old else f"{(r.mean_step_ns / old - 1) * 100:+.2f}%")
        if r.kind == "baseline":
            line += [f"measured {ms(r.measured_step_ns)} ms", ""]
        else:
            line.append("; ".join(f"`{cell(short_label(c.transform), 50)}` {ms(c.delta_ns, True)} ms"
                                  for c in r.contributors[:3]))
            line.append(", ".join(f"{s.category} {ms(s.delta_ns, True)}"
                                  for s in r.critical_path_shift[:2] if s.delta_ns))
        out.append(line)
    return _table(header, out, "lrr" + "r" * (len(header) - 5) + "ll")


def checks_table(report: ReportDocument) -> list[str]:
    rows = [[ICON[c.status], f"`{cell(c.name, 80)}`", cell(c.message, 100)] for c in report.checks]
    return _table(["", "check", "values"], rows, "cll")


def _details(summary: str, body: list[str]) -> list[str]:
    return ["<details>", f"<summary>{summary}</summary>", "", *body, "", "</details>", ""]


def scenario_details(scenario: ScenarioPrediction, baseline: BaselinePrediction) -> list[str]:
    """Transforms, waterfall, change log and critical path of one scenario, in a ``<details>`` block."""
    body = [f"Source: `{scenario.source or 'built in code'}`", ""]
    if scenario.cap is not None:
        body += [f"**{scenario.cap.reason}**", ""]
    prev = baseline.mean_step_ns
    water = []
    for w in scenario.waterfall:
        water.append([f"`{cell(w.transform, 90)}`", ms(w.mean_step_ns), ms(w.mean_step_ns - prev, True),
                      f"{w.speedup:.3f}x"])
        prev = w.mean_step_ns
    body += [*_table(["after transform", "mean step ms", "change ms", "speedup"], water), ""]
    if scenario.changes:
        changes = [[cell(c.transform, 30), cell(c.action, 20), c.touched,
                    ms(c.after_ns - c.before_ns, True), cell(c.reason, 60)] for c in scenario.changes]
        body += [*_table(["transform", "action", "touched", "time ms (tasks: duration, edges: latency)", "reason"],
                         changes, "llrrl"), ""]
    cats = list(baseline.critical_path[0].breakdown_ns) if baseline.critical_path else []
    before, after = mean_breakdown_ns(baseline.critical_path), mean_breakdown_ns(scenario.critical_path)
    path = [[c, ms(before.get(c, 0)), ms(after.get(c, 0)), ms(after.get(c, 0) - before.get(c, 0), True)]
            for c in cats if before.get(c, 0) or after.get(c, 0)]
    body += ["Critical path, mean per step:", "",
             *_table(["category", "baseline ms", "predicted ms", "change ms"], path)]
    n = sum(c.tasks for c in scenario.changes)
    return _details(f"<b>{cell(scenario.name, 60)}</b>: {len(scenario.transforms)} transform(s), "
                    f"{n:,} task changes, {scenario.speedup:.3f}x", body)


SUGGEST_ROWS = 5
"""Suggestions shown in a report (the document keeps them all)."""
OPS_ROWS = 10
"""Rows of the per-op roofline table shown in a report (the document keeps them all)."""
OPS_HEADER = ["op", "shapes", "dtype", "count", "total ms", "TFLOP/s", "TB/s", "% of roofline", "bound"]


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def ops_cells(row: OpRow) -> list[str]:
    """One row of the report's per-op table (:data:`OPS_HEADER`), plain text."""
    return [row.op, row.shapes or "-", row.dtype or "-", str(row.count), ms(row.total_ns),
            _num(row.achieved_tflops, ".1f"), _num(row.achieved_tbps, ".2f"), _num(row.roofline_pct, ".1f"),
            row.bound]


def ops_caption(doc: OpsDocument) -> str:
    shown = doc.rows[:OPS_ROWS]
    share = sum(r.total_ns for r in shown) / doc.gpu_total_ns if doc.gpu_total_ns else 0.0
    return (f"The {len(shown)} of {len(doc.rows)} op groups with the most GPU time ({share:.0%} of "
            f"{ms(doc.gpu_total_ns)} ms) on {', '.join(doc.devices) or 'an unknown GPU'}; roofline: "
            "the datasheet roof at each row's intensity (`whatif ops`; docs/cost-models.md).")


def ops_section(report: ReportDocument) -> list[str]:
    """The baseline's per-op roofline table (``whatif report --ops``), its top rows."""
    doc = report.ops
    if not isinstance(doc, OpsDocument):
        return []
    rows = [[f"`{cell(c, 50)}`" if i == 0 else cell(c, 40) for i, c in enumerate(ops_cells(r))]
            for r in doc.rows[:OPS_ROWS]]
    return ["### Where the GPU time goes, per op (`whatif ops`)", "", ops_caption(doc), "",
            *_table(OPS_HEADER, rows, "lllrrrrrl"), ""]


def suggest_section(report: ReportDocument) -> list[str]:
    """The optimizations ``whatif suggest`` ranked on the baseline, and what it could not try."""
    doc = report.suggestions
    if not isinstance(doc, SuggestDocument):
        return []
    rows = [[f"`{cell(s.setting, 50)}`", f"{s.headline.speedup:.3f}x", ms(s.saved_ns_per_step),
             cell("; ".join(s.where) or "-", 60), cell(s.headline.cap.reason if s.headline.cap else "-", 60)]
            for s in doc.suggestions[:SUGGEST_ROWS]]
    out = ["### What to try next (`whatif suggest`)", ""]
    out += [*_table(["optimization, alone", "predicted speedup", "saved ms/step", "acts on", "cap"], rows, "lrrll"),
            ""] if rows else ["No optimization whatif knows applies to this trace.", ""]
    if doc.skipped:
        out += _details(f"Not tried: {len(doc.skipped)} transform(s)",
                        [f"- `{k.transform}`: {cell(k.reason, 120)}" for k in doc.skipped])
    return out


def top_details(report: ReportDocument) -> list[str]:
    out = []
    for rows, title, cpu in top_tables(report):
        if rows:
            table = [[f"`{cell(r.name, 70)}`", f"{r.count:,}", ms(r.gpu_ns), *([ms(r.cpu_ns)] if cpu else [])]
                     for r in rows]
            header = ["name", "count", "GPU ms", *(["CPU ms"] if cpu else [])]
            out += _details(f"Baseline: top {title} (measured)", _table(header, table))
    return out


def render_markdown(report: ReportDocument) -> str:
    """The whole Markdown report."""
    pred = report.prediction
    base = pred.baseline
    failed = sum(c.status == "failed" for c in report.checks)
    status = (f"{ICON['failed']} **{failed} of {len(report.checks)} checks failed**" if failed else
              f"{ICON['passed']} **passed** ({len(report.checks)} checks)" if report.checks else
              "no checks")
    lines = [f"## whatif report: `{report.source}`", "",
             f"{report.device or 'GPU unknown'} · {len(counted(base.steps))} of {len(base.steps)} steps · "
             f"baseline mean step {ms(base.mean_step_ns)} ms · {status}", ""]
    excluded = excluded_line(base.steps)
    if excluded:
        lines += [cell(excluded, 400), ""]
    lines += [*summary_table(report), ""]
    if report.checks:
        lines += ["### Checks", "", *checks_table(report), ""]
    lines += suggest_section(report)
    lines += ops_section(report)
    for s in pred.scenarios:
        lines += scenario_details(s, base)
    lines += top_details(report)
    fid = report.fidelity
    if fid is not None and fid.max_abs_error is not None:
        lines.append(f"Replay of the unmodified trace: worst step error {fid.max_abs_error * 100:.3f}%. "
                     f"whatif {report.whatif_version}.")
    return "\n".join(lines).rstrip() + "\n"
