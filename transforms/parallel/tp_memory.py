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

from collections import Counter
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from whatif.core.dtypes import element_bytes
from whatif.core.kernels import KernelClass, classify_kernel, param_args, weight_arg
from whatif.depgraph.hierarchy import CpuHierarchy, autograd_nodes, build_hierarchy, enclosing, inherit, record_steps
from whatif.tracer.args import Arg, int_values
from whatif.tracer.kinds import EventKind
from whatif.tracer.memory import (
    BEFORE_THE_RECORDING,
    GPU_BLOCK_BYTES,
    BlockScaling,
    RecordEdit,
    on_gpu,
    scaled_edit,
)
from whatif.tracer.trace import Trace

from ..base import TransformError
from ..optimizations.batch_memory import BlockRole, BlockRoles, backward_events, block_roles
from .layers import sequence_rows
from .sharding import Role

_ROLES = list(Role)
FORWARD_SHARDED = frozenset({Role.COLUMN, Role.HEADS, Role.SHARDED})
"""Forward roles whose output is ``1/t`` on a rank (SEQUENCE too with sequence parallelism)."""
PARAMETER_BYTES = 4
"""Bytes an element of a parameter's master copy, gradient and optimizer state are taken to hold (fp32)."""


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


def _positions(mask: np.ndarray) -> np.ndarray:
    """Each position where ``mask`` holds, -1 elsewhere (what :func:`inherit` passes down)."""
    return np.where(mask, np.arange(len(mask)), -1)


