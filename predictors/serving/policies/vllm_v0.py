"""``vllm``: continuous batching that prefills first (vLLM V0 with chunked prefill off, its default
for contexts up to 32K; examples/llm_serve.py's scheduler).

Admit waiting requests FCFS while a sequence slot is free (``max_seqs``), their prompts fit
``max_batched_tokens`` and the KV cache; if any were admitted the iteration is a prefill of
exactly them, else a decode step of every running sequence (a full cache preempts the latest
admitted, recompute). Its KV watermark is ``kv_watermark`` (default 0: vLLM V0 keeps 0.01 of the
blocks free at admission); leaves out V0's swap preemption and the delay factor.
Source: vllm/core/scheduler.py ``_schedule_default`` (v0.8).
"""
from __future__ import annotations

from ..scheduler import PolicyName, ReplicaState, SchedulingPolicy, Work, register_policy


@register_policy
class ContinuousBatching(SchedulingPolicy):
    """A prefill of the newly admitted requests, else a decode of every running sequence."""

    key = PolicyName.VLLM

    def next_work(self, rep: ReplicaState) -> Work | None:
        pre = rep.admit_prefills(rep.max_batched_tokens)
        if pre:
            return Work(prefill=pre)
        dec = rep.reserve_decode(list(rep.running))
        return Work(decode=dec) if dec else None
