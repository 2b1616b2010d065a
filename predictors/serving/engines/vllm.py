"""vLLM's iterations: one per ``execute_…`` range that vLLM's GPU worker opens around each
``execute_model`` while its torch profiler runs (``Worker.annotate_profile``,
``vllm/v1/worker/gpu_worker.py``). Two spellings, both read here:

* native (vLLM v0.14.0's own ``annotate_profile``): ``execute_context_{Rc}({Tc})_generation_{Rg}({Tg})``,
  the requests and scheduled tokens of the context (prefill) and generation (decode) groups; a
  variant (TraceLens's B200 trace: ``execute_context_1(888_788544)_generation_0(0)``, a vLLM run
  whose ops take 888 tokens) follows a group's tokens with a second sum, 888² there: read as Σsq²;
* detailed (``--profiler-config.detailed_trace_annotation True``: upstream from v0.26.0, TraceLens's
  patches for v0.14–v0.25; the TraceLens patches of SGLang write it too):
  ``execute_{T}_context_{Rc}(sq…sk…sqsq…sqsk…)_generation_{Rg}(sq…sk…sqsq…sqsk…)`` where, per
  request, ``sq`` = tokens scheduled this step and ``sk`` = tokens computed before + ``sq`` (the keys
  it attends to), summed per group as Σsq, Σsk, Σsq², Σsq·sk, and ``T`` = Σsq of both groups.

Read from AMD-AGI/TraceLens @ 171dd74721 ``examples/custom_workflows/inference_analysis/vllm_patches/
config_vllm_v0.14.0.patch`` (its ``vllm/v1/worker/gpu_worker.py`` hunk: the native code it replaces
and the detailed code) and vllm-project/vllm @ 04b022935c ``vllm/config/profiler.py``
(``detailed_trace_annotation``). The annotation gives sums, not each request: :func:`split_group`
says how they are spread over the requests. A trace of vLLM without these ranges (V0, or a profiler
run without the annotation) has ``execute_model`` Python frames: each is an iteration, its
composition read from recorded attention shapes (:class:`.generic.AttentionShapes`); without
shapes the adapter says what to record.
"""
from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from whatif.depgraph.graph import TaskGraph
from whatif.tracer.kinds import EventKind
from whatif.tracer.trace import Trace, per_name

from ..logs import LLMBatch, ServingLogError
from . import register
from .base import (
    CompositionSource,
    EngineAdapter,
    EventWindow,
    FoundIteration,
    FoundIterations,
    IterationPhase,
    annotation_rows,
    equal_shares,
    event_windows,
)
from .generic import AttentionShapes

_GROUP = r"_(context|generation)_(\d+)\(sq(\d+)sk(\d+)sqsq(\d+)sqsk(\d+)\)"
DETAILED = re.compile(rf"execute_(\d+){_GROUP}{_GROUP}")
NATIVE = re.compile(r"execute_context_(\d+)\((\d+)(?:_(\d+))?\)_generation_(\d+)\((\d+)(?:_(\d+))?\)")
_EXECUTE_MODEL = re.compile(r"vllm/.*\): execute_model$")


@dataclass(frozen=True)
class Group:
    """One request group of an iteration: ``requests``, Σ scheduled tokens ``sq`` and, where the
    annotation is detailed, Σ keys ``sk``, Σ sq² ``sqsq`` and Σ sq·sk ``sqsk``."""

    requests: int
    sq: int
    sk: int | None = None
    sqsq: int | None = None
    sqsk: int | None = None

    def check(self) -> None:
        """Raises ValueError when the sums cannot come from ``requests`` requests."""
        if self.requests == 0 and (self.sq or self.sk or self.sqsq or self.sqsk):
            raise ValueError("tokens without requests")
        if self.requests and self.sq < self.requests:
            raise ValueError(f"{self.sq} tokens for {self.requests} requests")
        if self.sqsq is not None and self.sqsq < self.sq:
            raise ValueError(f"Σsq² {self.sqsq} below Σsq {self.sq}")
        if self.sk is not None and (self.sk < self.sq or (self.sqsk or 0) < (self.sqsq or 0)):
            raise ValueError("sums out of order (need sk >= sq, sqsk >= sqsq)")


@dataclass(frozen=True)
class ExecuteAnnotation:
    """What one ``execute_…`` range says: its context (prefill) and generation (decode) groups."""

    context: Group
    generation: Group

    @property
    def detailed(self) -> bool:
        return self.context.sk is not None

    def batch(self) -> LLMBatch:
        """The composition, each group spread over its requests by :func:`split_group` (a decode
        request's context is its ``sk``; without ``sk`` it is unknown and set to 1)."""
        tokens, cached = split_group(self.context)
        g = self.generation
        contexts = equal_shares(g.sk, g.requests) if g.sk is not None else (1,) * g.requests
        return LLMBatch(prefill_tokens=tokens, prefill_cached=cached, decode_context=contexts)


