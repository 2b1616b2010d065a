"""Which steps a user means: the rule, defined once, on plain arrays (the recorder's summary and
the graph's step table both call it).

Not every recorded step is one a user means. :func:`rank_exclusions` names, for one rank's steps
in time order, those that means, speedups, phase tables, charts and fits leave out by default:

* **warm-up**: the rank's ``ProfilerStep#0`` when the rank has another whole step. Step 0 is the
  first step the profiler saw: it holds the program's start-up (imports, model construction,
  CUDA context, allocator growth, autotuning) or, when the program ran before the profiler
  started, the profiler's own start-up, the reason ``torch.profiler.schedule`` has a ``warmup``
  phase. A recording whose first step is numbered above 0 was made after steps the profiler's
  schedule skipped or warmed up on, so nothing is left out: the rule reads the step number, not
  the step's length, so that a legitimately long first step (a prefill) stays in.
* **partial**: the rank's last step when it holds less than :data:`PARTIAL_SHARE` of the events
  of the rank's median step: the annotation the last ``prof.step()`` opened, cut short by the end
  of the recording (it holds the profiler's shutdown, not an iteration).

A rank with a single step keeps it. :class:`StepOptions` brings either kind back.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

PARTIAL_SHARE = 0.5
"""A last step holding fewer events than this share of the rank's median step is partial."""


class Exclusion(Enum):
    """Why a step is left out of means, speedups, phase tables, charts and fits by default."""

    WARMUP = "warm-up"
    PARTIAL = "partial"

    @property
    def why(self) -> str:
        """One line for people."""
        return _WHY[self]


_WHY = {Exclusion.WARMUP: "the first step (ProfilerStep#0) holds start-up",
        Exclusion.PARTIAL: "the last step is cut short by the end of the recording"}


@dataclass(frozen=True)
class StepOptions:
    """Which steps count in means, speedups, phase tables, charts and fits (excluded steps are
    still listed). Each field is also a command-line flag (``--include-warmup``, ...)."""

    include_warmup: bool = field(default=False, metadata={
        "help": "count the warm-up step (ProfilerStep#0, start-up) in means, speedups, charts and fits"})
    include_partial: bool = field(default=False, metadata={
        "help": "count a last step cut short by the end of the recording"})

    def counts(self, reason: Exclusion | None) -> bool:
        """Whether a step excluded for ``reason`` (None: not excluded) counts."""
        return (reason is None or (reason is Exclusion.WARMUP and self.include_warmup)
                or (reason is Exclusion.PARTIAL and self.include_partial))

    def mask(self, reasons: Sequence[Exclusion | None]) -> np.ndarray:
        """Per step of ``reasons`` (why each is left out by default, None when not): whether it counts.

        >>> StepOptions(include_warmup=True).mask([Exclusion.WARMUP, None, Exclusion.PARTIAL]).tolist()
        [True, True, False]
        """
        return np.array([self.counts(r) for r in reasons], dtype=bool)


COUNT_DEFAULT = StepOptions()
"""The default: warm-up and partial steps left out."""


def rank_exclusions(numbers: Sequence[int], events: Sequence[int]) -> list[Exclusion | None]:
    """Per step of one rank, given in time order by its ``ProfilerStep`` number and how many events
    (tasks, ops) it holds: why it is left out by default, None when it counts.

    >>> rank_exclusions([0, 1, 2, 3], [900, 100, 100, 10])
    [<Exclusion.WARMUP: 'warm-up'>, None, None, <Exclusion.PARTIAL: 'partial'>]
    >>> rank_exclusions([5, 6, 7], [100, 100, 100]), rank_exclusions([0, 1], [100, 100])
    ([None, None, None], [<Exclusion.WARMUP: 'warm-up'>, None])
    """
    out: list[Exclusion | None] = [None] * len(numbers)
    if len(numbers) < 2:
        return out
    counts = np.asarray(events, dtype=float)
    if counts[-1] < PARTIAL_SHARE * float(np.median(counts[:-1])):
        out[-1] = Exclusion.PARTIAL
    whole = sum(r is None for r in out)
    if int(numbers[0]) == 0 and whole >= 2 and out[0] is None:
        out[0] = Exclusion.WARMUP
    return out


def excluded_part(step: int, reason: Exclusion, step_ms: float, rank: int = 0) -> str:
    """How a left-out step is named wherever steps are listed (``rank`` shown when not 0).

    >>> excluded_part(0, Exclusion.WARMUP, 68.7012)
    'step 0 (warm-up: the first step (ProfilerStep#0) holds start-up, 68.701 ms)'
    """
    return f"step {step}{f' of rank {rank}' if rank else ''} ({reason.value}: {reason.why}, {step_ms:,.3f} ms)"


def ranks_text(ranks: Sequence[int]) -> str:
    """Ranks as runs: ``0-3, 5, 7-9`` (``-`` for none).

    >>> ranks_text([0, 1, 2, 3, 5, 7, 8, 9]), ranks_text([4]), ranks_text([])
    ('0-3, 5, 7-9', '4', '-')
    """
    xs = sorted(set(int(r) for r in ranks))
    if not xs:
        return "-"
    runs: list[list[int]] = [[xs[0], xs[0]]]
    for x in xs[1:]:
        if x == runs[-1][1] + 1:
            runs[-1][1] = x
        else:
            runs.append([x, x])
    return ", ".join(f"{a}-{b}" if b > a else str(a) for a, b in runs)


def excluded_group(step: int, reason: Exclusion, step_ms: Sequence[float], ranks: Sequence[int]) -> str:
    """One left-out step number on several ranks, named once (the ranks as runs, the times' range).

    >>> excluded_group(0, Exclusion.WARMUP, [0.9, 1.2], [0, 1])
    'step 0 of ranks 0-1 (warm-up: the first step (ProfilerStep#0) holds start-up, 0.900-1.200 ms)'
    """
    if len(ranks) == 1:
        return excluded_part(step, reason, step_ms[0], ranks[0])
    lo, hi = min(step_ms), max(step_ms)
    took = f"{lo:,.3f} ms" if lo == hi else f"{lo:,.3f}-{hi:,.3f} ms"
    return f"step {step} of ranks {ranks_text(ranks)} ({reason.value}: {reason.why}, {took})"


INCLUDE_HINT = "--include-warmup / --include-partial count them"
"""What brings left-out steps back, said after the list of them."""


def completion_floor(ranks: np.ndarray, begin: np.ndarray, done: np.ndarray) -> np.ndarray:
    """Per step row: where its time starts: the previous step's completion on the same rank
    (running max, rows in begin order), or its own begin for a rank's first step (the rule of
    ``whatif analyze``'s measured step, and of ``whatif record``'s summary).

    >>> completion_floor(np.zeros(3, dtype=np.int64), np.array([0, 10, 20]), np.array([12, 18, 24])).tolist()
    [0, 12, 18]
    """
    floor = np.array(begin, copy=True)
    order = np.lexsort((begin, ranks))
    prev_rank, running = None, 0
    for i in order.tolist():
        if ranks[i] != prev_rank:
            prev_rank, running = ranks[i], done[i]
            continue
        floor[i] = running
        running = max(running, done[i])
    return floor
