"""What a serving-engine adapter finds in a trace: the model iterations and their composition.

An adapter (one file per engine family in this package) reads a trace and says, for every model
iteration it finds, when it ran (a window on one rank's clock, the trace's own ``ts_ns``), its
phase and what it computed (:class:`~whatif.predictors.serving.logs.LLMBatch` for an LLM,
:class:`DitBatch` for a diffusion transformer), and what said so (``evidence``). The serving
iteration model (:mod:`whatif.predictors.serving.iteration_model`) prices those iterations; the
serving log of this project's example servers is one source among others, used only when the
trace cannot say.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar

import numpy as np

from whatif.depgraph.graph import EdgeKind, TaskGraph, TaskKind
from whatif.tracer.kinds import EventKind
from whatif.tracer.trace import Trace, per_name

from ..logs import LLMBatch


class IterationPhase(str, Enum):
    """What an iteration runs: prompt tokens, one new token per sequence, both, or a denoising step."""

    PREFILL = "prefill"
    DECODE = "decode"
    MIXED = "mixed"
    DENOISE = "denoise"


class CompositionSource(str, Enum):
    """Where an iteration's composition was read from, best first."""

    ANNOTATION = "annotation"      # the engine's own record_function / NVTX range names the batch
    SHAPES = "shapes"              # recorded tensor shapes (record_shapes)
    KERNEL_NAMES = "kernel names"  # kernel names and counts (e.g. a CUDA graph captured per batch size)
    LOG = "serving log"            # a side log written by the server (this project's examples)


@dataclass(frozen=True)
class DitBatch:
    """What one denoising step computes: ``model_batch`` sequences through the transformer
    (requests × 2 with classifier-free guidance run as a batch), each of ``tokens`` latent
    (image/video) tokens plus ``text_tokens`` of the prompt (joint attention, as FLUX/SD3)."""

    model_batch: int
    tokens: int
    text_tokens: int = 0


@dataclass(frozen=True)
class FoundIteration:
    """One model iteration: on ``rank``, CPU window ``[start_ns, end_ns)`` on that rank's trace clock
    (the events' ``ts_ns``, which is the graph's ``measured_start_ns``), its phase and composition
    (``llm`` for prefill/decode/mixed, ``dit`` for denoise), and the text that said so."""

    rank: int
    start_ns: int
    end_ns: int
    phase: IterationPhase
    evidence: str
    llm: LLMBatch | None = None
    dit: DitBatch | None = None

    def __post_init__(self) -> None:
        if self.end_ns <= self.start_ns:
            raise ValueError(f"empty iteration window [{self.start_ns}, {self.end_ns})")
        if (self.phase is IterationPhase.DENOISE) != (self.dit is not None) or (self.llm is None) == (self.dit is None):
            need = "dit" if self.phase is IterationPhase.DENOISE else "llm"
            raise ValueError(f"a {self.phase.value} iteration needs {need} composition and no other")


@dataclass(frozen=True)
class FoundIterations:
    """Every iteration an adapter found, rank by rank, each rank's in time order, with where the
    compositions came from and what the adapter could not say (``notes``: one line each, printed
    by `whatif serve`)."""

    adapter: str
    iterations: tuple[FoundIteration, ...]
    source: CompositionSource
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.iterations:
            raise ValueError(f"{self.adapter}: no iterations")

    @property
    def kind(self) -> str:
        """``"dit"`` when the iterations are denoising steps, else ``"llm"``."""
        return "dit" if self.iterations[0].phase is IterationPhase.DENOISE else "llm"


class EngineAdapter(ABC):
    """Finds a serving engine's iterations in a trace. Subclasses declare their ``name`` (the
    ``--engine`` choice) and ``order`` (adapters are tried in ascending order; the generic fallback
    last) and register with :func:`whatif.predictors.serving.engines.register`."""

    name: ClassVar[str]
    order: ClassVar[int] = 50

    @abstractmethod
    def find(self, graph: TaskGraph) -> FoundIterations | None:
        """The iterations of ``graph`` (built from ``graph.trace``), or None when the trace is not
        this engine's. Raises :class:`~whatif.predictors.serving.logs.ServingLogError` when it is
        this engine's but cannot be read (one line naming the problem)."""


@dataclass(frozen=True)
class EventWindow:
    """One trace event as an adapter reads it: its row, where it ran and when (``[start_ns,
    end_ns)``, at least 1 ns long), and its name."""

    row: int
    rank: int
    tid: int
    start_ns: int
    end_ns: int
    name: str


def annotation_rows(trace: Trace, predicate: Callable[[str], bool]) -> np.ndarray:
    """Rows of the CPU annotations (``record_function`` ranges) whose name passes ``predicate``,
    in the table's order (rank, start)."""
    ev = trace.events
    return np.flatnonzero((ev["kind"].to_numpy() == int(EventKind.ANNOTATION)) & per_name(ev["name"], predicate))


