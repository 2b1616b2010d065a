"""A small Diffusion Transformer server: adaLN-Zero DiT, CFG, Euler sampler, batched requests.

Random weights, pure torch, seedable; runs on CPU in seconds and on a GPU unchanged::

    python examples/dit_serve.py --log dit.json                  # 8 images, 10 steps each
    python examples/dit_serve.py --frames 4 --resolution 16      # video: 4 x 64 tokens
    whatif record examples/dit_serve.py -- --log dit.json

Model (DiT, Peebles & Xie 2023): the latent ``[C, H, W]`` (or ``[C, F, H, W]`` for video,
``--frames F``) is cut into ``--patch`` x ``--patch`` patches per frame by a strided conv
(tokens = F x (H/p) x (W/p)), plus a learned position embedding; the conditioning vector is
a sinusoidal timestep embedding (MLP) plus a class embedding (one extra "null" class for
classifier-free guidance); ``--layers`` adaLN-Zero blocks (LayerNorm modulated by shift /
scale and a gate on each residual branch, self-attention over all tokens, GELU MLP); a
modulated final layer; unpatchify back to the latent shape. Weights are random (not the
zero init of training, which would make every block an identity).

Precision: ``--dtype`` converts the model (bfloat16 on cuda, float32 on cpu by default);
``--autocast bf16|fp16`` runs an fp32 model under ``torch.autocast`` instead (its GEMMs, convolutions
and attention in 16 bits, the rest in fp32).

Sampler: rectified-flow Euler (as SD3 / Flux / video DiTs): x starts as Gaussian noise at
t = 1, ``--steps`` uniform steps to t = 0, ``x += (t_next - t) * v``. With
``--cfg-scale`` > 1 every model call runs the batch twice (conditional and null class,
concatenated, so the model batch is 2 x the request batch) and mixes
``v = v_null + s * (v_cond - v_null)``.

Serving: requests arrive in wall-clock time (Poisson at ``--rate`` req/s, first one at
0 s; ``inf`` = all at once); when the server is idle it takes up to ``--batch`` waiting
requests (FCFS) and denoises them together, one ``whatif.phase("denoise")`` and one
``whatif.step()`` per denoising step, so a run has ceil-per-batch x ``--steps`` steps.
The device is synchronized before every timestamp.

Sequence parallelism (``--sp P``, DeepSpeed-Ulysses as xDiT runs it through yunchang's
``SeqAllToAll4D``): ``P`` processes started by torchrun (gloo on the CPU, NCCL on GPUs) each hold
the whole model and run the transformer blocks on ``tokens / P`` of the tokens: the embedded
sequence is cut into ``P`` chunks after the position embedding, and before attention an all-to-all
turns each rank's chunk of Q, K and V (all heads) into all tokens of ``heads / P`` heads, another
turns the attention output back (each all-to-all sends a contiguous copy of its input into a new
buffer, whose reshape is copied once more); after the last block the chunks are all-gathered, so
the final layer and the sampler run on every token, on every rank. Every rank serves the same
requests, so ``--sp`` needs ``--rate inf`` (the batches do not depend on each rank's clock).

``--ring R`` runs Ring attention (Liu et al. 2023, as ring-flash-attention's
``ring_flash_attn_forward`` does without a mask) over ``R`` of the ranks and Ulysses over the other
factor ``U = P/R`` (USP, Fang & Zhao 2024, the default of xDiT; ``--ring P`` is Ring alone): the
Ulysses all-to-all runs within each group of ``U`` neighbouring ranks, giving each rank ``tokens/R``
tokens of ``heads/U`` heads; then each of ``R`` steps sends the K, V block the rank holds to the next
rank of its ring while receiving the previous one's into new buffers, attends to the block it holds
(the flash kernel, which also returns the log-sum-exp) and folds the result into a running fp32
output (``out - sigmoid(lse_block - lse)·(out - out_block)``)::

    torchrun --nproc-per-node 2 -m whatif.cli record -o runs/sp2 --memory --record-shapes \
        examples/dit_serve.py -- --device cpu --rate inf --sp 2
    torchrun --nproc-per-node 4 -m whatif.cli record -o runs/usp --memory --record-shapes \
        examples/dit_serve.py -- --device cpu --rate inf --sp 4 --ring 2

Log (``--log OUT.json``); every ``*_s`` is seconds since the server started, every
``*_ms`` a duration in milliseconds::

    {"schema": "whatif.examples.dit_serve/1",
     "config": {<every CLI option>, "device", "dtype", "num_params", "tokens",
                "latent_shape", "torch_version"},
     "clock": {"t0_unix_s", "t0_perf_counter_s"},
     "requests": [{"id", "class_label", "batch_index", "arrival_s", "start_s", "end_s",
                   "queue_ms", "service_ms", "latency_ms"}],
     "batches": [{"index", "request_ids", "batch_size", "model_batch", "start_s", "end_s",
                  "duration_ms", "step_ms": [...], "latent_sum"}],
     "steps": [{"index", "batch_index", "step", "t", "model_batch", "start_s", "end_s",
                "duration_ms"}],
     "summary": {"num_requests", "num_batches", "num_steps", "duration_s",
                 "throughput_req_s", "latency_ms"|"queue_ms"|"service_ms"|"step_ms":
                 {"mean", "p50", "p90", "p99"}}}
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _runtime import (
    AUTOCAST_DTYPES,
    Collectives,
    add_runtime_args,
    attention_backend,
    join_torchrun,
    json_safe,
    mixed_precision,
    pick_device,
    pick_dtype,
    poisson_schedule,
    set_threads,
    sleep_until,
    stats,
)
from torch import nn

import whatif

SCHEMA = "whatif.examples.dit_serve/1"


# ----------------------------------------------------------------------------- model


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal embedding ``[N, dim]`` of (possibly fractional) timesteps ``t``: ``[N]``."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale[:, None]) + shift[:, None]


@dataclass
class SpGroups:
    """This rank's groups under ``--sp P --ring R`` (yunchang's layout with the Ulysses groups on
    neighbouring ranks): every rank (the all-gather), its Ulysses group (ranks ``g·U…g·U+U-1``,
    ``U = P/R``; None when ``U`` is 1) and its ring (ranks ``j, j+U, …``; None when ``R`` is 1)."""

    every: Collectives
    ulysses: Collectives | None
    ring: Collectives | None


SP: SpGroups | None = None
"""The ``--sp`` ranks' groups (None without ``--sp``)."""


