"""The short report printed after a recording: steps, step times (measured as ``whatif analyze``
measures them, :func:`measured_step_ms`, over the steps that count by its rule,
:mod:`whatif.core.steps`), phases, top ops or kernels."""
from __future__ import annotations

import bisect
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from whatif.core.steps import (
    COUNT_DEFAULT,
    INCLUDE_HINT,
    Exclusion,
    StepOptions,
    completion_floor,
    excluded_part,
    rank_exclusions,
)

from ..kinds import CATEGORY_KINDS, GPU_ACTIVITY_KINDS, EventKind
from ..markers import PHASE_PREFIX

_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
TOP_N = 5


@dataclass
class RunSummary:
    """Facts about one rank's trace; durations in milliseconds."""

    step_numbers: list[int] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    step_events: list[int] = field(default_factory=list)  # events starting inside each step's annotation
    phase_ms: dict[str, list[float]] = field(default_factory=dict)
    top: list[tuple[str, float, int]] = field(default_factory=list)  # (name, total ms, calls)
    top_is_gpu: bool = False
    event_count: int = 0
    gpu_event_count: int = 0


def _self_times_us(ops: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Self time (duration minus enclosed ops on the same thread) per op name, in us."""
    by_thread: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for ev in ops:
        by_thread[(ev.get("pid"), ev.get("tid"))].append(ev)
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for events in by_thread.values():
        events.sort(key=lambda e: (e["ts"], -e.get("dur", 0)))
        stack: list[tuple[float, int]] = []  # (end us, index of the enclosing op)
        selfs: list[float] = []
        names: list[str] = []
        for ev in events:
            ts, dur = float(ev["ts"]), float(ev.get("dur", 0))
            while stack and stack[-1][0] <= ts:
                stack.pop()
            if stack:
                selfs[stack[-1][1]] -= dur
            selfs.append(dur)
            names.append(str(ev.get("name")))
            stack.append((ts + dur, len(selfs) - 1))
        for name, self_us in zip(names, selfs):
            entry = totals[name]
            entry[0] += max(0.0, self_us)
            entry[1] += 1
    return totals


# the categories of the events that become tasks of whatif analyze's graph (others neither join nor
# end a step), those of them that run on a GPU, and the calls that launch them
_LAUNCH_CATEGORIES = frozenset(c for c, k in CATEGORY_KINDS.items() if k in (EventKind.RUNTIME, EventKind.DRIVER))
_GPU_TASK_CATEGORIES = frozenset(c for c, k in CATEGORY_KINDS.items() if k in GPU_ACTIVITY_KINDS)
_TASK_CATEGORIES = _LAUNCH_CATEGORIES | _GPU_TASK_CATEGORIES | frozenset(
    c for c, k in CATEGORY_KINDS.items() if k in (EventKind.CPU_OP, EventKind.ANNOTATION))


def measured_step_ms(begins: list[float], ends: list[float], events: list[tuple[float, float]]
                     ) -> tuple[list[float], list[int]]:
    """Step times (ms) and event counts of one process's steps, by the rule of ``whatif analyze``
    (:func:`whatif.predictors.steps.measured_step_ns`), on the trace's events instead of the graph.

    ``begins``/``ends``: the ``ProfilerStep#N`` annotations in begin order (us); ``events``:
    (anchor, end) of every other event, the anchor being where it belongs in time (its start; a
    GPU activity's: its launch's start). An event belongs to the step whose window [begin, next
    begin) holds its anchor (anchors after the last annotation's end belong to none); a step
    *completes* when the last of its events or its annotation ends; its time runs from the previous
    step's completion (the first step's: from its begin) to its own completion.

    >>> measured_step_ms([0, 10, 20], [9, 19, 25], [(1, 12), (11, 18), (21, 24)])
    ([0.012, 0.007, 0.006], [1, 1, 1])
    """
    completion = [float(e) for e in ends]
    counts = [0] * len(begins)
    last_end = max(ends, default=0.0)
    for anchor, end in events:
        i = bisect.bisect_right(begins, anchor) - 1
        if i < 0 or anchor >= last_end:
            continue
        counts[i] += 1
        if end > completion[i]:
            completion[i] = end
    done = np.asarray(completion, dtype=float)
    floor = completion_floor(np.zeros(len(begins), dtype=np.int64), np.asarray(begins, dtype=float), done)
    return ((done - floor) / 1000.0).tolist(), counts


def summarize(doc: dict[str, Any]) -> RunSummary:
    """Summarize a Kineto document (the one whatif writes for one rank)."""
    out = RunSummary()
    steps: list[tuple[float, int, float]] = []  # (begin us, number, end us)
    timed: list[tuple[float, float]] = []  # the other events of the graph's kinds: (anchor, end)
    gpu_timed: list[tuple[float, float, Any]] = []  # those on a GPU: (start, end, correlation)
    launch_ts: dict[Any, float] = {}  # correlation id -> start of the runtime/driver call that launched it
    phases: dict[str, list[float]] = defaultdict(list)
    cpu_ops: list[dict[str, Any]] = []
    gpu: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for ev in doc.get("traceEvents", []):
        if ev.get("ph") != "X" or not isinstance(ev.get("ts"), (int, float)):
            continue
        out.event_count += 1
        cat = str(ev.get("cat", "")).lower()
        name = str(ev.get("name", ""))
        ts, dur_us = float(ev["ts"]), float(ev.get("dur", 0))
        if cat in GPU_CATEGORIES:
            out.gpu_event_count += 1
            if cat == "kernel":
                gpu[name][0] += dur_us
                gpu[name][1] += 1
        elif cat == "cpu_op":
            cpu_ops.append(ev)
        elif cat == "user_annotation":
            match = _STEP_RE.match(name)
            if match:
                steps.append((ts, int(match.group(1)), ts + dur_us))
                continue
            if name.startswith(PHASE_PREFIX):
                phases[name[len(PHASE_PREFIX):]].append(dur_us / 1000.0)
        if cat not in _TASK_CATEGORIES:
            continue
        if cat in _GPU_TASK_CATEGORIES:
            args = ev.get("args")
            gpu_timed.append((ts, ts + dur_us, args.get("correlation") if isinstance(args, dict) else None))
            continue
        if cat in _LAUNCH_CATEGORIES:
            args = ev.get("args")
            corr = args.get("correlation") if isinstance(args, dict) else None
            if corr is not None:
                launch_ts.setdefault(corr, ts)
        timed.append((ts, ts + dur_us))
    steps.sort()
    timed += [(launch_ts.get(corr, ts), end) for ts, end, corr in gpu_timed]
    out.step_numbers = [n for _, n, _ in steps]
    out.step_ms, out.step_events = measured_step_ms([b for b, _, _ in steps], [e for _, _, e in steps], timed)
    out.phase_ms = dict(phases)
    totals = gpu if gpu else _self_times_us(cpu_ops)
    out.top_is_gpu = bool(gpu)
    ranked = sorted(totals.items(), key=lambda kv: kv[1][0], reverse=True)[:TOP_N]
    out.top = [(name, total_us / 1000.0, int(calls)) for name, (total_us, calls) in ranked]
    return out


def _ms(value: float) -> str:
    return f"{value:.2f} ms" if value < 100 else f"{value:.0f} ms"


def format_summary(s: RunSummary, *, gpu_note: str | None, options: StepOptions = COUNT_DEFAULT) -> list[str]:
    """Lines of the printed report for one process; the step times are over the steps ``options``
    counts (the ones left out are named, with why). :func:`rank_lines` prefixes them for the
    ranks other than 0."""
    lines: list[str] = []
    if s.step_ms:
        first, last = min(s.step_numbers), max(s.step_numbers)
        line = f"steps recorded: {len(s.step_ms)} (ProfilerStep#{first}..#{last})"
        reasons = rank_exclusions(s.step_numbers, s.step_events)
        left_out = [(n, r, ms) for n, r, ms in zip(s.step_numbers, reasons, s.step_ms) if not options.counts(r)]
        body = [ms for r, ms in zip(reasons, s.step_ms) if options.counts(r)] or s.step_ms
        line += (f"; step time median {_ms(statistics.median(body))}, min {_ms(min(body))}, "
                 f"max {_ms(max(body))}")
        lines.append(line)
        if left_out and len(body) < len(s.step_ms):
            lines.append("excluded from the step time: "
                         + "; ".join(excluded_part(n, r, ms) for n, r, ms in left_out if isinstance(r, Exclusion))
                         + f" ({INCLUDE_HINT})")
    else:
        lines.append("steps recorded: 0 (no step boundary was seen; mark steps with whatif.step() "
                     "or use --step-on module:function)")
    if s.phase_ms:
        parts = [f"{name} {len(v)}x {_ms(sum(v))}" for name, v in sorted(s.phase_ms.items())]
        lines.append("phases: " + ", ".join(parts))
    if s.top:
        what = "top GPU kernels (total time)" if s.top_is_gpu else "top CPU ops (self time)"
        lines.append(f"{what}:")
        width = min(60, max(len(n) for n, _, _ in s.top))
        for name, total_ms, calls in s.top:
            shown = name if len(name) <= width else name[: width - 1] + "…"
            lines.append(f"  {shown:<{width}}  {_ms(total_ms):>10}  {calls:>7} calls")
    if gpu_note:
        lines.append(gpu_note)
    return lines


def rank_lines(lines: list[str], rank: int) -> list[str]:
    """``lines`` as a rank prints them: under ``[rank k]`` for k > 0, so that the ranks of a
    torchrun job, which share one terminal, can be told apart.

    >>> rank_lines(["trace: x"], 0), rank_lines(["trace: x"], 1)
    (['trace: x'], ['[rank 1] trace: x'])
    """
    return [f"[rank {rank}] {ln}" if rank else ln for ln in lines]
