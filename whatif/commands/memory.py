"""The memory timeline of a trace recorded with profile_memory (whatif record --memory): the peak of
allocated and reserved bytes per device, when it happened (step, operator), which operators held
the memory at the peak, and allocated bytes per step. -o writes every allocator record with what
was derived from it as a table (.csv or .parquet). See docs/memory.md."""
from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from whatif.depgraph.build import build_graph
from whatif.documents import MemoryDocument
from whatif.memory import MemoryOptions, memory, memory_edits, memory_table
from whatif.report.diff_text import short_name
from whatif.summary import console, mib_text, ms_text
from whatif.tracer.readers import accepted
from whatif.tracer.trace import load_trace
from whatif.transforms.scenario import load_scenario

from ._dataclass_args import add_dataclass_arguments, from_args
from ._progress import working
from ._tables import add_output_arguments, check_outputs, print_table, write_outputs
from ._values import positive_int

NO_RECORDS = ("no allocator records in this trace: record it with profile_memory "
              "(whatif record --memory, or torch.profiler.profile(profile_memory=True))")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, help=f"trace file ({accepted()}), folder of per-rank traces, or run folder")
    add_output_arguments(parser, "every allocator record with its allocated/reserved bytes, step and op",
                         "whatif.memory")
    parser.add_argument("-s", "--scenario", type=Path, metavar="FILE",
                        help="the timeline this scenario's transforms predict (those that model memory: "
                             "flash_attention, autocast, precision, batch, tensor_parallel, pipeline_parallel, "
                             "sequence_parallel), beside the recorded peak")
    parser.add_argument("--steps", action="store_true", help="a row per step and device (default: per device)")
    parser.add_argument("--top", type=positive_int, default=10, help="operators per device (default 10)")
    add_dataclass_arguments(parser, MemoryOptions)


def run(args: argparse.Namespace) -> int:
    options = from_args(MemoryOptions, args)
    check_outputs(args)
    scenario = load_scenario(args.scenario) if args.scenario else None
    with working(f"whatif memory: reading {args.path}", args.quiet) as status:
        trace = load_trace(args.path)
        status(f"whatif memory: building the graph of {args.path}")
        graph = build_graph(trace)
        recorded = memory(trace, graph, options)
        edits, lines = memory_edits(graph, scenario.transforms) if scenario is not None else ([], None)
        doc = memory(trace, graph, options, edits, lines) if scenario is not None else recorded
        table = memory_table(trace, edits) if args.output else None
    written = write_outputs(args, doc, table)
    if not args.quiet:
        out = console()
        if scenario is not None and recorded.devices:
            render_prediction(recorded, doc, scenario.name, out)
        render_memory(doc, out, steps=args.steps, top=args.top)
        for path in written:
            print(f"wrote {path}")
    return 0


def render_prediction(recorded: MemoryDocument, predicted: MemoryDocument, scenario: str, out: Console) -> None:
    """What the scenario's transforms do to the records, and each device's peak recorded and
    predicted (the tables after it are the predicted timeline's)."""
    out.print(f"scenario {scenario}: the predicted timeline (the tables below are the prediction's)")
    for line in predicted.predicted or ():
        out.print(f"  {line}")
    print_table(out, "peak allocated memory per device (MiB)", ["rank", "device", "recorded", "predicted", "ratio"],
                [[str(r.rank), r.device, mib_text(r.peak_allocated_bytes), mib_text(p.peak_allocated_bytes),
                  f"{p.peak_allocated_bytes / r.peak_allocated_bytes:.3f}x" if r.peak_allocated_bytes else "-"]
                 for r, p in zip(recorded.devices, predicted.devices)], text={0, 1})


def _step(step: int) -> str:
    return "-" if step < 0 else str(step)


def render_memory(doc: MemoryDocument, out: Console, steps: bool = False, top: int = 10) -> None:
    """The device, per-step and operator tables, numbers first after the rank and device."""
    out.print(f"whatif memory: {doc.source}")
    if not doc.devices:
        out.print(NO_RECORDS)
        return
    relative = any(d.baseline == "relative" for d in doc.devices)
    print_table(out, "allocated memory per device (MiB" + ("; relative: from 0 at the first record, the trace has "
                                                       "sizes only)" if relative else ")"),
           ["rank", "device", "peak", "peak reserved", "start", "end", "at ms", "step", "allocations", "baseline",
            "op at the peak"],
           [[str(d.rank), d.device, mib_text(d.peak_allocated_bytes),
             mib_text(d.peak_reserved_bytes) if d.peak_reserved_bytes is not None else "-",
             mib_text(d.start_allocated_bytes), mib_text(d.end_allocated_bytes), ms_text(d.peak_ns - d.first_ns),
             _step(d.peak_step), f"{d.allocations:,}", d.baseline, short_name(d.peak_op, 40)] for d in doc.devices],
           text={0, 1, 9, 10})
    if steps:
        print_table(out, "allocated memory per step (MiB)",
               ["rank", "device", "step", "start", "peak", "end", "allocated", "records"],
               [[str(s.rank), s.device, f"{s.step}{f' ({s.excluded})' if s.excluded else ''}",
                 mib_text(s.start_allocated_bytes), mib_text(s.peak_allocated_bytes), mib_text(s.end_allocated_bytes),
                 mib_text(s.allocated_bytes), f"{s.records:,}"] for s in doc.steps], text={0, 1, 2})
    for d in doc.devices:
        ops = [o for o in doc.ops if o.rank == d.rank and o.device == d.device][:top]
        held = d.held_at_peak_unrecorded_bytes
        note = (f"; {mib_text(held)} MiB of the peak was allocated before the recording" if held is not None else
                "; the records carry no addresses: nothing is matched to the peak")
        print_table(out, f"rank {d.rank} {d.device}: operators by memory held at the peak (MiB){note}",
               ["held at peak", "allocated", "freed", "allocated − freed", "allocations", "op"],
               [[mib_text(o.held_at_peak_bytes) if o.held_at_peak_bytes is not None else "-",
                 mib_text(o.allocated_bytes), mib_text(o.freed_bytes), mib_text(o.net_bytes), f"{o.allocations:,}",
                 short_name(o.op, 60)] for o in ops], text={5})
