"""Two sweeps. With --rates: latency-vs-throughput curves of a serving loop, the `whatif serve`
simulation repeated over arrival rates, for the baseline and each --scenario (a whatif.serving-sweep
JSON document; --html: whatif.figures.serving_curves_figure). With --plans: every parallel plan of
a grid TP x PP x DP x SP x micro-batches x device predicted as `whatif predict` predicts its scenario,
on local processes (--jobs) or Ray (--ray), with the Pareto front of GPUs, step time and throughput
(a whatif.plan-sweep/1 document, -o the table, --html the Pareto figure; docs/scale.md)."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

from whatif.core.errors import WhatifError
from whatif.core.output import check_table_path, refuse_overwrite, write_output, write_table
from whatif.documents import LlmSweepDocument, LlmSweepPoint, PlanSweepDocument, SweepDocument, write_json
from whatif.predictors.cost_models import CostConfig
from whatif.predictors.steps import StepOptions
from whatif.scale.plans import PlanGrid, PlanStatus, plans_table, ran, sweep_plans
from whatif.serving import sweep
from whatif.summary import console, ms_text

from ._dataclass_args import add_dataclass_arguments, from_args
from ._execution import add_execution_arguments, execution
from ._progress import working
from ._values import positive_int
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
    parser.add_argument("--rates", type=_rates, metavar="R1,R2,...", help="arrival rates (req/s): a serving sweep")
    parser.add_argument("--json", type=Path, metavar="OUT",
                        help="write the whatif.serving-sweep (--plans: whatif.plan-sweep/1) JSON document")
    parser.add_argument("--html", type=Path, metavar="OUT",
                        help="write the latency-vs-throughput figure (--plans: the Pareto figure; self-contained "
                             "HTML: works offline)")
    parser.add_argument("-q", "--quiet", action="store_true")
    plans = parser.add_argument_group("plan sweep (--plans)")
    plans.add_argument("--plans", action="store_true",
                       help="sweep parallel plans (the grid below) instead of arrival rates")
    add_dataclass_arguments(plans, PlanGrid)
    add_execution_arguments(plans)
    plans.add_argument("-o", "--output", type=Path, metavar="TABLE", help="write every plan's row (.csv or .parquet)")
    plans.add_argument("-f", "--force", action="store_true", help="overwrite the -o table if it exists")
    plans.add_argument("--top", type=positive_int, default=20, help="Pareto-front plans printed (default 20)")


def run(args: argparse.Namespace) -> int:
    if args.plans:
        return run_plans(args)
    if args.rates is None:
        raise WhatifError("sweep: give --rates (a serving sweep) or --plans (a plan sweep)")
    if args.output:
        raise WhatifError("sweep: -o writes the plan table of --plans (a serving sweep writes --json and --html)")
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


def run_plans(args: argparse.Namespace) -> int:
    """The plan sweep: checks every option before the trace is read, then one progress line of
    plans done out of the grid's."""
    if args.rates is not None or args.scenario:
        raise WhatifError("sweep --plans: a plan is its own scenario; --rates and -s belong to the serving sweep")
    if args.output:
        check_table_path(args.output)
        refuse_overwrite([args.output], args.force)
    try:
        grid = from_args(PlanGrid, args)
    except ValueError as exc:
        raise WhatifError(f"sweep --plans: {exc}") from None
    where = execution(args)
    with working(f"whatif sweep: {grid.size()} plans of {args.path}", args.quiet) as status:
        doc = sweep_plans(args.path, grid, where, cost_model=from_args(CostConfig, args).cost_model.value,
                          options=from_args(StepOptions, args),
                          progress=lambda done, total: status(f"whatif sweep: {done}/{total} plans"))
    if args.json:
        write_json(args.json, doc)
    if args.output:
        write_table(args.output, plans_table(doc))
    if args.html:
        from whatif.figures import plan_pareto_figure

        write_output(args.html, plan_pareto_figure(doc).to_html(include_plotlyjs=True).encode("utf-8"))
    if not args.quiet:
        render_plans(doc, console(), args.top)
    return 0


def render_plans(doc: PlanSweepDocument, out: Console, top: int) -> None:
    """The Pareto front of the plans that ran (fewest GPUs first, ``top`` rows) and one line of counts."""
    front = sorted((r for r in doc.plans if r.pareto), key=lambda r: (r.gpus, r.step_ns or 0, r.plan))
    done = sum(ran(r.status, r.step_ns) for r in doc.plans)
    # a line of its own, not the table's title, which wraps at the table's width, inside the path
    out.print(f"{doc.source}: Pareto front of the {done} plan{'' if done == 1 else 's'} that ran ({doc.mode}, "
              f"traced step {ms_text(doc.baseline_step_ns)} ms)", markup=False, highlight=False, soft_wrap=True)
    table = Table()
    for c in ("plan", "GPUs", "step ms", doc.throughput_unit, "GB per GPU"):
        table.add_column(c, justify="left" if c == "plan" else "right", no_wrap=True)
    for r in front[:top]:
        table.add_row(r.plan, str(r.gpus), ms_text(r.step_ns or 0), cell(r.throughput_per_s, "{:,.2f}"),
                      cell(None if r.memory_per_gpu_bytes is None else r.memory_per_gpu_bytes / 1e9, "{:.1f}"))
    out.print(table)
    counts = {s: sum(r.status == s.value for r in doc.plans) for s in PlanStatus}
    out.print(f"{counts[PlanStatus.OK]} plans predicted, {counts[PlanStatus.REFUSED]} refused by a transform, "
              f"{counts[PlanStatus.NO_FIT]} over the device's memory; {len(front)} on the Pareto front"
              + (f" ({len(front) - top} more in -o/--json)" if len(front) > top else ""))
    out.print(f"memory per GPU: {doc.memory_model}")
