"""Request-level discrete-event serving simulator (LLM and DiT).

Events come off a heap keyed ``(time_ns, priority, sequence number)``: arrivals (0) before KV
hand-offs (1) before iteration ends (2) before idle-replica kicks (3) at the same instant, so a
request arriving exactly when an iteration ends is seen by the next one (as the example server's
loop does), and simultaneous arrivals at an idle replica start one iteration together. Same
inputs, same result: nothing is random here (arrivals are drawn, seeded, in :mod:`.arrivals`).
"""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from whatif.core.bounds import check_fields
from whatif.core.limits import MAX_DURATION_NS, MAX_GPUS, MAX_INT_PARAMETER, MAX_TOKENS

from .arrivals import RequestSpec, WorkloadError
from .capacity import Capacity, GpuMemory, engine_capacity
from .engine_defaults import DEFAULT_MAX_MODEL_LEN, EngineName, EngineProfile, engine_key, engine_profile
from .iteration_costs import RangeTally
from .iteration_model import DitStepModel
from .kvcache import KVCache
from .logs import LLMBatch
from .metrics import RequestResult, stats, summarize
from .routers import ROUTERS, RouterName
from .scheduler import POLICIES, ReplicaState, Role, Seq, Work

ARRIVE, HANDOFF, DONE, KICK = 0, 1, 2, 3


@dataclass
class SchedulerConfig:
    """Serving system: engine, policy, limits, KV cache and replicas (token counts in tokens).

    ``engine_profile`` picks the defaults (:mod:`.engine_defaults`) of every figure left ``None``: the
    policy, sequence and token caps, KV block size, prefix caching; with the recording's memory
    model they size the KV cache too (:mod:`.capacity`). ``policy`` and ``router`` are registry
    keys (:data:`~.scheduler.POLICIES`, :data:`~.routers.ROUTERS`); their names (``"chunked"``)
    are accepted too. Each field's ``help`` (and, where the command line spells it differently,
    ``flag``, ``aliases``, ``cli_scale``) is its ``whatif serve`` option.
    """

    engine_profile: Enum | None = field(default=None, metadata={
        "help": "the serving engine whose settings size a replica and fill every figure not given "
                "(default: the engine whose adapter found the iterations, else examples; "
                "docs/serving.md \"Engine profiles\")",
        "choices": tuple(e.value for e in EngineName)})
    policy: Enum | None = field(default=None, metadata={
        "help": "scheduling policy (default: the engine's; docs/serving.md)", "choices": POLICIES.names})
    max_seqs: int | None = field(default=None, metadata={
        "minimum": 1, "maximum": MAX_TOKENS, "help": "sequence slots per replica (default: the engine's)",
        "aliases": ("--max-batch",)})
    max_batched_tokens: int | None = field(default=None, metadata={
        "minimum": 1, "maximum": MAX_TOKENS, "help": "tokens one iteration may compute (default: the engine's)"})
    chunk_tokens: int | None = field(default=None, metadata={"minimum": 1, "maximum": MAX_TOKENS,
        "help": "chunked: token budget per iteration (default max batched tokens)"})
    kv_capacity_tokens: int | None = field(default=None, metadata={"minimum": 1, "maximum": MAX_INT_PARAMETER,
        "help": "KV-cache tokens per replica (default: the memory model of the recorded model and GPU under the "
                "engine's memory fraction; unlimited without transformer blocks or a cataloged GPU)"})
    kv_block_tokens: int | None = field(default=None, metadata={
        "minimum": 1, "maximum": MAX_TOKENS, "help": "tokens per KV-cache block (default: the engine's)"})
    max_model_len: int = field(default=DEFAULT_MAX_MODEL_LEN, metadata={"minimum": 1, "maximum": MAX_TOKENS,
        "help": "the model's context length (vLLM V0's batched tokens, SGLang's request pool)"})
    prefix_caching: bool | None = field(default=None, metadata={
        "help": "shared prompt prefixes (--prefix-share) are cached (default: the engine's)"})
    kv_watermark: float = field(default=0.0, metadata={"minimum": 0, "maximum": 1,
        "help": "fraction of KV blocks a new admission must leave free (vLLM V0's and Vidur's default: 0.01)"})
    replicas: int = field(default=1, metadata={
        "minimum": 1, "maximum": MAX_GPUS, "help": "replicas (disagg: decode replicas)"})
    prefill_replicas: int = field(default=1, metadata={
        "minimum": 1, "maximum": MAX_GPUS, "help": "disagg: prefill replicas"})
    kv_transfer_ns_per_token: float | None = field(default=None, metadata={"minimum": 0, "maximum": MAX_DURATION_NS,
        "help": "disagg: KV hand-off time per token (us; default: KV bytes per token over the GPU's peer link, "
                "0 without a memory model)", "flag": "--kv-transfer-us-per-token", "cli_scale": 1e3})
    router: Enum = field(default=RouterName.LEAST_LOADED, metadata={
        "help": "which replica a request joins", "choices": ROUTERS.names})

    def __post_init__(self) -> None:
        self.engine_profile = None if self.engine_profile is None else engine_key(self.engine_profile)
        self.policy = None if self.policy is None else POLICIES.key(self.policy)
        self.router = ROUTERS.key(self.router)
        self.check()

    @property
    def engine(self) -> Enum:
        """The engine profile in force: the one given, else the examples'."""
        return self.engine_profile if self.engine_profile is not None else EngineName.EXAMPLES

    @property
    def profile(self) -> EngineProfile:
        return engine_profile(self.engine)

    @property
    def policy_key(self) -> Enum:
        """The policy simulated: the one given, else the engine's."""
        return self.policy if self.policy is not None else self.profile.policy

    @property
    def caches_prefixes(self) -> bool:
        return self.profile.prefix_caching if self.prefix_caching is None else self.prefix_caching

    def check(self) -> None:
        """Every field within the bounds its metadata declares (also after fields were reassigned)."""
        check_fields(self, WorkloadError)

    def capacity(self, capacity: Capacity | None = None) -> Capacity:
        """The figures a replica serves with: ``capacity`` (default: the engine's without a memory
        model, KV unlimited) with the ones this config gives put in their place; the sequence cap,
        when not given, follows the engine's rule from the token budget and KV tokens in force."""
        base = capacity or engine_capacity(self.engine, None, GpuMemory(), max_model_len=self.max_model_len,
                                           why="no memory model")
        cap = base.with_given(max_seqs=self.max_seqs, max_batched_tokens=self.max_batched_tokens,
                              block_tokens=self.kv_block_tokens, kv_tokens=self.kv_capacity_tokens,
                              kv_transfer_ns_per_token=self.kv_transfer_ns_per_token)
        if self.max_seqs is not None:
            return cap
        return replace(cap, max_seqs=self.profile.max_seqs(cap.gpu, cap.max_batched_tokens, cap.kv_tokens,
                                                           self.max_model_len))

    def to_dict(self) -> dict[str, Any]:
        return {k: v.value if isinstance(v, Enum) else v for k, v in vars(self).items()}


