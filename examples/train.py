"""A small training script: a tiny causal transformer LM on random tokens, AdamW.

Random data and weights, pure torch, seedable; runs on CPU in seconds and on a GPU unchanged::

    python examples/train.py --steps 20 --log train.json
    whatif record examples/train.py

Deliberately a plain PyTorch loop with no whatif markers: one iteration is
``zero_grad -> forward -> cross-entropy -> backward -> clip_grad_norm_ -> optimizer.step()``,
and a recorder finds the steps from ``optimizer.step()`` (one per ``--steps``).
The data set is ``--batches`` fixed random batches cycled in order, so the model can
memorize them and the loss goes down.

Variants (the GPU harvest's before/after pairs, ``bench/gpu_harvest``):

* ``--autocast bf16|fp16``: forward and loss under ``torch.autocast`` (mixed precision);
* ``--dtype bfloat16|float16``: the model converted to that dtype (``model.to(dtype)``: weights,
  gradients, optimizer state and activations; the loss still in fp32, ``logits.float()``);
* ``--compile``: ``torch.compile`` the model (inductor);
* ``--sdpa math|flash|efficient|cudnn``: force one scaled-dot-product-attention backend;
* ``--workers N``: batches come from a ``torch.utils.data.DataLoader`` with ``num_workers=N``
  (0: loaded in the training thread) whose dataset spends ``--load-ms`` of CPU time per batch,
  as tokenization or decoding would; without ``--workers`` the batches are pre-made tensors;
* ``--tp N``: Megatron-LM tensor parallelism over ``N`` processes started by torchrun (gloo on
  the CPU, NCCL on a GPU): QKV and MLP up column-parallel, attention on ``heads / N`` heads,
  attention output and MLP down row-parallel (an all-reduce, then the bias); embeddings, norms
  and the LM head replicated; every rank trains on the same batches::

    torchrun --nproc-per-node 2 -m whatif.cli record -o runs/tp2 --memory --record-shapes \
        examples/train.py -- --tp 2

* ``--pp N --micro-batches M``: pipeline parallelism over ``N`` processes started by torchrun,
  the 1F1B schedule of Megatron-LM (PipeDream-Flush, Narayanan et al. 2021): stage ``s`` holds
  blocks ``[s·L/N, (s+1)·L/N)`` (stage 0 also the embeddings, the last also the final norm, the
  LM head and the loss), runs ``min(N − s − 1, M)`` warm-up forwards, then one forward and one
  backward in turn, then the remaining backwards; activations go forward and their gradients back
  by send/recv (gloo on the CPU, NCCL on a GPU); ``--schedule gpipe`` runs every forward,
  then every backward (GPipe, Huang et al. 2019). ``--micro-batches`` alone (``--pp 1``)
  accumulates the gradients of ``M`` micro-batches. ``--tp T --pp N`` together: ``T·N``
  processes, rank ``s·T + j`` is tensor-parallel rank ``j`` of stage ``s`` (each stage's ranks
  all-reduce among themselves; rank ``j`` of a stage sends to rank ``j`` of the next).

Log (``--log OUT.json``)::

    {"schema": "whatif.examples.train/1",
     "config": {<every CLI option>, "device", "num_params", "torch_version"},
     "steps": [{"step", "loss", "step_ms"}],
     "summary": {"steps", "first_loss", "last_loss", "duration_s", "mean_step_ms",
                 "tokens_per_s"}}

``step_ms`` is the wall time in milliseconds from the end of the previous iteration (the start,
for the first) to the end of this one, device synchronized: loading the batch is included.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from collections.abc import Iterator
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
    mixed_precision,
    pick_device,
    pick_dtype,
    set_threads,
)
from torch import nn
from torch.utils.data import DataLoader, Dataset

TENSOR_PARALLEL: Collectives | None = None
"""The all-reduces among this rank's tensor-parallel ranks (its pipeline stage's with ``--pp``), with ``--tp`` > 1."""

SCHEMA = "whatif.examples.train/1"


class _ToTensorParallel(torch.autograd.Function):
    """Megatron's ``f``: the identity forward, an all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous()
        assert TENSOR_PARALLEL is not None
        TENSOR_PARALLEL.all_reduce(grad)
        return grad


