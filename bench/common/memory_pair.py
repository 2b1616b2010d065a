"""A memory what-if against a second recording: the timeline transforms predict from the
``before`` recording (``whatif memory -s``), beside ``before`` as recorded and ``after`` as measured."""
from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from whatif.depgraph.build import build_graph
from whatif.documents import MemoryDocument
from whatif.memory import memory, memory_edits
from whatif.tracer.trace import Trace, load_trace
from whatif.transforms.base import Transform

from .recording import record_cpu, record_cpu_ranks


@dataclass(frozen=True)
class MemoryPair:
    """The three memory documents, the transforms' lines and the what-if's seconds (edit and
    predicted document, not the graph build)."""

    recorded: MemoryDocument
    predicted: MemoryDocument
    measured: MemoryDocument
    lines: list[str]
    what_if_s: float

    @property
    def line(self) -> str:
        """The first transform's line."""
        return self.lines[0]


def predict_pair(before: Trace, after: Trace, *transforms: Transform) -> MemoryPair:
    graph = build_graph(before)
    t0 = time.perf_counter()
    edits, lines = memory_edits(graph, list(transforms))
    predicted = memory(before, graph, edits=edits, predicted=lines)
    took = time.perf_counter() - t0
    return MemoryPair(memory(before, graph), predicted, memory(after, build_graph(after)), lines, took)


def span(values: list[float], fmt: str) -> str:
    """The least and greatest of ``values`` formatted with ``fmt`` ("a to b"; one value when they print the same)."""
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo} to {hi}"


@dataclass(frozen=True)
class RanksRun:
    """One run of an example program as torchrun ranks: the flags added to its setup's arguments
    and how many ranks."""

    flags: tuple[str, ...]
    ranks: int


def alone_and_ranks(program: str, args: tuple[str, ...], runs: Sequence[RanksRun],
                    alone_flags: tuple[str, ...] = ()) -> Iterator[tuple[RanksRun, Trace, Trace]]:
    """``examples/<program>`` recorded alone with ``args`` and ``alone_flags``, then as each of
    ``runs`` (``args`` and its flags, that many gloo ranks on this machine's CPU): ``(run, the
    trace alone, the ranks' trace)`` each, the recordings removed once the last is read."""
    with tempfile.TemporaryDirectory() as tmp:
        alone = load_trace(record_cpu(program, (*args, *alone_flags), Path(tmp) / "alone"))
        for i, run in enumerate(runs):
            ranks = record_cpu_ranks(program, (*args, *run.flags), Path(tmp) / f"run{i}", run.ranks)
            yield run, alone, load_trace(ranks)
