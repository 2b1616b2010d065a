"""The KV admission watermark (vLLM V0's ``watermark``, Vidur's ``watermark_blocks_fraction``): a
new request is admitted only if it leaves that share of the blocks free, so the running sequences
grow into them instead of preempting each other."""
from __future__ import annotations

import pytest

from whatif.predictors.serving import LLMBatch, RequestSpec, SchedulerConfig, WorkloadError, simulate_llm


def flat(batch: LLMBatch) -> float:
    """Prefill 10 ms, decode 2 ms."""
    return 10e6 if batch.prefill_tokens else 2e6


def run(watermark: float) -> list[dict]:
    # 6 blocks of 8 tokens; each request's 24-token prompt takes 3 blocks and its first decode a 4th
    specs = [RequestSpec(0, 0.0, 24, 3), RequestSpec(1, 0.0, 24, 3)]
    cfg = SchedulerConfig(kv_capacity_tokens=48, kv_block_tokens=8, kv_watermark=watermark)
    return simulate_llm(specs, flat, cfg).requests


def test_without_a_watermark_the_second_admission_forces_a_preemption() -> None:
    r0, r1 = run(0.0)
    assert r1["preemptions"] == 1 and (r0["e2e_ms"], r1["e2e_ms"]) == (14.0, 26.0)


def test_a_watermark_keeps_the_second_request_waiting_instead() -> None:
    # int(0.34 * 6) = 2 blocks kept free: r1 (3 blocks) waits until r0 finishes at 14 ms
    r0, r1 = run(0.34)
    assert (r0["preemptions"], r1["preemptions"]) == (0, 0)
    assert (r0["e2e_ms"], r1["ttft_ms"], r1["e2e_ms"]) == (14.0, 24.0, 28.0)


def test_the_watermark_is_a_fraction() -> None:
    with pytest.raises(WorkloadError):
        SchedulerConfig(kv_watermark=1.5)
