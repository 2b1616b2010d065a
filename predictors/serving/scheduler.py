"""What a scheduling policy works with: the sequences of one replica (:class:`ReplicaState`:
queues, KV cache, FCFS admission, decode reservation with preemption), one iteration's
:class:`Work`, and the policy interface with its registry (keys: :class:`PolicyName` for the
built-ins, which live in :mod:`.policies`; a new policy is one module, see docs/extending.md).

A decode that finds the KV cache full preempts the most recently admitted sequence (vLLM's
recompute): its blocks are freed and it waits at the front of the queue to prefill its prompt
and the tokens generated so far again.
"""
from __future__ import annotations

import collections
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import Enum
from typing import ClassVar

from whatif.core.registry import EnumRegistry

from .arrivals import WorkloadError
from .kvcache import KVCache
from .logs import LLMBatch
from .metrics import RequestResult


class PolicyName(str, Enum):
    """Keys of the built-in policies (the names ``--policy`` takes)."""

    VLLM = "vllm"          # V0-style prefill-first (the examples' scheduler)
    STATIC = "static"
    CHUNKED = "chunked"
    DISAGG = "disagg"
    VLLM_V1 = "vllm-v1"
    SGLANG = "sglang"


class Role(str, Enum):
    """What iterations a replica runs: both phases, or one side of a disaggregated deployment."""

    MIXED = "mixed"
    PREFILL = "prefill"
    DECODE = "decode"


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
    """Queues and KV cache of one replica, scheduled by ``policy`` in its ``role``."""

    def __init__(self, index: int, role: Role, policy: SchedulingPolicy, max_seqs: int, max_batched_tokens: int,
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

    def admit(self, s: Seq, tokens: int) -> None:
        """Move ``s`` (already taken off ``waiting``) to ``running`` with ``tokens`` of KV cache more."""
        self.kv.grow(s.id, tokens)
        self._order += 1
        s.order = self._order
        self.running.append(s)

    def admit_prefills(self, budget: int) -> list[tuple[Seq, int]]:
        """FCFS admission of whole prompts within ``budget`` tokens, free slots and KV space."""
        out: list[tuple[Seq, int]] = []
        while self.waiting and len(self.running) < self.max_seqs:
            s = self.waiting[0]
            n = s.target - s.prefilled
            if n > budget or not self.kv.can_admit(s.id, n):
                break
            budget -= n
            self.admit(self.waiting.popleft(), n)
            out.append((s, n))
        return out

    def admit_chunks(self, budget: int) -> list[tuple[Seq, int]]:
        """FCFS admission while a slot, ``budget`` tokens and KV space are left, each prompt chunked
        to the budget that remains (chunked prefill)."""
        out: list[tuple[Seq, int]] = []
        while self.waiting and len(self.running) < self.max_seqs and budget > 0:
            s = self.waiting[0]
            n = min(s.target - s.prefilled, budget)
            if not self.kv.can_admit(s.id, n):
                break
            self.admit(self.waiting.popleft(), n)
            out.append((s, n))
            budget -= n
        return out

    def reserve_decode(self, seqs: list[Seq]) -> list[Seq]:
        """Reserve one KV token per decoding sequence, preempting the latest admitted when full."""
        out = []
        for s in sorted(seqs, key=lambda q: q.order):
            if s not in self.running:
                continue  # preempted while making room
            while not self.kv.grow(s.id, 1):
                if self.preempt_latest() is s:
                    break
            else:
                out.append(s)
        return [s for s in out if s in self.running]

    def preempt_latest(self) -> Seq:
        """Preempt the most recently admitted running sequence (recompute) and return it."""
        victim = max((q for q in self.running if not q.padding), key=lambda q: q.order)
        self._preempt(victim)
        return victim

    def _preempt(self, s: Seq) -> None:
        self.kv.free(s.id)
        self.running.remove(s)
        s.res.preemptions += 1
        s.prefilled, s.target = 0, s.prompt + s.generated
        self.preempted.append(s)

    def next_work(self) -> Work | None:
        """The next iteration under this replica's policy and role, or None when idle."""
        return self.policy.next_work(self)


class SchedulingPolicy(ABC):
    """Which sequences a replica runs in its next iteration. Subclasses set ``key`` (the name
    users type), may set ``disaggregated`` (prefill and decode replicas apart) and
    ``chunks_prompts`` (prompts longer than ``max_batched_tokens`` are fine), implement
    :meth:`next_work`, and may change what happens to a finished sequence."""

    key: ClassVar[Enum]
    disaggregated: ClassVar[bool] = False
    chunks_prompts: ClassVar[bool] = False

    @abstractmethod
    def next_work(self, rep: ReplicaState) -> Work | None:
        """The next iteration of ``rep`` (admitting, chunking, preempting as it goes), or None when idle."""

    def finished(self, rep: ReplicaState, s: Seq) -> None:
        """``s`` generated its last token (its KV blocks are freed already): it leaves the batch."""
        rep.running.remove(s)

    def after_iteration(self, rep: ReplicaState) -> None:
        """Called when an iteration of ``rep`` has ended and its finished sequences were handled."""
        return None


POLICIES: EnumRegistry[type[SchedulingPolicy]] = EnumRegistry(
    "policy", SchedulingPolicy, builtin_modules=("whatif.predictors.serving.policies",),
    entry_point_group="whatif.serving_policies", plural="policies", error=WorkloadError)
register_policy = POLICIES.register