def parse_execute(name: str) -> ExecuteAnnotation | None:
    """The groups of a vLLM ``execute_…`` range, None for any other name.

    >>> a = parse_execute("execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk55086sqsq32sqsk55086)")
    >>> a.generation
    Group(requests=32, sq=32, sk=55086, sqsq=32, sqsk=55086)
    >>> parse_execute("execute_context_2(100)_generation_8(8)").context
    Group(requests=2, sq=100, sk=None, sqsq=None, sqsk=None)

    Raises
    ------
    ValueError
        The name starts like one but does not parse, or its sums are inconsistent.
    """
    if not is_execute(name):
        return None
    m = DETAILED.fullmatch(name)
    if m:
        total, *rest = m.groups()
        if rest[0] != "context" or rest[6] != "generation":
            raise ValueError("groups out of order")
        ctx = Group(*(int(v) for v in rest[1:6]))
        gen = Group(*(int(v) for v in rest[7:12]))
        if int(total) != ctx.sq + gen.sq:
            raise ValueError(f"{total} scheduled tokens but the groups hold {ctx.sq + gen.sq}")
    else:
        m = NATIVE.fullmatch(name)
        if not m:
            raise ValueError("not execute_N_context_R(sq…sk…sqsq…sqsk…)_generation_R(…) "
                             "nor execute_context_R(T)_generation_R(T)")
        rc, tc, xc, rg, tg, xg = (None if v is None else int(v) for v in m.groups())
        ctx, gen = Group(rc or 0, tc or 0, sqsq=xc), Group(rg or 0, tg or 0, sqsq=xg)
    ctx.check()
    gen.check()
    return ExecuteAnnotation(ctx, gen)


def is_execute(name: str) -> bool:
    """Whether ``name`` is meant as an ``execute_…`` iteration range (parsed or not)."""
    return name.startswith("execute_") and "_context_" in name and "_generation_" in name