def event_windows(trace: Trace, rows: np.ndarray) -> list[EventWindow]:
    """The events at ``rows`` of ``trace``'s table, in the order given."""
    ev = trace.events
    rows = np.asarray(rows, dtype=np.int64)
    start = ev["ts_ns"].to_numpy()[rows]
    end = start + np.maximum(ev["dur_ns"].to_numpy()[rows], 1)
    return [EventWindow(int(r), int(k), int(t), int(s), int(e), str(n)) for r, k, t, s, e, n in
            zip(rows, ev["rank"].to_numpy()[rows], ev["tid"].to_numpy()[rows], start, end,
                ev["name"].to_numpy()[rows])]


def equal_shares(total: int, parts: int) -> tuple[int, ...]:
    """``total`` split into ``parts`` integers as equal as they go, the larger first: how an
    adapter spreads a sum the trace gives (tokens, context) over sequences it does not detail.

    >>> equal_shares(10, 4), equal_shares(3, 0)
    ((3, 3, 2, 2), ())
    """
    if parts <= 0:
        return ()
    base, extra = divmod(total, parts)
    return (base + 1,) * extra + (base,) * (parts - extra)


def clock_offsets_ns(graph: TaskGraph) -> dict[int, int]:
    """Per rank, the graph's clock minus the rank's trace clock: what the build's clock alignment
    added to the rank's measured times (0 for the lowest rank, and for every rank without
    collectives or without the trace)."""
    t = graph.tasks
    if graph.trace is None or not len(t):
        return {}
    event = t["event"].to_numpy()
    start = t["measured_start_ns"].to_numpy()
    ok = (event >= 0) & (start >= 0)
    shift = start[ok] - graph.trace.events["ts_ns"].to_numpy()[event[ok]]
    ranks = t["rank"].to_numpy()[ok]
    return {int(r): int(np.median(shift[ranks == r])) for r in np.unique(ranks)}


def iteration_of_tasks(graph: TaskGraph, found: FoundIterations) -> np.ndarray:
    """Per task of ``graph``, the index of the iteration it belongs to (-1: none).

    A CPU task belongs to the iteration whose window holds its measured start on its rank (on the
    rank's trace clock, the build's clock alignment taken back: :func:`clock_offsets_ns`); GPU work
    belongs to the iteration of the call that launched it, and GPU work with no launching call in
    any window (a CUDA/HIP graph's kernels whose launch flows are missing) to the window holding
    its own measured start. Tasks a transform inserted (no measured time) inherit nothing here:
    the replay places them, and the iteration's replayed span is taken over its measured tasks.
    """
    t = graph.tasks
    n = len(t)
    out = np.full(n, -1, dtype=np.int64)
    rank = t["rank"].to_numpy()
    offsets = clock_offsets_ns(graph)
    measured = t["measured_start_ns"].to_numpy() >= 0
    shift = np.zeros(n, dtype=np.int64)
    for r, off in offsets.items():
        shift[rank == r] = off
    start = t["measured_start_ns"].to_numpy() - shift
    kind = t["kind"].to_numpy()
    for i, it in enumerate(found.iterations):
        inside = measured & (rank == it.rank) & (start >= it.start_ns) & (start < it.end_ns)
        out[inside & (out < 0)] = i
    gpu = np.isin(kind, [int(k) for k in TaskKind if k.on_gpu])
    out_cpu = np.where(gpu, -1, out)
    e = graph.edges
    launch = e[e["kind"].to_numpy() == int(EdgeKind.LAUNCH)]
    src, dst = launch["src"].to_numpy(), launch["dst"].to_numpy()
    by_launch = np.full(n, -1, dtype=np.int64)
    by_launch[dst] = out_cpu[src]
    return np.where(gpu & (by_launch >= 0), by_launch, np.where(gpu, out, out_cpu))


def iteration_spans(member: np.ndarray, start_ns: np.ndarray, end_ns: np.ndarray, iterations: int) -> np.ndarray:
    """Per iteration, ``[first start, last end]`` of the tasks ``member`` assigns to it (a task's
    iteration index, -1: none; e.g. :func:`iteration_of_tasks`) under the task times
    ``start_ns``/``end_ns`` (a replay's, or the measured ones), shape ``(iterations, 2)``; a row of
    ``-1`` for an iteration that holds no task.

    >>> iteration_spans(np.array([0, 0, 1, -1]), np.array([5, 2, 9, 0]), np.array([8, 4, 12, 1]), 3).tolist()
    [[2, 8], [9, 12], [-1, -1]]
    """
    out = np.full((iterations, 2), -1, dtype=np.int64)
    ok = member >= 0
    if not ok.any():
        return out
    first = np.full(iterations, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(iterations, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(first, member[ok], np.asarray(start_ns, dtype=np.int64)[ok])
    np.maximum.at(last, member[ok], np.asarray(end_ns, dtype=np.int64)[ok])
    held = np.zeros(iterations, dtype=bool)
    held[member[ok]] = True
    out[held, 0], out[held, 1] = first[held], last[held]
    return out
