"""A small LLM server: decoder-only transformer, KV cache, continuous batching, real time.

Random weights, pure torch, seedable; runs on CPU in seconds and on a GPU unchanged::

    python examples/llm_serve.py --log llm.json                  # 20 Poisson requests
    python examples/llm_serve.py --workload reqs.csv --device cuda
    whatif record examples/llm_serve.py -- --log llm.json

Model: token + learned position embedding, ``--layers`` x (RMSNorm, multi-head attention,
RMSNorm, SwiGLU MLP), RMSNorm, LM head. The KV cache is preallocated per sequence slot:
per layer one ``[max_batch, heads, max_seq, head_dim]`` tensor for K and one for V; a
running request owns one slot.

Scheduler (vLLM's default, one kind of work per iteration): every iteration first admits
waiting requests (arrival time passed) in arrival order while there is a free slot
(``--max-batch`` running sequences) and the admitted prompts fit in ``--max-batched-tokens``;
if it admitted any, the iteration is a *prefill* of all of them (packed into one sequence,
block-diagonal causal mask), which produces each one's first token; otherwise it is a
*decode* step of every running request (one token each). Sampling is greedy. A request
finishes after ``output_tokens`` tokens (the first one comes from prefill) and frees its slot.
Each iteration runs under ``whatif.phase("prefill")`` or ``whatif.phase("decode")`` and ends
with ``whatif.step()``, so one step == one scheduler iteration.

Requests arrive in wall-clock time (Poisson at ``--rate`` req/s, first one at 0 s, or from
``--workload FILE``); when nothing can run the server sleeps until the next arrival, so
the measured TTFT includes queueing. The device is synchronized before every timestamp.

Log (``--log OUT.json``); every ``*_s`` is seconds since the server started (``t0``),
every ``*_ms`` a duration in milliseconds::

    {"schema": "whatif.examples.llm_serve/1",
     "config": {<every CLI option>, "device", "dtype", "num_params", "torch_version"},
     "clock": {"t0_unix_s", "t0_perf_counter_s"},
     "requests": [{"id", "arrival_s", "admitted_s", "first_token_s", "finish_s",
                   "prompt_tokens", "output_tokens", "queue_ms", "ttft_ms",
                   "tpot_ms" (null when output_tokens == 1), "e2e_ms",
                   "token_times_s": [...], "output_token_ids": [...]}],
     "iterations": [{"index", "phase" ("prefill"|"decode"), "start_s", "end_s",
                     "duration_ms", "batch_size", "num_tokens", "request_ids",
                     "num_running" (sequences holding a slot when the iteration started)}],
     "summary": {"num_requests", "num_iterations", "num_prefill_iterations",
                 "num_decode_iterations", "duration_s", "output_tokens",
                 "output_throughput_tok_s", "total_throughput_tok_s",
                 "ttft_ms"|"tpot_ms"|"e2e_ms"|"queue_ms": {"mean", "p50", "p90", "p99"}}}

Workload files: CSV with a header, or JSONL, with ``arrival_s``, ``prompt_tokens`` and
``output_tokens`` per request (arrival in seconds from the start).
"""
from __future__ import annotations

import argparse
import collections
import csv
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _runtime import (
    add_runtime_args,
    attention_backend,
    json_safe,
    pick_device,
    pick_dtype,
    poisson_schedule,
    set_threads,
    sleep_until,
    stats,
)
from torch import nn

import whatif

SCHEMA = "whatif.examples.llm_serve/1"


# ----------------------------------------------------------------------------- model


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class KVCache:
    """Preallocated K/V per layer: ``[num_slots, heads, max_seq, head_dim]``; one slot per sequence."""

    def __init__(self, layers: int, num_slots: int, heads: int, max_seq: int, head_dim: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        shape = (num_slots, heads, max_seq, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)]


