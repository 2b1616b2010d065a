"""``whatif nanoflow``: is NanoFlow's intra-device parallelism worth building for this program?
One iteration's GEMMs, memory-bound kernels and collectives (after a scenario, e.g. the
``tensor_parallel`` that inserts the collectives) priced as nano-batches on shares of the GPU,
with NanoFlow's measured interference curves or idealized ones
(:func:`~whatif.transforms.parallel.nanoflow.search_nanoflow`; docs/multi-gpu.md).

>>> from whatif.nanoflow import NanoFlowOptions
>>> NanoFlowOptions(memory_saturation=0.4).curves()[0].name
'saturates HBM on 40% of the GPU'
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from whatif.analysis import Analysis, analyze, make_context, scenario_cost_model
from whatif.core.bounds import check_fields
from whatif.core.errors import WhatifError
from whatif.documents import NanoFlowDocument, NanoFlowPartition
from whatif.hardware.topology import TopologyName
from whatif.predictors.cost_models import CostModelName
from whatif.predictors.steps import StepOptions, step_exclusions
from whatif.transforms.parallel.nanoflow import (
    NANOFLOW_GEMV,
    NANOFLOW_NETWORK,
    SHARE_COLUMNS,
    NanoFlowSearch,
    ShareCurve,
    saturating_curve,
    search_nanoflow,
)
from whatif.transforms.scenario import Scenario, load_scenario


class NanoFlowError(WhatifError):
    """A NanoFlow analysis that cannot run as asked (one line)."""


_SATURATION = ("idealized curve: full speed from this share of the GPU on, in proportion below it "
               "(default 0: NanoFlow's measured A100 curve)")


@dataclass
class NanoFlowOptions:
    topology: str | None = field(default=None, metadata={
        "choices": [t.value for t in TopologyName],
        "help": "topology preset that prices each collective's nano-batch parts (default: the one the "
                "scenario's transforms name, else dgx_h100)"})
    memory_saturation: float = field(default=0.0, metadata={
        "minimum": 0.0, "maximum": 1.0, "help": f"memory-bound kernels beside GEMMs: {_SATURATION}"})
    comm_saturation: float = field(default=0.0, metadata={
        "minimum": 0.0, "maximum": 1.0, "help": f"collectives beside GEMMs: {_SATURATION}"})

    def __post_init__(self) -> None:
        check_fields(self)

    def curves(self) -> tuple[ShareCurve, ShareCurve]:
        """The memory-bound and collective curves these options name."""
        return (saturating_curve(self.memory_saturation) if self.memory_saturation else NANOFLOW_GEMV,
                saturating_curve(self.comm_saturation) if self.comm_saturation else NANOFLOW_NETWORK)


def scenario_topology(scenario: Scenario | None) -> str:
    """The topology preset ``scenario``'s transforms price their collectives on
    (:meth:`~whatif.transforms.base.Transform.collective_topology`); ``dgx_h100`` when none names one.

    Raises
    ------
    NanoFlowError
        When its transforms name different ones.
    """
    named = sorted({name for t in (scenario.transforms if scenario else [])
                    if (name := t.collective_topology()) is not None})
    if scenario is not None and len(named) > 1:
        raise NanoFlowError(f"{scenario.source or scenario.name}: the scenario's transforms name "
                            f"topologies {', '.join(named)}: choose the one that prices the collectives with "
                            f"--topology")
    return named[0] if named else TopologyName.DGX_H100.value


def nanoflow_document(search: NanoFlowSearch, source: str, scenario: str, topology: str,
                      options: NanoFlowOptions) -> NanoFlowDocument:
    """The ``whatif.nanoflow`` document of a search."""
    parts, best = search.parts.mean(), search.best
    memory, comm = options.curves()
    partition = NanoFlowPartition(**{c: best[c] for c in SHARE_COLUMNS}) if search.overlapped else None
    return NanoFlowDocument(
        source=source, scenario=scenario, topology=topology, memory_curve=memory.name, comm_curve=comm.name,
        layers=search.layers, gemm_ns=int(round(parts["gemm_ns"])), memory_ns=int(round(parts["memory_ns"])),
        comm_ns=int(round(parts["comm_ns"])), sequential_ns=int(round(search.sequential_ns)),
        nano_batches=int(best["nano_batches"]), partition=partition, iteration_ns=int(round(best["iteration_ns"])),
        speedup=round(search.speedup, 6), assumptions=list(search.assumptions))


def counted_step_numbers(analysis: Analysis, steps: StepOptions) -> tuple[list[int], list[str]]:
    """The step numbers that count under ``steps`` (on any rank) and, per step left out, why
    (``step 0 (warm-up)``)."""
    g = analysis.graph
    reasons = step_exclusions(g)
    numbers = g.steps["step"].astype(int).tolist()
    counted = sorted({n for n, r in zip(numbers, reasons) if steps.counts(r)})
    left = sorted({(n, r.value) for n, r in zip(numbers, reasons)
                   if r is not None and not steps.counts(r) and n not in counted})
    return counted, [f"step {n} ({why})" for n, why in left]


def nanoflow(path_or_analysis: str | Path | Analysis, scenario: Scenario | str | Path | None = None,
             options: NanoFlowOptions | None = None, *, cost_model: str | Enum = CostModelName.TRACE,
             steps: StepOptions | None = None) -> tuple[NanoFlowDocument, NanoFlowSearch]:
    """NanoFlow's schedule of a trace's iterations, after ``scenario``'s transforms when given.

    Parameters
    ----------
    path_or_analysis : a trace, folder or run folder, or its :class:`Analysis`.
    scenario : a scenario (object or TOML file) applied first, e.g. ``tensor_parallel`` on one
        GPU's trace.
    options : the collectives' topology (default: the scenario's) and the interference curves.
    cost_model : what prices the transforms and the nano-batches, unless the scenario names one.
    steps : which steps' mean iteration is searched (default: the analysis' options; for a path,
        the warm-up step and a partial last step are left out).

    Returns
    -------
    The ``whatif.nanoflow`` document and the search (every partition tried in ``search.table``).

    Raises
    ------
    WhatifError
        A bad scenario or trace, a scenario naming several topologies without ``options.topology``,
        or a graph without GEMMs (``TransformError``).
    """
    options = options or NanoFlowOptions()
    sc = load_scenario(scenario) if isinstance(scenario, (str, Path)) else scenario
    topology = options.topology or scenario_topology(sc)
    model = scenario_cost_model(sc, cost_model) if sc is not None else cost_model
    base = path_or_analysis if isinstance(path_or_analysis, Analysis) else analyze(path_or_analysis)
    ctx = make_context(base.trace, model, sc.collective_points if sc is not None else ())
    graphs = sc.apply(base.graph, ctx) if sc is not None else []
    memory, comm = options.curves()
    counted, left_out = counted_step_numbers(base, steps or base.options)
    search = search_nanoflow(graphs[-1] if graphs else base.graph, ctx, topology=topology,
                             memory_curve=memory, comm_curve=comm, steps=counted if left_out else None)
    if left_out:
        search.assumptions.append(f"the mean iteration of {len(counted)} steps; left out: {', '.join(left_out)} "
                                  f"(--include-warmup / --include-partial count them)")
    return nanoflow_document(search, base.trace.source, sc.name if sc is not None else "", topology, options), search
