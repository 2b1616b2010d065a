"""Request streams: Poisson or gamma (bursty) arrivals with seeded lengths, or a workload file.

Times are seconds from the start of the run (``arrival_s``); lengths are tokens. Every stream
is deterministic for a given seed (``random.Random(seed)``, no global state).
"""
from __future__ import annotations

import csv
import io
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

from whatif.core.errors import WhatifError


class WorkloadError(WhatifError):
    """A workload file or option that cannot be used; one line naming the file, row and problem."""


@dataclass(frozen=True)
class RequestSpec:
    """One request: arrival (s from start), prompt tokens, output tokens (the first comes from prefill)."""

    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


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
                       seed: int = 0, cv: float | None = None) -> list[RequestSpec]:
    """``n`` requests at ``rate`` req/s (Poisson, or gamma with ``cv``), lengths uniform in the given
    inclusive ranges. With ``cv`` None this draws exactly what ``llm_serve.py --seed`` draws."""
    if n < 1:
        raise WorkloadError(f"--num-requests must be >= 1, got {n}")
    for name, (lo, hi) in (("prompt", prompt_tokens), ("output", output_tokens)):
        if lo < 1 or hi < lo:
            raise WorkloadError(f"--{name}-tokens must be MIN[:MAX] with 1 <= MIN <= MAX, got {lo}:{hi}")
    rng = random.Random(seed)
    arrivals = poisson_arrivals(n, rate, rng) if cv is None else gamma_arrivals(n, rate, cv, rng)
    specs = [(a, _length(prompt_tokens, rng), _length(output_tokens, rng)) for a in arrivals]
    return [RequestSpec(i, a, p, o) for i, (a, p, o) in enumerate(specs)]


DEFAULT_COLUMNS = {"arrival_s": "arrival_s", "prompt_tokens": "prompt_tokens", "output_tokens": "output_tokens"}


def read_workload(path: str | Path, columns: dict[str, str] | None = None,
                  time_scale: float = 1.0) -> list[RequestSpec]:
    """Requests from a CSV (with header) or JSONL file (``.jsonl``/``.ndjson``/``.json``: one object per line).

    ``columns`` maps our field (``arrival_s``, ``prompt_tokens``, ``output_tokens``) to the file's
    column name; ``time_scale`` converts the file's time unit to seconds (1e-3 for ms). Arrivals are
    shifted so the first is at 0 and sorted. Raises :class:`WorkloadError` (``FILE:ROW: problem``).
    """
    path = Path(path)
    cols = {**DEFAULT_COLUMNS, **(columns or {})}
    unknown = sorted(set(cols) - set(DEFAULT_COLUMNS))
    if unknown:
        raise WorkloadError(f"unknown workload field {unknown[0]!r} (fields: {', '.join(DEFAULT_COLUMNS)})")
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
        missing = [c for c in cols.values() if c not in reader.fieldnames]
        if missing:
            raise WorkloadError(f"{path}:1: no column {missing[0]!r} in the header "
                                f"({', '.join(reader.fieldnames)}); map it with --column FIELD=NAME")
        rows = [(i, r) for i, r in enumerate(reader, 2)]
    if not rows:
        raise WorkloadError(f"{path}: no requests")
    out = []
    for i, row in rows:
        vals = []
        for field, conv in (("arrival_s", float), ("prompt_tokens", int), ("output_tokens", int)):
            name = cols[field]
            if name not in row or row[name] in (None, ""):
                raise WorkloadError(f"{path}:{i}: missing {name!r}" + ("" if name == field else f" (for {field})"))
            try:
                v = conv(float(row[name])) if conv is int else conv(row[name])
            except (TypeError, ValueError):
                raise WorkloadError(f"{path}:{i}: {name} = {row[name]!r} is not a number") from None
            if conv is int and float(row[name]) != v:
                raise WorkloadError(f"{path}:{i}: {name} = {row[name]!r} is not a whole number of tokens")
            vals.append(v)
        arrival, p, o = vals
        if not math.isfinite(arrival) or arrival < 0:
            raise WorkloadError(f"{path}:{i}: {cols['arrival_s']} = {row[cols['arrival_s']]!r} must be finite and >= 0")
        if p < 1 or o < 1:
            raise WorkloadError(f"{path}:{i}: prompt_tokens and output_tokens must be >= 1")
        out.append((arrival * time_scale, p, o))
    out.sort(key=lambda r: r[0])
    t0 = out[0][0]
    return [RequestSpec(i, a - t0, int(p), int(o)) for i, (a, p, o) in enumerate(out)]
