"""Predict serving metrics from a trace of a serving loop: fit an iteration-time model on the
replayed iterations (baseline and each --scenario), then simulate requests arriving at a rate or
from a workload file under a scheduler (vLLM-style continuous batching, static, chunked prefill,
prefill/decode disaggregation) and report TTFT, TPOT, end-to-end latency, throughput and goodput
per scenario. DiT traces (phase:denoise) give request latency and throughput. The work is done by
:func:`whatif.serving.serve`; this module maps the flags onto it and prints. See docs/serving.md."""
from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from msgspec import UnsetType
from rich.console import Console
from rich.table import Table

from whatif.core.steps import INCLUDE_HINT, Exclusion, StepOptions
from whatif.documents import (
    CapacityEntry,
    CostPhaseEntry,
    DitIterationModel,
    DitScenarioServing,
    DitServingDocument,
    DitSettings,
    DriverRange,
    ExcludedIteration,
    LatencyStats,
    LlmScenarioServing,
    LlmServingDocument,
    PhaseFitEntry,
    ServingDocument,
    Stat,
    write_json,
)
from whatif.predictors.cost_models import CostConfig
from whatif.predictors.serving.simulator import SchedulerConfig
from whatif.serving import DitOptions, Workload, serve
from whatif.summary import console

from ._dataclass_args import add_dataclass_arguments, from_args
from ._device_specs import add_device_spec_argument
from ._progress import working
from ._values import positive_float


def add_common_arguments(parser: argparse.ArgumentParser, rate_required: bool = True) -> None:
    """Options shared by ``serve`` and ``sweep``: trace, scenarios, log, the steps the models are
    fitted on (:class:`~whatif.core.steps.StepOptions`), and the workload, scheduler and DiT
    options, generated from :class:`~whatif.serving.Workload`,
    :class:`~whatif.predictors.serving.simulator.SchedulerConfig` and :class:`~whatif.serving.DitOptions`
    (``sweep`` draws at each of its ``--rates``, so it has no ``--rate``)."""
    parser.add_argument("path", type=Path, help="run folder (or trace) of a serving loop with phase annotations")
    parser.add_argument("-s", "--scenario", type=Path, action="append", default=[], metavar="FILE",
                        help="scenario TOML applied to the graph before fitting (repeatable)")
    add_dataclass_arguments(parser, CostConfig)
    add_device_spec_argument(parser)
    add_dataclass_arguments(parser.add_argument_group("steps fitted"), StepOptions)
    parser.add_argument("--iterations-log", type=Path, metavar="FILE",
                        help="the server's JSON log of the recorded run (batch composition per iteration); "
                             "default: the --log named in the run folder's meta.jsonc")
    parser.add_argument("--engine", metavar="NAME",
                        help="the serving-engine adapter that finds the iterations in a trace without a serving "
                             "log (default: the first that recognises it; docs/serving.md)")
    parser.add_argument("--unprofiled-log", type=Path, metavar="FILE",
                        help="log of the same program run without the profiler: rescales iteration times by "
                             "the measured profiler overhead")
    parser.add_argument("--no-baseline", action="store_true", help="report only the scenarios")
    add_dataclass_arguments(parser.add_argument_group("workload"), Workload, exclude=_workload_exclude(rate_required))
    s = parser.add_argument_group("scheduler (LLM)")
    add_dataclass_arguments(s, SchedulerConfig)
    s.add_argument("--slo-ttft-ms", type=positive_float, help="TTFT objective of goodput and SLO attainment")
    s.add_argument("--slo-tpot-ms", type=positive_float, help="TPOT objective of goodput and SLO attainment")
    add_dataclass_arguments(parser.add_argument_group("DiT"), DitOptions)


def _workload_exclude(rate_required: bool) -> tuple[str, ...]:
    return () if rate_required else ("rate",)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the whatif.serving JSON document")
    parser.add_argument("--requests", action="store_true", help="include every request in the JSON")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing (with --json)")


def workload(args: argparse.Namespace) -> Workload:
    """The :class:`~whatif.serving.Workload` of the workload options."""
    return from_args(Workload, args)


