"""``static``: static batching, as servers did before continuous batching (FasterTransformer,
a plain ``generate`` loop).

A batch of up to ``max_seqs`` requests is formed only when the replica is empty; it is prefilled,
then decoded until its last sequence finishes, finished ones staying in it as padding.
"""
from __future__ import annotations

from ..scheduler import PolicyName, ReplicaState, SchedulingPolicy, Seq, Work, register_policy


@register_policy
class StaticBatching(SchedulingPolicy):
    """A new batch only when the replica is empty; finished sequences stay in it as padding."""

    key = PolicyName.STATIC

    def next_work(self, rep: ReplicaState) -> Work | None:
        if not rep.running:
            pre = rep.admit_prefills(rep.max_batched_tokens)
            return Work(prefill=pre) if pre else None
        dec = rep.reserve_decode([s for s in rep.running if not s.padding])
        pad = [s for s in rep.running if s.padding]
        return Work(decode=dec + pad) if dec else None

    def finished(self, rep: ReplicaState, s: Seq) -> None:
        s.padding = True

    def after_iteration(self, rep: ReplicaState) -> None:
        if all(s.padding for s in rep.running):
            rep.running.clear()
