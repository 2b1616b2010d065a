"""A memory what-if against a second recording: the timeline transforms predict from the
``before`` recording (``whatif memory -s``), beside ``before`` as recorded and ``after`` as measured."""
from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
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
class RanksSetup:
    """One setup of an example program: its arguments, recorded alone and as each of ``degrees``
    ranks."""

    label: str
    args: tuple[str, ...]
    degrees: tuple[int, ...]


def rank_pairs(program: str, flag: str, setups: Sequence[RanksSetup],
               row: Callable[[RanksSetup, Trace, Trace, int], str]) -> list[str]:
    """``row(setup, alone, ranks, degree)`` for each setup of ``examples/<program>`` recorded alone
    and with ``flag degree`` as that many torchrun ranks (this machine's CPU, gloo)."""
    rows = []
    for setup in setups:
        with tempfile.TemporaryDirectory() as tmp:
            alone = load_trace(record_cpu(program, setup.args, Path(tmp) / "alone"))
            for degree in setup.degrees:
                run = record_cpu_ranks(program, (*setup.args, flag, str(degree)), Path(tmp) / f"ranks{degree}", degree)
                rows.append(row(setup, alone, load_trace(run), degree))
    return rows
