"""The per-op roofline table: every GPU activity grouped by the op that launched it, its shapes and
dtype (or by kernel as well), with count, time, FLOPs, bytes, intensity, achieved TFLOP/s and
TB/s, the device's roofline at that intensity, the share of it reached and the bound (compute,
memory, latency, launch). See docs/cost-models.md for the formulas and the bound rule."""
from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from whatif.documents import OpsDocument
from whatif.ops import GroupBy, ops_table, table_frame
from whatif.report.diff_text import short_name, short_names
from whatif.summary import console, ms_text
from whatif.tracer.readers import accepted
from whatif.tracer.trace import load_trace

from ._device_specs import add_device_spec_argument
from ._progress import working
from ._tables import add_output_arguments, check_outputs, print_table, write_outputs
from ._values import positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, help=f"trace file ({accepted()}), folder of per-rank traces, or run folder")
    parser.add_argument("--by", choices=[g.value for g in GroupBy], default=GroupBy.OP.value,
                        help="group by launching op, shapes and dtype (op, default) or by the kernel as well (kernel)")
    parser.add_argument("--top", type=positive_int, default=20, help="rows printed (default 20; files get all rows)")
    add_output_arguments(parser, "every row", "whatif.ops")
    add_device_spec_argument(parser)


def run(args: argparse.Namespace) -> int:
    check_outputs(args)
    with working(f"whatif ops: reading {args.path}", args.quiet) as status:
        trace = load_trace(args.path)
        status(f"whatif ops: pricing the ops of {args.path}")
        doc = ops_table(trace, args.by)
    written = write_outputs(args, doc, table_frame(doc))
    if not args.quiet:
        render_ops(doc, console(), top=args.top)
        for path in written:
            print(f"wrote {path}")
    return 0


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def render_ops(doc: OpsDocument, out: Console, top: int = 20) -> None:
    """The table, numbers first, op names shortened from the middle."""
    device = ", ".join(doc.devices) or "not in the catalog (no roofline)"
    out.print(f"whatif ops: {doc.source} ({device}; {len(doc.rows)} groups by {doc.by}, "
              f"{ms_text(doc.gpu_total_ns)} ms of GPU activity)")
    if not doc.rows:
        out.print("no GPU activity (kernel, copy or memset) in this trace: no ops to price")
        return
    columns = ["total ms", "share", "count", "mean us", "GFLOP", "MB", "FLOP/B", "TFLOP/s", "TB/s", "roof TFLOP/s",
               "% roof", "bound", "op", "shapes", "dtype"]
    rows = []
    shown = doc.rows[:top]
    labels = short_names([r.op if not r.kernel else f"{r.op} / {r.kernel}" for r in shown], 48)
    for r, label in zip(shown, labels):
        rows.append([ms_text(r.total_ns), f"{100 * r.total_ns / doc.gpu_total_ns:.1f} %", str(r.count),
                     f"{r.mean_ns / 1e3:,.1f}", _num(None if r.flops is None else r.flops / 1e9, ",.2f"),
                     _num(None if r.bytes is None else r.bytes / 1e6, ",.2f"), _num(r.intensity, ",.1f"),
                     _num(r.achieved_tflops, ",.2f"), _num(r.achieved_tbps, ".3f"), _num(r.roofline_tflops, ",.1f"),
                     _num(r.roofline_pct, ".1f"), r.bound, label, short_name(r.shapes, 40), r.dtype])
    print_table(out, "", columns, rows, text={11, 12, 13, 14})
    if len(doc.rows) > top:
        out.print(f"({len(doc.rows) - top} more rows: --top, -o table.csv or --json for all)")