def options(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments of :func:`whatif.serving.serve` / ``sweep`` shared by both commands."""
    return {"scheduler": from_args(SchedulerConfig, args), "dit": from_args(DitOptions, args),
            "slo_ttft_ms": args.slo_ttft_ms, "slo_tpot_ms": args.slo_tpot_ms,
            "iterations_log": args.iterations_log, "unprofiled_log": args.unprofiled_log, "engine": args.engine,
            "baseline": not args.no_baseline, "cost_model": from_args(CostConfig, args).cost_model,
            "step_options": from_args(StepOptions, args)}


def run(args: argparse.Namespace) -> int:
    with working(f"whatif serve: fitting and simulating {args.path}", args.quiet):
        doc = serve(args.path, args.scenario, workload(args), requests=args.requests, **options(args))
    if args.json:
        write_json(args.json, doc)
    if not args.quiet:
        render(doc, console())
    return 0


def cell(v: float | None, fmt: str = "{:.2f}") -> str:
    """A table cell: ``v`` formatted, ``-`` when missing."""
    return "-" if v is None else fmt.format(v)


def _stat_cells(stats: list[tuple[LatencyStats, Stat]]) -> list[str]:
    return [cell(s.get(q)) for s, q in stats]


def _llm_row(s: LlmScenarioServing) -> list[str]:
    return [*_stat_cells([(s.ttft_ms, "mean"), (s.ttft_ms, "p99"), (s.tpot_ms, "mean"), (s.tpot_ms, "p99"),
                          (s.e2e_ms, "mean"), (s.e2e_ms, "p99")]),
            cell(s.throughput_tokens_per_s, "{:.0f}"), cell(s.throughput_req_per_s), cell(s.busy_fraction, "{:.0%}")]


def _dit_row(s: DitScenarioServing) -> list[str]:
    return [*_stat_cells([(s.latency_ms, "mean"), (s.latency_ms, "p50"), (s.latency_ms, "p99"), (s.queue_ms, "mean"),
                          (s.service_ms, "mean")]),
            cell(s.throughput_req_per_s), cell(s.busy_fraction, "{:.0%}")]


def fitted_without(excluded: list[ExcludedIteration]) -> str:
    """``step 0 (prefill, warm-up: the first step ... holds start-up)`` for each iteration left out of a fit."""
    return "; ".join(f"step {e.step} ({e.phase}, {e.excluded}: {Exclusion(e.excluded).why})" for e in excluded) \
        + f" ({INCLUDE_HINT})"


def capacity_lines(recorded: CapacityEntry | UnsetType,
                   scenarios: list[tuple[str, CapacityEntry | UnsetType]]) -> list[str]:
    """``  capacity per replica: …`` once when every scenario's replica holds the same, else one per scenario."""
    shown = [(name, c) for name, c in scenarios if isinstance(c, CapacityEntry)]
    if len({c.describe for _, c in shown}) <= 1 and isinstance(recorded, CapacityEntry):
        shown = [("", recorded)]
    return [f"  capacity per replica{f' ({name})' if name else ''}: {c.describe}" for name, c in shown]


def describe_cost_phase(e: CostPhaseEntry) -> str:
    """``decode: 1 anchor, GPU 8.2 ms GEMM + 0.6 attention + 1.2 per-token, residual 1.00``."""
    law = e.gpu_ns_by_law
    gpu = " + ".join(f"{law.get(k, 0.0) / 1e6:.2f} ms {label}" for k, label in
                     (("gemm", "GEMM"), ("attention", "attention"), ("per_token", "per-token")))
    loo = "" if e.loo_mape is None else f", LOO {e.loo_mape:.1%}"
    return (f"{e.phase}: {e.anchors} anchor(s), GPU {gpu}, CPU {e.cpu_per_seq_ns / 1e3:.1f} us/seq, "
            f"residual {e.residual:.2f}{loo}")


def loo_text(loo_mape: float | None, n: int, one: str) -> str:
    """``LOO 5.2%``, or why the leave-one-out error is undefined (None or NaN; ``n`` fitted on,
    ``one``: what one of them is): ``LOO n/a (one denoising step)``, ``LOO n/a (too few distinct
    iterations to fit)``."""
    if loo_mape is not None and not math.isnan(loo_mape):
        return f"LOO {loo_mape:.1%}"
    return f"LOO n/a ({'one ' + one if n <= 1 else 'too few distinct iterations to fit'})"


def describe_phase_fit(phase: str, f: PhaseFitEntry) -> str:
    """``decode: seqs+padded (n=376, R²=0.67, MAPE 10.2%, LOO 11.9%)``."""
    return (f"{phase}: {'+'.join(f.features) or 'constant'} (n={f.n}, R²={f.r2:.2f}, MAPE {f.mape:.1%}, "
            f"{loo_text(f.loo_mape, f.n, 'iteration')})")


def describe_dit_model(m: DitIterationModel) -> str:
    """``denoise step at model batches [1, 2, 4] (n=6, MAPE 3.5%, LOO 3.7%)``."""
    return (f"denoise step at model batches {m.model_batches_seen} (n={m.n}, MAPE {m.mape:.1%}, "
            f"{loo_text(m.loo_mape, m.n, 'denoising step')})")


def _number(v: float) -> str:
    """``4,194,304``; ``0.5``."""
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.3g}"


