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
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar

import numpy as np

from whatif.depgraph.graph import EdgeKind, TaskGraph, TaskKind

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
    """Every iteration an adapter found, in time order, with where the compositions came from and
    what the adapter could not say (``notes``: one line each, printed by `whatif serve`)."""

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


def iteration_of_tasks(graph: TaskGraph, found: FoundIterations) -> np.ndarray:
    """Per task of ``graph``, the index of the iteration it belongs to (-1: none).

    A CPU task belongs to the iteration whose window holds its measured start on its rank; GPU work
    belongs to the iteration of the call that launched it, and GPU work with no launching call in
    any window (a CUDA/HIP graph's kernels whose launch flows are missing) to the window holding
    its own measured start. Tasks a transform inserted (no measured time) inherit nothing here:
    the replay places them, and the iteration's replayed span is taken over its measured tasks.
    """
    t = graph.tasks
    n = len(t)
    out = np.full(n, -1, dtype=np.int64)
    rank = t["rank"].to_numpy()
    start = t["measured_start_ns"].to_numpy()
    kind = t["kind"].to_numpy()
    measured = start >= 0
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
