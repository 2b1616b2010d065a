"""A static-shape decode loop: the workload of the GPU harvest's decode-side before/after pairs
(``bench/gpu_harvest``).

A decoder-only transformer with random weights generates ``--steps`` tokens for ``--batch``
sequences whose KV cache holds ``--context`` positions (the cache is treated as full: every step
attends over all ``--context`` positions, so every shape is static). Each step takes
``--query-len`` new tokens per sequence (1: decode; more: a chunked-prefill-like step).
Static shapes make the same step capturable in a CUDA graph, which is what ``--cuda-graph`` does.

Variants (one flag each, so a pair differs in one thing):

* ``--cuda-graph``: the step is captured once and replayed (one graph launch per step);
* ``--compile``: the step's model is ``torch.compile``-d (inductor fuses the elementwise ops);
* ``--sdpa math|flash|efficient|cudnn``: force one attention backend;
* ``--tp 2``: "TP-2 emulated": one rank's share of a tensor-parallel layer, on one GPU: half the
  heads, half of the QKV and MLP-up outputs (column-parallel) and half of the attention-output and
  MLP-down inputs (row-parallel); the all-reduce is left out (it is what ``tensor_parallel``
  adds to the graph, not what this pair checks);
* ``--batch``: sequences per step.

A ``whatif.step()`` ends every step, inside ``whatif.phase("decode")``; ``--warmup`` untimed
steps (and the capture or compilation) come first and end with one ``whatif.step()`` of their own,
so the recording's first step, which ``whatif record`` leaves out, holds them.

Log (``--log OUT.json``): ``{"schema": "whatif.bench.decode/1", "config": {...},
"steps": [{"step", "step_ms"}], "summary": {"steps", "duration_s", "mean_step_ms",
"tokens_per_s"}}`` with ``step_ms`` the wall time of one step, device synchronized.

  python examples/decode.py --device cpu --steps 5
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _runtime import SDPA_BACKENDS, attention_backend
from torch import nn

import whatif

SCHEMA = "whatif.bench.decode/1"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class Layer(nn.Module):
    """One pre-norm block of one tensor-parallel rank (``tp`` = 1: the whole block)."""

    def __init__(self, dim: int, heads: int, tp: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads // tp, dim // heads
        local = self.heads * self.head_dim
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * local), nn.Linear(local, dim)
        self.up, self.down = nn.Linear(dim, 4 * dim // tp), nn.Linear(4 * dim // tp, dim)

    def forward(self, x: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
                pos: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        cache_k.index_copy_(2, pos, k)
        cache_v.index_copy_(2, pos, v)
        o = F.scaled_dot_product_attention(q, cache_k, cache_v)
        x = x + self.proj(o.transpose(1, 2).reshape(b, t, -1))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Decoder(nn.Module):
    """Token ids ``[batch, query_len]`` -> the next ids, writing K/V at ``pos`` in the caches."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.embed = nn.Embedding(args.vocab, args.d_model)
        self.layers = nn.ModuleList(Layer(args.d_model, args.heads, args.tp) for _ in range(args.layers))
        self.norm, self.head = nn.LayerNorm(args.d_model), nn.Linear(args.d_model, args.vocab, bias=False)

    def forward(self, tokens: torch.Tensor, caches: list[tuple[torch.Tensor, torch.Tensor]],
                pos: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for layer, (k, v) in zip(self.layers, caches):
            h = layer(h, k, v, pos)
        return self.head(self.norm(h[:, -1:])).argmax(-1)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", default=None, help="cpu or cuda[:N]; None: cuda if available")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=512, help="KV-cache positions attended per step")
    p.add_argument("--query-len", type=int, default=1, help="new tokens per sequence per step")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--tp", type=int, default=1, choices=[1, 2, 4], help="emulated tensor-parallel rank share")
    p.add_argument("--sdpa", default="auto", choices=SDPA_BACKENDS)
    p.add_argument("--cuda-graph", action="store_true", help="capture the step in a CUDA graph")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--log", default=None)
    args = p.parse_args(argv)
    if args.heads % args.tp or args.d_model % args.heads:
        p.error(f"--heads {args.heads} must divide --d-model {args.d_model} and be a multiple of --tp {args.tp}")
    if args.query_len > args.context:
        p.error("--query-len must be <= --context")
    if args.cuda_graph and not (args.device or "cuda").startswith("cuda"):
        p.error("--cuda-graph needs a CUDA device")
    return args


def sync(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu":
        torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    dtype = DTYPES[args.dtype]
    model = Decoder(args).to(device, dtype).eval()
    heads, head_dim = args.heads // args.tp, args.d_model // args.heads
    caches = [(torch.randn(args.batch, heads, args.context, head_dim, device=device, dtype=dtype),
               torch.randn(args.batch, heads, args.context, head_dim, device=device, dtype=dtype))
              for _ in range(args.layers)]
    tokens = torch.randint(args.vocab, (args.batch, args.query_len), device=device)
    pos = torch.arange(args.query_len, device=device)
    step_model = torch.compile(model) if args.compile else model

    def step() -> None:
        nxt = step_model(tokens, caches, pos)
        tokens[:, -1:].copy_(nxt)
        pos.add_(args.query_len).remainder_(args.context)

    run = step
    with torch.inference_mode(), attention_backend(args.sdpa):
        if args.cuda_graph:
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(max(args.warmup, 1)):
                    step()
            torch.cuda.current_stream(device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            run = graph.replay
        else:
            for _ in range(args.warmup):
                step()
        sync(device)
        whatif.step()
        steps: list[dict[str, Any]] = []
        start = t0 = sync(device)
        for i in range(args.steps):
            with whatif.phase("decode"):
                run()
            t1 = sync(device)
            whatif.step()
            steps.append({"step": i, "step_ms": (t1 - t0) * 1e3})
            t0 = t1
    duration = t0 - start
    summary = {"steps": len(steps), "duration_s": duration, "mean_step_ms": duration * 1e3 / len(steps),
               "tokens_per_s": len(steps) * args.batch * args.query_len / duration}
    print(f"decode: {len(steps)} steps | {summary['mean_step_ms']:.3f} ms/step | "
          f"{summary['tokens_per_s']:.0f} tok/s", file=sys.stderr)
    if args.log:
        Path(args.log).parent.mkdir(parents=True, exist_ok=True)
        Path(args.log).write_text(json.dumps({
            "schema": SCHEMA, "config": {**vars(args), "device": str(device), "torch_version": torch.__version__},
            "steps": steps, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
