"""Where each GPU's time went, as HolisticTraceAnalysis reports it and computed from every
event (no step window): idle / compute / non-compute time and the communication hidden under
compute, per rank and per step; idle gaps by cause (host wait, kernel wait, other) per stream;
launch delays; launch-queue length; GPU time by kernel class. See docs/breakdown.md."""
from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from whatif.breakdown import WHOLE_RANK, BreakdownOptions, breakdown, step_label
from whatif.depgraph.build import build_graph
from whatif.documents import BreakdownDocument, write_json
from whatif.summary import console, ms_text
from whatif.tracer.readers import accepted
from whatif.tracer.trace import load_trace

from ._dataclass_args import add_dataclass_arguments, from_args
from ._progress import working
from ._values import positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, help=f"trace file ({accepted()}), folder of per-rank traces, or run folder")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the whatif.breakdown JSON document here")
    parser.add_argument("--steps", action="store_true", help="a row per step in the temporal and class tables "
                                                             "(default: one per rank)")
    parser.add_argument("--top", type=positive_int, default=10, help="rows per table (default 10)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing (with --json)")
    add_dataclass_arguments(parser, BreakdownOptions)


def run(args: argparse.Namespace) -> int:
    options = from_args(BreakdownOptions, args)
    with working(f"whatif breakdown: reading {args.path}", args.quiet) as status:
        trace = load_trace(args.path)
        status(f"whatif breakdown: building the graph of {args.path}")
        doc = breakdown(trace, build_graph(trace), options)
    if args.json:
        write_json(args.json, doc)
    if not args.quiet:
        render_breakdown(doc, console(), steps=args.steps, top=args.top)
        if args.json:
            print(f"wrote {args.json}")
    return 0


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "-"


def _table(out: Console, title: str, columns: list[str], rows: list[list[str]], left: int = 2) -> None:
    """A table whose first ``left`` columns (rank, step or stream) are text, the rest numbers."""
    t = Table(title=title, title_justify="left", show_edge=False)
    for i, col in enumerate(columns):
        t.add_column(col, justify="left" if i < left else "right")
    for row in rows:
        t.add_row(*row)
    out.print(t)


def _more(out: Console, left: int) -> None:
    if left > 0:
        out.print(f"({left} more rows: --top, or --json for all)")


def render_breakdown(doc: BreakdownDocument, out: Console, steps: bool = False, top: int = 10) -> None:
    """The breakdown tables, numbers first after the rank and step."""
    out.print(f"whatif breakdown: {doc.source} (every GPU activity; steps by the step that launched them)")
    if not doc.temporal:
        out.print("no GPU activity (kernel, copy or memset) in this trace: nothing to break down")
        return
    temporal = [r for r in doc.temporal if steps or r.step == WHOLE_RANK]
    _table(out, "GPU time (idle, compute, non-compute: share of the span from first to last activity)",
           ["rank", "step", "span ms", "idle", "compute", "non-compute", "comm ms", "memory ms", "comm overlapped"],
           [[str(r.rank), step_label(r.step, r.excluded), ms_text(r.span_ns), _pct(r.idle_ns, r.span_ns),
             _pct(r.compute_ns, r.span_ns), _pct(r.non_compute_ns, r.span_ns), ms_text(r.communication_ns),
             ms_text(r.memory_ns), _pct(r.comm_overlapped_ns, r.communication_ns)] for r in temporal[: top * 4]])
    _more(out, len(temporal) - top * 4)
    idle = sorted(doc.idle, key=lambda g: -(g.host_wait_ns + g.kernel_wait_ns + g.other_ns))[:top]
    _table(out, f"idle gaps by cause (kernel wait: under {doc.kernel_wait_ns / 1e3:g} us, launched in time)",
           ["rank", "stream", "host wait ms", "kernel wait ms", "other ms", "gaps"],
           [[str(g.rank), g.stream, ms_text(g.host_wait_ns), ms_text(g.kernel_wait_ns), ms_text(g.other_ns),
             str(g.gaps)] for g in idle])
    _table(out, f"launch delay (activity start - end of its launch call; long: over {doc.long_delay_ns / 1e3:g} us)",
           ["rank", "launches", "p50 us", "p90 us", "p99 us", "max us", "long", "GPU < launch"],
           [[str(d.rank), str(d.launches), f"{d.p50_ns / 1e3:.1f}", f"{d.p90_ns / 1e3:.1f}",
             f"{d.p99_ns / 1e3:.1f}", f"{d.max_ns / 1e3:.1f}", str(d.long_delays), str(d.shorter_than_launch)]
            for d in doc.launches], left=1)
    queues = sorted(doc.queues, key=lambda q: -q.mean)[:top]
    _table(out, "launch queue (launched, not started)", ["rank", "stream", "max", "mean", "empty"],
           [[str(q.rank), q.stream, str(q.max), f"{q.mean:.2f}", f"{100 * q.empty_share:.1f} %"] for q in queues])
    classes = [c for c in doc.classes if steps or c.step == WHOLE_RANK]
    _table(out, "GPU time by kernel class", ["rank", "step", "class", "ms", "share", "count"],
           [[str(c.rank), step_label(c.step, None), c.kernel_class, ms_text(c.total_ns), f"{100 * c.share:.1f} %",
             str(c.count)] for c in classes[: top * 10]])
    _more(out, len(classes) - top * 10)
