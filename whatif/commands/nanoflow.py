"""NanoFlow's intra-device parallelism priced on a trace: one iteration's GEMMs, memory-bound
kernels and collectives (after the scenario given with -s, e.g. a tensor_parallel that inserts the
collectives) run as nano-batches on shares of the GPU, priced by NanoFlow's measured A100
interference curves (or idealized ones), against the same kernels one at a time: the best
nano-batch count and partition of the GPU, and its speedup. -o writes every partition tried. See
docs/multi-gpu.md."""
from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from whatif.documents import NanoFlowDocument
from whatif.nanoflow import NanoFlowOptions, nanoflow
from whatif.predictors.cost_models import CostConfig
from whatif.predictors.steps import StepOptions
from whatif.summary import console, ms_text
from whatif.tracer.readers import accepted

from ._dataclass_args import add_dataclass_arguments, from_args
from ._device_specs import add_device_spec_argument
from ._progress import working
from ._tables import add_output_arguments, check_outputs, print_table, write_outputs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, help=f"trace file ({accepted()}), folder of per-rank traces, or run folder")
    parser.add_argument("-s", "--scenario", type=Path, metavar="FILE",
                        help="scenario TOML applied first (e.g. tensor_parallel, which inserts the collectives)")
    add_output_arguments(parser, "every partition tried (nano-batches, shares, time)", "whatif.nanoflow")
    add_dataclass_arguments(parser, NanoFlowOptions)
    add_dataclass_arguments(parser, CostConfig)
    add_dataclass_arguments(parser, StepOptions)
    add_device_spec_argument(parser)


def run(args: argparse.Namespace) -> int:
    check_outputs(args)
    options = from_args(NanoFlowOptions, args)
    cost = from_args(CostConfig, args)
    with working(f"whatif nanoflow: reading {args.path}", args.quiet):
        doc, search = nanoflow(args.path, args.scenario, options, cost_model=cost.cost_model,
                               steps=from_args(StepOptions, args))
    written = write_outputs(args, doc, search.table)
    if not args.quiet:
        render_nanoflow(doc, console())
        for path in written:
            print(f"wrote {path}")
    return 0


def render_nanoflow(doc: NanoFlowDocument, out: Console) -> None:
    """The iteration's parts, NanoFlow's schedule and its speedup, then the assumptions."""
    scenario = f" after {doc.scenario}" if doc.scenario else ""
    out.print(f"whatif nanoflow: {doc.source}{scenario} (collective parts priced on {doc.topology}; "
              f"{doc.layers} blocks per step)")
    p = doc.partition
    rows = [["one kernel at a time", "1", "1.00", "1.00", "1.00" if doc.comm_ns else "-", ms_text(doc.gemm_ns),
             ms_text(doc.memory_ns), ms_text(doc.comm_ns), ms_text(doc.sequential_ns), "1.00x"]]
    if p is not None:
        rows.append(["NanoFlow", str(doc.nano_batches), f"{p.gemm_share:.2f}", f"{p.memory_share:.2f}",
                     f"{p.comm_share:.2f}" if doc.comm_ns else "-", "", "", "", ms_text(doc.iteration_ns),
                     f"{doc.speedup:.2f}x"])
    print_table(out, "one iteration (ms; shares of the GPU)",
                ["schedule", "nano-batches", "GEMM share", "memory share", "comm share", "GEMM", "memory-bound",
                 "collectives", "iteration", "speedup"], rows, text={0})
    if p is None:
        out.print("no partition of the GPU beats one kernel at a time here")
    for line in doc.assumptions:
        out.print(f"assumption: {line}")
