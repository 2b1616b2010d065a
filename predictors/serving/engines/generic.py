"""The fallback: a trace no engine adapter recognises, its iterations guessed as repeated forward
passes and their compositions read from recorded attention shapes.

Iterations are the rank's annotated steps (``ProfilerStep#N``, at least two), else the calls of
its most repeated outermost ``nn.Module`` (``with_stack``/``with_modules`` recordings name them
``nn.Module: <class>_<i>``). An iteration's composition comes from the first forward attention
op inside it (:class:`AttentionShapes`): each sequence of its batch with one query decodes over
its keys, one with more queries prefills them. A window without attention shapes has no
composition; with fewer than two composed iterations the adapter finds nothing. It always says
that it guessed.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np

from whatif.core.kernels import attention_sequences, is_attention, is_attention_backward
from whatif.depgraph.graph import TaskGraph
from whatif.depgraph.hierarchy import BACKWARD_NODE
from whatif.tracer.args import Arg
from whatif.tracer.kinds import EventKind
from whatif.tracer.trace import Trace, per_name

from ..logs import LLMBatch
from . import register
from .base import (
    CompositionSource,
    EngineAdapter,
    EventWindow,
    FoundIteration,
    FoundIterations,
    IterationPhase,
    annotation_rows,
    event_windows,
)

MODULE_PREFIX = "nn.Module: "


class ShapedOps:
    """The CPU ops of a trace whose name passes ``predicate`` (with recorded shapes, unless
    ``shaped`` is False), indexed so that the ones starting in a window of one rank are found by
    bisection."""

    def __init__(self, trace: Trace, predicate: Callable[[str], bool], shaped: bool = True) -> None:
        ev = trace.events
        dims = trace.arg(Arg.INPUT_DIMS)
        has_dims = np.fromiter((d is not None or not shaped for d in dims), dtype=bool, count=len(dims))
        # the table is sorted by rank, then start: so are these rows
        self.rows = np.flatnonzero((ev["kind"].to_numpy() == int(EventKind.CPU_OP)) & has_dims
                                   & per_name(ev["name"], predicate))
        self._rank = ev["rank"].to_numpy()[self.rows]
        self._ts = ev["ts_ns"].to_numpy()[self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def within(self, rank: int, start_ns: int, end_ns: int) -> np.ndarray:
        """Rows of the ops of ``rank`` starting in ``[start_ns, end_ns)``, in time order."""
        lo, hi = np.searchsorted(self._rank, rank, "left"), np.searchsorted(self._rank, rank, "right")
        ts = self._ts[lo:hi]
        return self.rows[lo + np.searchsorted(ts, start_ns, "left"):lo + np.searchsorted(ts, end_ns, "left")]


class AttentionShapes:
    """Compositions of a trace's iterations read from its attention ops' recorded shapes."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.ops = ShapedOps(trace, is_attention)
        self.backward = ShapedOps(trace, lambda n: n.startswith(BACKWARD_NODE) or is_attention_backward(n),
                                  shaped=False)

    def composition(self, rank: int, start_ns: int, end_ns: int) -> LLMBatch | None:
        """The composition of the iteration ``[start_ns, end_ns)`` of ``rank``, read from the first
        forward attention op starting in it whose shapes say its sequences (None without one): a
        sequence with one query decodes over its keys, one with more prefills its queries over its
        earlier keys (cached = keys − queries). A padded batch gives every sequence the padded
        lengths. A window that runs a backward pass (autograd's functions, attention gradients) is a
        training step: None."""
        trace = self.trace
        dims, concrete = trace.arg(Arg.INPUT_DIMS), trace.arg(Arg.CONCRETE_INPUTS)
        names = trace.events["name"].to_numpy()
        if len(self.backward.within(rank, start_ns, end_ns)):
            return None     # a training step
        for row in self.ops.within(rank, start_ns, end_ns):
            seqs = attention_sequences(str(names[row]), dims[row], concrete[row])
            if seqs:
                prefill = [(q, k) for q, k in seqs if q > 1]
                return LLMBatch(prefill_tokens=tuple(q for q, _ in prefill),
                                prefill_cached=tuple(max(k - q, 0) for q, k in prefill),
                                decode_context=tuple(k for q, k in seqs if q == 1))
        return None


def _step_windows(graph: TaskGraph) -> list[tuple[int, int, int, str]]:
    """(rank, start, end, what) of every annotated step of ranks with at least two."""
    if graph.trace is None or not _has_step_annotations(graph.trace):
        return []
    s = graph.steps
    rows = s[s["rank"].map(s["rank"].value_counts()).to_numpy() >= 2]
    return [(int(r), int(b), int(e), f"step {int(k)}") for r, k, b, e in
            zip(rows["rank"], rows["step"], rows["measured_begin_ns"], rows["measured_end_ns"]) if e > b]


def _has_step_annotations(trace: Trace) -> bool:
    return bool(len(annotation_rows(trace, lambda n: n.startswith("ProfilerStep#"))))


def _module_windows(trace: Trace) -> list[tuple[int, int, int, str]]:
    """(rank, start, end, what) of each call of the most repeated outermost ``nn.Module``."""
    ev = trace.events
    rows = np.flatnonzero((ev["kind"].to_numpy() == int(EventKind.PYTHON))
                          & per_name(ev["name"], lambda n: n.startswith(MODULE_PREFIX)))
    outer: list[EventWindow] = []
    covered_until: dict[tuple[int, int], int] = {}
    for w in event_windows(trace, rows):     # table order: rank, then start, longer first
        if w.start_ns >= covered_until.get((w.rank, w.tid), -1):
            outer.append(w)
            covered_until[(w.rank, w.tid)] = w.end_ns
    names = Counter(_module_class(w.name) for w in outer)
    if not names:
        return []
    top, n = names.most_common(1)[0]
    if n < 2:
        return []
    return [(w.rank, w.start_ns, w.end_ns, top) for w in outer if _module_class(w.name) == top]


def _module_class(name: str) -> str:
    """``nn.Module: LlamaModel_3`` without its instance number."""
    return name.rsplit("_", 1)[0]


@register
class GenericAdapter(EngineAdapter):
    """Repeated forward passes (annotated steps, else the most repeated outermost module), composed
    from attention shapes; tried last."""

    name = "generic"
    order = 99

    def find(self, graph: TaskGraph) -> FoundIterations | None:
        trace = graph.trace
        shapes = AttentionShapes(trace) if trace is not None else None
        if trace is None or shapes is None or not len(shapes.ops):
            return None
        windows = _step_windows(graph) or _module_windows(trace)
        found = []
        for rank, start, end, what in windows:
            batch = shapes.composition(rank, start, end)
            if batch is not None:
                found.append(FoundIteration(rank=rank, start_ns=start, end_ns=end, phase=IterationPhase(batch.phase),
                                            evidence=f"{what}: attention shapes", llm=batch))
        if len(found) < 2:
            return None
        kind = "annotated steps" if windows and windows[0][3].startswith("step ") else f"calls of {windows[0][3]}"
        return FoundIterations(self.name, tuple(sorted(found, key=lambda f: (f.rank, f.start_ns))),
                               CompositionSource.SHAPES,
                               (f"guessed: no engine annotation; iterations = the {kind} with attention shapes "
                                f"({len(found)} of {len(windows)}), compositions from the first attention op of "
                                "each (padded batches give every sequence the padded length)",))
