"""SGLang's iterations: one per ``step[MODE …]`` range its scheduler opens around each forward
batch while profiling (``MODE`` EXTEND = prefill, DECODE, MIXED), with the batch in its fields:

* native: ``step[EXTEND bs=2 toks=14721]``, ``step[DECODE bs=64]``, ``step[MIXED bs=2]``;
* detailed (TraceLens's SGLang patches): the same plus per-group sums ``c_sq c_sk c_sqsq c_sqsk``
  (context) and ``g_sq g_sk g_sqsq g_sqsk`` (generation), and for MIXED the group sizes ``c=``/``g=``.

Those patches also open vLLM's detailed ``execute_…`` range around the step
(``SchedulerProfilerMixin._build_profile_annotation``: per request ``sq`` = new tokens, ``sk`` =
prefix + new tokens for a prefill, ``req.seqlen`` for a decode), which is read first when it
encloses the step (:mod:`.vllm`). Formats read from AMD-AGI/TraceLens @ 171dd74721
``TraceLens/TraceUtils/annotation_utils.py`` and ``examples/custom_workflows/inference_analysis/
sglang_roofline_patches/sglang_0_5_12/scheduler_profiler_mixin.patch``. A trace with only
``execute_…`` ranges is SGLang's when it holds SGLang's Python frames.
"""
from __future__ import annotations

import bisect
import re

from whatif.depgraph.graph import TaskGraph
from whatif.tracer.kinds import EventKind
from whatif.tracer.trace import Trace, per_name

from . import register
from .base import (
    CompositionSource,
    EngineAdapter,
    EventWindow,
    FoundIterations,
    annotation_rows,
    event_windows,
)
from .vllm import ExecuteAnnotation, Group, annotated_iterations, is_execute, parse_execute

STEP = re.compile(r"step\[(EXTEND|DECODE|MIXED)\b([^\]]*)\]")


def parse_step(name: str) -> ExecuteAnnotation | None:
    """The groups of an SGLang ``step[…]`` range, None for any other name.

    >>> parse_step("step[DECODE bs=32]").generation
    Group(requests=32, sq=32, sk=None, sqsq=None, sqsk=None)
    >>> parse_step("step[EXTEND bs=2 toks=14721 c_sq=14721 c_sqsq=108745533 c_sqsk=108745533 c_sk=14721]").context
    Group(requests=2, sq=14721, sk=14721, sqsq=108745533, sqsk=108745533)

    Raises
    ------
    ValueError
        A MIXED step without its group sizes, or sums that cannot come from its requests.
    """
    m = STEP.fullmatch(name.strip())
    if not m:
        return None
    mode, body = m.groups()
    kv = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", body)}
    bs = kv.get("bs", 0)
    detailed = "c_sk" in kv or "g_sk" in kv

    def group(prefix: str, requests: int, tokens: int) -> Group:
        if not detailed:
            return Group(requests, tokens)
        return Group(requests, kv.get(f"{prefix}_sq", tokens), kv.get(f"{prefix}_sk", 0),
                     kv.get(f"{prefix}_sqsq", 0), kv.get(f"{prefix}_sqsk", 0))

    if mode == "DECODE":
        ann = ExecuteAnnotation(group("c", 0, 0), group("g", bs, bs))
    elif mode == "EXTEND":
        ann = ExecuteAnnotation(group("c", bs, kv.get("toks", 0)), group("g", 0, 0))
    elif "c" in kv and "g" in kv:
        ann = ExecuteAnnotation(group("c", kv["c"], kv.get("c_sq", 0)), group("g", kv["g"], kv.get("g_sq", kv["g"])))
    else:
        raise ValueError("a MIXED step without c=/g= request counts")
    ann.context.check()
    ann.generation.check()
    return ann


def _enclosing(ranges: list[EventWindow], at: EventWindow) -> EventWindow:
    """The last of ``ranges`` (sorted by rank, then start) of ``at``'s rank that starts at or before
    it and is still open when it starts; ``at`` itself when none is."""
    lo = bisect.bisect_left(ranges, at.rank, key=lambda w: w.rank)
    hi = bisect.bisect_right(ranges, at.rank, key=lambda w: w.rank)
    j = bisect.bisect_right(ranges, at.start_ns, lo, hi, key=lambda w: w.start_ns) - 1
    return ranges[j] if j >= lo and ranges[j].end_ns > at.start_ns else at


def _parse(name: str) -> ExecuteAnnotation | None:
    return parse_execute(name) or parse_step(name)


def _is_step(name: str) -> bool:
    return name.startswith("step[")


def _is_sglang_frame(name: str) -> bool:
    return "/sglang/" in name


@register
class SglangAdapter(EngineAdapter):
    """SGLang: ``step[…]`` ranges, composed from the enclosing ``execute_…`` range when there is
    one; tried before vLLM, whose ranges SGLang's patches also write."""

    name = "sglang"
    order = 10

    def find(self, graph: TaskGraph) -> FoundIterations | None:
        trace = graph.trace
        if trace is None:
            return None
        steps = annotation_rows(trace, _is_step)
        executes = annotation_rows(trace, is_execute)
        if not len(steps):
            if not len(executes) or not self._has_frames(trace):
                return None
            steps = executes
        ranges = event_windows(trace, executes)
        spans = [(step, _enclosing(ranges, step)) for step in event_windows(trace, steps)]
        iterations, notes = annotated_iterations(trace, spans, _parse, "SGLang")
        return FoundIterations(self.name, tuple(iterations), CompositionSource.ANNOTATION, notes)

    @staticmethod
    def _has_frames(trace: Trace) -> bool:
        ev = trace.events
        return bool(((ev["kind"].to_numpy() == int(EventKind.PYTHON)) & per_name(ev["name"], _is_sglang_frame)).any())