@dataclass
class SimResult:
    """Per-request rows (``RequestResult.to_dict``), the aggregate summary, iteration counts, and
    the iterations whose batch left the iteration model's range (per driver, and the values the
    drivers took there)."""

    requests: list[dict[str, Any]]
    summary: dict[str, Any]
    iterations: dict[str, int] = field(default_factory=dict)
    extrapolated_iterations: int = 0
    extrapolated_drivers: dict[str, int] = field(default_factory=dict)
    extrapolated_values: dict[str, tuple[float, float]] = field(default_factory=dict)  # driver -> (min, max) beyond

    def with_tally(self, tally: RangeTally) -> SimResult:
        """This result with the iterations ``tally`` counted beyond the model's range."""
        return replace(self, extrapolated_iterations=tally.iterations, extrapolated_drivers=dict(tally.drivers),
                       extrapolated_values=dict(tally.values))


def simulate_llm(requests: list[RequestSpec], time_ns: Callable[[LLMBatch], float], cfg: SchedulerConfig,
                 slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None,
                 capacity: Capacity | None = None) -> SimResult:
    """Serve ``requests`` with iteration times from ``time_ns`` (e.g. ``IterationModel.time_ns``)
    on replicas of ``capacity`` (default: the engine's figures, KV unlimited), the figures ``cfg``
    gives put in their place (:meth:`SchedulerConfig.capacity`)."""
    cfg.check()
    if not requests:
        raise WorkloadError("no requests to simulate")
    cap = cfg.capacity(capacity)
    chunk = cfg.chunk_tokens or cap.max_batched_tokens
    policy = POLICIES.get(cfg.policy_key)()
    cached = cfg.caches_prefixes

    def replica(i: int, role: Role) -> ReplicaState:
        return ReplicaState(i, role, policy, cap.max_seqs, cap.max_batched_tokens, chunk,
                            KVCache(cap.kv_tokens, cap.block_tokens, cfg.kv_watermark))

    if policy.disaggregated:
        front = [replica(i, Role.PREFILL) for i in range(cfg.prefill_replicas)]
        back = [replica(cfg.prefill_replicas + i, Role.DECODE) for i in range(cfg.replicas)]
    else:
        front = back = [replica(i, Role.MIXED) for i in range(cfg.replicas)]
    everyone = front + ([] if back is front else back)
    for r in requests:
        need = r.prompt_tokens + r.output_tokens
        if not policy.chunks_prompts and r.prompt_tokens > cap.max_batched_tokens:
            raise WorkloadError(f"request {r.id}: prompt_tokens {r.prompt_tokens} exceeds max batched tokens "
                                f"{cap.max_batched_tokens} (it could never be scheduled)")
        if not everyone[0].kv.fits_ever(need):
            raise WorkloadError(f"request {r.id}: {need} tokens do not fit in the KV cache "
                                f"({cap.kv_tokens} tokens)")
    router = ROUTERS.get(cfg.router)
    route_in, route_out = router(front), router(back)
    results = [RequestResult(r.id, r.arrival_s * 1e9, r.prompt_tokens, r.output_tokens) for r in requests]
    heap: list[tuple[float, int, int, Any]] = []
    counter = itertools.count()

    def push(t: float, kind: int, data: Any) -> None:
        heapq.heappush(heap, (t, kind, next(counter), data))

    for res, spec in zip(results, requests):
        push(res.arrival_ns, ARRIVE, Seq(res, spec.prompt_tokens, spec.output_tokens, target=spec.prompt_tokens,
                                         prefilled=min(spec.cached_tokens, spec.prompt_tokens - 1) if cached else 0))
    busy = dict.fromkeys(range(len(everyone)), 0.0)
    current: dict[int, Work] = {}
    kicked: set[int] = set()
    counts = {"prefill": 0, "decode": 0, "mixed": 0}

    def start(rep: ReplicaState, now: float) -> None:
        work = rep.next_work()
        for s in rep.preempted:  # disagg decode replicas send preempted sequences back to prefill
            (route_in.pick() if rep.role is Role.DECODE else rep).waiting.appendleft(s)
        rep.preempted.clear()
        if work is None:
            return
        for s, _ in work.prefill:
            if s.res.admitted_ns is None:
                s.res.admitted_ns, s.res.replica = now, rep.index
        batch = work.batch()
        dur = max(float(time_ns(batch)), 1.0)
        counts[batch.phase] += 1
        busy[rep.index] += dur
        current[rep.index] = work
        push(now + dur, DONE, rep)

    def finish(rep: ReplicaState, now: float) -> None:
        work = current.pop(rep.index)
        emitted = [s for s in work.decode if not s.padding]
        for s, n in work.prefill:
            s.prefilled += n
            if not s.in_prefill:
                emitted.append(s)
        for s in emitted:
            s.generated += 1
            s.res.token_ns.append(now)
        for s in emitted:
            if s.done:
                rep.kv.free(s.id)
                policy.finished(rep, s)
            elif rep.role is Role.PREFILL:
                rep.kv.free(s.id)
                rep.running.remove(s)
                push(now + cap.kv_transfer_ns_per_token * s.prefilled, HANDOFF, s)
        policy.after_iteration(rep)

    while heap:
        now, kind, _, data = heapq.heappop(heap)
        if kind == ARRIVE:
            rep = route_in.pick()
            rep.waiting.append(data)
        elif kind == HANDOFF:
            rep = route_out.pick()
            rep.waiting.append(data)
        elif kind == DONE:
            rep = data
            finish(rep, now)
            start(rep, now)
            continue
        else:
            kicked.discard(data.index)
            if data.index not in current:
                start(data, now)
            continue
        if rep.index not in current and rep.index not in kicked:
            kicked.add(rep.index)
            push(now, KICK, rep)
    unfinished = [r.id for r in results if len(r.token_ns) < r.output_tokens]
    if unfinished:
        raise WorkloadError(f"{len(unfinished)} requests never finished (first: {unfinished[0]}); "
                            "check max_seqs / KV capacity")
    rows = [r.to_dict() for r in results]
    summary = summarize(rows, list(busy.values()), slo_ttft_ms, slo_tpot_ms)
    summary["iterations"] = counts
    return SimResult(rows, summary, counts)