def outermost(mask: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Per position of a hierarchy: ``mask`` holds there and at none of its ancestors.

    >>> outermost(np.array([True, True, False, True]), np.array([-1, 0, -1, 2])).tolist()
    [True, False, False, True]
    """
    above = inherit(_positions(mask), parent)
    return mask & (np.where(parent >= 0, above[np.maximum(parent, 0)], -1) < 0)


def _work_classes(names: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per CPU op row: its :class:`KernelClass` value read from its name, ``other`` where it does no work."""
    distinct = pd.unique(names[rows])
    by_name = {n: classify_kernel(n, n).value for n in distinct}
    return np.asarray([by_name[n] for n in names[rows]], dtype=object)


@dataclass(frozen=True)
class ForwardShares:
    """Per position of a :class:`CpuHierarchy`'s ``rows`` (forward CPU ops; the backward's get
    -1 and 1): the :class:`Role` index of the work op it is or is inside of (-1: none, or one
    outside every block), the share of the blocks it makes (``out``) and of its inputs (``into``:
    the input gradients its autograd node makes)."""

    role: np.ndarray
    out: np.ndarray
    into: np.ndarray


def forward_shares(trace: Trace, hierarchy: CpuHierarchy, backward: np.ndarray, steps: np.ndarray, degree: int,
                   sequence_parallel: bool = False) -> ForwardShares:
    """The :class:`ForwardShares` of ``trace``'s forward ops under tensor parallelism of ``degree``.

    The work ops (the outermost CPU ops whose name has a kernel class other than ``other``) of
    each rank's and step's forward form a sequence whose transformer blocks
    (:func:`~whatif.transforms.parallel.layers.sequence_rows`) give each its role; a work op's
    output is ``1/t`` for the roles of :data:`FORWARD_SHARDED` (and norms and residual adds with
    ``sequence_parallel``), its input what the work op before it output (a column-parallel GEMM's
    always whole: all-gathered with sequence parallelism); ops inside a work op take its shares,
    other forward ops (views, reshapes) the output share of the work op before them.
    ``backward``: per event, whether it lies in a backward window; ``steps``: per event, its step
    (:func:`~whatif.depgraph.hierarchy.record_steps`)."""
    ev = trace.events
    rows = hierarchy.rows
    n = len(rows)
    names = ev["name"].astype(str).to_numpy()
    kinds = ev["kind"].to_numpy()[rows]
    nodes = np.isin(rows, autograd_nodes(ev))
    forward = (kinds == int(EventKind.CPU_OP)) & ~nodes & ~backward[rows]
    cls = np.where(forward, _work_classes(names, rows), KernelClass.OTHER.value)
    outer = np.flatnonzero(outermost(cls != KernelClass.OTHER.value, hierarchy.parent))
    ts = ev["ts_ns"].to_numpy()[rows]
    rank = ev["rank"].to_numpy()[rows]
    steps = steps[rows]
    pos_names = names[rows]
    layers = np.full(n, None, dtype=object)
    sharded = FORWARD_SHARDED | ({Role.SEQUENCE} if sequence_parallel else set())
    role = np.full(n, -1, dtype=np.int64)
    out = np.ones(n)
    into = np.ones(n)
    frame = pd.DataFrame({"pos": outer, "rank": rank[outer], "step": steps[outer], "ts": ts[outer]})
    sequences = {}
    for (r, s), seq in frame.groupby(["rank", "step"], sort=True):
        k = seq.sort_values(["ts", "pos"], kind="stable")["pos"].to_numpy()
        found: list[tuple[int, int, int, str, str]] = []
        sequence_rows(found, k, int(r), 0, cls, pos_names, pos_names, layers)
        for pos, _, _, _, value in found:
            role[pos] = _ROLES.index(Role(value))
            out[pos] = 1 / degree if Role(value) in sharded else 1.0
        into[k[1:]] = np.where(role[k[1:]] == _ROLES.index(Role.COLUMN), 1.0, out[k[:-1]])
        sequences[(int(r), int(s))] = k
    in_outer = inherit(_positions(np.isin(np.arange(n), outer)), hierarchy.parent)
    inside = in_outer >= 0
    at = np.maximum(in_outer, 0)
    role = np.where(inside, role[at], -1)
    into = np.where(inside, into[at], 1.0)
    out = np.where(inside, out[at], 1.0)
    loose = np.flatnonzero(forward & ~inside)
    for (r, s), group in pd.DataFrame({"pos": loose, "rank": rank[loose], "step": steps[loose]}).groupby(
            ["rank", "step"], sort=False):
        k = sequences.get((int(r), int(s)))
        if k is None:
            continue
        at = group["pos"].to_numpy()
        before = np.searchsorted(ts[k], ts[at], side="right") - 1
        known = before >= 0
        out[at[known]] = into[at[known]] = out[k[before[known]]]
    return ForwardShares(role, out, into)


def _shares_by_bytes(trace: Trace, hierarchy: CpuHierarchy, role: np.ndarray, backward: np.ndarray,
                     t: int) -> tuple[dict[int, float], dict[int, float], float]:
    """The share of a parameter-sized block by its bytes (CPU sizes, GPU sizes rounded to
    :data:`GPU_BLOCK_BYTES`), and the parameters' share by elements. A parameter's blocks are
    taken to hold 4 bytes an element (fp32 weights, gradients, optimizer state) or its recorded
    type's (a bf16 copy under autocast); of nested ops given parameters, the outermost counts."""
    ev = trace.events
    names = ev["name"].astype(str).to_numpy()
    dims, types = trace.arg(Arg.INPUT_DIMS), trace.arg(Arg.INPUT_TYPES)
    rows = hierarchy.rows
    forward = ~backward[rows] & (ev["kind"].to_numpy()[rows] == int(EventKind.CPU_OP))
    given = np.asarray([bool(f) and bool(param_args(str(names[r]), dims[r])) for f, r in zip(forward, rows)])
    uses: Counter[tuple[int, int, bool]] = Counter()   # (elements, bytes an element, sharded) -> uses
    for pos in np.flatnonzero(outermost(given, hierarchy.parent)).tolist():
        r = int(rows[pos])
        name, d = str(names[r]), dims[r]
        kinds = types[r] if isinstance(types[r], (list, tuple)) else ()
        w = weight_arg(name, d)
        of = _ROLES[role[pos]] if role[pos] >= 0 else Role.REPLICATED
        for i in param_args(name, d):
            numel = int(np.prod(d[i], dtype=np.int64))
            if numel > 1:
                recorded = element_bytes(kinds[i] if i < len(kinds) else None) or PARAMETER_BYTES
                for e in sorted({PARAMETER_BYTES, int(recorded)}):
                    uses[(numel, e, of is Role.COLUMN or (of is Role.ROW and i == w))] += 1
    cpu: dict[int, list[int]] = {}
    gpu: dict[int, list[int]] = {}
    by_numel: dict[int, list[int]] = {}
    for (numel, e, sharded), n in uses.items():
        for table, nbytes in ((cpu, numel * e), (gpu, -(-numel * e // GPU_BLOCK_BYTES) * GPU_BLOCK_BYTES)):
            table.setdefault(nbytes, [0, 0])[0 if sharded else 1] += n
        if e == PARAMETER_BYTES:
            by_numel.setdefault(numel, [0, 0])[0 if sharded else 1] += n

    def share(s: int, r: int) -> float:
        return (s / t + r) / (s + r)

    total = sum((s + r) * n for n, (s, r) in by_numel.items())
    before = sum((s / t + r) * n for n, (s, r) in by_numel.items()) / total if total else 1.0
    return ({b: share(*sr) for b, sr in cpu.items()}, {b: share(*sr) for b, sr in gpu.items()}, before)


def tensor_parallel_shares(trace: Trace, degree: int, sequence_parallel: bool = False,
                           roles: BlockRoles | None = None) -> TensorParallelShares:
    """Each allocation's share on one rank of tensor parallelism of ``degree`` (module docstring).

    Raises
    ------
    TransformError : as :func:`~whatif.transforms.optimizations.batch_memory.block_roles`, or the
        trace's forward has no transformer block.
    """
    roles = block_roles(trace, "tensor_parallel") if roles is None else roles
    ev, mem = trace.events, trace.memory
    hierarchy = build_hierarchy(ev)
    steps = record_steps(ev, ev)
    backward = backward_events(ev, steps=steps)
    fwd = forward_shares(trace, hierarchy, backward, steps, degree, sequence_parallel)
    if not (fwd.role >= 0).any():
        raise TransformError(f"tensor_parallel: found no transformer block (attention followed by a GEMM) in the "
                             f"forward ops of {trace.source}; its memory cannot be sharded")
    # the forward op behind each autograd node (by rank and sequence number)
    rows = hierarchy.rows
    seq = int_values(trace.arg(Arg.SEQUENCE_NUMBER), rows)
    ranks = ev["rank"].to_numpy()[rows]
    by_seq: dict[tuple[int, int], int] = {}
    for pos in np.flatnonzero(~backward[rows] & (seq >= 0)).tolist():
        by_seq.setdefault((int(ranks[pos]), int(seq[pos])), pos)
    is_node = np.isin(rows, autograd_nodes(ev))
    node_into = np.ones(len(rows))
    for pos in np.flatnonzero(is_node & (seq >= 0)).tolist():
        made_by = by_seq.get((int(ranks[pos]), int(seq[pos])), -1)
        if made_by >= 0:
            node_into[pos] = fwd.into[made_by]
    node_at = inherit(_positions(is_node), hierarchy.parent)

    allocs = roles.rows
    pos = enclosing(hierarchy, ev, mem.iloc[allocs])
    at = np.maximum(pos, 0)
    node = np.where(pos >= 0, node_at[at], -1)
    scale = np.where(node >= 0, node_into[np.maximum(node, 0)], np.where(pos >= 0, fwd.out[at], 1.0))
    activation = roles.codes == list(BlockRole).index(BlockRole.ACTIVATION)

    cpu, gpu, before = _shares_by_bytes(trace, hierarchy, fwd.role, backward, degree)
    sizes = mem["bytes"].to_numpy()[allocs]
    gpu_row = on_gpu(mem)[allocs]
    lasting = np.asarray([(gpu if g else cpu).get(int(b), 1.0) for b, g in zip(sizes, gpu_row)], dtype=float)
    scale = np.where(activation, scale, lasting)
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
    sizes = trace.memory["bytes"].to_numpy()
    rows = shares.roles.rows
    activation = shares.roles.codes == list(BlockRole).index(BlockRole.ACTIVATION)
    less = sizes[rows] * (1 - shares.scale)
    what = (f"tensor_parallel(degree={degree}{', sequence_parallel' if sequence_parallel else ''}): "
            f"{len(shares.sharded()):,} blocks held at less than their bytes on one rank: "
            f"{less[activation].sum() / 2**20:,.1f} MiB fewer activation bytes allocated, "
            f"{less[~activation].sum() / 2**20:,.1f} MiB fewer parameter, gradient and optimizer-state bytes")
    order = np.argsort(rows)
    edit = scaled_edit(trace.memory, BlockScaling(rows[order], shares.scale[order], shares.before), what)
    if (edit.added["op"] == BEFORE_THE_RECORDING).any():
        what += f"; what was allocated before the recording, taken as parameters, at {shares.before:.1%} of its bytes"
    return replace(edit, what=what)
