"""Scheduling policies: which sequences one replica runs in its next iteration.

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

A decode that finds the KV cache full preempts the most recently admitted sequence (vLLM's
recompute): its blocks are freed and it waits at the front of the queue to prefill its prompt
and the tokens generated so far again.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field

from .kvcache import KVCache
from .logs import LLMBatch
from .metrics import RequestResult

POLICIES = ("vllm", "static", "chunked", "disagg")


@dataclass
class Seq:
    """A request inside a replica. ``target``: tokens its (re)prefill must process (the prompt, or
    prompt + generated after a preemption); ``prefilled``: how many of them are done."""

    res: RequestResult
    prompt: int
    output: int
    generated: int = 0
    prefilled: int = 0
    target: int = 0
    order: int = 0         # admission order, for choosing the preemption victim
    padding: bool = False  # static batching: finished, still computed

    @property
    def id(self) -> int:
        return self.res.id

    @property
    def in_prefill(self) -> bool:
        return self.prefilled < self.target

    @property
    def done(self) -> bool:
        return self.generated >= self.output


@dataclass
class Work:
    """One iteration: prompt chunks ``(seq, tokens)`` and decoding sequences."""

    prefill: list[tuple[Seq, int]] = field(default_factory=list)
    decode: list[Seq] = field(default_factory=list)

    def batch(self) -> LLMBatch:
        return LLMBatch(prefill_tokens=tuple(n for _, n in self.prefill),
                        prefill_cached=tuple(s.prefilled for s, _ in self.prefill),
                        decode_context=tuple(s.prompt + s.generated for s in self.decode))


class ReplicaState:
    """Queues and KV cache of one replica (``role``: ``mixed``, ``prefill`` or ``decode``)."""

    def __init__(self, index: int, role: str, policy: str, max_seqs: int, max_batched_tokens: int,
                 chunk_tokens: int, kv: KVCache) -> None:
        self.index, self.role, self.policy = index, role, policy
        self.max_seqs, self.max_batched_tokens, self.chunk_tokens = max_seqs, max_batched_tokens, chunk_tokens
        self.kv = kv
        self.waiting: collections.deque[Seq] = collections.deque()
        self.running: list[Seq] = []
        self.preempted: list[Seq] = []  # filled by next_work, drained by the simulator
        self._order = 0

    @property
    def load(self) -> int:
        return len(self.waiting) + len(self.running)

    def _admit(self, s: Seq, tokens: int) -> None:
        self.kv.grow(s.id, tokens)
        self._order += 1
        s.order = self._order
        self.running.append(s)

    def _admit_prefills(self, budget: int) -> list[tuple[Seq, int]]:
        """FCFS admission of whole prompts within ``budget`` tokens, free slots and KV space."""
        out: list[tuple[Seq, int]] = []
        while self.waiting and len(self.running) < self.max_seqs:
            s = self.waiting[0]
            n = s.target - s.prefilled
            if n > budget or not self.kv.can_grow(s.id, n):
                break
            budget -= n
            self._admit(self.waiting.popleft(), n)
            out.append((s, n))
        return out

    def _reserve_decode(self, seqs: list[Seq]) -> list[Seq]:
        """Reserve one KV token per decoding sequence, preempting the latest admitted when full."""
        out = []
        for s in sorted(seqs, key=lambda q: q.order):
            if s not in self.running:
                continue  # preempted while making room
            while not self.kv.grow(s.id, 1):
                victim = max((q for q in self.running if not q.padding), key=lambda q: q.order)
                self._preempt(victim)
                if victim is s:
                    break
            else:
                out.append(s)
        return [s for s in out if s in self.running]

    def _preempt(self, s: Seq) -> None:
        self.kv.free(s.id)
        self.running.remove(s)
        s.res.preemptions += 1
        s.prefilled, s.target = 0, s.prompt + s.generated
        self.preempted.append(s)

    def next_work(self) -> Work | None:
        """The next iteration under this replica's policy and role, or None when idle."""
        if self.role == "decode":
            while self.waiting and len(self.running) < self.max_seqs and self.kv.can_grow(self.waiting[0].id,
                                                                                          self.waiting[0].prefilled):
                s = self.waiting.popleft()
                self._admit(s, s.prefilled)
            dec = self._reserve_decode([s for s in self.running])
            return Work(decode=dec) if dec else None
        if self.policy == "chunked":
            return self._chunked()
        if self.policy == "static":
            if not self.running:
                pre = self._admit_prefills(self.max_batched_tokens)
                return Work(prefill=pre) if pre else None
            active = [s for s in self.running if not s.padding]
            dec = self._reserve_decode(active)
            pad = [s for s in self.running if s.padding]
            return Work(decode=dec + pad) if dec else None
        pre = self._admit_prefills(self.max_batched_tokens)
        if pre:
            return Work(prefill=pre)
        if self.role == "prefill":
            return None
        dec = self._reserve_decode(list(self.running))
        return Work(decode=dec) if dec else None

    def _chunked(self) -> Work | None:
        budget = self.chunk_tokens
        dec = self._reserve_decode([s for s in self.running if not s.in_prefill][:budget])
        budget -= len(dec)
        pre: list[tuple[Seq, int]] = []
        for s in sorted((q for q in self.running if q.in_prefill), key=lambda q: q.order):
            c = min(s.target - s.prefilled, budget)
            if c > 0 and self.kv.grow(s.id, c):
                pre.append((s, c))
                budget -= c
        while self.waiting and len(self.running) < self.max_seqs and budget > 0:
            s = self.waiting[0]
            c = min(s.target - s.prefilled, budget)
            if not self.kv.can_grow(s.id, c):
                break
            self._admit(self.waiting.popleft(), c)
            pre.append((s, c))
            budget -= c
        return Work(prefill=pre, decode=dec) if pre or dec else None
