"""This project's example servers (``examples/llm_serve.py``, ``examples/dit_serve.py``) and any
loop marked the same way: one iteration per step (``whatif.step()``) that ran a phase
(``whatif.phase("prefill"|"decode"|"denoise")``), its window the step's measured window.

The trace says which steps are iterations, not what they computed: compositions come from the
server's JSON log (``--log``, found through the run folder's metadata, or given), matched in order
as :func:`~whatif.predictors.serving.logs.llm_compositions` /
:func:`~whatif.predictors.serving.logs.dit_compositions` read it; without a log, from shapes when
the recording had ``--record-shapes`` (LLM only): the example packs a prefill's prompts into one
attention call over ``T`` tokens and computes the logits of each prompt's last token (its last
``aten::linear`` has one row per sequence), and pads a decode's attention to the longest context.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from whatif.depgraph.graph import TaskGraph
from whatif.tracer.args import Arg
from whatif.tracer.trace import Trace

from .. import logs
from ..logs import LLMBatch, ServingLogError
from . import register
from .base import (
    CompositionSource,
    DitBatch,
    EngineAdapter,
    FoundIteration,
    FoundIterations,
    IterationPhase,
    clock_offsets_ns,
    equal_shares,
)
from .generic import AttentionShapes, ShapedOps

LM_HEAD_OP = "aten::linear"


@dataclass(frozen=True)
class PhaseStep:
    """A step that ran a phase: its measured window and that of its phase-marked tasks, on the
    rank's trace clock."""

    rank: int
    step: int
    phase: str
    start_ns: int
    end_ns: int
    phase_start_ns: int
    phase_end_ns: int


def phase_steps(graph: TaskGraph) -> list[PhaseStep]:
    """Every step that ran a serving phase (prefill, decode, mixed, denoise), rank by rank, in step
    order."""
    t = graph.tasks
    serving = t["phase"].isin([p.value for p in IterationPhase]).to_numpy()
    marked = t[serving & (t["step"].to_numpy() >= 0) & (t["measured_start_ns"].to_numpy() >= 0)]
    if not len(marked):
        return []
    per_step = marked.groupby(["rank", "step"], sort=False).agg(
        phase=("phase", "first"), first=("measured_start_ns", "min"), last=("measured_end_ns", "max"))
    windows = graph.steps.set_index(["rank", "step"])
    offsets = clock_offsets_ns(graph)
    out = []
    for (rank, step), row in per_step.iterrows():
        if (rank, step) in windows.index:
            w, shift = windows.loc[(rank, step)], offsets.get(int(rank), 0)
            out.append(PhaseStep(int(rank), int(step), str(row["phase"]), int(w["measured_begin_ns"]) - shift,
                                 int(w["measured_end_ns"]) - shift, int(row["first"]) - shift,
                                 int(row["last"]) - shift))
    return sorted(out, key=lambda s: (s.rank, s.step))


