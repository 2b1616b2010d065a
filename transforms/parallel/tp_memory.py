"""What ``tensor_parallel`` does to memory: one rank of Megatron-LM tensor parallelism of degree
``t`` holds ``1/t`` of the blocks made from sharded weights and sharded activations and all of the
others (Shoeybi et al. 2019 for the sharding; Korthikanti et al. 2022, §4.2, for which activations
it shards).

Each allocation of the trace's allocator records (``Trace.memory``) keeps its
:class:`~whatif.transforms.optimizations.batch_memory.BlockRole` and gets a **share**, its bytes on
one rank over its recorded bytes:

* **Activations made in the forward** take the share of the output of the op they are made in:
  the trace's forward CPU ops that do work (the outermost op whose name has a kernel class other
  than ``other``: a GEMM, attention, a norm, a reduction, an elementwise op, a copy…) form a
  sequence per rank and step, and the transformer blocks of
  :func:`~whatif.transforms.parallel.layers.sequence_rows` (the heuristic ``tensor_parallel`` runs
  on kernels) give each its role. The output of a column-parallel GEMM (QKV, MLP up/gate), of
  attention (its heads) and of an elementwise op between them (the MLP activation, the attention
  output's copy) is ``1/t``; that of a row-parallel GEMM (the full hidden size, all-reduced), a
  norm, a residual add or an op outside every block (embedding, LM head, loss) whole; with
  ``sequence_parallel`` norms and residual adds are ``1/t`` too (but the last block's MLP
  residual add, which lies after the last GEMM the heuristic puts in a block). An op that does no
  work (a view, a reshape) outputs what the work op before it output.
* **Activations made in the backward** are the input gradients of the forward op whose autograd
  node makes them (matched by ``Sequence number``), the share of that op's input: what the work
  op before it output (a column-parallel GEMM's input is whole, all-gathered with sequence
  parallelism). So a row-parallel GEMM's input gradient is ``1/t``, a column-parallel one's whole.
* **Parameters, their gradients, optimizer state and everything else made to last** (every role
  but activations): a block whose bytes are those of a parameter (its elements × 4 bytes, the
  fp32 master copy, gradient and optimizer state, or × its recorded type's size, autocast's bf16
  copy; rounded up to 512 on a GPU) takes that parameter's share: a column-parallel GEMM's weight and
  bias and a row-parallel GEMM's weight are ``1/t``; a row-parallel bias, norms and embeddings
  are whole. When several parameters have those bytes, the block takes their mean share, each
  parameter counted as often as the forward uses it.
* **Memory allocated before the recording** (a GPU's first ``Total Allocated`` less its first
  record; a CPU-only trace's device's) is taken to be parameters: its share is the parameters'
  (their elements, weighted as above).

Left out: the all-reduce's own buffers (NCCL's are outside the caching allocator; gloo's on the
CPU are allocated on its own threads and show as no block), blocks made inside attention that are
not per head (a causal mask) taken as ``1/t``, the extra output-sized block of a row-parallel
GEMM's bias added after its all-reduce, a vocabulary-parallel embedding or LM head (Megatron
shards them; whatif's ``tensor_parallel`` keeps them replicated), and KV caches allocated before
the recording (taken as parameters).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from whatif.depgraph.hierarchy import enclosing
from whatif.tracer.memory import BlockScaling, RecordEdit, on_gpu
from whatif.tracer.trace import Trace

from ..base import TransformError
from ..optimizations.batch_memory import BlockRole, BlockRoles, block_roles
from .forward_ops import ROLES, ForwardOps, forward_ops, lasting_shares, parameter_uses, shares_edit
from .sharding import Role

FORWARD_SHARDED = frozenset({Role.COLUMN, Role.HEADS, Role.SHARDED})
"""Forward roles whose output is ``1/t`` on a rank (SEQUENCE too with sequence parallelism)."""


@dataclass(frozen=True)
class TensorParallelShares:
    """Each allocation's bytes on one rank over its recorded bytes (``scale``, aligned with
    ``roles.rows``) and the share of what was allocated before the recording (``before``)."""

    degree: int
    sequence_parallel: bool
    roles: BlockRoles
    scale: np.ndarray
    before: float

    def sharded(self) -> np.ndarray:
        """Positions (into ``roles.rows``) of the allocations a rank holds less of."""
        return np.flatnonzero(self.scale < 1)

    def scaling(self) -> BlockScaling:
        """The shares as a :class:`~whatif.tracer.memory.BlockScaling` (what ``scaled_edit`` and
        ``batch_peaks`` take)."""
        return BlockScaling(self.roles.rows, self.scale, self.before)


@dataclass(frozen=True)
class ForwardShares:
    """Per position of a :class:`~.forward_ops.ForwardOps`' hierarchy: the :class:`Role` index of
    the work op it is or is inside of (-1: none, a loose op, or one outside every block), the share
    of the blocks it makes (``out``) and of its inputs (``into``: the input gradients its autograd
    node makes)."""

    role: np.ndarray
    out: np.ndarray
    into: np.ndarray


def forward_shares(ops: ForwardOps, degree: int, sequence_parallel: bool = False) -> ForwardShares:
    """The :class:`ForwardShares` of a trace's forward ops under tensor parallelism of ``degree``:
    a work op's output is ``1/t`` for the roles of :data:`FORWARD_SHARDED` (and norms and residual
    adds with ``sequence_parallel``), its input what the work op before it output (a
    column-parallel GEMM's always whole: all-gathered with sequence parallelism); ops inside a work
    op take its shares, loose ops (views, reshapes) the output share of their work op."""
    sharded = FORWARD_SHARDED | ({Role.SEQUENCE} if sequence_parallel else set())
    codes = [ROLES.index(r) for r in sharded]
    n = len(ops.work)
    own = ops.work == np.arange(n)
    out = np.where(own & np.isin(ops.role, codes), 1 / degree, 1.0)
    into = np.where(ops.role == ROLES.index(Role.COLUMN), 1.0,
                    np.where(ops.before >= 0, out[np.maximum(ops.before, 0)], 1.0))
    at = np.maximum(ops.work, 0)
    known = ops.work >= 0
    out_pos = np.where(known, out[at], 1.0)
    into_pos = np.where(known, np.where(ops.loose, out[at], into[at]), 1.0)
    return ForwardShares(np.where(ops.loose, -1, ops.role), out_pos, into_pos)


def tensor_parallel_shares(trace: Trace, degree: int, sequence_parallel: bool = False,
                           roles: BlockRoles | None = None, ops: ForwardOps | None = None) -> TensorParallelShares:
    """Each allocation's share on one rank of tensor parallelism of ``degree`` (module docstring).

    Raises
    ------
    TransformError : as :func:`~whatif.transforms.optimizations.batch_memory.block_roles`, or the
        trace's forward has no transformer block.
    """
    roles = block_roles(trace, "tensor_parallel") if roles is None else roles
    ops = forward_ops(trace) if ops is None else ops
    fwd = forward_shares(ops, degree, sequence_parallel)
    if not (fwd.role >= 0).any():
        raise TransformError(f"tensor_parallel: found no transformer block (attention followed by a GEMM) in the "
                             f"forward ops of {trace.source}; its memory cannot be sharded")
    mem = trace.memory
    allocs = roles.rows
    pos = enclosing(ops.hierarchy, trace.events, mem.iloc[allocs])
    at = np.maximum(pos, 0)
    made_by = np.where(pos >= 0, ops.made_by[at], -1)
    scale = np.where(made_by >= 0, fwd.into[np.maximum(made_by, 0)], np.where(pos >= 0, fwd.out[at], 1.0))
    activation = roles.mask(BlockRole.ACTIVATION)
    uses = parameter_uses(trace, ops)
    of = fwd.role[uses.pos]
    sharded = (of == ROLES.index(Role.COLUMN)) | ((of == ROLES.index(Role.ROW)) & uses.weight)
    lasting = lasting_shares(uses, np.where(sharded, 1 / degree, 1.0))
    scale = np.where(activation, scale, lasting.of(mem["bytes"].to_numpy()[allocs], on_gpu(mem)[allocs]))
    before = lasting.before
    return TensorParallelShares(degree, sequence_parallel, roles, scale, before)


def tensor_parallel_memory_edit(trace: Trace, degree: int, sequence_parallel: bool = False) -> RecordEdit:
    """The allocator records of one rank of tensor parallelism of ``degree``: each allocation at
    its share of its bytes (:func:`tensor_parallel_shares`), at its place, freed at its free; on
    each device, what was allocated before the recording at the parameters' share, from the first
    record on (:func:`~whatif.tracer.memory.scaled_edit`).

    Raises
    ------
    TransformError : as :func:`tensor_parallel_shares`.
    """
    shares = tensor_parallel_shares(trace, degree, sequence_parallel)
    return shares_edit(trace, shares.roles, shares.scaling(),
                       f"tensor_parallel(degree={degree}{', sequence_parallel' if sequence_parallel else ''}): "
                       f"{len(shares.sharded()):,} blocks held at less than their bytes on one rank: ")
