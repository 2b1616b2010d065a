"""Request streams: Poisson, gamma (bursty; BurstGPT's), or fixed-rate arrivals with seeded
lengths, or a workload file; and the share of each prompt that earlier requests also sent.

Times are seconds from the start of the run (``arrival_s``); lengths are tokens. Every stream
is deterministic for a given seed (``random.Random(seed)``, no global state).
"""
from __future__ import annotations

import csv
import io
import json
import math
import random
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

from whatif.core.errors import WhatifError


class WorkloadError(WhatifError):
    """A workload file or option that cannot be used; one line naming the file, row and problem."""


@dataclass(frozen=True)
class RequestSpec:
    """One request: arrival (s from start), prompt tokens, output tokens (the first comes from
    prefill), and how many of its first prompt tokens earlier requests sent too (a prefix cache holds them)."""

    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int = 0


class Arrivals(str, Enum):
    """How arrival gaps are drawn (the names ``--arrivals`` takes)."""

    POISSON = "poisson"
    GAMMA = "gamma"        # with --cv
    BURSTGPT = "burstgpt"  # gamma of shape BURSTGPT_SHAPE
    FIXED = "fixed"


BURSTGPT_SHAPE = 0.5
"""Gamma shape of BurstGPT's workload generator (HPMLL/BurstGPT 01131e1b, example/src/burstgpt/config.py:
``gamma_shape 0.5``, ``gamma_scale 2.0`` at 1 req/s), i.e. a coefficient of variation of sqrt(2);
the scale follows the rate asked for. Wang et al., "BurstGPT: A Real-World Workload Dataset to
Optimize LLM Serving Systems" (arXiv 2401.17644) model the traces' bursts with this family."""


def fixed_arrivals(n: int, rate: float) -> list[float]:
    """``n`` arrival times (s) a constant ``1/rate`` apart, the first at 0 (``inf``: all at 0).

    >>> fixed_arrivals(4, 2.0)
    [0.0, 0.5, 1.0, 1.5]
    """
    gap = 1.0 / rate if rate > 0 and math.isfinite(rate) else 0.0
    return [i * gap for i in range(n)]


def with_prefix_share(requests: list[RequestSpec], share: float) -> list[RequestSpec]:
    """``requests`` with the first ``share`` of every prompt but the first request's marked as
    sent before (``cached_tokens``, at most all but one token: the last is always computed).

    >>> [r.cached_tokens for r in with_prefix_share([RequestSpec(i, i, 100, 5) for i in range(3)], 0.25)]
    [0, 25, 25]
    """
    if not 0.0 <= share <= 1.0:
        raise WorkloadError(f"--prefix-share must be in [0, 1], got {share}")
    return [r if i == 0 else replace(r, cached_tokens=min(int(r.prompt_tokens * share), r.prompt_tokens - 1))
            for i, r in enumerate(requests)]


def draw_arrivals(n: int, rate: float, rng: random.Random, kind: Arrivals = Arrivals.POISSON,
                  cv: float | None = None) -> list[float]:
    """``n`` arrival times (s) of ``kind`` at ``rate`` req/s (gamma: coefficient of variation ``cv``)."""
    if kind is Arrivals.FIXED:
        return fixed_arrivals(n, rate)
    if kind is Arrivals.BURSTGPT:
        return gamma_arrivals(n, rate, 1.0 / math.sqrt(BURSTGPT_SHAPE), rng)
    if kind is Arrivals.GAMMA:
        if cv is None:
            raise WorkloadError("gamma arrivals need --cv")
        return gamma_arrivals(n, rate, cv, rng)
    return poisson_arrivals(n, rate, rng)


def poisson_arrivals(n: int, rate: float, rng: random.Random) -> list[float]:
    """``n`` arrival times (s): the first at 0, then exponential gaps of mean ``1/rate`` (``inf``: all at 0).

    Same construction as examples/llm_serve.py, so the same seed gives the same schedule.
    """
    times, t = [], 0.0
    for i in range(n):
        if i and rate > 0 and math.isfinite(rate):
            t += rng.expovariate(rate)
        times.append(t)
    return times


