"""``sglang``: SGLang's scheduler (python/sglang/srt/managers/scheduler.py
``get_next_batch_to_run``, schedule_policy.py ``PrefillAdder``; v0.5 line).

Prefill first: an iteration prefills when anything can be admitted, else decodes the running
batch. A prefill batch continues the request being chunked, then admits waiting requests FCFS
while ``max_seqs`` (``max_running_requests``) allows, their new tokens within one
``max_batched_tokens`` (``chunked_prefill_size``) budget (the request that does not fit is
chunked and ends the batch), and only while the KV pool keeps room for what the batch may still
generate: each admission needs its prompt plus its output tokens (at most 4,096) below the free
tokens less, for every running request, its remaining output tokens times the **new-token
ratio**. The ratio starts at 0.7, falls by (0.7 − 0.098)/600 per decode step to 0.098, and goes
back to 0.7 when a full cache retracts a request (the latest admitted, recompute) or the replica
idles. The output length stands for the request's ``max_new_tokens``. Leaves out LPM ordering
over the radix tree (prefix hits are the ``prefix_share`` of each prompt), ``max_prefill_tokens``,
mixed chunks (off by default) and the overlap scheduler.
"""
from __future__ import annotations

from ..scheduler import PolicyName, ReplicaState, SchedulingPolicy, Seq, Work, register_policy

INIT_NEW_TOKEN_RATIO = 0.7       # SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO = 0.7 * 0.14  # x SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
DECAY_STEPS = 600                # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
CLIP_NEW_TOKENS = 4096           # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION


@register_policy
class SGLangScheduler(SchedulingPolicy):
    """Prefill first with chunking; admission by the new-token ratio's estimate of future decode tokens."""

    key = PolicyName.SGLANG
    chunks_prompts = True

    def __init__(self) -> None:
        self.ratio: dict[int, float] = {}

    def new_token_ratio(self, rep: ReplicaState) -> float:
        """The replica's current estimate of the share of its remaining output a request will still generate."""
        return self.ratio.get(rep.index, INIT_NEW_TOKEN_RATIO)

    def next_work(self, rep: ReplicaState) -> Work | None:
        pre = self._prefill(rep)
        if pre:
            return Work(prefill=pre)
        dec = rep.reserve_decode([s for s in rep.running if not s.in_prefill])
        if rep.preempted or not dec:
            self.ratio[rep.index] = INIT_NEW_TOKEN_RATIO
        else:
            self.ratio[rep.index] = max(self.new_token_ratio(rep) - (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO)
                                        / DECAY_STEPS, MIN_NEW_TOKEN_RATIO)
        return Work(decode=dec) if dec else None

    def _prefill(self, rep: ReplicaState) -> list[tuple[Seq, int]]:
        budget = rep.max_batched_tokens
        free = rep.kv.free_tokens()
        ratio = self.new_token_ratio(rep)
        room = None if free is None else free - sum(
            min(s.output - s.generated, CLIP_NEW_TOKENS) * ratio for s in rep.running if not s.in_prefill)
        out: list[tuple[Seq, int]] = []
        for s in [q for q in rep.running if q.in_prefill]:        # the request being chunked
            n = min(s.target - s.prefilled, budget)
            if n > 0 and rep.kv.grow(s.id, n):
                out.append((s, n))
                budget -= n
                room = None if room is None else room - n
        running = len(rep.running)
        while rep.waiting and budget > 0 and running < rep.max_seqs:
            s = rep.waiting[0]
            need = s.target - s.prefilled
            if room is not None and need + min(s.output - s.generated, CLIP_NEW_TOKENS) >= room:
                break
            n = min(need, budget)
            if not rep.kv.can_grow(s.id, n):
                break
            rep.admit(rep.waiting.popleft(), n)
            out.append((s, n))
            budget -= n
            running += 1
            if room is not None:
                room -= need + min(s.output - s.generated, CLIP_NEW_TOKENS)
            if n < need:
                break
        return out
