"""The memory model of a parallel plan: model shape read from the trace, bytes per rank, and
whether a plan fits the device.

**Shape** (:func:`model_shape`), from one step's detected blocks (:func:`~.layers.find_blocks`):

* ``layers``: blocks per step that hold a kernel with a recorded launch — a launch call, graph
  launches included, or a launching op (:func:`launched_blocks`);
  ``weight_bytes``: the step's forward GEMM weights on one rank from the GEMMs' recorded shapes
  (``CostModel.kernel_facts``; the backward's GEMMs and other ranks are not counted; the time-based
  estimates of GEMMs without shapes only when no GEMM has shapes, as an assumption);
* ``heads``, ``kv_heads``, ``head_dim``: the attention op's recorded ``Input Dims`` — query and
  key shapes of ``scaled_dot_product_attention`` (``[b, H, s, d]``), of the flash-attention ops
  (``[b, s, H, d]``, varlen ``[tokens, H, d]``); a key with fewer heads than the query is GQA/MQA;
* without recorded shapes: ``hidden = sqrt(W_o / e)`` from the attention-output GEMMs' weight
  ``W_o`` (``hidden × hidden`` of ``e``-byte elements; the median over the layers, each a time-based
  estimate when the GEMMs have no shapes either), ``head_dim`` 128 and MHA — or the head size and
  query heads per KV head that a paged-attention kernel's template names
  (:func:`~whatif.core.kernels.paged_attention_kernel_heads`), KV heads
  ``round(hidden / head_dim / ratio)`` — stated in :attr:`ModelShape.assumptions`. Every field can
  be overridden (``replace``).

**Bytes per rank** for a plan of t-way tensor and p-way pipeline parallelism
(:func:`plan_memory`): weights ``W/(t·p)``; KV cache ``tokens · 2·ceil(L/p)·ceil(H_kv/t)·d·e`` — each
rank holds its stage's layers and its share of the KV heads (a KV head is replicated, not split,
when t > H_kv, as vLLM does); activations and workspace a fraction of the capacity
(``workspace_fraction``, vLLM's ``gpu_memory_utilization`` 0.9 leaves 10 %).

>>> s = ModelShape(layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, weight_bytes=130e9,
...                elem_bytes=2)
>>> s.kv_bytes_per_token   # Llama-2/3-70B: 2·80·8·128·2 B = 320 KiB
327680
>>> m = plan_memory(s, tensor=8, pipeline=1, kv_tokens=100_000, capacity_bytes=80e9)
>>> round(m.weights_bytes / 1e9, 2), round(m.kv_bytes / 1e9, 2), m.fits
(16.25, 4.1, True)
>>> plan_memory(s, tensor=1, pipeline=1, kv_tokens=0, capacity_bytes=80e9).why_not()
'weights 130.0 GB + KV 0.0 GB + workspace 8.0 GB = 138.0 GB per rank > 80.0 GB of the device (over by 58.0 GB)'
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

import numpy as np
import pandas as pd

from whatif.core.dtypes import element_bytes
from whatif.core.kernels import KernelClass, embedding_table, is_attention, paged_attention_kernel_heads
from whatif.core.work import WorkShare, current_shares
from whatif.depgraph.graph import EdgeKind, TaskGraph, TaskKind
from whatif.hardware.devices import find_device
from whatif.tracer.args import Arg

from ..base import TransformContext, TransformError
from ..placement import Placement
from .layers import backward_mask, find_blocks, linked_op_rows

WORKSPACE_FRACTION = 0.10  # vLLM gpu_memory_utilization = 0.9: activations, workspace, CUDA graphs
DEFAULT_HEAD_DIM = 128     # Llama, Mistral, Qwen, GPT-3 family


@dataclass(frozen=True)
class ModelShape:
    """What sizes a model's memory: per-step transformer ``layers``, ``hidden`` size, query
    ``heads``, ``kv_heads`` (fewer than ``heads``: GQA/MQA), ``head_dim``, forward GEMM
    ``weight_bytes`` of one step (what its GEMMs read), KV ``elem_bytes``, the embedding
    ``table_bytes`` it looks tokens up in (held, not read whole), and how each was obtained."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    weight_bytes: float
    elem_bytes: int = 2
    table_bytes: float = 0.0
    assumptions: tuple[str, ...] = field(default=(), compare=False)

    @property
    def held_bytes(self) -> float:
        """Parameter bytes a replica holds: the GEMM weights and the embedding tables."""
        return self.weight_bytes + self.table_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token: ``2·L·H_kv·d·e``."""
        return self.kv_bytes_per_rank_token()

    def kv_bytes_per_rank_token(self, tensor: int = 1, pipeline: int = 1) -> int:
        """K and V one rank of a t × p plan holds per token: ``2·ceil(L/p)·ceil(H_kv/t)·d·e`` (its
        stage's layers, its share of the KV heads; a KV head replicated when t > H_kv)."""
        return 2 * math.ceil(self.layers / pipeline) * math.ceil(self.kv_heads / tensor) * self.head_dim \
            * self.elem_bytes


@dataclass(frozen=True)
class PlanMemory:
    """Bytes per rank of one plan and the device's capacity."""

    tensor: int
    pipeline: int
    weights_bytes: float
    kv_bytes: float
    workspace_bytes: float
    capacity_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.kv_bytes + self.workspace_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.capacity_bytes

    def why_not(self) -> str:
        """One line naming what does not fit and by how much ('' when it fits)."""
        if self.fits:
            return ""
        gb = 1e9
        return (f"weights {self.weights_bytes / gb:.1f} GB + KV {self.kv_bytes / gb:.1f} GB + workspace "
                f"{self.workspace_bytes / gb:.1f} GB = {self.total_bytes / gb:.1f} GB per rank > "
                f"{self.capacity_bytes / gb:.1f} GB of the device (over by "
                f"{(self.total_bytes - self.capacity_bytes) / gb:.1f} GB)")


def plan_memory(shape: ModelShape, *, tensor: int, pipeline: int, kv_tokens: float, capacity_bytes: float,
                workspace_fraction: float = WORKSPACE_FRACTION) -> PlanMemory:
    """Bytes per rank of ``shape`` under t-way tensor and p-way pipeline parallelism holding the
    KV cache of ``kv_tokens`` tokens (every in-flight sequence's context) in all; see the module
    docstring for the formulas."""
    if tensor < 1 or pipeline < 1:
        raise TransformError(f"memory: tensor and pipeline degrees must be >= 1 (got {tensor}, {pipeline})")
    kv = float(kv_tokens) * shape.kv_bytes_per_rank_token(tensor, pipeline)
    return PlanMemory(tensor=tensor, pipeline=pipeline, weights_bytes=shape.held_bytes / (tensor * pipeline),
                      kv_bytes=kv, workspace_bytes=workspace_fraction * capacity_bytes, capacity_bytes=capacity_bytes)


def kv_capacity_tokens(shape: ModelShape, capacity_bytes: float, placement: Placement | None = None, *,
                       workspace_fraction: float = WORKSPACE_FRACTION) -> int:
    """KV-cache tokens one replica holds when placed as ``placement`` (t × p GPUs): on each rank,
    what the weights and the workspace leave of its HBM, ``(1 − workspace)·capacity − W/(t·p) +
    moved`` (vLLM's ``gpu_memory_utilization`` rule; ``moved``: weights held outside HBM; ``W``
    times ``placement.weights_scale``, :func:`weights_per_rank_bytes`), over its
    bytes per token ``2·ceil(L/p)·ceil(H_kv/t)·d·e``; when the KV cache lives beside the GPU
    (``placement.kv_home_bytes``: PIM stacks), that memory over the same bytes per token, provided
    the weights fit HBM. 0 when the weights alone do not fit.

    >>> s = ModelShape(layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, weight_bytes=130e9)
    >>> kv_capacity_tokens(s, 80e9, Placement(tensor=8))    # Llama-70B, TP 8 on 80 GB: 55.75 GB / 40 KiB a token
    1361083
    >>> kv_capacity_tokens(s, 80e9)
    0
    >>> kv_capacity_tokens(s, 80e9, Placement(tensor=8).kv_in(80e9, "PIM"))   # 80 GB of PIM stacks per GPU
    1953125
    """
    placement = placement or Placement()
    t, p = placement.tensor, placement.pipeline
    per_token = shape.kv_bytes_per_rank_token(t, p)
    free = (1 - workspace_fraction) * capacity_bytes - weights_per_rank_bytes(shape, placement) \
        + placement.weights_moved_bytes
    if free < 0:
        return 0
    return int(max(0.0, placement.kv_home_bytes if placement.kv_outside_hbm else free) // per_token)


def weights_per_rank_bytes(shape: ModelShape, placement: Placement) -> float:
    """Parameter bytes one rank of ``placement`` holds: ``(W · weights_scale + tables) / (t·p)`` (a
    lower precision scales the GEMM weights, not the embedding tables).

    >>> s = ModelShape(layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, weight_bytes=130e9)
    >>> weights_per_rank_bytes(s, Placement(tensor=8).weights_scaled(0.5)) / 1e9   # fp8 weights, TP 8
    8.125
    """
    return (shape.weight_bytes * placement.weights_scale + shape.table_bytes) / (placement.tensor * placement.pipeline)


def device_capacity_bytes(ctx: TransformContext, override_gb: float = 0.0, device: str = "") -> float:
    """Memory of the recorded GPU (``device``: another one) from the hardware catalog
    (``override_gb`` when given)."""
    if override_gb > 0:
        return override_gb * 1e9
    name = device or ctx.device
    dev = find_device(name) if name else None
    if dev is None or not dev.mem_bytes:
        whose = f"GPU {device}" if device else f"trace's GPU ({ctx.device or 'unknown'})"
        raise TransformError(f"memory: the {whose} is not in the hardware catalog; give its memory (capacity_gb)")
    return float(dev.mem_bytes)


def launched_blocks(graph: TaskGraph, blocks: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``blocks`` whose block has a kernel with a recorded launch, when any has: a step
    can hold kernels launched before the profiler started (the tail of an earlier forward, with no
    launch call to link them), which are not more layers of the model.

    A launch is a launch call (a ``LAUNCH`` edge: a kernel launch, or a CUDA/HIP graph launch that
    replays many kernels under one correlation) or a launching CPU op. Graph-replayed kernels have
    no op (AMD's carry no ``External id``), so an op alone does not mark the launched blocks: on the
    shared SGLang Qwen3-8B trace (36 layers replayed by one ``hipGraphLaunch``) one ``aten::neg``
    kernel of another stream inside one layer was the only kernel with an op, and the model read
    as 1 layer from 2026-11-28 (commit 14b4555) until 2026-11-29."""
    tasks = blocks["task"].to_numpy()
    e = graph.edges
    launch_dst = e["dst"].to_numpy()[e["kind"].to_numpy() == int(EdgeKind.LAUNCH)]
    launched = np.isin(tasks, launch_dst) | ~np.isnan(linked_op_rows(graph, tasks))
    if not launched.any():
        return blocks
    keep = np.unique(blocks["block"].to_numpy()[launched])
    return blocks[np.isin(blocks["block"].to_numpy(), keep)]


def _weight_bytes(facts: dict[str, np.ndarray]) -> tuple[float, list[str]]:
    """GEMM weight bytes of one forward from its kernels' facts: those with recorded shapes when any
    has them (a kernel without them has only an estimate from its time, every byte counted as a
    weight); else the estimates, with that stated."""
    gemm = facts["kernel_class"] == KernelClass.GEMM.value
    wb = np.nan_to_num(facts["weight_bytes"])
    shaped = gemm & ~facts["estimated"]
    if shaped.any():
        return float(wb[shaped].sum()), []
    return float(wb[gemm].sum()), ["no GEMM shapes recorded: weights estimated from the GEMMs' times "
                                   "(every byte a GEMM moves counted as a weight; give weight_bytes)"]


def embedding_bytes(graph: TaskGraph, tasks: np.ndarray, hidden: int) -> float:
    """Bytes of the tables ``tasks`` look tokens up in (:func:`~whatif.core.kernels.embedding_table`
    of their launching ops, rows of the model's ``hidden`` width: token and position embeddings, not
    a rotary cache), each distinct table shape once."""
    tr = graph.trace
    if tr is None or hidden <= 0:
        return 0.0
    rows = linked_op_rows(graph, tasks)
    names = tr.events["name"].astype(str).to_numpy()
    dims, types, concrete = tr.arg(Arg.INPUT_DIMS), tr.arg(Arg.INPUT_TYPES), tr.arg(Arg.CONCRETE_INPUTS)
    tables = set()
    for r in np.unique(rows[~np.isnan(rows)].astype(np.int64)).tolist():
        found = embedding_table(names[r], dims[r], types[r], concrete[r])
        if found is not None and found[1] == hidden:
            tables.add(found)
    return float(sum(n * w * e for n, w, e in tables))


def attention_heads(graph: TaskGraph, tasks: np.ndarray) -> tuple[int, int, int] | None:
    """(heads, kv_heads, head_dim) from the first attention op with recorded query and key shapes."""
    tr = graph.trace
    if tr is None or not len(tasks):
        return None
    rows = linked_op_rows(graph, tasks)
    dims_all = tr.arg(Arg.INPUT_DIMS)
    names = tr.events["name"].astype(str).to_numpy()
    for r in rows[~np.isnan(rows)].astype(np.int64).tolist():
        found = attention_op_heads(names[r], dims_all[r])
        if found is not None:
            return found
    return None


def block_heads(graph: TaskGraph, blocks: pd.DataFrame, first: int = 8) -> tuple[int, int, int] | None:
    """(heads, kv_heads, head_dim) of the first ``first`` attention kernels of ``blocks``
    (:func:`~.layers.find_blocks`) with a launching op (whose recorded shapes say the heads); None
    when none has them. Kernels without one are skipped, not counted: on the Qwen H100 trace the
    first 10 of 34 attention kernels have no op, and taking the first 8 kernels let a TP degree of
    3 through for 16 heads."""
    tasks = blocks.loc[blocks["part"] == "attention", "task"].to_numpy()
    linked = tasks[~np.isnan(linked_op_rows(graph, tasks))]
    return attention_heads(graph, linked[:first])


def block_heads_now(graph: TaskGraph, blocks: pd.DataFrame) -> tuple[int, int, int] | None:
    """:func:`block_heads` on one rank now: the recorded heads times the attention kernels' head
    share (``WorkShare.heads``: 1/t after ``tensor_parallel`` t), KV heads at least one (a KV head
    replicated when t exceeds them)."""
    found = block_heads(graph, blocks)
    if found is None:
        return None
    tasks = blocks.loc[blocks["part"] == "attention", "task"].to_numpy()
    share = min((s.heads for s in current_shares(graph.tasks, tasks) if isinstance(s, WorkShare)), default=1.0)
    heads, kv_heads, head_dim = found
    return max(int(round(heads * share)), 1), max(math.ceil(kv_heads * share), 1), head_dim


class HeadSplit(Enum):
    """Whether attention heads split ``ways`` ways: every GPU needs whole query heads, and its KV
    heads either split evenly or, when ways exceed them, replicated (vLLM, Megatron query groups)."""

    OK = "ok"
    HEADS = "heads"          # the query heads do not divide
    KV_HEADS = "kv_heads"    # the KV heads neither divide nor are divided by the ways


def head_split(heads: int, kv_heads: int, ways: int) -> HeadSplit:
    """:class:`HeadSplit` of ``heads`` query and ``kv_heads`` KV heads over ``ways`` GPUs.

    >>> head_split(32, 8, 16).name, head_split(32, 8, 64).name, head_split(24, 6, 4).name
    ('OK', 'HEADS', 'KV_HEADS')
    """
    if heads % ways:
        return HeadSplit.HEADS
    if kv_heads % ways and ways % kv_heads:
        return HeadSplit.KV_HEADS
    return HeadSplit.OK


def attention_op_heads(op: str, dims: object) -> tuple[int, int, int] | None:
    """Query heads, key heads and head size of one fused attention op's input shapes (None for any
    other op: an unfused bmm or matmul's shapes do not say which dimension is the heads)."""
    if not is_attention(op) or not isinstance(dims, list) or len(dims) < 2:
        return None
    q, k = dims[0], dims[1]
    if not (isinstance(q, list) and isinstance(k, list)) or len(q) != len(k) or len(q) not in (3, 4):
        return None
    try:
        if len(q) == 3:                                   # varlen: [tokens, H, d]
            h, hk, d = int(q[1]), int(k[1]), int(q[2])
        elif "scaled_dot_product" in op:                  # [b, H, s, d]
            h, hk, d = int(q[1]), int(k[1]), int(q[3])
        else:                                             # flash-attention ops: [b, s, H, d]
            h, hk, d = int(q[2]), int(k[2]), int(q[3])
    except (TypeError, ValueError):
        return None
    return (h, hk, d) if h > 0 and hk > 0 and d > 0 and h % hk == 0 else None


def _attn_out_hidden(facts: dict[str, np.ndarray]) -> int:
    """``sqrt(W_o / e)`` of the attention-output GEMMs' facts: ``W_o`` the median weight over the
    blocks (one per layer: a time-based estimate of one kernel, the first layer's often slower,
    is noisier than their median), ``e`` its element size (2 when unknown); 0 without a weight."""
    w = np.nan_to_num(np.asarray(facts["weight_bytes"], dtype=float))
    has = np.flatnonzero(w > 0)
    if not len(has):
        return 0
    elem = element_bytes(str(facts["weight_dtype"][has[0]])) if len(facts["weight_dtype"]) else None
    return int(round(math.sqrt(float(np.median(w[has])) / (elem or 2))))


def _kernel_heads(graph: TaskGraph, tasks: np.ndarray) -> tuple[int, int] | None:
    """(head_dim, query heads per KV head) from the first attention kernel whose name carries them
    (:func:`~whatif.core.kernels.paged_attention_kernel_heads`), None when none does."""
    names = graph.tasks["name"].to_numpy()
    for task in np.asarray(tasks, dtype=np.int64).tolist():
        found = paged_attention_kernel_heads(str(names[task]))
        if found is not None:
            return found
    return None


def model_shape(graph: TaskGraph, ctx: TransformContext, who: str = "memory") -> ModelShape:
    """The :class:`ModelShape` of the first step with detected blocks; see the module docstring."""
    blocks = find_blocks(graph)
    if blocks.empty:
        raise TransformError(f"{who}: found no transformer block, so no model shape (layers, heads)")
    cost = ctx.require_cost(who)
    t = graph.tasks
    steps = t["step"].to_numpy()
    b_steps = steps[blocks["task"].to_numpy()]
    step0 = int(b_steps.min())
    rank0 = int(blocks.loc[b_steps == step0, "rank"].min())
    b0 = launched_blocks(graph, blocks[(b_steps == step0) & (blocks["rank"].to_numpy() == rank0)])
    kern = np.flatnonzero((t["kind"].to_numpy() == int(TaskKind.KERNEL)) & (steps == step0)
                          & (t["rank"].to_numpy() == rank0) & ~backward_mask(graph))
    weights, notes = _weight_bytes(cost.kernel_facts(graph, kern))
    layers = int(b0["block"].nunique())
    found = attention_heads(graph, b0.loc[b0["part"] == "attention", "task"].to_numpy())
    if found is not None:
        heads, kv_heads, head_dim = found
        hidden = heads * head_dim
    else:
        hidden = _attn_out_hidden(cost.kernel_facts(graph, b0.loc[b0["part"] == "attn_out", "task"].to_numpy()))
        if hidden <= 0:
            raise TransformError(f"{who}: no attention shapes recorded and no attention-output GEMM weight; "
                                 "give the model's hidden size, heads and kv_heads")
        named = _kernel_heads(graph, b0.loc[b0["part"] == "attention", "task"].to_numpy())
        head_dim, ratio = named or (DEFAULT_HEAD_DIM, 1)
        kv_heads = max(1, int(round(hidden / head_dim / ratio)))
        heads = kv_heads * ratio
        if named is None:
            notes.append(f"no attention shapes recorded: hidden {hidden} from the attention-output weight, "
                         f"head_dim {head_dim}, MHA ({heads} KV heads; GQA holds less)")
        else:
            notes.append(f"no attention shapes recorded: hidden {hidden} from the attention-output weight, "
                         f"head_dim {head_dim} and {ratio} query heads per KV head from the attention kernel's "
                         f"name ({heads} heads, {kv_heads} KV heads)")
    return ModelShape(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                      weight_bytes=weights, table_bytes=embedding_bytes(graph, kern, hidden), assumptions=tuple(notes))
