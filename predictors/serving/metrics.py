"""Per-request and aggregate serving metrics (times in ms, throughput per second)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated ``q``-th percentile (0..100), the examples' definition."""
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def stats(values: list[float | None]) -> dict[str, float | None]:
    """mean, p50, p90, p99 of the non-None values (all None when there are none)."""
    xs = [v for v in values if v is not None]
    if not xs:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    return {"mean": sum(xs) / len(xs), "p50": percentile(xs, 50), "p90": percentile(xs, 90), "p99": percentile(xs, 99)}


@dataclass
class RequestResult:
    """One simulated request; times in ns from the start of the run."""

    id: int
    arrival_ns: float
    prompt_tokens: int
    output_tokens: int
    admitted_ns: float | None = None
    token_ns: list[float] = field(default_factory=list)
    preemptions: int = 0
    replica: int = -1

    @property
    def finish_ns(self) -> float:
        return self.token_ns[-1]

    def to_dict(self) -> dict[str, Any]:
        first, n = self.token_ns[0], len(self.token_ns)
        return {"id": self.id, "replica": self.replica, "arrival_s": self.arrival_ns / 1e9,
                "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
                "queue_ms": ((first if self.admitted_ns is None else self.admitted_ns) - self.arrival_ns) / 1e6,
                "ttft_ms": (first - self.arrival_ns) / 1e6,
                "tpot_ms": (self.finish_ns - first) / (n - 1) / 1e6 if n > 1 else None,
                "e2e_ms": (self.finish_ns - self.arrival_ns) / 1e6, "preemptions": self.preemptions}


def summarize(requests: list[dict[str, Any]], busy_ns: list[float], slo_ttft_ms: float | None = None,
              slo_tpot_ms: float | None = None) -> dict[str, Any]:
    """Aggregate of :meth:`RequestResult.to_dict` rows: latency stats, throughput over the span from
    the first arrival to the last token (as the examples measure it), goodput under the SLOs, and
    the mean busy fraction of the replicas (``busy_ns`` per replica)."""
    start = min(r["arrival_s"] for r in requests)
    end = max(r["arrival_s"] + r["e2e_ms"] / 1e3 for r in requests)
    dur = end - start
    out_tok = sum(r["output_tokens"] for r in requests)
    ok = [r for r in requests
          if (slo_ttft_ms is None or r["ttft_ms"] <= slo_ttft_ms)
          and (slo_tpot_ms is None or r["tpot_ms"] is None or r["tpot_ms"] <= slo_tpot_ms)]
    return {
        "num_requests": len(requests), "duration_s": dur, "output_tokens": out_tok,
        **{k: stats([r[k] for r in requests]) for k in ("ttft_ms", "tpot_ms", "e2e_ms", "queue_ms")},
        "throughput_req_per_s": len(requests) / dur if dur > 0 else None,
        "throughput_tokens_per_s": out_tok / dur if dur > 0 else None,
        "total_tokens_per_s": (out_tok + sum(r["prompt_tokens"] for r in requests)) / dur if dur > 0 else None,
        "slo": {"ttft_ms": slo_ttft_ms, "tpot_ms": slo_tpot_ms, "attainment": len(ok) / len(requests),
                "goodput_req_per_s": len(ok) / dur if dur > 0 else None},
        "preemptions": sum(r.get("preemptions", 0) for r in requests),
        "busy_fraction": sum(b / 1e9 for b in busy_ns) / (len(busy_ns) * dur) if dur > 0 and busy_ns else None,
    }
