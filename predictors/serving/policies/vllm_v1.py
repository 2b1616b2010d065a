"""``vllm-v1``: vLLM's V1 scheduler (vllm/v1/core/sched/scheduler.py ``Scheduler.schedule``, at
vllm-project/vllm 99d7eb5d).

One token budget per iteration (``max_batched_tokens``) shared by every request: first the
running ones in admission order, each taking what it still needs (one token to decode, or the
rest of its prompt, chunked to the budget left), a full KV cache preempting the latest admitted
request (recompute: it waits at the front of the queue to prefill again); then, if nothing was
preempted, waiting requests FCFS while a sequence slot (``max_seqs``) and budget are left, their
prompts chunked to the budget. So one iteration mixes decodes with prompt chunks. A prompt whose
prefix the prefix cache holds starts past it (``Workload.prefix_share``). Leaves out
``long_prefill_token_threshold`` (0 by default), speculative tokens, encoder inputs, priorities
and asynchronous scheduling.
"""
from __future__ import annotations

from ..scheduler import PolicyName, ReplicaState, SchedulingPolicy, Seq, Work, register_policy


@register_policy
class VllmV1Scheduler(SchedulingPolicy):
    """Running requests first, then waiting ones, within one token budget; chunked prefill."""

    key = PolicyName.VLLM_V1
    chunks_prompts = True

    def next_work(self, rep: ReplicaState) -> Work | None:
        budget = rep.max_batched_tokens
        prefill: list[tuple[Seq, int]] = []
        decode: list[Seq] = []
        preempted = False
        for s in list(rep.running):
            if budget <= 0:
                break
            if s not in rep.running:
                continue
            n = min(s.target - s.prefilled if s.in_prefill else 1, budget)
            while not rep.kv.grow(s.id, n):
                preempted = True
                if rep.preempt_latest() is s:
                    break
            else:
                (prefill.append((s, n)) if s.in_prefill else decode.append(s))
                budget -= n
        if not preempted:
            prefill += rep.admit_chunks(budget)
        return Work(prefill=prefill, decode=decode) if prefill or decode else None
