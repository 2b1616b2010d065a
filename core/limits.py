"""Bounds on what an input may contain, so that hostile or corrupt input is refused at read time
with one line instead of overflowing, exhausting memory or hanging later (docs/reliability.md).

* Times, in nanoseconds: every timestamp (with ``baseTimeNanoseconds`` added) within
  ``±MAX_TIME_NS`` = 2^62 ns (146 years: epoch timestamps until 2116), every duration within
  ``MAX_DURATION_NS`` = 2^60 ns (36 years), so that ``ts + dur`` and a replay's sums stay inside int64.
* Ranks, world sizes and step numbers fit the int32/int64 columns that hold them; a plan has at
  most ``MAX_GPUS`` GPUs, a batch at most ``MAX_PARTS`` parts and a kernel at most
  ``MAX_GPU_SMS`` SMs (a transform parameter's ``maximum``, checked when a scenario is read).
* Memory: an allocator record's sizes and totals within ``MAX_MEMORY_BYTES`` = 2^50 bytes (1 PiB,
  far above any device's memory), so that a timeline's running sums stay inside int64.
* Serving: token counts within int32 (``MAX_TOKENS``), at most ``MAX_REQUESTS`` simulated requests
  (a config field's ``maximum``, checked by the command line and by the dataclass itself,
  :mod:`whatif.core.bounds`).
* Decompression: a gzip file inflates to at most ``max_inflate_ratio()`` times its compressed size
  (real Kineto traces: 7-30x over the 44 gzipped traces in ../shared/traces) and at most
  ``max_trace_bytes()`` in all; both can be raised with the environment variables
  ``WHATIF_MAX_INFLATE_RATIO`` and ``WHATIF_MAX_TRACE_GB``.
"""
from __future__ import annotations

import os

from whatif.core.errors import WhatifError

MAX_TIME_NS = 1 << 62
MAX_DURATION_NS = 1 << 60
MAX_RANK = (1 << 31) - 1
MAX_GPUS = 1 << 17          # GPUs in one plan (the largest clusters hold ~10^5)
MAX_PARTS = 4096            # nano-batches, micro-batches, workers, a batch's splits
MAX_GPU_SMS = 1024          # SMs (CUs) of one GPU (a B200 has 148, an MI300X 304 CUs)
MAX_STEP = (1 << 31) - 1
MAX_INT_PARAMETER = 1 << 53     # a scenario's integers: what a float64 holds exactly
MAX_TOKENS = (1 << 31) - 1      # a request's or an iteration's tokens, a KV-cache block
MAX_REQUESTS = 10 ** 6          # requests one serving simulation draws
MAX_MEMORY_BYTES = 1 << 50      # an allocator record's Bytes / Total Allocated / Total Reserved
DEFAULT_INFLATE_RATIO = 100
OVER_INFLATE_CAP = "inflates to more than"   # how a refusal over the inflate cap begins (readers, uploads)
DEFAULT_TRACE_GB = 64


def _env_number(name: str, default: float) -> float:
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = float(text)
    except ValueError:
        raise WhatifError(f"{name}={text!r}: not a number") from None
    if not value > 0 or value == float("inf"):
        raise WhatifError(f"{name}={text!r}: must be a positive finite number")
    return value


def max_inflate_ratio() -> float:
    """How many times its compressed size a gzip trace may inflate to.

    >>> max_inflate_ratio() >= 1
    True
    """
    return _env_number("WHATIF_MAX_INFLATE_RATIO", DEFAULT_INFLATE_RATIO)


def max_trace_bytes() -> int:
    """The most bytes a trace's JSON text may have once inflated."""
    return int(_env_number("WHATIF_MAX_TRACE_GB", DEFAULT_TRACE_GB) * (1 << 30))


def inflate_cap_bytes(compressed_bytes: int) -> int:
    """``min(ratio × compressed, absolute cap)``.

    >>> inflate_cap_bytes(1 << 20) == min(100 << 20, 64 << 30)
    True
    """
    return min(int(max_inflate_ratio() * compressed_bytes), max_trace_bytes())
