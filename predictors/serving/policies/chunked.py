"""``chunked``: Sarathi-Serve's stall-free batching (Agrawal et al., OSDI 2024).

Every iteration decodes all running sequences and fills the rest of a ``chunk_tokens`` budget
with prompt chunks: running prefills first, then new admissions FCFS. Leaves out Sarathi's
per-iteration time budget (the chunk is a token count here).
"""
from __future__ import annotations

from ..scheduler import PolicyName, ReplicaState, SchedulingPolicy, Seq, Work, register_policy


@register_policy
class ChunkedPrefill(SchedulingPolicy):
    """Decode everything running, fill the rest of ``chunk_tokens`` with prompt chunks."""

    key = PolicyName.CHUNKED
    chunks_prompts = True

    def next_work(self, rep: ReplicaState) -> Work | None:
        budget = rep.chunk_tokens
        dec = rep.reserve_decode([s for s in rep.running if not s.in_prefill][:budget])
        budget -= len(dec)
        pre: list[tuple[Seq, int]] = []
        for s in sorted((q for q in rep.running if q.in_prefill), key=lambda q: q.order):
            c = min(s.target - s.prefilled, budget)
            if c > 0 and rep.kv.grow(s.id, c):
                pre.append((s, c))
                budget -= c
        pre += rep.admit_chunks(budget)
        return Work(prefill=pre, decode=dec) if pre or dec else None