class _FromTensorParallel(torch.autograd.Function):
    """Megatron's ``g``: an all-reduce forward, the identity backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        assert TENSOR_PARALLEL is not None
        TENSOR_PARALLEL.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class RowParallelLinear(nn.Module):
    """A rank's ``in_features / tp`` columns of a linear layer: its partial product all-reduced,
    then the (whole) bias."""

    def __init__(self, full: nn.Linear, rank: int, tp: int) -> None:
        super().__init__()
        width = full.in_features // tp
        self.weight = nn.Parameter(full.weight.detach()[:, rank * width:(rank + 1) * width].clone())
        self.bias = nn.Parameter(full.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _FromTensorParallel.apply(F.linear(x, self.weight)) + self.bias


def column_parallel(full: nn.Linear, rows: torch.Tensor) -> nn.Linear:
    """A rank's output features ``rows`` of a linear layer (weight rows and bias)."""
    part = nn.Linear(full.in_features, len(rows))
    with torch.no_grad():
        part.weight.copy_(full.weight[rows])
        part.bias.copy_(full.bias[rows])
    return part


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and a GELU MLP; :meth:`shard` makes a
    tensor-parallel rank's part of it (module docstring, ``--tp``)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"d_model {dim} is not a multiple of heads {heads}")
        self.heads, self.tp = heads, 1
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def shard(self, rank: int, tp: int) -> list[nn.Parameter]:
        """Keep rank ``rank`` of ``tp``'s part: QKV's rows of its heads (of Q, K and V each) and MLP
        up's rows column-parallel, attention output's and MLP down's columns row-parallel; returns
        the sharded parameters."""
        if self.heads % tp:
            raise ValueError(f"heads {self.heads} is not a multiple of --tp {tp}")
        dim = self.proj.in_features
        width, hidden = dim // tp, self.mlp[0].out_features // tp
        mine = torch.arange(rank * width, (rank + 1) * width)
        self.qkv = column_parallel(self.qkv, torch.cat([mine + j * dim for j in range(3)]))
        self.proj = RowParallelLinear(self.proj, rank, tp)
        up = column_parallel(self.mlp[0], torch.arange(rank * hidden, (rank + 1) * hidden))
        self.mlp = nn.Sequential(up, nn.GELU(), RowParallelLinear(self.mlp[2], rank, tp))
        self.heads, self.tp = self.heads // tp, tp
        return [self.qkv.weight, self.qkv.bias, self.proj.weight, up.weight, up.bias, self.mlp[2].weight]

    def _in(self, x: torch.Tensor) -> torch.Tensor:
        return _ToTensorParallel.apply(x) if self.tp > 1 else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self._in(self.norm1(x))).unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(o.transpose(1, 2).flatten(2))
        return x + self.mlp(self._in(self.norm2(x)))


class TinyLM(nn.Module):
    """``[batch, seq]`` token ids -> ``[batch, seq, vocab]`` next-token logits; with ``tp`` > 1 the
    part of tensor-parallel rank ``rank`` of the same (seeded) model, with ``pp`` > 1 of pipeline
    stage ``stage`` (both: that rank's part of that stage)."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int, max_seq: int, tp: int = 1,
                 rank: int = 0, pp: int = 1, stage: int = 0) -> None:
        super().__init__()
        self.dim = dim
        self.embed, self.pos = nn.Embedding(vocab, dim), nn.Embedding(max_seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)
        self.tp, self.pp, self.tp_rank, self.stage, self.first, self.last = tp, pp, rank, stage, True, True
        self.sharded: set[int] = set()
        if tp > 1:
            self.sharded = {id(p) for block in self.blocks for p in block.shard(rank, tp)}
        if pp > 1:
            self._keep_stage(stage, pp)

    def _keep_stage(self, stage: int, pp: int) -> None:
        """Keep pipeline stage ``stage`` of ``pp``: its blocks, the embeddings on the first, the
        final norm and LM head on the last."""
        if len(self.blocks) % pp:
            raise ValueError(f"layers {len(self.blocks)} is not a multiple of --pp {pp}")
        per = len(self.blocks) // pp
        self.blocks = nn.ModuleList(list(self.blocks)[stage * per:(stage + 1) * per])
        self.first, self.last = stage == 0, stage == pp - 1
        if not self.first:
            del self.embed, self.pos
        if not self.last:
            del self.norm, self.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids ``[batch, seq]`` (the first stage) or the previous stage's hidden states
        ``[batch, seq, dim]`` -> logits (the last stage) or this stage's hidden states."""
        h = self.embed(x) + self.pos(torch.arange(x.shape[1], device=x.device)) if self.first else x
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h)) if self.last else h