def gamma_arrivals(n: int, rate: float, cv: float, rng: random.Random) -> list[float]:
    """``n`` arrival times (s), first at 0, gamma-distributed gaps of mean ``1/rate`` and coefficient of
    variation ``cv`` (shape ``1/cv²``; ``cv`` = 1 is Poisson, > 1 bursty as in BurstGPT)."""
    if cv <= 0:
        raise WorkloadError(f"--cv must be > 0, got {cv}")
    shape = 1.0 / (cv * cv)
    times, t = [], 0.0
    for i in range(n):
        if i and rate > 0 and math.isfinite(rate):
            t += rng.gammavariate(shape, 1.0 / (rate * shape))
        times.append(t)
    return times


def _length(spec: tuple[int, int], rng: random.Random) -> int:
    """Uniform in the inclusive range; always draws (as llm_serve.py does), so seeds line up."""
    return rng.randint(spec[0], spec[1])


def synthetic_workload(n: int, rate: float, prompt_tokens: tuple[int, int], output_tokens: tuple[int, int],
                       seed: int = 0, cv: float | None = None, kind: Arrivals | None = None) -> list[RequestSpec]:
    """``n`` requests at ``rate`` req/s (``kind``; default Poisson, or gamma with ``cv``), lengths
    uniform in the given inclusive ranges. Poisson draws exactly what ``llm_serve.py --seed`` draws."""
    if n < 1:
        raise WorkloadError(f"--num-requests must be >= 1, got {n}")
    for name, (lo, hi) in (("prompt", prompt_tokens), ("output", output_tokens)):
        if lo < 1 or hi < lo:
            raise WorkloadError(f"--{name}-tokens must be MIN[:MAX] with 1 <= MIN <= MAX, got {lo}:{hi}")
    rng = random.Random(seed)
    kind = kind or (Arrivals.POISSON if cv is None else Arrivals.GAMMA)
    arrivals = draw_arrivals(n, rate, rng, kind, cv)
    specs = [(a, _length(prompt_tokens, rng), _length(output_tokens, rng)) for a in arrivals]
    return [RequestSpec(i, a, p, o) for i, (a, p, o) in enumerate(specs)]


LLM_FIELDS = ("arrival_s", "prompt_tokens", "output_tokens")
DIT_FIELDS = ("arrival_s", "resolution", "steps")
DEFAULT_COLUMNS = {f: f for f in (*LLM_FIELDS, *DIT_FIELDS)}


@dataclass(frozen=True)
class DitRequestSpec:
    """One DiT request: arrival (s from start), latent resolution and denoising steps (None: the
    serving options', else as recorded)."""

    id: int
    arrival_s: float
    resolution: int | None = None
    steps: int | None = None