def split_group(group: Group) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(new tokens, cached tokens) per request of a context group whose annotation gives only sums.

    Σ new and Σ cached are kept exactly. Given Σsq², the requests are taken as one of ``b`` new
    tokens and the rest of ``a`` each, ``a`` and ``b`` solving it (a request's attention grows
    with its square); given Σsk and Σsq·sk too, the cached tokens are placed so that
    Σ new·(cached + new) is Σsq·sk: the two moments the prefill time depends on, up to rounding.
    Without them: equal shares, nothing cached.

    >>> split_group(Group(1, 6144, 7144, 6144 ** 2, 6144 * 7144))
    ((6144,), (1000,))
    >>> split_group(Group(3, 300, 300, 45000, 45000))   # one 200-token prompt, two of 50
    ((200, 50, 50), (0, 0, 0))
    >>> split_group(Group(2, 6144, 7144, 20971520, 23019520))   # 1000 cached tokens, on the short one
    ((4096, 2048), (0, 1000))
    >>> split_group(Group(2, 100))
    ((50, 50), (0, 0))
    """
    r, s = group.requests, group.sq
    if r == 0:
        return (), ()
    if group.sqsq is None or r == 1:
        tokens = equal_shares(s, r)
    else:
        spread = r * group.sqsq - s * s                  # r²·variance of the requests' tokens
        a = s // r if spread <= 0 else int(round((s * (r - 1) - math.sqrt((r - 1) * spread)) / ((r - 1) * r)))
        a = min(max(a, 1), s // r)
        tokens = (s - (r - 1) * a,) + (a,) * (r - 1)
    if group.sk is None or group.sqsk is None:
        return tokens, (0,) * r
    cached_total = group.sk - s
    if r == 1:
        return tokens, (cached_total,)
    b, a = tokens[0], tokens[-1]
    excess = group.sqsk - sum(t * t for t in tokens)     # Σ new·cached wanted
    big = 0 if b == a else min(max(int(round((excess - a * cached_total) / (b - a))), 0), cached_total)
    return tokens, (big, *equal_shares(cached_total - big, r - 1))


def annotated_iterations(trace: Trace, spans: list[tuple[EventWindow, EventWindow]],
                         parse: Callable[[str], ExecuteAnnotation | None],
                         engine: str) -> tuple[list[FoundIteration], tuple[str, ...]]:
    """One iteration per (range, annotation) pair: its window spans both, its composition is what
    ``parse`` reads in the annotation's name (the range itself, or one enclosing it); idle ones
    (no request) are left out. With the notes on what the annotations could not say.

    Raises
    ------
    ServingLogError
        An annotation that does not parse, or only idle ones (one line naming the trace).
    """
    out: list[FoundIteration] = []
    anns: list[ExecuteAnnotation] = []
    idle = 0
    for span, ann_at in spans:
        try:
            ann = parse(ann_at.name)
        except ValueError as exc:
            ann, why = None, f" ({exc})"
        else:
            why = ""
        if ann is None:
            raise ServingLogError(f"{trace.source}: malformed {engine} iteration annotation {ann_at.name!r}"
                                  f"{why or ' (not a known spelling)'}")
        if not (ann.context.requests or ann.generation.requests):
            idle += 1
            continue
        batch = ann.batch()
        out.append(FoundIteration(rank=span.rank, start_ns=min(span.start_ns, ann_at.start_ns),
                                  end_ns=max(span.end_ns, ann_at.end_ns), phase=IterationPhase(batch.phase),
                                  evidence=span.name if ann_at is span else f"{span.name} in {ann_at.name}",
                                  llm=batch))
        anns.append(ann)
    if not out:
        raise ServingLogError(f"{trace.source}: every {engine} iteration annotation is idle (no request)")
    return out, annotation_notes(anns, idle)


def _iteration(rank: int, start: int, end: int, batch: LLMBatch, evidence: str) -> FoundIteration:
    return FoundIteration(rank=rank, start_ns=start, end_ns=end, phase=IterationPhase(batch.phase),
                          evidence=evidence, llm=batch)


def annotation_notes(annotations: list[ExecuteAnnotation], idle: int) -> tuple[str, ...]:
    """What the ``execute_…`` ranges could not say, one line each."""
    notes = []
    if any(a.context.requests > 1 for a in annotations):
        notes.append("prompts per request not in the trace: Σ tokens split to keep Σsq² and Σsq·sk "
                     "(detailed annotation) or in equal shares (native)")
    if any(a.generation.requests > 1 and a.detailed for a in annotations):
        notes.append("decode contexts per request not in the trace: Σ context (sk) split in equal shares "
                     "(decode attention depends on Σ context)")
    if any(not a.detailed for a in annotations):
        notes.append("native annotation (no sk): contexts unknown, decode context set to 1 and no cached "
                     "prompt tokens; record with --profiler-config.detailed_trace_annotation True")
    if any(a.generation.sq > a.generation.requests for a in annotations):
        notes.append("speculative decoding (more decode tokens than requests): draft tokens not modelled")
    if idle:
        notes.append(f"{idle} idle iteration(s) (no request) left out")
    return tuple(notes)


@register
class VllmAdapter(EngineAdapter):
    """vLLM V1 (and V0 with recorded shapes): ``execute_…`` ranges, else ``execute_model`` frames."""

    name = "vllm"
    order = 20

    def find(self, graph: TaskGraph) -> FoundIterations | None:
        trace = graph.trace
        if trace is None:
            return None
        rows = annotation_rows(trace, is_execute)
        if len(rows):
            iterations, notes = annotated_iterations(trace, [(w, w) for w in event_windows(trace, rows)],
                                                     parse_execute, "vLLM")
            return FoundIterations(self.name, tuple(iterations), CompositionSource.ANNOTATION, notes)
        return self._from_frames(trace)

    def _from_frames(self, trace: Trace) -> FoundIterations | None:
        ev = trace.events
        frames = np.flatnonzero((ev["kind"].to_numpy() == int(EventKind.PYTHON))
                                & per_name(ev["name"], lambda n: bool(_EXECUTE_MODEL.search(n))))
        if not len(frames):
            return None
        found = []
        shapes = AttentionShapes(trace)
        for w in event_windows(trace, frames):
            batch = shapes.composition(w.rank, w.start_ns, w.end_ns)
            if batch is None:
                raise ServingLogError(
                    f"{trace.source}: vLLM execute_model calls without iteration annotations or attention "
                    "shapes; record with --profiler-config.detailed_trace_annotation True (V1) or "
                    "torch_profiler_record_shapes")
            found.append(_iteration(w.rank, w.start_ns, w.end_ns, batch, f"{w.name} (attention shapes)"))
        return FoundIterations(self.name, tuple(found), CompositionSource.SHAPES,
                               ("no execute_… annotations: compositions from attention shapes (padded "
                                "batches give every sequence the padded length)",))