def sp_rank_sets(sp: int, ring: int) -> dict[str, list[list[int]]]:
    """The ranks of every group of each kind of :class:`SpGroups`.

    >>> sp_rank_sets(4, 2)
    {'every': [[0, 1, 2, 3]], 'ulysses': [[0, 1], [2, 3]], 'ring': [[0, 2], [1, 3]]}
    """
    u = sp // ring
    return {"every": [list(range(sp))], "ulysses": [list(range(g * u, g * u + u)) for g in range(ring)],
            "ring": [list(range(j, sp, u)) for j in range(u)]}


def sp_groups(sp: int, ring: int, device: torch.device) -> SpGroups:
    """Make the groups of :class:`SpGroups` (on a GPU every rank makes every group, as
    ``dist.new_group`` asks)."""
    rank = dist.get_rank()
    mine: dict[str, Collectives] = {}
    for kind, groups in sp_rank_sets(sp, ring).items():
        for i, ranks in enumerate(groups):
            group = dist.new_group(ranks) if device.type == "cuda" and kind != "every" else None
            if rank in ranks and len(ranks) > 1:
                mine[kind] = (mine["every"] if len(ranks) == sp and "every" in mine
                              else Collectives(ranks, device, f"{kind}{i}", group))
    return SpGroups(mine["every"], mine.get("ulysses"), mine.get("ring"))


def exchange(got: torch.Tensor, send: torch.Tensor) -> None:
    """``all_to_all_single(got, send)`` over this rank's Ulysses group."""
    assert SP is not None and SP.ulysses is not None
    SP.ulysses.all_to_all(got, send)