def simulate_dit(arrivals_s: list[float], model: DitStepModel, steps: int, tokens: int, max_batch: int,
                 cfg_guidance: bool = True, replicas: int = 1,
                 shapes: list[tuple[int, int]] | None = None) -> SimResult:
    """Dynamic batching as examples/dit_serve.py: an idle replica takes up to ``max_batch`` waiting
    requests (FCFS) and runs ``steps`` denoising steps on them (model batch doubled with CFG); every
    request of a batch finishes when the batch does. ``shapes``: each request's ``(steps, latent
    tokens)``, in the order of ``arrivals_s`` (default: all ``(steps, tokens)``); a batch then takes
    the waiting requests of the first one's shape (a batch shares one latent size and schedule).
    The denoising steps run at a model batch or token count beyond the range ``model`` was fitted
    on are counted (:meth:`DitStepModel.extrapolation`, ``extrapolated_*`` of the result)."""
    if max_batch < 1 or steps < 1 or replicas < 1:
        raise WorkloadError("max_batch, steps and replicas must be >= 1")
    if shapes is not None and len(shapes) != len(arrivals_s):
        raise WorkloadError(f"{len(shapes)} request shapes for {len(arrivals_s)} arrivals")
    order = sorted(range(len(arrivals_s)), key=lambda k: arrivals_s[k])
    shape = [(steps, tokens) if shapes is None else shapes[k] for k in order]
    heap: list[tuple[float, int, int, Any]] = []
    counter = itertools.count()
    for i, a in enumerate(sorted(arrivals_s)):
        heapq.heappush(heap, (a * 1e9, ARRIVE, next(counter), i))
    waiting: list[int] = []
    free = list(range(replicas))
    busy = [0.0] * replicas
    start_ns: dict[int, float] = {}
    end_ns: dict[int, float] = {}
    arrival = {i: a * 1e9 for i, a in enumerate(sorted(arrivals_s))}
    batches = steps_run = 0
    tally = RangeTally()

    def launch(now: float) -> None:
        nonlocal batches, steps_run
        while waiting and free:
            rep = free.pop(0)
            head = shape[waiting[0]]
            batch = [i for i in waiting if shape[i] == head][:max_batch]
            waiting[:] = [i for i in waiting if i not in batch]
            mb = len(batch) * (2 if cfg_guidance else 1)
            dur = head[0] * model.step_ns(mb, head[1]) + model.batch_overhead_ns
            tally.add(model.extrapolation(mb, head[1]), head[0])
            busy[rep] += dur
            batches += 1
            steps_run += head[0]
            for i in batch:
                start_ns[i], end_ns[i] = now, now + dur
            heapq.heappush(heap, (now + dur, DONE, next(counter), rep))

    while heap:
        now, kind, _, data = heapq.heappop(heap)
        if kind == ARRIVE:
            waiting.append(data)
            heapq.heappush(heap, (now, KICK, next(counter), None))
        elif kind == DONE:
            free.append(data)
            free.sort()
            launch(now)
        else:
            launch(now)
    rows = [{"id": i, "arrival_s": arrival[i] / 1e9, "queue_ms": (start_ns[i] - arrival[i]) / 1e6,
             "service_ms": (end_ns[i] - start_ns[i]) / 1e6, "latency_ms": (end_ns[i] - arrival[i]) / 1e6}
            for i in sorted(arrival)]
    dur = max(end_ns.values()) / 1e9 - min(arrival.values()) / 1e9
    summary = {"num_requests": len(rows), "num_batches": batches, "duration_s": dur,
               "throughput_req_per_s": len(rows) / dur if dur > 0 else None,
               **{k: stats([r[k] for r in rows]) for k in ("latency_ms", "queue_ms", "service_ms")},
               "step_ms_at_full_batch": model.step_ns(max_batch * (2 if cfg_guidance else 1), tokens) / 1e6,
               "busy_fraction": sum(busy) / 1e9 / (replicas * dur) if dur > 0 else None}
    return SimResult(rows, summary, {"denoise": steps_run}).with_tally(tally)
