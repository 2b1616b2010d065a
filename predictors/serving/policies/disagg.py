"""``disagg``: disaggregated prefill and decode (DistServe, OSDI 2024; Splitwise, ISCA 2024).

Prefill replicas admit as ``vllm`` does and run prefill-only iterations; each finished prompt's
KV cache then moves to a decode replica (the hand-off time per token: the per-GPU KV bytes of a
token over the GPU's peer link, or ``--kv-transfer-us-per-token``), which admits it when a slot
and its blocks are free and runs decode-only iterations. Leaves out the transfer's contention
with other transfers and layer-by-layer pipelining of the hand-off.
"""
from __future__ import annotations

from ..scheduler import PolicyName, ReplicaState, Role, SchedulingPolicy, Work, register_policy


@register_policy
class Disaggregated(SchedulingPolicy):
    """Prefill replicas admit as ``vllm`` and hand the KV cache over; decode replicas take the
    handed-over sequences and decode them."""

    key = PolicyName.DISAGG
    disaggregated = True

    def next_work(self, rep: ReplicaState) -> Work | None:
        if rep.role is Role.DECODE:
            while rep.waiting and len(rep.running) < rep.max_seqs and rep.kv.can_admit(rep.waiting[0].id,
                                                                                     rep.waiting[0].prefilled):
                s = rep.waiting.popleft()
                rep.admit(s, s.prefilled)
            dec = rep.reserve_decode(list(rep.running))
            return Work(decode=dec) if dec else None
        pre = rep.admit_prefills(rep.max_batched_tokens)
        return Work(prefill=pre) if pre else None