def seq_to_heads(x: torch.Tensor, sp: int) -> torch.Tensor:
    """Ulysses' first all-to-all: ``[N, tokens/P, heads, d]`` on each rank -> ``[N, tokens, heads/P, d]``
    (rank r keeps heads ``r·H/P…``; the tokens in rank order)."""
    n, chunk, heads, d = x.shape
    send = x.reshape(n, chunk, sp, heads // sp, d).transpose(0, 2).contiguous()   # [P, chunk, N, H/P, d]
    got = torch.empty_like(send)
    exchange(got, send)
    return got.reshape(sp * chunk, n, heads // sp, d).transpose(0, 1).contiguous()


def heads_to_seq(x: torch.Tensor, sp: int) -> torch.Tensor:
    """Ulysses' second all-to-all, the inverse of :func:`seq_to_heads`: ``[N, tokens, heads/P, d]``
    -> ``[N, tokens/P, heads, d]``."""
    n, tokens, part, d = x.shape
    send = x.reshape(n, sp, tokens // sp, part, d).transpose(0, 3).transpose(0, 1).contiguous()   # [P, H/P, s, N, d]
    got = torch.empty_like(send)
    exchange(got, send)
    return got.reshape(sp * part, tokens // sp, n, d).transpose(0, 2).contiguous()


def gather_tokens(x: torch.Tensor, sp: int) -> torch.Tensor:
    """Every rank's ``[N, tokens/P, dim]`` chunk, all-gathered in rank order: ``[N, tokens, dim]``."""
    parts = [torch.empty_like(x) for _ in range(sp)]
    assert SP is not None
    SP.every.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=1)


def attention_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Bidirectional attention of ``[N, tokens, heads, d]`` tensors and its log-sum-exp
    (``[N, heads, tokens]``, fp32), as flash-attention's ``_flash_attn_forward`` returns them: the
    CPU's flash kernel, on a GPU the memory-efficient one (any dtype)."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if q.device.type == "cuda":
        out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True)
        lse = lse[..., :q.shape[2]]
    else:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False)
    return out.transpose(1, 2), lse


def merge_attention(out: torch.Tensor | None, lse: torch.Tensor | None, block_out: torch.Tensor,
                    block_lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold one block of keys' attention into the running output (fp32) and log-sum-exp, as
    ring-flash-attention's ``update_out_and_lse`` does (eager)."""
    block_out = block_out.to(torch.float32)
    block_lse = block_lse.transpose(-2, -1).unsqueeze(dim=-1)
    if out is None or lse is None:
        return block_out, block_lse
    out = out - torch.sigmoid(block_lse - lse) * (out - block_out)
    lse = lse - F.logsigmoid(lse - block_lse)
    return out, lse


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Ring attention (Liu et al. 2023) over this rank's ring, as ring-flash-attention's
    ``ring_flash_attn_forward`` runs it without a mask: ``[N, tokens/R, heads, d]`` each; every
    step sends the K, V block it holds to the next rank while receiving the previous one's into new
    buffers, attends to the block it holds and folds the result in (:func:`merge_attention`)."""
    assert SP is not None and SP.ring is not None
    k, v = k.contiguous(), v.contiguous()   # a fused QKV projection's are strided views
    out: torch.Tensor | None = None
    lse: torch.Tensor | None = None
    steps = len(SP.ring.ranks)
    for step in range(steps):
        if step + 1 != steps:
            next_k, next_v = torch.empty_like(k), torch.empty_like(v)
            pending = SP.ring.send_recv([next_k, next_v], [k, v])
        block_out, block_lse = attention_with_lse(q, k, v)
        out, lse = merge_attention(out, lse, block_out, block_lse)
        if step + 1 != steps:
            pending.wait()
            k, v = next_k, next_v
    assert out is not None
    return out.to(q.dtype)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, sp: int = 1, ring: int = 1) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"d_model {dim} is not a multiple of heads {heads}")
        if sp % ring:
            raise ValueError(f"--ring {ring} does not divide --sp {sp}")
        if heads % (sp // ring):
            raise ValueError(f"heads {heads} is not a multiple of the Ulysses degree {sp // ring} (--sp / --ring)")
        self.heads, self.sp, self.ulysses, self.ring = heads, sp, sp // ring, ring
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Bidirectional self-attention over all tokens; ``x``: ``[N, tokens, dim]`` (``tokens / P``
        of them with ``--sp P``)."""
        if self.sp == 1:
            q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)
            o = F.scaled_dot_product_attention(q, k, v)
            return self.proj(o.transpose(1, 2).flatten(2))
        q, k, v = self.qkv(x).unflatten(-1, (3, self.heads, -1)).unbind(2)
        if self.ulysses > 1:
            q, k, v = (seq_to_heads(t, self.ulysses) for t in (q, k, v))
        if self.ring > 1:
            o = ring_attention(q, k, v)
        else:
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
        if self.ulysses > 1:
            o = heads_to_seq(o, self.ulysses)
        return self.proj(o.flatten(2))


class DiTBlock(nn.Module):
    """adaLN-Zero block: modulated LayerNorm, gated attention and MLP residuals."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float = 4.0, sp: int = 1, ring: int = 1) -> None:
        super().__init__()
        hidden = int(dim * mlp_ratio)
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = Attention(dim, heads, sp, ring)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(approximate="tanh"),
                                 nn.Linear(hidden, dim))
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift1, scale1, gate1, shift2, scale2, gate2 = self.ada(c).chunk(6, dim=-1)
        x = x + gate1[:, None] * self.attn(modulate(self.norm1(x), shift1, scale1))
        return x + gate2[:, None] * self.mlp(modulate(self.norm2(x), shift2, scale2))


class DiT(nn.Module):
    """Latent ``[N, C, H, W]`` (image) or ``[N, C, F, H, W]`` (video) -> velocity of the same shape;
    with ``sp`` > 1 the blocks run on this rank's ``tokens / sp`` (module docstring)."""

    def __init__(self, channels: int, resolution: int, frames: int, patch: int, dim: int,
                 layers: int, heads: int, num_classes: int, sp: int = 1, ring: int = 1) -> None:
        super().__init__()
        if resolution % patch:
            raise ValueError(f"--resolution {resolution} is not a multiple of --patch {patch}")
        self.channels, self.patch, self.frames, self.sp = channels, patch, frames, sp
        self.grid = resolution // patch
        self.num_tokens = frames * self.grid ** 2
        if self.num_tokens % sp:
            raise ValueError(f"{self.num_tokens} tokens are not a multiple of --sp {sp}")
        self.num_classes = num_classes  # index num_classes is the null class
        self.patchify = nn.Conv2d(channels, dim, kernel_size=patch, stride=patch)
        self.pos = nn.Parameter(torch.randn(1, self.num_tokens, dim) * 0.02)
        self.t_mlp = nn.Sequential(nn.Linear(256, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.y_embed = nn.Embedding(num_classes + 1, dim)
        self.blocks = nn.ModuleList(DiTBlock(dim, heads, sp=sp, ring=ring) for _ in range(layers))
        self.final_norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.final_ada = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))
        self.final = nn.Linear(dim, patch * patch * channels)

    def latent_shape(self) -> tuple[int, ...]:
        side = self.grid * self.patch
        if self.frames > 1:
            return (self.channels, self.frames, side, side)
        return (self.channels, side, side)

    def forward(self, x: torch.Tensor, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``t``: ``[N]`` in [0, 1] (noise level), ``y``: ``[N]`` class ids (``num_classes`` = null)."""
        n = x.shape[0]
        frames = x.transpose(1, 2).flatten(0, 1) if self.frames > 1 else x  # [N*F, C, H, W]
        h = self.patchify(frames).flatten(2).transpose(1, 2).reshape(n, self.num_tokens, -1) + self.pos
        c = self.t_mlp(timestep_embedding(t * 1000, 256).to(h.dtype)) + self.y_embed(y)
        if self.sp > 1:
            h = h.chunk(self.sp, dim=1)[dist.get_rank()]
        for block in self.blocks:
            h = block(h, c)
        if self.sp > 1:
            h = gather_tokens(h, self.sp)
        shift, scale = self.final_ada(c).chunk(2, dim=-1)
        return self.unpatchify(self.final(modulate(self.final_norm(h), shift, scale)))

    def unpatchify(self, h: torch.Tensor) -> torch.Tensor:
        """``[N, tokens, p*p*C]`` -> ``[N, C, H, W]`` or ``[N, C, F, H, W]``."""
        n, g, p, c = h.shape[0], self.grid, self.patch, self.channels
        h = h.reshape(n, self.frames, g, g, p, p, c)
        x = torch.einsum("nfhwpqc->ncfhpwq", h).reshape(n, c, self.frames, g * p, g * p)
        return x if self.frames > 1 else x[:, :, 0]


def build_model(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> DiT:
    """Random weights from ``--seed`` (drawn on the CPU, so identical on every device)."""
    torch.manual_seed(args.seed)
    model = DiT(args.channels, args.resolution, args.frames, args.patch, args.d_model,
                args.layers, args.heads, args.num_classes, args.sp, args.ring)
    return model.to(device=device, dtype=dtype).eval()


# ----------------------------------------------------------------------------- sampler


def guided_velocity(model: DiT, x: torch.Tensor, t: float, y: torch.Tensor,
                    cfg_scale: float) -> torch.Tensor:
    """Model velocity at time ``t``; with ``cfg_scale`` > 1 one call on the doubled batch."""
    tt = torch.full((x.shape[0],), t, device=x.device)
    if cfg_scale <= 1.0:
        return model(x, tt, y)
    null = torch.full_like(y, model.num_classes)
    v = model(torch.cat([x, x]), torch.cat([tt, tt]), torch.cat([y, null]))
    v_cond, v_null = v.chunk(2)
    return v_null + cfg_scale * (v_cond - v_null)


def sample(model: DiT, noise: torch.Tensor, labels: torch.Tensor, steps: int, cfg_scale: float,
           on_step: Callable[[int, float], None] | None = None) -> torch.Tensor:
    """Euler integration of the flow from t=1 (``noise``) to t=0; returns a latent of ``noise``'s shape.

    Each step runs under ``whatif.phase("denoise")``; ``on_step(step, t)`` is called after it.
    """
    x = noise
    ts = torch.linspace(1.0, 0.0, steps + 1).tolist()
    for i in range(steps):
        with whatif.phase("denoise"):
            v = guided_velocity(model, x, ts[i], labels, cfg_scale)
            x = x + (ts[i + 1] - ts[i]) * v
        if on_step is not None:
            on_step(i, ts[i])
    return x


# ----------------------------------------------------------------------------- server


@dataclass
class Request:
    id: int
    arrival_s: float
    class_label: int
    batch_index: int = -1
    start_s: float | None = None
    end_s: float | None = None


def make_requests(args: argparse.Namespace) -> list[Request]:
    rng = random.Random(args.seed)
    arrivals = poisson_schedule(args.num_requests, args.rate, rng)
    return [Request(i, a, rng.randrange(args.num_classes)) for i, a in enumerate(arrivals)]


def request_noise(req_id: int, seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Per-request initial noise, drawn on the CPU from ``(seed, request id)``."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + req_id)
    return torch.randn(shape, generator=g)


class Server:
    """Dynamic batching in wall-clock time: idle server takes up to ``max_batch`` waiting requests."""

    def __init__(self, model: DiT, requests: list[Request], args: argparse.Namespace,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.model, self.requests, self.args = model, requests, args
        self.device, self.dtype = device, dtype
        self.batches: list[dict[str, Any]] = []
        self.steps: list[dict[str, Any]] = []
        self.t0 = self.t0_unix = 0.0

    def now(self) -> float:
        """Seconds since start, after the device finished all queued work."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - self.t0

    def run(self) -> None:
        pending = collections.deque(self.requests)
        waiting: collections.deque[Request] = collections.deque()
        self.t0, self.t0_unix = time.perf_counter(), time.time()
        while pending or waiting:
            now = self.now()
            while pending and pending[0].arrival_s <= now:
                waiting.append(pending.popleft())
            if not waiting:
                sleep_until(pending[0].arrival_s, self.now)
                continue
            batch = [waiting.popleft() for _ in range(min(self.args.batch, len(waiting)))]
            self.serve(batch)

    def serve(self, batch: list[Request]) -> torch.Tensor:
        index = len(self.batches)
        start = self.now()
        shape = self.model.latent_shape()
        noise = torch.stack([request_noise(r.id, self.args.seed, shape) for r in batch])
        noise = noise.to(self.device, self.dtype)
        labels = torch.tensor([r.class_label for r in batch], device=self.device)
        model_batch = len(batch) * (2 if self.args.cfg_scale > 1.0 else 1)
        step_ms: list[float] = []
        last = [start]

        def on_step(step: int, t: float) -> None:
            end = self.now()
            step_ms.append((end - last[0]) * 1e3)
            self.steps.append({"index": len(self.steps), "batch_index": index, "step": step, "t": t,
                               "model_batch": model_batch, "start_s": last[0], "end_s": end,
                               "duration_ms": step_ms[-1]})
            last[0] = end
            whatif.step()

        latents = sample(self.model, noise, labels, self.args.steps, self.args.cfg_scale, on_step)
        latent_sum = latents.sum().item()  # the result leaves the device: the request is done
        end = self.now()
        for r in batch:
            r.batch_index, r.start_s, r.end_s = index, start, end
        self.batches.append({"index": index, "request_ids": [r.id for r in batch],
                             "batch_size": len(batch), "model_batch": model_batch, "start_s": start,
                             "end_s": end, "duration_ms": (end - start) * 1e3, "step_ms": step_ms,
                             "latent_sum": latent_sum})
        return latents


def warm_up(model: DiT, args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> None:
    """Untimed guided model calls at every batch size the server can run (1 to ``--batch``
    requests), so one-time initialization, and the first call at each shape (kernel selection: on
    an H200 the first step at a new batch took 63 ms against 4), is charged to no request."""
    for n in range(1, args.batch + 1):
        x = torch.zeros((n, *model.latent_shape()), device=device, dtype=dtype)
        guided_velocity(model, x, 1.0, torch.zeros(n, dtype=torch.long, device=device), args.cfg_scale).sum().item()


# ----------------------------------------------------------------------------- report


def request_record(r: Request) -> dict[str, Any]:
    assert r.start_s is not None and r.end_s is not None
    return {"id": r.id, "class_label": r.class_label, "batch_index": r.batch_index,
            "arrival_s": r.arrival_s, "start_s": r.start_s, "end_s": r.end_s,
            "queue_ms": (r.start_s - r.arrival_s) * 1e3, "service_ms": (r.end_s - r.start_s) * 1e3,
            "latency_ms": (r.end_s - r.arrival_s) * 1e3}


def summarize(reqs: list[dict[str, Any]], batches: list[dict[str, Any]],
              steps: list[dict[str, Any]]) -> dict[str, Any]:
    duration = max(r["end_s"] for r in reqs) - min(r["arrival_s"] for r in reqs)
    return {
        "num_requests": len(reqs), "num_batches": len(batches), "num_steps": len(steps),
        "duration_s": duration, "throughput_req_s": len(reqs) / duration if duration > 0 else None,
        **{k: stats([r[k] for r in reqs]) for k in ("latency_ms", "queue_ms", "service_ms")},
        "step_ms": stats([s["duration_ms"] for s in steps]),
    }


def one_line(s: dict[str, Any]) -> str:
    lat, step = s["latency_ms"], s["step_ms"]
    return (f"dit_serve: {s['num_requests']} requests in {s['num_batches']} batches, "
            f"{s['num_steps']} denoise steps in {s['duration_s']:.2f} s | latency mean "
            f"{lat['mean']:.1f} p50 {lat['p50']:.1f} p99 {lat['p99']:.1f} ms | step mean "
            f"{step['mean']:.1f} ms | {s['throughput_req_s'] or 0.0:.2f} req/s")


# ----------------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--seed", type=int, default=0, help="seeds weights, arrivals, labels, noise")
    add_runtime_args(p)
    m = p.add_argument_group("model")
    m.add_argument("--layers", type=int, default=4)
    m.add_argument("--d-model", type=int, default=192)
    m.add_argument("--heads", type=int, default=4)
    m.add_argument("--patch", type=int, default=2, help="patch side (latent pixels)")
    m.add_argument("--channels", type=int, default=4, help="latent channels")
    m.add_argument("--num-classes", type=int, default=10)
    g = p.add_argument_group("generation")
    g.add_argument("--resolution", type=int, default=16, help="latent side (latent pixels)")
    g.add_argument("--frames", type=int, default=1, help="video frames (tokens = frames x patches)")
    g.add_argument("--steps", type=int, default=10, help="denoising steps per request")
    g.add_argument("--cfg-scale", type=float, default=4.0, help="guidance scale; <= 1 disables CFG")
    w = p.add_argument_group("serving")
    w.add_argument("--num-requests", type=int, default=8)
    w.add_argument("--rate", type=float, default=10.0, help="Poisson arrival rate (req/s); inf: all at 0")
    w.add_argument("--batch", type=int, default=4, help="max requests denoised together")
    w.add_argument("--warmup", type=int, default=1,
                   help="untimed warm-up passes before serving, each a model call at every batch size up to --batch")
    g.add_argument("--autocast", default="off", choices=["off", *AUTOCAST_DTYPES],
                   help="denoise an fp32 model under torch.autocast (mixed precision; not with a 16-bit --dtype)")
    w.add_argument("--sp", type=int, default=1,
                   help="sequence-parallel degree (torchrun starts --sp processes; needs --rate inf)")
    w.add_argument("--ring", type=int, default=1,
                   help="ring-attention degree within --sp: Ulysses over --sp / --ring ranks, a ring over --ring "
                        "(--ring = --sp: Ring attention; between: USP)")
    p.add_argument("--log", default=None, help="write the JSON log here")
    args = p.parse_args(argv)
    for name in ("layers", "d_model", "heads", "patch", "channels", "num_classes", "resolution",
                 "frames", "steps", "num_requests", "batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.sp < 1:
        p.error("--sp must be >= 1")
    if args.ring < 1 or args.sp % args.ring:
        p.error(f"--ring {args.ring} must divide --sp {args.sp}")
    if args.autocast != "off" and args.dtype not in ("auto", "float32"):
        p.error("--dtype converts the model; --autocast runs an fp32 one in mixed precision: choose one")
    if args.sp > 1 and math.isfinite(args.rate):
        p.error("--sp needs --rate inf: every rank must serve the same batches, which a wall-clock schedule "
                "does not promise")
    return args


def main(argv: list[str] | None = None) -> int:
    global SP
    args = parse_args(argv)
    device = pick_device(args.device)
    if device.type == "cuda" and args.sp > 1:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    set_threads(args.threads, device)
    dtype = torch.float32 if args.autocast != "off" and args.dtype == "auto" else pick_dtype(args.dtype, device)
    problem = join_torchrun(args.sp, f"--sp {args.sp}", device) if args.sp > 1 else None
    if problem:
        print(f"dit_serve: error: {problem}", file=sys.stderr)
        return 2
    if args.sp > 1:
        SP = sp_groups(args.sp, args.ring, device)
    try:
        model = build_model(args, device, dtype)
    except ValueError as e:
        print(f"dit_serve: error: {e}", file=sys.stderr)
        return 2
    requests = make_requests(args)
    with torch.inference_mode(), attention_backend(args.sdpa), mixed_precision(args.autocast, device):
        for _ in range(args.warmup):
            warm_up(model, args, device, dtype)
        server = Server(model, requests, args, device, dtype)
        server.run()
    records = [request_record(r) for r in requests]
    summary = summarize(records, server.batches, server.steps)
    print(one_line(summary))
    if args.log and (args.sp == 1 or dist.get_rank() == 0):   # every rank served the same requests
        log = {
            "schema": SCHEMA,
            "config": {**json_safe(vars(args)), "device": str(device),
                       "dtype": str(dtype).removeprefix("torch."),
                       "num_params": sum(p.numel() for p in model.parameters()),
                       "tokens": model.num_tokens, "latent_shape": list(model.latent_shape()),
                       "torch_version": torch.__version__},
            "clock": {"t0_unix_s": server.t0_unix, "t0_perf_counter_s": server.t0},
            "requests": records, "batches": server.batches, "steps": server.steps,
            "summary": summary,
        }
        Path(args.log).parent.mkdir(parents=True, exist_ok=True)
        Path(args.log).write_text(json.dumps(log, indent=1))
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
