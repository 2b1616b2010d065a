"""What one replica can hold: KV blocks and tokens, sequences and batched tokens, from the memory
model of the recorded model (:mod:`whatif.transforms.parallel.memory`: weights, GQA-aware KV
bytes per token, the share of memory left to activations and workspace) and an engine's defaults
(:mod:`.engine_defaults`). Every figure can be given instead (:meth:`Capacity.with_given`).

**Formulas** (per GPU of a replica placed t × p ways):

* KV tokens = ``(f · M − W/(t·p)) / (2·ceil(L/p)·ceil(H_kv/t)·d·e)`` with ``f`` the engine's memory
  fraction, ``M`` the GPU's memory, ``W`` the forward GEMM weights
  (:func:`~whatif.transforms.parallel.memory.kv_capacity_tokens`); KV blocks = tokens // block;
* max batched tokens and max sequences: the engine's rules (SGLang's sequences from the KV tokens);
* KV hand-off of a disaggregated deployment: per-GPU KV bytes per token over the GPU's peer link
  (``Device.peer_copy_bw_bytes_per_s``), ns per token.

>>> from whatif.transforms.parallel.memory import ModelShape
>>> llama2_7b = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128, weight_bytes=13.5e9)
>>> c = engine_capacity("vllm", llama2_7b, GpuMemory("A100_SXM_80GB", 80 * GIB), peer_bw_bytes_per_s=228.3e9)
>>> c.kv_tokens, c.kv_blocks, c.max_seqs, c.max_batched_tokens       # (0.9 x 80 GiB - 13.5 GB) / 512 KiB
(121706, 7606, 256, 2048)
>>> c.describe().split(" (")[0], c.describe().split("); ")[1]
('vllm: KV 121,706 tokens = 7,606 blocks of 16', '256 seqs, 2,048 batched tokens')
>>> round(c.kv_transfer_ns_per_token)    # 512 KiB over 228.3 GB/s
2296
>>> engine_capacity("examples", None, GpuMemory(), why="no transformer block").describe()
'examples: KV unlimited (no transformer block); 8 seqs, 512 batched tokens'
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from whatif.transforms.parallel.memory import ModelShape, kv_capacity_tokens, weights_per_rank_bytes
from whatif.transforms.placement import Placement

from .engine_defaults import DEFAULT_MAX_MODEL_LEN, GIB, EngineName, GpuMemory, engine_key, engine_profile

__all__ = ["GIB", "Capacity", "GpuMemory", "engine_capacity"]


@dataclass(frozen=True)
class Capacity:
    """The figures one replica serves with. ``kv_tokens`` None: unlimited (``source`` says why);
    ``given``: the figures that were given rather than derived."""

    engine: EngineName
    max_seqs: int
    max_batched_tokens: int
    block_tokens: int
    kv_tokens: int | None
    memory_fraction: float
    source: str
    gpu: GpuMemory
    weights_bytes: float | None = None
    kv_bytes_per_token: int | None = None
    kv_transfer_ns_per_token: float = 0.0
    given: tuple[str, ...] = ()

    @property
    def kv_source(self) -> str:
        """Where the KV capacity came from: ``given``, ``memory model: …`` or ``unlimited: <why>``."""
        if "kv_tokens" in self.given:
            return "given"
        return f"unlimited: {self.source}" if self.kv_tokens is None else f"memory model: {self.source}"

    @property
    def kv_blocks(self) -> int | None:
        return None if self.kv_tokens is None else self.kv_tokens // self.block_tokens

    def describe(self) -> str:
        """One line: the KV cache (and where it came from), the sequence and token caps."""
        if self.kv_tokens is None:
            kv = f"KV unlimited ({self.source})"
        else:
            kv = f"KV {self.kv_tokens:,} tokens = {self.kv_blocks:,} blocks of {self.block_tokens} ({self.source})"
        return f"{self.engine.value}: {kv}; {self.max_seqs:,} seqs, {self.max_batched_tokens:,} batched tokens"

    def with_given(self, *, max_seqs: int | None = None, max_batched_tokens: int | None = None,
                   block_tokens: int | None = None, kv_tokens: int | None = None,
                   kv_transfer_ns_per_token: float | None = None) -> Capacity:
        """These figures with the ones given (not None) in their place, listed in :attr:`given`.

        >>> c = engine_capacity("examples", None, GpuMemory(), why="CPU")
        >>> g = c.with_given(max_seqs=4, kv_tokens=4096)
        >>> (g.max_seqs, g.kv_tokens, g.kv_blocks, g.given, g.kv_source)
        (4, 4096, 256, ('kv_tokens', 'max_seqs'), 'given')
        """
        changes = {k: v for k, v in (("max_seqs", max_seqs), ("max_batched_tokens", max_batched_tokens),
                                     ("block_tokens", block_tokens), ("kv_tokens", kv_tokens),
                                     ("kv_transfer_ns_per_token", kv_transfer_ns_per_token))
                   if v is not None and v != getattr(self, k)}
        if not changes:
            return self
        return replace(self, **changes, given=tuple(sorted({*self.given, *changes})))  # type: ignore[arg-type]


def engine_capacity(engine: str | Enum, shape: ModelShape | None, gpu: GpuMemory, placement: Placement | None = None,
                    *, max_model_len: int = DEFAULT_MAX_MODEL_LEN, peer_bw_bytes_per_s: float = 0.0,
                    why: str = "") -> Capacity:
    """The :class:`Capacity` of one replica of ``shape`` on ``gpu`` placed as ``placement`` under
    ``engine``'s defaults; ``shape`` None or an unknown GPU memory: KV unlimited because ``why``.
    ``peer_bw_bytes_per_s`` prices the KV hand-off of a disaggregated deployment (0: free)."""
    profile = engine_profile(engine)
    placement = placement or Placement()
    gpu = replace(gpu, tensor=placement.tensor)
    fraction = profile.memory_fraction(gpu)
    batched = profile.max_batched_tokens(gpu, max_model_len)
    if shape is None or gpu.capacity_bytes is None:
        return Capacity(engine_key(engine), profile.max_seqs(gpu, batched, None, max_model_len), batched,
                        profile.block_tokens, None, fraction, why or "no model shape or GPU memory", gpu)
    t, p = placement.tensor, placement.pipeline
    per_token = shape.kv_bytes_per_rank_token(t, p)
    tokens = kv_capacity_tokens(shape, gpu.capacity_bytes, placement, workspace_fraction=1 - fraction)
    weights = weights_per_rank_bytes(shape, placement)
    where = (f"{placement.kv_home_bytes / 1e9:.1f} GB of {placement.kv_home}" if placement.kv_outside_hbm else
             f"{fraction:g} x {gpu.capacity_bytes / 1e9:.1f} GB {gpu.name or 'GPU'} - {weights / 1e9:.1f} GB weights"
             + (f" + {placement.weights_moved_bytes / 1e9:.1f} GB moved out" if placement.weights_moved_bytes else ""))
    source = (f"{where}, {per_token / 1024:.0f} KiB/token: {shape.layers} layers, {shape.kv_heads} KV heads of "
              f"{shape.head_dim}" + (f"; {placement.label()}" if placement != Placement() else ""))
    return Capacity(engine_key(engine), profile.max_seqs(gpu, batched, tokens, max_model_len), batched,
                    profile.block_tokens, tokens, fraction, source, gpu, weights, per_token,
                    per_token / peer_bw_bytes_per_s * 1e9 if peer_bw_bytes_per_s > 0 else 0.0)