def _file_rows(path: Path, cols: dict[str, str], required: tuple[str, ...]) -> list[tuple[int, dict]]:
    """The rows of a CSV (header) or JSONL file with their line numbers; a CSV must name every ``required`` column."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise WorkloadError(f"{path}: no such workload file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkloadError(f"{path}: cannot be read ({exc})") from None
    rows: list[tuple[int, dict]] = []
    if path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{path}:{i}: not a JSON object ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise WorkloadError(f"{path}:{i}: expected a JSON object, got {type(obj).__name__}")
            rows.append((i, obj))
    else:
        reader = csv.DictReader(io.StringIO(text))
        if not reader.fieldnames:
            raise WorkloadError(f"{path}: empty CSV file (expected a header line)")
        missing = [cols[f] for f in required if cols[f] not in reader.fieldnames]
        if missing:
            raise WorkloadError(f"{path}:1: no column {missing[0]!r} in the header "
                                f"({', '.join(reader.fieldnames)}); map it with --column FIELD=NAME")
        rows = [(i, r) for i, r in enumerate(reader, 2)]
    if not rows:
        raise WorkloadError(f"{path}: no requests")
    return rows


def _value(path: Path, i: int, row: dict, cols: dict[str, str], field: str, whole: bool,
           required: bool = True) -> float | None:
    """Field ``field`` of row ``i`` (its column ``cols[field]``) as a number (a whole one when
    ``whole``); None when an optional field is absent; :class:`WorkloadError` naming the row."""
    name = cols[field]
    if name not in row or row[name] in (None, ""):
        if not required:
            return None
        raise WorkloadError(f"{path}:{i}: missing {name!r}" + ("" if name == field else f" (for {field})"))
    try:
        v = float(row[name])
    except (TypeError, ValueError):
        raise WorkloadError(f"{path}:{i}: {name} = {row[name]!r} is not a number") from None
    if whole and (not math.isfinite(v) or v != int(v)):
        raise WorkloadError(f"{path}:{i}: {name} = {row[name]!r} is not a whole number")
    return v


def _columns(columns: dict[str, str] | None) -> dict[str, str]:
    cols = {**DEFAULT_COLUMNS, **(columns or {})}
    unknown = sorted(set(cols) - set(DEFAULT_COLUMNS))
    if unknown:
        raise WorkloadError(f"unknown workload field {unknown[0]!r} (fields: {', '.join(DEFAULT_COLUMNS)})")
    return cols


def _arrival(path: Path, i: int, row: dict, cols: dict[str, str]) -> float:
    arrival = _value(path, i, row, cols, "arrival_s", whole=False)
    assert arrival is not None   # required
    if not math.isfinite(arrival) or arrival < 0:
        raise WorkloadError(f"{path}:{i}: {cols['arrival_s']} = {row[cols['arrival_s']]!r} must be finite and >= 0")
    return arrival


def read_workload(path: str | Path, columns: dict[str, str] | None = None,
                  time_scale: float = 1.0) -> list[RequestSpec]:
    """LLM requests from a CSV (with header) or JSONL file (``.jsonl``/``.ndjson``/``.json``: one object per line).

    ``columns`` maps our field (``arrival_s``, ``prompt_tokens``, ``output_tokens``) to the file's
    column name; ``time_scale`` converts the file's time unit to seconds (1e-3 for ms). Arrivals are
    shifted so the first is at 0 and sorted. Raises :class:`WorkloadError` (``FILE:ROW: problem``).
    """
    path, cols = Path(path), _columns(columns)
    out = []
    for i, row in _file_rows(path, cols, LLM_FIELDS):
        arrival = _arrival(path, i, row, cols)
        p, o = (int(_value(path, i, row, cols, f, whole=True) or 0) for f in ("prompt_tokens", "output_tokens"))
        if p < 1 or o < 1:
            raise WorkloadError(f"{path}:{i}: prompt_tokens and output_tokens must be >= 1")
        out.append((arrival * time_scale, p, o))
    out.sort(key=lambda r: r[0])
    t0 = out[0][0]
    return [RequestSpec(i, a - t0, int(p), int(o)) for i, (a, p, o) in enumerate(out)]


def read_dit_workload(path: str | Path, columns: dict[str, str] | None = None,
                      time_scale: float = 1.0) -> list[DitRequestSpec]:
    """DiT requests from a CSV/JSONL file: ``arrival_s``, and optionally ``resolution`` (latent
    side) and ``steps`` per request (mapped and scaled as :func:`read_workload`'s; shifted to start at 0).

    >>> import tempfile, os
    >>> f = os.path.join(tempfile.mkdtemp(), "dit.csv")
    >>> _ = open(f, "w").write("arrival_s,resolution,steps\\n0.5,32,20\\n0.2,,\\n")
    >>> [(r.arrival_s, r.resolution, r.steps) for r in read_dit_workload(f)]
    [(0.0, None, None), (0.3, 32, 20)]
    """
    path, cols = Path(path), _columns(columns)

    def whole(i: int, row: dict, f: str) -> int | None:
        v = _value(path, i, row, cols, f, whole=True, required=False)
        if v is not None and v < 1:
            raise WorkloadError(f"{path}:{i}: {f} must be >= 1")
        return None if v is None else int(v)

    out = sorted(((_arrival(path, i, row, cols) * time_scale, whole(i, row, "resolution"), whole(i, row, "steps"))
                  for i, row in _file_rows(path, cols, ("arrival_s",))), key=lambda r: r[0])
    t0 = out[0][0]
    return [DitRequestSpec(i, a - t0, res, steps) for i, (a, res, steps) in enumerate(out)]