def _times(ratio: float) -> str:
    """``16,384x``; ``2.5x``."""
    return f"{ratio:,.0f}x" if ratio >= 10 else f"{ratio:.2g}x"


def _how_far(name: str, count: int, values: DriverRange | None, ranges: dict[str, dict[str, DriverRange]]) -> str:
    """``tokens 28 at 4,194,304, 16,384x the largest seen``: a driver's iterations beyond the range,
    the values they took and how far those are from what the model saw (any phase)."""
    seen = [rs[name] for rs in ranges.values() if name in rs]
    if values is None or not seen:
        return f"{name} {count:,}"
    at = _number(values.low) if values.low == values.high else f"{_number(values.low)}-{_number(values.high)}"
    low, high = min(r.low for r in seen), max(r.high for r in seen)
    far = ""
    if 0 < high < values.high:
        far += f", {_times(values.high / high)} the largest seen"
    if 0 < values.low < low:
        far += f", {_times(low / values.low)} below the smallest seen"
    return f"{name} {count:,} at {at}{far}"


def extrapolation_line(s: LlmScenarioServing | DitScenarioServing) -> str:
    """How many simulated iterations (a DiT's denoising steps) left the iteration model's range: per
    driver, the values they took and how far beyond what the model saw, what it saw, and how it
    extrapolates (the LLM and DiT outputs' one wording)."""
    m = s.iteration_model
    total = sum(s.iterations.values()) or s.extrapolated_iterations
    by = "; ".join(_how_far(k, v, s.extrapolated_values.get(k), m.ranges)
                   for k, v in sorted(s.extrapolated_drivers.items()))
    if isinstance(s, DitScenarioServing):
        unit = "denoising steps"
        how = ("extrapolated by the step model (attention by the square of the tokens, the rest in proportion to "
               "the tokens and the model batch): treat with care, or record at this resolution and batch")
    else:
        unit = "iterations"
        how = ("extrapolated by the kernels' roofline laws" if s.iteration_model.kind == "operator costs"
               else "extrapolated by a straight-line fit (the weight GEMMs by their law): treat with care, or record "
               "at this load" if s.iteration_model.weight_gemms is not None
               else "extrapolated by a straight-line fit: treat with care, or record at this load")
    seen = "; ".join(f"{p} saw " + ", ".join(f"{k} {_number(r.low)}-{_number(r.high)}" for k, r in rs.items())
                     for p, rs in m.ranges.items())
    return (f"{s.extrapolated_iterations:,} of {total:,} simulated {unit} left the recorded range: {by} ({seen}); "
            f"{how}")


def dit_shape(d: DitSettings) -> str:
    """``resolution 16 (latent side, patch 1) = 256 latent tokens, 28 steps, batch 1``."""
    frames = f" x {d.frames:,} frames" if d.frames != 1 else ""
    return (f"resolution {d.resolution:,} (latent side, patch {d.patch}){frames} = {d.tokens:,} latent tokens, "
            f"{d.steps} step{'s' if d.steps != 1 else ''}, batch {d.batch}{', CFG' if d.cfg else ''}")