class Attention(nn.Module):
    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model {d_model} is not a multiple of heads {heads}")
        self.heads, self.head_dim = heads, d_model // heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[..., d_model]`` -> q, k, v each ``[..., heads, head_dim]``."""
        q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, self.head_dim)).unbind(-3)
        return q, k, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Full causal attention without a cache; ``x``: ``[batch, seq, d_model]``."""
        q, k, v = (t.transpose(1, 2) for t in self._qkv(x))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(o.transpose(1, 2).flatten(2))

    def prefill(self, x: torch.Tensor, mask: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Packed prompts ``x``: ``[tokens, d_model]``; writes each token's K/V to its slot."""
        q, k, v = self._qkv(x)
        k_cache[slots, :, positions] = k
        v_cache[slots, :, positions] = v
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(o.squeeze(0).transpose(0, 1).flatten(1))

    def decode(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               slots: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """One new token per sequence, ``x``: ``[batch, d_model]``; attends to its cached prefix."""
        q, k, v = self._qkv(x)
        k_cache[slots, :, positions] = k
        v_cache[slots, :, positions] = v
        length = mask.shape[-1]
        keys, values = k_cache[slots, :, :length], v_cache[slots, :, :length]
        o = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=mask)
        return self.out(o.flatten(1))


class MLP(nn.Module):
    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.gate_up = nn.Linear(d_model, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    """One layer's weights; :class:`TinyLM` runs them in its full / prefill / decode paths."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.attn_norm, self.attn = RMSNorm(d_model), Attention(d_model, heads)
        self.mlp_norm, self.mlp = RMSNorm(d_model), MLP(d_model, 4 * d_model)


class TinyLM(nn.Module):
    """Decoder-only transformer with three entry points: full forward, prefill, decode."""

    def __init__(self, vocab: int, d_model: int, layers: int, heads: int, max_seq: int) -> None:
        super().__init__()
        self.max_seq, self.heads, self.head_dim = max_seq, heads, d_model // heads
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_seq, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.norm = RMSNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def new_cache(self, num_slots: int) -> KVCache:
        p = self.head.weight
        return KVCache(len(self.blocks), num_slots, self.heads, self.max_seq, self.head_dim,
                       p.device, p.dtype)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Reference path without a cache: ``[batch, seq]`` token ids -> ``[batch, seq, vocab]`` logits."""
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        h = self.embed(tokens) + self.pos(pos)
        for b in self.blocks:
            h = h + b.attn(b.attn_norm(h))
            h = h + b.mlp(b.mlp_norm(h))
        return self.head(self.norm(h))

    def prefill(self, prompts: list[list[int]], slots: list[int], cache: KVCache) -> torch.Tensor:
        """Run the prompts packed into one sequence, fill their cache slots; ``[n, vocab]`` last-token logits."""
        dev = self.head.weight.device
        lens = [len(p) for p in prompts]
        tokens = torch.tensor([t for p in prompts for t in p], device=dev)
        positions = torch.tensor([i for n in lens for i in range(n)], device=dev)
        seq = torch.tensor([j for j, n in enumerate(lens) for _ in range(n)], device=dev)
        tok_slots = torch.tensor([slots[j] for j, n in enumerate(lens) for _ in range(n)], device=dev)
        causal = torch.ones(len(seq), len(seq), dtype=torch.bool, device=dev).tril()
        mask = causal & (seq[:, None] == seq[None, :])
        h = self.embed(tokens) + self.pos(positions)
        for i, b in enumerate(self.blocks):
            h = h + b.attn.prefill(b.attn_norm(h), mask, cache.k[i], cache.v[i], tok_slots, positions)
            h = h + b.mlp(b.mlp_norm(h))
        last = torch.tensor(lens, device=dev).cumsum(0) - 1
        return self.head(self.norm(h[last]))

    def decode(self, tokens: list[int], positions: list[int], slots: list[int],
               cache: KVCache) -> torch.Tensor:
        """One token per sequence at ``positions`` (= tokens already cached); ``[batch, vocab]`` logits."""
        dev = self.head.weight.device
        tok = torch.tensor(tokens, device=dev)
        pos = torch.tensor(positions, device=dev)
        slot = torch.tensor(slots, device=dev)
        length = max(positions) + 1
        mask = (torch.arange(length, device=dev)[None, :] <= pos[:, None])[:, None, None, :]
        h = self.embed(tok) + self.pos(pos)
        for i, b in enumerate(self.blocks):
            h = h + b.attn.decode(b.attn_norm(h), cache.k[i], cache.v[i], slot, pos, mask)
            h = h + b.mlp(b.mlp_norm(h))
        return self.head(self.norm(h))


def build_model(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> TinyLM:
    """Random weights from ``--seed`` (drawn on the CPU, so identical on every device)."""
    torch.manual_seed(args.seed)
    model = TinyLM(args.vocab, args.d_model, args.layers, args.heads, args.max_seq)
    return model.to(device=device, dtype=dtype).eval()


# ----------------------------------------------------------------------------- requests


@dataclass
class Request:
    id: int
    arrival_s: float
    prompt: list[int]
    output_tokens: int
    slot: int = -1
    admitted_s: float | None = None
    finish_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)

    @property
    def cached_tokens(self) -> int:
        """Tokens whose K/V are in the cache: the prompt plus every output but the last."""
        return len(self.prompt) + len(self.output_ids) - 1

    @property
    def done(self) -> bool:
        return len(self.output_ids) >= self.output_tokens


def read_workload(path: Path) -> list[tuple[float, int, int]]:
    """(arrival_s, prompt_tokens, output_tokens) rows from a CSV (with header) or JSONL file."""
    text = path.read_text()
    if path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        rows = list(csv.DictReader(text.splitlines()))
    try:
        return [(float(r["arrival_s"]), int(r["prompt_tokens"]), int(r["output_tokens"])) for r in rows]
    except KeyError as e:
        raise ValueError(f"{path}: every row needs arrival_s, prompt_tokens, output_tokens (missing {e})") from None


def make_requests(args: argparse.Namespace) -> list[Request]:
    """The seeded request list, sorted by arrival; prompt token ids are random in ``[0, vocab)``."""
    rng = random.Random(args.seed)
    if args.workload:
        specs = read_workload(Path(args.workload))
        if args.num_requests is not None:
            specs = specs[: args.num_requests]
    else:
        n = 20 if args.num_requests is None else args.num_requests
        arrivals = poisson_schedule(n, args.rate, rng)
        specs = [(a, rng.randint(args.prompt_min, args.prompt_max),
                  rng.randint(args.output_min, args.output_max)) for a in arrivals]
    specs.sort(key=lambda s: s[0])
    reqs = []
    for i, (arrival, p_len, o_len) in enumerate(specs):
        check_request(i, p_len, o_len, args)
        prompt = [rng.randrange(args.vocab) for _ in range(p_len)]
        reqs.append(Request(i, max(0.0, arrival), prompt, o_len))
    return reqs


def check_request(i: int, prompt_tokens: int, output_tokens: int, args: argparse.Namespace) -> None:
    if prompt_tokens < 1 or output_tokens < 1:
        raise ValueError(f"request {i}: prompt_tokens and output_tokens must be >= 1")
    if prompt_tokens + output_tokens > args.max_seq:
        raise ValueError(f"request {i}: prompt_tokens + output_tokens = {prompt_tokens + output_tokens}"
                         f" exceeds --max-seq {args.max_seq}")
    if prompt_tokens > args.max_batched_tokens:
        raise ValueError(f"request {i}: prompt_tokens {prompt_tokens} exceeds --max-batched-tokens"
                         f" {args.max_batched_tokens}")


# ----------------------------------------------------------------------------- server


class Server:
    """Continuous-batching loop in wall-clock time; fills ``requests`` and ``iterations``."""

    def __init__(self, model: TinyLM, requests: list[Request], max_batch: int,
                 max_batched_tokens: int, device: torch.device) -> None:
        self.model, self.requests, self.device = model, requests, device
        self.max_batch, self.max_batched_tokens = max_batch, max_batched_tokens
        self.cache = model.new_cache(max_batch)
        self.free_slots = list(range(max_batch))
        self.iterations: list[dict[str, Any]] = []
        self.t0 = self.t0_unix = 0.0

    def now(self) -> float:
        """Seconds since start, after the device finished all queued work."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - self.t0

    def run(self) -> None:
        pending = collections.deque(self.requests)
        waiting: collections.deque[Request] = collections.deque()
        running: list[Request] = []
        self.t0, self.t0_unix = time.perf_counter(), time.time()
        while pending or waiting or running:
            now = self.now()
            while pending and pending[0].arrival_s <= now:
                waiting.append(pending.popleft())
            if not waiting and not running:
                sleep_until(pending[0].arrival_s, self.now)
                continue
            admitted = self.admit(waiting, len(running))
            if admitted:
                self.prefill(admitted, len(running))
                running.extend(admitted)
            else:
                self.decode(running)
            for r in [r for r in running if r.done]:
                r.finish_s = r.token_times_s[-1]
                self.free_slots.append(r.slot)
                running.remove(r)
            whatif.step()

    def admit(self, waiting: collections.deque[Request], num_running: int) -> list[Request]:
        """Pop waiting requests (FCFS) while a slot is free and the prompts fit the token budget."""
        admitted: list[Request] = []
        tokens = 0
        while waiting and num_running + len(admitted) < self.max_batch:
            n = len(waiting[0].prompt)
            if tokens + n > self.max_batched_tokens:
                break
            tokens += n
            admitted.append(waiting.popleft())
        return admitted

    def prefill(self, batch: list[Request], num_running: int) -> None:
        start = self.now()
        for r in batch:
            r.slot, r.admitted_s = self.free_slots.pop(0), start
        with whatif.phase("prefill"):
            logits = self.model.prefill([r.prompt for r in batch], [r.slot for r in batch], self.cache)
            next_ids = logits.argmax(-1).tolist()
        self.finish_iteration("prefill", start, batch, next_ids, sum(len(r.prompt) for r in batch),
                              num_running)

    def decode(self, batch: list[Request]) -> None:
        start = self.now()
        with whatif.phase("decode"):
            logits = self.model.decode([r.output_ids[-1] for r in batch],
                                       [r.cached_tokens for r in batch],
                                       [r.slot for r in batch], self.cache)
            next_ids = logits.argmax(-1).tolist()
        self.finish_iteration("decode", start, batch, next_ids, len(batch), len(batch))

    def finish_iteration(self, phase: str, start: float, batch: list[Request], next_ids: list[int],
                         num_tokens: int, num_running: int) -> None:
        end = self.now()
        for r, t in zip(batch, next_ids):
            r.output_ids.append(int(t))
            r.token_times_s.append(end)
        self.iterations.append({
            "index": len(self.iterations), "phase": phase, "start_s": start, "end_s": end,
            "duration_ms": (end - start) * 1e3, "batch_size": len(batch), "num_tokens": num_tokens,
            "request_ids": [r.id for r in batch], "num_running": num_running,
        })


def warm_up(model: TinyLM, args: argparse.Namespace) -> None:
    """One untimed prefill + decode so one-time initialization is not charged to request 0."""
    cache = model.new_cache(1)
    n = min(args.prompt_min, args.max_seq - 1)
    logits = model.prefill([[0] * n], [0], cache)
    model.decode([int(logits.argmax(-1)[0])], [n], [0], cache).argmax(-1).tolist()


# ----------------------------------------------------------------------------- report


def request_record(r: Request) -> dict[str, Any]:
    assert r.admitted_s is not None and r.finish_s is not None
    first = r.token_times_s[0]
    n_out = len(r.output_ids)
    tpot = (r.finish_s - first) / (n_out - 1) * 1e3 if n_out > 1 else None
    return {
        "id": r.id, "arrival_s": r.arrival_s, "admitted_s": r.admitted_s, "first_token_s": first,
        "finish_s": r.finish_s, "prompt_tokens": len(r.prompt), "output_tokens": n_out,
        "queue_ms": (r.admitted_s - r.arrival_s) * 1e3, "ttft_ms": (first - r.arrival_s) * 1e3,
        "tpot_ms": tpot, "e2e_ms": (r.finish_s - r.arrival_s) * 1e3,
        "token_times_s": r.token_times_s, "output_token_ids": r.output_ids,
    }


def summarize(reqs: list[dict[str, Any]], iterations: list[dict[str, Any]]) -> dict[str, Any]:
    start = min(r["arrival_s"] for r in reqs)
    duration = max(r["finish_s"] for r in reqs) - start
    out_tokens = sum(r["output_tokens"] for r in reqs)
    all_tokens = out_tokens + sum(r["prompt_tokens"] for r in reqs)
    return {
        "num_requests": len(reqs), "num_iterations": len(iterations),
        "num_prefill_iterations": sum(it["phase"] == "prefill" for it in iterations),
        "num_decode_iterations": sum(it["phase"] == "decode" for it in iterations),
        "duration_s": duration, "output_tokens": out_tokens,
        "output_throughput_tok_s": out_tokens / duration if duration > 0 else None,
        "total_throughput_tok_s": all_tokens / duration if duration > 0 else None,
        **{k: stats([r[k] for r in reqs]) for k in ("ttft_ms", "tpot_ms", "e2e_ms", "queue_ms")},
    }


def one_line(s: dict[str, Any]) -> str:
    def ms(k: str) -> str:
        d = s[k]
        return "n/a" if d["mean"] is None else f"mean {d['mean']:.1f} p50 {d['p50']:.1f} p99 {d['p99']:.1f} ms"
    tput = s["output_throughput_tok_s"] or 0.0
    return (f"llm_serve: {s['num_requests']} requests, {s['num_iterations']} iterations "
            f"({s['num_prefill_iterations']} prefill, {s['num_decode_iterations']} decode) in "
            f"{s['duration_s']:.2f} s | TTFT {ms('ttft_ms')} | TPOT {ms('tpot_ms')} | "
            f"e2e {ms('e2e_ms')} | {tput:.0f} output tok/s")


# ----------------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--seed", type=int, default=0, help="seeds weights, arrivals, lengths, prompts")
    add_runtime_args(p)
    m = p.add_argument_group("model")
    m.add_argument("--layers", type=int, default=4)
    m.add_argument("--d-model", type=int, default=256)
    m.add_argument("--heads", type=int, default=4)
    m.add_argument("--vocab", type=int, default=1024)
    m.add_argument("--max-seq", type=int, default=256, help="cache length per sequence (tokens)")
    w = p.add_argument_group("workload")
    w.add_argument("--num-requests", type=int, default=None,
                   help="requests to generate (default 20); with --workload, keep the first N")
    w.add_argument("--rate", type=float, default=10.0, help="Poisson arrival rate (req/s); inf: all at 0")
    w.add_argument("--prompt-min", type=int, default=16, help="prompt tokens, uniform in [min, max]")
    w.add_argument("--prompt-max", type=int, default=64)
    w.add_argument("--output-min", type=int, default=32, help="output tokens, uniform in [min, max]")
    w.add_argument("--output-max", type=int, default=128)
    w.add_argument("--workload", default=None,
                   help="CSV/JSONL with arrival_s, prompt_tokens, output_tokens (replaces the Poisson schedule)")
    s = p.add_argument_group("scheduler")
    s.add_argument("--max-batch", type=int, default=8, help="max running sequences (= cache slots)")
    s.add_argument("--max-batched-tokens", type=int, default=512, help="max prompt tokens per prefill")
    s.add_argument("--warmup", type=int, default=1, help="untimed warm-up passes before serving")
    p.add_argument("--log", default=None, help="write the JSON log here")
    args = p.parse_args(argv)
    if args.prompt_min > args.prompt_max or args.output_min > args.output_max:
        p.error("--prompt-min/--output-min must not exceed --prompt-max/--output-max")
    if args.max_seq < 2 or args.max_batch < 1:
        p.error("--max-seq must be >= 2 and --max-batch >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = pick_device(args.device)
    set_threads(args.threads, device)
    dtype = pick_dtype(args.dtype, device)
    try:
        requests = make_requests(args)
        model = build_model(args, device, dtype)
    except (ValueError, OSError) as e:
        print(f"llm_serve: error: {e}", file=sys.stderr)
        return 2
    if not requests:
        print("llm_serve: error: no requests", file=sys.stderr)
        return 2
    with torch.inference_mode(), attention_backend(args.sdpa):
        for _ in range(args.warmup):
            warm_up(model, args)
        server = Server(model, requests, args.max_batch, args.max_batched_tokens, device)
        server.run()
    records = [request_record(r) for r in requests]
    summary = summarize(records, server.iterations)
    print(one_line(summary))
    if args.log:
        log = {
            "schema": SCHEMA,
            "config": {**json_safe(vars(args)), "device": str(device), "dtype": str(dtype).removeprefix("torch."),
                       "num_params": sum(p.numel() for p in model.parameters()),
                       "torch_version": torch.__version__},
            "clock": {"t0_unix_s": server.t0_unix, "t0_perf_counter_s": server.t0},
            "requests": records, "iterations": server.iterations, "summary": summary,
        }
        Path(args.log).parent.mkdir(parents=True, exist_ok=True)
        Path(args.log).write_text(json.dumps(log, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
