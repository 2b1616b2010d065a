"""The built-in scheduling policies: which sequences one replica runs in its next iteration.

* ``vllm`` (continuous batching, examples/llm_serve.py's scheduler): admit waiting requests FCFS
  while a sequence slot is free (``max_seqs``), their prompts fit ``max_batched_tokens`` and the KV
  cache; if any were admitted the iteration is a prefill of exactly them, else a decode step of
  every running sequence.
* ``static``: a batch of up to ``max_seqs`` requests is formed only when the replica is empty; it
  is prefilled, then decoded until its last sequence finishes (finished ones stay as padding).
* ``chunked`` (Sarathi-Serve): every iteration decodes all running sequences and fills the rest of
  a ``chunk_tokens`` budget with prompt chunks (running prefills first, then new admissions).
* ``disagg`` (Splitwise/DistServe): prefill replicas run prefill-only iterations as ``vllm`` does;
  the KV cache then moves to a decode replica, which runs decode-only iterations.

>>> POLICIES.names()
('vllm', 'static', 'chunked', 'disagg')
"""
from __future__ import annotations

from .scheduler import (  # noqa: F401 - POLICIES: the doctest
    POLICIES,
    PolicyName,
    ReplicaState,
    Role,
    SchedulingPolicy,
    Seq,
    Work,
    register_policy,
)

__all__ = ["ChunkedPrefill", "ContinuousBatching", "Disaggregated", "StaticBatching"]


@register_policy
class ContinuousBatching(SchedulingPolicy):
    """vLLM: a prefill of the newly admitted requests, else a decode of every running sequence."""

    key = PolicyName.VLLM

    def next_work(self, rep: ReplicaState) -> Work | None:
        pre = rep.admit_prefills(rep.max_batched_tokens)
        if pre:
            return Work(prefill=pre)
        dec = rep.reserve_decode(list(rep.running))
        return Work(decode=dec) if dec else None


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


@register_policy
class ChunkedPrefill(SchedulingPolicy):
    """Sarathi-Serve: decode everything running, fill the rest of ``chunk_tokens`` with prompt chunks."""

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
        while rep.waiting and len(rep.running) < rep.max_seqs and budget > 0:
            s = rep.waiting[0]
            c = min(s.target - s.prefilled, budget)
            if not rep.kv.can_admit(s.id, c):
                break
            rep.admit(rep.waiting.popleft(), c)
            pre.append((s, c))
            budget -= c
        return Work(prefill=pre, decode=dec) if pre or dec else None


@register_policy
class Disaggregated(SchedulingPolicy):
    """Splitwise/DistServe: prefill replicas admit as ``vllm`` and hand the KV cache over; decode
    replicas take the handed-over sequences and decode them."""

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

