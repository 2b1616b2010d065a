"""Latency-vs-throughput curves of a serving loop: the `whatif serve` simulation repeated over
arrival rates, for the baseline and each --scenario. Writes a whatif.serving-sweep JSON document
and, with --html, the plotly figure (whatif.figures.serving_curves_figure)."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

from whatif.core.output import write_output
from whatif.documents import LlmSweepDocument, LlmSweepPoint, SweepDocument, write_json
from whatif.serving import sweep
from whatif.summary import console

from ._progress import working
from .serve import add_common_arguments, capacity_lines, cell, options, workload


def _rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated rates, got {text!r}") from None
    if not rates or not all(r > 0 and math.isfinite(r) for r in rates):
        raise argparse.ArgumentTypeError(f"rates must be finite numbers > 0, got {text!r}")
    return rates


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser, rate_required=False)
    parser.add_argument("--rates", type=_rates, required=True, metavar="R1,R2,...", help="arrival rates (req/s)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the whatif.serving-sweep JSON document")
    parser.add_argument("--html", type=Path, metavar="OUT",
                        help="write the latency-vs-throughput figure (self-contained HTML: works offline)")
    parser.add_argument("-q", "--quiet", action="store_true")


def run(args: argparse.Namespace) -> int:
    with working(f"whatif sweep: fitting and simulating {len(args.rates)} rates on {args.path}", args.quiet):
        doc = sweep(args.path, args.rates, args.scenario, workload(args), **options(args))
    if args.json:
        write_json(args.json, doc)
    if args.html:
        from whatif.figures import serving_curves_figure

        html = serving_curves_figure(doc).to_html(include_plotlyjs=True)
        write_output(args.html, html.encode("utf-8"))
    if not args.quiet:
        render(doc, console())
    return 0


def render(doc: SweepDocument, console: Console) -> None:
    llm = doc.kind == "llm"
    table = Table(title=f"{doc.source}: latency vs load", title_justify="left")
    for c in ["scenario", "rate req/s", "req/s"] + (["out tok/s", "TTFT mean ms", "TTFT p99 ms", "TPOT mean ms",
                                                    "TPOT p99 ms"] if llm else ["latency mean ms", "latency p99 ms"]) \
            + ["busy"]:
        table.add_column(c, justify="left" if c == "scenario" else "right", no_wrap=True)
    for curve in doc.curves:
        for p in curve.points:
            vals = ([cell(p.throughput_tokens_per_s, "{:.0f}"), cell(p.ttft_ms.get("mean")), cell(p.ttft_ms.get("p99")),
                     cell(p.tpot_ms.get("mean")), cell(p.tpot_ms.get("p99"))] if isinstance(p, LlmSweepPoint)
                    else [cell(p.latency_ms.get("mean")), cell(p.latency_ms.get("p99"))])
            table.add_row(curve.name, f"{p.rate_req_per_s:g}", cell(p.throughput_req_per_s), *vals,
                          cell(p.busy_fraction, "{:.0%}"))
    console.print(table)
    if isinstance(doc, LlmSweepDocument):
        for line in capacity_lines(doc.scheduler.capacity, [(c.name, c.capacity) for c in doc.curves]):
            console.print(line)