@register
class ExamplesAdapter(EngineAdapter):
    """Phase-marked steps (``whatif.phase``), composed from the server's log, else recorded shapes."""

    name = "examples"
    order = 40

    def __init__(self, log: Path | None = None) -> None:
        self.log = log

    def find(self, graph: TaskGraph) -> FoundIterations | None:
        trace = graph.trace
        steps = phase_steps(graph)
        if trace is None or not steps:
            return None
        if self.log is not None:
            return self._from_log(trace, steps, self.log, logs.read_log(self.log))
        found = logs.find_log(trace.ranks[0].path)
        unusable = ""
        if found is not None:
            try:
                return self._from_log(trace, steps, found, logs.read_log(found))
            except ServingLogError as exc:     # the recorded command's --log is some other file
                unusable = f" ({exc})"
        if any(s.phase == IterationPhase.DENOISE.value for s in steps) or not _has_shapes(trace):
            raise ServingLogError(f"{trace.source}: {len(steps)} phase-marked steps but no serving log{unusable} "
                                  "and no recorded shapes: pass --iterations-log FILE or record with --record-shapes")
        return self._from_shapes(trace, steps, unusable)

    def _from_log(self, trace: Trace, steps: list[PhaseStep], path: Path,
                  log: logs.ServingLog) -> FoundIterations:
        compositions: list[tuple[str, LLMBatch | DitBatch]]
        if isinstance(log, logs.LlmLog):
            compositions = list(logs.llm_compositions(log))
        else:
            compositions = [(IterationPhase.DENOISE.value, DitBatch(model_batch=b, tokens=n))
                            for b, n in logs.dit_compositions(log)]
        found = []
        for rank in sorted({s.rank for s in steps}):
            mine = [s for s in steps if s.rank == rank]
            phases = [s.phase for s in mine]
            logged = [p for p, _ in compositions]
            if phases != logged:
                n = next((i for i, (a, b) in enumerate(zip(phases, logged)) if a != b), min(len(phases), len(logged)))
                raise ServingLogError(f"{trace.source}: trace and serving log {path} disagree: {len(phases)} phase "
                                      f"steps on rank {rank} vs {len(logged)} logged iterations, first difference "
                                      f"at iteration {n} (is the log from this recording?)")
            found += [_iteration(s, c, f"step {s.step} phase:{s.phase}, composition from {path.name}")
                      for s, (_, c) in zip(mine, compositions)]
        return FoundIterations(self.name, tuple(sorted(found, key=lambda f: (f.rank, f.start_ns))),
                               CompositionSource.LOG,
                               (f"compositions from the serving log {path}: the trace marks the iterations, "
                                "not what they computed",))

    def _from_shapes(self, trace: Trace, steps: list[PhaseStep], unusable: str = "") -> FoundIterations:
        found = []
        shapes, linears = AttentionShapes(trace), ShapedOps(trace, lambda n: n == LM_HEAD_OP)
        dims = trace.arg(Arg.INPUT_DIMS)
        for s in steps:
            seen = shapes.composition(s.rank, s.phase_start_ns, s.phase_end_ns)
            if seen is None:
                raise ServingLogError(f"{trace.source}: step {s.step} ({s.phase}) has no attention shapes and there "
                                      "is no serving log: pass --iterations-log FILE")
            if s.phase == IterationPhase.PREFILL.value:
                tokens = sum(seen.prefill_tokens) or sum(seen.decode_context)
                heads = linears.within(s.rank, s.phase_start_ns, s.phase_end_ns)
                seqs = _leading_rows(dims[heads[-1]]) if len(heads) else 0
                n = seqs if 1 <= seqs <= tokens else 1
                batch = LLMBatch(prefill_tokens=equal_shares(tokens, n), prefill_cached=(0,) * n)
            else:
                batch = LLMBatch(decode_context=seen.decode_context or seen.prefill_tokens)
            found.append(_iteration(s, batch, f"step {s.step} phase:{s.phase}, attention shapes"))
        return FoundIterations(self.name, tuple(found), CompositionSource.SHAPES,
                               (f"no serving log{unusable}: compositions from recorded shapes; a prefill's prompts "
                                "in equal shares of its packed tokens, a decode's contexts the padded (longest) "
                                "length",))


def _iteration(step: PhaseStep, batch: LLMBatch | DitBatch, evidence: str) -> FoundIteration:
    if isinstance(batch, DitBatch):
        return FoundIteration(rank=step.rank, start_ns=step.start_ns, end_ns=step.end_ns,
                              phase=IterationPhase.DENOISE, evidence=evidence, dit=batch)
    return FoundIteration(rank=step.rank, start_ns=step.start_ns, end_ns=step.end_ns,
                          phase=IterationPhase(step.phase), evidence=evidence, llm=batch)


def _has_shapes(trace: Trace) -> bool:
    return any(d is not None for d in trace.arg(Arg.INPUT_DIMS))


def _leading_rows(input_dims: list) -> int:
    """Rows (product of the leading dims) of an op's first input, 0 when not recorded: for the
    example's last ``aten::linear``, its LM head over each prompt's last token, the sequences."""
    first = input_dims[0] if input_dims else None
    return int(np.prod(first[:-1])) if isinstance(first, list) and first else 0
