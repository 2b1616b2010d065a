"""The collectives of a multi-rank job as a whole: per collective call across the loaded ranks, the
message size, algorithm and bus bandwidth (nccl-tests' conventions), the arrival skew, the
straggler and the waiting it cost the others, intra- vs inter-node; per rank, transfer and wait
time and how often it arrived last. -o writes one row per call (.csv or .parquet). See
docs/collectives.md."""
from __future__ import annotations

import argparse
from pathlib import Path

import msgspec
import pandas as pd
from rich.console import Console

from whatif.collectives import CollectivesOptions, collectives
from whatif.depgraph.build import build_graph
from whatif.documents import CollectivesDocument
from whatif.report.diff_text import short_name
from whatif.summary import console, mib_text, ms_text
from whatif.tracer.readers import accepted
from whatif.tracer.trace import load_trace

from ._dataclass_args import add_dataclass_arguments, from_args
from ._progress import working
from ._tables import add_output_arguments, check_outputs, print_table, write_outputs
from ._values import positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, help=f"folder of per-rank traces, run folder, or one trace ({accepted()})")
    add_output_arguments(parser, "one row per call", "whatif.collectives")
    parser.add_argument("--top", type=positive_int, default=10, help="calls and ranks per table (default 10)")
    add_dataclass_arguments(parser, CollectivesOptions)


def run(args: argparse.Namespace) -> int:
    options = from_args(CollectivesOptions, args)
    check_outputs(args)
    with working(f"whatif collectives: reading {args.path}", args.quiet) as status:
        trace = load_trace(args.path)
        status(f"whatif collectives: building the graph of {args.path}")
        doc = collectives(trace, build_graph(trace), options)
    written = write_outputs(args, doc, calls_table(doc) if args.output else None)
    if not args.quiet:
        render_collectives(doc, console(), top=args.top)
        for path in written:
            print(f"wrote {path}")
    return 0


def calls_table(doc: CollectivesDocument) -> pd.DataFrame:
    """One row per call, the document's fields as columns (ranks as text)."""
    rows = [msgspec.to_builtins(c) for c in doc.calls]
    for r in rows:
        r["ranks"] = " ".join(str(x) for x in r["ranks"])
    columns = list(msgspec.structs.fields(type(doc.calls[0])) if doc.calls else [])
    return pd.DataFrame(rows, columns=[f.name for f in columns] or None)


def _us(ns: float) -> str:
    return f"{ns / 1e3:,.1f}"


def _opt(value: float | None, fmt: str = "{:,.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def render_collectives(doc: CollectivesDocument, out: Console, top: int = 10) -> None:
    """Totals per kind and span, the calls that cost the most waiting, and the ranks."""
    loaded = len(doc.ranks)
    out.print(f"whatif collectives: {doc.source} ({loaded} rank{'s' if loaded != 1 else ''} with collectives; "
              f"GPUs per node: "
              f"{doc.ranks_per_node or 'unknown'})")
    if not doc.calls:
        out.print("no collective kernels (NCCL/RCCL) in this trace")
        return
    if loaded == 1:
        out.print("one rank: a call's transfer time includes its wait for peers that are not loaded, so bandwidths "
                  "are lower bounds and there is no skew")
    groups: dict[tuple[str, str], list] = {}
    for c in doc.calls:
        groups.setdefault((c.kind, c.span), []).append(c)
    summary = []
    for (kind, span), calls in sorted(groups.items()):
        bus = sorted(c.busbw_gbps for c in calls if c.busbw_gbps is not None)
        summary.append([kind, span, f"{len(calls):,}", ms_text(sum(c.transfer_ns for c in calls)),
                        ms_text(sum(c.waited_ns for c in calls)),
                        _opt(bus[len(bus) // 2] if bus else None), _opt(bus[-1] if bus else None),
                        _mib_known(calls)])
    print_table(out, "collectives by kind (busbw: nccl-tests' bus bandwidth, GB/s)",
           ["kind", "span", "calls", "transfer ms", "waited ms", "median busbw", "max busbw", "MiB"], summary, {0, 1})
    worst = sorted(doc.calls, key=lambda c: (-c.waited_ns, -c.transfer_ns, c.first_arrival_ns))[:top]
    print_table(out, "calls that cost the most waiting, then the longest (waited: every rank's wait for the last "
                     "arrival)",
           ["waited us", "skew us", "transfer us", "straggler", "MiB", "busbw", "step", "call"],
           [[_us(c.waited_ns), _us(c.skew_ns), _us(c.transfer_ns), _opt(c.straggler, "{}"),
             _opt(None if c.message_bytes is None else c.message_bytes / 2**20, "{:,.2f}"), _opt(c.busbw_gbps),
             str(c.step), f"{short_name(c.key, 50)} #{c.occurrence}"] for c in worst], {7})
    ranks = sorted(doc.ranks, key=lambda r: (-r.caused_wait_ns, r.rank))[:top]
    print_table(out, "ranks, by the waiting they caused (straggler: arrived last)",
           ["rank", "calls", "transfer ms", "waited ms", "straggler calls", "caused wait ms"],
           [[str(r.rank), f"{r.calls:,}", ms_text(r.transfer_ns), ms_text(r.waited_ns), f"{r.straggler_calls:,}",
             ms_text(r.caused_wait_ns)] for r in ranks], set())


def _mib_known(calls: list) -> str:
    """The MiB the calls move, "-" when no call's size is recorded."""
    sizes = [c.message_bytes for c in calls if c.message_bytes is not None]
    return mib_text(sum(sizes)) if sizes else "-"