def clip_gradients(model: TinyLM, max_norm: float) -> None:
    """``clip_grad_norm_`` over the whole model: with ``--tp`` or ``--pp``, each rank's squared
    gradient norms summed over every rank, a tensor-parallel replicated parameter's (the same on
    each rank of its stage) counted once."""
    if model.tp == model.pp == 1:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        return
    device = next(model.parameters()).device
    squares = torch.zeros((), device=device)
    for p in model.parameters():
        if p.grad is not None:
            squares = squares + p.grad.detach().float().pow(2).sum() / (1 if id(p) in model.sharded else model.tp)
    dist.all_reduce(squares)
    torch.nn.utils.clip_grads_with_norm_(model.parameters(), max_norm, squares.sqrt())


def make_data(args: argparse.Namespace, device: torch.device) -> list[torch.Tensor]:
    """``--batches`` random ``[batch_size, seq_len + 1]`` token batches (drawn on the CPU)."""
    g = torch.Generator().manual_seed(args.seed + 1)
    shape = (args.batch_size, args.seq_len + 1)
    return [torch.randint(args.vocab, shape, generator=g).to(device) for _ in range(args.batches)]


class TokenDataset(Dataset):
    """``steps * batch_size`` random sequences, each costing ``load_ms / batch_size`` of CPU time.

    The CPU time is spent drawing the tokens one by one with Python's ``random`` and then spinning
    until the sequence's share of ``load_ms`` has passed, so a batch costs at least ``load_ms``
    wherever it is loaded (training thread or worker process).
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.vocab, self.seq, self.seed = args.vocab, args.seq_len + 1, args.seed
        self.size = args.steps * args.batch_size
        self.item_s = args.load_ms / 1e3 / args.batch_size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> torch.Tensor:
        end = time.perf_counter() + self.item_s
        rng = random.Random(self.seed * 1_000_003 + i)
        tokens = torch.tensor([rng.randrange(self.vocab) for _ in range(self.seq)])
        while time.perf_counter() < end:
            pass
        return tokens


def batches(args: argparse.Namespace, device: torch.device) -> Iterator[torch.Tensor]:
    """The training batches: pre-made tensors cycled, or a DataLoader's (``--workers``)."""
    if args.workers is None:
        data = make_data(args, device)
        for i in range(args.steps):
            yield data[i % len(data)]
        return
    loader = DataLoader(TokenDataset(args), batch_size=args.batch_size, shuffle=False,
                        num_workers=args.workers, pin_memory=device.type == "cuda")
    for batch in loader:
        yield batch.to(device, non_blocking=True)