def dit_shapes_line(doc: DitServingDocument) -> str:
    """The requests' shape next to the recording's, so a side given in pixels shows."""
    recorded = f"; recorded: {dit_shape(doc.recorded)}" if isinstance(doc.recorded, DitSettings) else ""
    return f"  requests: {dit_shape(doc.scheduler)}{recorded}"


def render(doc: ServingDocument, console: Console) -> None:
    """One table of scenarios, then each iteration model's fit quality."""
    w = doc.workload
    where = w.file if isinstance(w.file, str) else f"{w.arrivals} {w.rate_req_per_s} req/s x {w.num_requests}"
    llm = isinstance(doc, LlmServingDocument)
    console.print(f"[bold]{doc.source}[/bold] ({doc.kind}), workload: {where}")
    if doc.log:
        console.print(f"  iterations: the trace's phase-marked steps, composed from the serving log {doc.log}")
    if isinstance(doc, DitServingDocument):
        console.print(dit_shapes_line(doc))
    table = Table(title="Predicted serving metrics per scenario", title_justify="left")
    table.add_column("scenario", overflow="ellipsis", no_wrap=True, max_width=32)
    labels = (["TTFT mean", "TTFT p99", "TPOT mean", "TPOT p99", "e2e mean", "e2e p99"] if llm
              else ["latency mean", "latency p50", "latency p99", "queue mean", "service mean"])
    for label in labels:
        table.add_column(f"{label} ms", justify="right", no_wrap=True)
    for e in ["out tok/s", "req/s", "busy"] if llm else ["req/s", "busy"]:
        table.add_column(e, justify="right", no_wrap=True)
    for s in doc.scenarios:
        table.add_row(s.name, *(_llm_row(s) if isinstance(s, LlmScenarioServing) else _dit_row(s)))
    console.print(table)
    for s in doc.scenarios:
        if isinstance(s, LlmScenarioServing) and s.iteration_model.kind == "operator costs":
            cm = s.iteration_model
            console.print(f"  {s.name} iteration model: operator costs of {cm.iterations_found} recorded iteration(s) "
                          f"found by the {cm.adapter} adapter (composition from the {cm.composition_source})")
            parts = [describe_cost_phase(e) for e in cm.cost_phases.values()]
        elif isinstance(s, LlmScenarioServing):
            if s.iteration_model.adapter:
                console.print(f"  {s.name} iterations found by the {s.iteration_model.adapter} adapter")
            parts = [describe_phase_fit(p, f) for p, f in s.iteration_model.phases.items()]
            g = s.iteration_model.weight_gemms
            if g is not None:
                parts.append(f"weight GEMMs priced by their law, not fitted ({g.params / 1e9:.2f} B weights on the "
                             f"{g.device}: {g.ns_at_1_token / 1e6:.3f} ms at 1-64 tokens, a step per 64 more)")
        else:
            parts = [describe_dit_model(s.iteration_model)]
        console.print(f"  {s.name} iteration model: " + "; ".join(parts))
        if isinstance(s, LlmScenarioServing):
            for note in s.iteration_model.notes:
                console.print(f"  {s.name} note: {note}")
        if s.extrapolated_iterations:
            console.print(f"  [yellow]warning[/yellow]: {s.name}: {extrapolation_line(s)}")
        if s.iteration_model.excluded_iterations:
            console.print(f"  {s.name} fitted without: " + fitted_without(s.iteration_model.excluded_iterations))
    if isinstance(doc, LlmServingDocument):
        for line in capacity_lines(doc.scheduler.capacity, [(s.name, s.capacity) for s in doc.scenarios
                                                             if isinstance(s, LlmScenarioServing)]):
            console.print(line)
    if isinstance(doc, DitServingDocument):
        for note in doc.notes:
            console.print(f"  note: {note}")
    if doc.profiler_correction is not None:
        console.print(f"  profiler-overhead correction applied: {doc.profiler_correction}")