def train_step(model: TinyLM, opt: torch.optim.Optimizer, batch: torch.Tensor,
               clip: float, autocast: str = "off", forward: nn.Module | None = None) -> torch.Tensor:
    """One optimizer step on next-token cross-entropy (``forward``: the model as it is called, e.g.
    compiled; default the model); returns the (detached) loss."""
    opt.zero_grad(set_to_none=True)
    with mixed_precision(autocast, batch.device):
        logits = (forward or model)(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
    loss.backward()
    if clip > 0:
        clip_gradients(model, clip)
    opt.step()
    return loss.detach()


class _Neighbours:
    """Send/recv between pipeline stages, as Megatron-LM pairs them (each call posts its sends and
    receives together and waits for all): activations go to the next stage, their gradients back
    to the previous one; a stage without that neighbour sends and receives nothing."""

    def __init__(self, model: TinyLM, shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> None:
        rank = dist.get_rank() if model.pp > 1 else 0
        self.prev = None if model.first else rank - model.tp
        self.next = None if model.last else rank + model.tp
        self.shape, self.device, self.dtype = shape, device, dtype

    def _exchange(self, send: tuple[torch.Tensor, int | None] | None, recv: int | None) -> torch.Tensor | None:
        ops, got = [], None
        if send is not None and send[1] is not None:
            ops.append(dist.P2POp(dist.isend, send[0].contiguous(), send[1]))
        if recv is not None:
            got = torch.empty(self.shape, device=self.device, dtype=self.dtype)
            ops.append(dist.P2POp(dist.irecv, got, recv))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        return got

    def recv_forward(self) -> torch.Tensor | None:
        x = self._exchange(None, self.prev)
        return None if x is None else x.requires_grad_()

    def send_forward(self, y: torch.Tensor) -> None:
        self._exchange((y, self.next), None)

    def send_forward_recv_backward(self, y: torch.Tensor) -> torch.Tensor | None:
        return self._exchange((y, self.next), self.next)

    def send_backward_recv_forward(self, g: torch.Tensor | None) -> torch.Tensor | None:
        x = self._exchange(None if g is None else (g, self.prev), self.prev)
        return None if x is None else x.requires_grad_()

    def recv_backward(self) -> torch.Tensor | None:
        return self._exchange(None, self.next)

    def send_backward(self, g: torch.Tensor | None) -> None:
        self._exchange(None if g is None else (g, self.prev), None)


def pipeline_step(model: TinyLM, opt: torch.optim.Optimizer, batch: torch.Tensor, clip: float,
                  micro_batches: int, autocast: str = "off", schedule: str = "1f1b") -> torch.Tensor:
    """One optimizer step over ``micro_batches`` micro-batches on this rank's pipeline stage, the
    1F1B schedule or GPipe's (every forward, then every backward; module docstring, ``--pp``;
    without ``--pp`` gradient accumulation); returns the (detached) loss of the whole batch, on
    every stage."""
    opt.zero_grad(set_to_none=True)
    m = micro_batches
    tokens, targets = batch[:, :-1].chunk(m), batch[:, 1:].chunk(m)
    link = _Neighbours(model, (*tokens[0].shape, model.dim), batch.device, next(model.parameters()).dtype)
    stage, stages = model.stage, model.pp
    total = torch.zeros((), device=batch.device)
    pending: list[tuple[torch.Tensor | None, torch.Tensor]] = []

    def forward(i: int, x: torch.Tensor | None) -> torch.Tensor:
        nonlocal total
        with mixed_precision(autocast, batch.device):
            y = model(tokens[i] if x is None else x)
            if model.last:
                y = F.cross_entropy(y.flatten(0, 1).float(), targets[i].flatten()) / m
                total = total + y.detach()
        pending.append((x, y))
        return y

    def backward(g: torch.Tensor | None) -> torch.Tensor | None:
        x, y = pending.pop(0)
        torch.autograd.backward(y, None if model.last else g)
        return None if x is None else x.grad

    warmup = m if schedule == "gpipe" else min(stages - stage - 1, m)
    for i in range(warmup):
        link.send_forward(forward(i, link.recv_forward()))
    x = link.recv_forward() if warmup < m else None
    for i in range(warmup, m):
        g = backward(link.send_forward_recv_backward(forward(i, x)))
        if i == m - 1:
            link.send_backward(g)
        else:
            x = link.send_backward_recv_forward(g)
    for _ in range(warmup):
        link.send_backward(backward(link.recv_backward()))
    if model.pp > 1:
        if not (model.last and model.tp_rank == 0):
            total.zero_()
        dist.all_reduce(total)
    if clip > 0:
        clip_gradients(model, clip)
    opt.step()
    return total


def now(device: torch.device) -> float:
    """``time.perf_counter()`` in seconds after the device finished its queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--seed", type=int, default=0, help="seeds weights and data")
    add_runtime_args(p, dtype=False)
    p.add_argument("--steps", type=int, default=20, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per step")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per sequence")
    p.add_argument("--batches", type=int, default=4, help="distinct random batches, cycled")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--clip", type=float, default=1.0, help="max grad norm; 0 disables clipping")
    p.add_argument("--autocast", default="off", choices=["off", *AUTOCAST_DTYPES],
                   help="mixed precision for forward and loss")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="the model's dtype (converted: weights, gradients, optimizer state, activations)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--workers", type=int, default=None,
                   help="load batches with a DataLoader of this many worker processes (0: in the "
                        "training thread); default: pre-made batches, no DataLoader")
    p.add_argument("--load-ms", type=float, default=0.0, help="CPU time to load one batch (with --workers)")
    p.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel degree (torchrun starts --tp x --pp processes: WORLD_SIZE)")
    p.add_argument("--pp", type=int, default=1,
                   help="pipeline-parallel stages (torchrun starts --tp x --pp processes: WORLD_SIZE)")
    p.add_argument("--micro-batches", type=int, default=1,
                   help="micro-batches per step (1F1B with --pp; gradient accumulation without)")
    p.add_argument("--schedule", default="1f1b", choices=["1f1b", "gpipe"],
                   help="pipeline schedule with --pp: 1F1B, or GPipe (every forward, then every backward)")
    p.add_argument("--log", default=None, help="write the JSON log here")
    args = p.parse_args(argv)
    if args.workers is not None and args.workers < 0:
        p.error("--workers must be >= 0")
    if args.load_ms < 0:
        p.error("--load-ms must be >= 0")
    for name in ("steps", "batch_size", "seq_len", "batches", "layers", "d_model", "heads", "vocab", "tp", "pp",
                 "micro_batches"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.batch_size % args.micro_batches:
        p.error(f"--batch-size {args.batch_size} is not a multiple of --micro-batches {args.micro_batches}")
    if args.dtype != "float32" and args.autocast != "off":
        p.error("--dtype converts the model; --autocast runs an fp32 one in mixed precision: choose one")
    if (args.micro_batches > 1 or args.pp > 1) and args.compile:
        p.error("--micro-batches and --pp run the model eagerly (no --compile)")
    return args


def start_ranks(tp: int, pp: int, device: torch.device) -> str | None:
    """Join torchrun's process group for ``--tp`` × ``--pp`` > 1 ranks (rank = stage · tp + its
    tensor-parallel rank; each stage's ranks all-reduce among themselves, :data:`TENSOR_PARALLEL`)
    and return None, or say why it cannot."""
    global TENSOR_PARALLEL
    ranks = tp * pp
    if ranks == 1:
        return None
    flags = " ".join(f"{flag} {n}" for flag, n in (("--tp", tp), ("--pp", pp)) if n > 1)
    problem = join_torchrun(ranks, flags, device)
    if problem:
        return problem
    if tp > 1:
        stage = dist.get_rank() // tp
        mine = list(range(stage * tp, (stage + 1) * tp))
        groups = [dist.new_group(list(range(s * tp, (s + 1) * tp))) for s in range(pp)] \
            if pp > 1 and device.type != "cpu" else [None] * pp
        TENSOR_PARALLEL = Collectives(mine, device, f"tp{stage}", groups[stage])
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = pick_device(args.device)
    ranks = args.tp * args.pp
    if device.type == "cuda" and ranks > 1:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    set_threads(args.threads, device)
    if args.heads % args.tp:
        print(f"train: error: heads {args.heads} is not a multiple of --tp {args.tp}", file=sys.stderr)
        return 2
    if args.layers % args.pp:
        print(f"train: error: layers {args.layers} is not a multiple of --pp {args.pp}", file=sys.stderr)
        return 2
    problem = start_ranks(args.tp, args.pp, device)
    if problem:
        print(f"train: error: {problem}", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    rank = dist.get_rank() if ranks > 1 else 0
    try:
        model = TinyLM(args.vocab, args.d_model, args.layers, args.heads, args.seq_len, args.tp, rank % args.tp,
                       args.pp, rank // args.tp).to(device, pick_dtype(args.dtype, device))
    except ValueError as e:
        print(f"train: error: {e}", file=sys.stderr)
        return 2
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    forward = torch.compile(model) if args.compile else model
    steps: list[dict[str, Any]] = []
    start = t0 = now(device)
    with attention_backend(args.sdpa):
        for i, batch in enumerate(batches(args, device)):
            loss = (pipeline_step(model, opt, batch, args.clip, args.micro_batches, args.autocast, args.schedule)
                    if args.pp > 1 or args.micro_batches > 1
                    else train_step(model, opt, batch, args.clip, args.autocast, forward)).item()
            t1 = now(device)
            steps.append({"step": i, "loss": loss, "step_ms": (t1 - t0) * 1e3})
            t0 = t1
    duration = now(device) - start
    summary = {"steps": len(steps), "first_loss": steps[0]["loss"], "last_loss": steps[-1]["loss"],
               "duration_s": duration, "mean_step_ms": duration * 1e3 / len(steps),
               "tokens_per_s": len(steps) * args.batch_size * args.seq_len / duration}
    print(f"train: {summary['steps']} steps in {duration:.2f} s | loss {summary['first_loss']:.3f}"
          f" -> {summary['last_loss']:.3f} | {summary['mean_step_ms']:.1f} ms/step"
          f" | {summary['tokens_per_s']:.0f} tok/s")
    if args.log:
        log = {"schema": SCHEMA,
               "config": {**vars(args), "device": str(device),
                          "num_params": sum(p.numel() for p in model.parameters()),
                          "torch_version": torch.__version__},
               "steps": steps, "summary": summary}
        Path(args.log).parent.mkdir(parents=True, exist_ok=True)
        Path(args.log).write_text(json.dumps(log, indent=1))
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0 if all(math.isfinite(s["loss"]) for s in steps) else 1


if __name__ == "__main__":
    raise SystemExit(main())
