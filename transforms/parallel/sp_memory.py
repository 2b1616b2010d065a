"""What ``sequence_parallel`` in Ulysses mode does to memory: one rank of DeepSpeed-Ulysses of
degree ``P`` (Jacobs et al. 2023) holds the whole model and ``1/P`` of every per-token activation
of the transformer blocks, plus the all-to-alls' buffers.

Read from a forward-only recording (DiT or long-context inference; a backward is refused, as the
transform refuses it) with its shapes (``--record-shapes``):

* **Which ops run on the rank's tokens**: the trace's forward work ops and transformer blocks
  (:mod:`.forward_ops`: the heuristic ``tensor_parallel`` runs on kernels) with, for the first
  block of each run of blocks, its lead-in (the work ops before it back to the first GEMM or
  convolution: a DiT block's norm and modulation before its QKV GEMM). Of these, an op is
  **per token** when a tensor it is given has a dimension other than its last equal to the
  attention's tokens per sequence ``N`` or to all its tokens ``B·N`` (read from the attention
  ops' shapes, :func:`~whatif.core.kernels.attention_sequences`); the others (the adaLN
  modulation of a DiT, computed from one conditioning vector per sample) run whole on every rank,
  and so does a forward whose attention has fewer query tokens than ranks (a decode step).
* **Activations made in a per-token op** of the blocks are ``1/P`` of their recorded bytes:
  GEMM, norm and elementwise outputs hold ``N/P`` tokens, and attention runs on ``H/P`` heads of
  all ``N`` tokens, so what it makes (the math backend's ``S×S`` scores too) is ``1/P``.
  Everything else (parameters, the embedding and final layers outside the blocks, per-sample
  tensors) is as recorded.
* **The all-to-alls' buffers**, as yunchang's ``SeqAllToAll4D`` (the Ulysses under xDiT) and
  DeepSpeed's ``_SeqAllToAll`` make them: each of Q, K and V is copied contiguous into a send
  buffer, received into a buffer of the same size, and the received one reshaped into one more
  copy, which attention reads; the send and receive buffers are freed once it is made. So right
  before each attention call three blocks of Q's bytes on a rank (``q``: its recorded bytes /
  ``P``) come and two go, then K's, then V's; the three reshaped copies stand for the QKV output
  (freed in the program, held in the recording's place). After the call the output's all-to-all
  makes the same three blocks of its bytes, the last standing for the copy the recording makes
  when the output is flattened. K and V hold at least one KV head of every token on a rank (a KV
  head replicated when the ranks outnumber them, as the transform prices it), and a head split
  the transform refuses is refused here too.
* **The all-gather after the last block** (each rank's tokens gathered for the final layer, which
  runs whole): ``P`` receive blocks holding the whole hidden state are made and freed after the
  last per-token op, and that op's output is kept whole (the gathered tensor from then on).

Left out: Ring, USP and Torus (their K, V blocks, running output and log-sum-exp; no recording
checks them: they are "memory not modelled"), buffers a communication library holds outside
PyTorch's allocator (NCCL's; gloo's), a sharded op's output briefly held whole before the gather,
and ops whose tensors only coincidentally have ``N`` in a non-last dimension.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from whatif.core.kernels import KernelClass, attention_sequences, classify_kernel, float_tensors, is_attention
from whatif.depgraph.hierarchy import enclosing, record_steps
from whatif.tracer.args import Arg
from whatif.tracer.memory import BlockScaling, RecordEdit, RecordEditor, gpu_block_bytes, on_gpu, scale_blocks
from whatif.tracer.trace import Trace

from ..base import TransformError
from ..optimizations.batch_memory import (
    BatchPeaks,
    BlockRole,
    BlockRoles,
    backward_events,
    batch_peaks,
    block_roles,
    with_transients,
)
from .forward_ops import ForwardOps, forward_ops
from .memory import HeadSplit, attention_op_heads, head_split

WHO = "sequence_parallel"
STOPS = frozenset({KernelClass.GEMM.value, KernelClass.CONV.value, KernelClass.ATTENTION.value})
"""Work-op classes a block's lead-in does not reach past."""


@dataclass(frozen=True)
class AttentionCall:
    """One attention op of the sharded blocks: the first and last allocator records inside it
    (rows of ``Trace.memory``) and the bytes on one rank of each tensor its all-to-alls move
    (Q, K, V, then the output)."""

    first: int
    last: int
    qkv_bytes: tuple[int, int, int]
    out_bytes: int


@dataclass(frozen=True)
class UlyssesMemory:
    """One Ulysses rank's memory: each allocation's share (``scale``, aligned with
    ``roles.rows``), the attention calls whose all-to-alls add buffers, and the all-gathers (the
    record after which each happens and the bytes it receives)."""

    degree: int
    roles: BlockRoles
    scale: np.ndarray
    calls: tuple[AttentionCall, ...]
    gathers: tuple[tuple[int, int], ...]

    def scaling(self) -> BlockScaling:
        return BlockScaling(self.roles.rows, self.scale)


def _tensor_dims(dims: object) -> list[list[int]]:
    if not isinstance(dims, list):
        return []
    return [[int(x) for x in d] for d in dims
            if isinstance(d, list) and d and all(isinstance(x, (int, float)) for x in d)]


def per_token(dims: object, tokens: frozenset[int]) -> bool:
    """Whether an op given tensors of shapes ``dims`` works per token: a tensor of two or more
    dimensions has one other than its last in ``tokens``.

    >>> per_token([[4, 256, 192], [1, 256, 192]], frozenset({256, 1024})), per_token([[4, 192]], frozenset({256}))
    (True, False)
    >>> per_token([[4, 256]], frozenset({256})), per_token([[1024, 192]], frozenset({256, 1024}))
    (False, True)
    """
    return any(len(d) >= 2 and any(x in tokens for x in d[:-1]) for d in _tensor_dims(dims))


def _sequences(trace: Trace, ops: ForwardOps) -> dict[tuple[int, int], np.ndarray]:
    """Each rank's and step's work ops in the order they ran."""
    rows = ops.hierarchy.rows
    own = np.flatnonzero((ops.work == np.arange(len(rows))) & ops.forward)
    steps = record_steps(trace.events, trace.events)[rows]
    ranks = trace.events["rank"].to_numpy()[rows]
    ts = trace.events["ts_ns"].to_numpy()[rows]
    out: dict[tuple[int, int], np.ndarray] = {}
    for key in sorted({(int(ranks[p]), int(steps[p])) for p in own.tolist()}):
        mine = own[(ranks[own] == key[0]) & (steps[own] == key[1])]
        out[key] = mine[np.lexsort((mine, ts[mine]))]
    return out


def _sharded(seq: np.ndarray, ops: ForwardOps, names: np.ndarray, dims: np.ndarray,
             tokens: frozenset[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per work op of one sequence: whether it runs on the rank's tokens (module docstring), and
    whether it is the last to before the gather (the next per-token op runs whole, or none follows)."""
    in_block = ops.role[seq] >= 0
    lead = np.zeros(len(seq), dtype=bool)
    for i in np.flatnonzero(in_block & ~np.r_[False, in_block[:-1]]).tolist():
        j = i - 1
        while j >= 0 and not in_block[j] and classify_kernel(str(names[seq[j]]), str(names[seq[j]])).value not in STOPS:
            lead[j] = True
            j -= 1
    token = np.asarray([per_token(dims[p], tokens) for p in seq.tolist()], dtype=bool)
    sharded = (in_block | lead) & token
    at = np.flatnonzero(token)
    last = np.zeros(len(seq), dtype=bool)
    last[at] = sharded[at] & ~np.r_[sharded[at][1:], False]
    return sharded, last


def _attention_bytes(name: str, dims: object, types: object, degree: int) -> tuple[int, int, int, int] | None:
    """Bytes on one rank of Q, K, V and the output an attention op's all-to-alls move: each over
    ``degree``, K and V at least one whole KV head of every token (a KV head replicated when the
    ranks outnumber them, as the transform prices it); None without its shapes."""
    kinds = types if isinstance(types, (list, tuple)) else None
    tensors = float_tensors(dims, kinds) if isinstance(dims, list) else []
    heads = attention_op_heads(name, dims)
    if len(tensors) < 3 or heads is None:
        return None
    (_, q, qt), (_, k, kt), (_, v, vt) = tensors[:3]
    kv_heads = heads[1]
    kv_share = math.ceil(kv_heads / degree) / kv_heads
    q_dims, v_dims = dims[tensors[0][0]], dims[tensors[2][0]]   # type: ignore[index]
    out = q // int(q_dims[-1]) * int(v_dims[-1])
    return (q * qt.bytes // degree, int(k * kt.bytes * kv_share), int(v * vt.bytes * kv_share),
            out * qt.bytes // degree)


def _split(trace: Trace, ops: ForwardOps, names: np.ndarray, dims: np.ndarray, degree: int) -> tuple[np.ndarray,
                                                                                                      list[int]]:
    """Per position of ``ops``' hierarchy: whether the op runs on the rank's tokens; and the work
    ops after which the tokens are gathered."""
    sharded = np.zeros(len(names), dtype=bool)
    ends: list[int] = []
    for seq in _sequences(trace, ops).values():
        lengths = [attention_sequences(str(names[p]), dims[p]) for p in seq.tolist() if is_attention(str(names[p]))]
        tokens = frozenset(x for found in lengths if found and found[0][0] >= degree   # fewer: not split
                           for x in (found[0][0], found[0][0] * len(found)))
        if not tokens:
            continue
        mine, last = _sharded(seq, ops, names, dims, tokens)
        sharded[seq[mine]] = True
        ends += seq[last].tolist()
    return sharded, ends


def ulysses_memory(trace: Trace, degree: int, roles: BlockRoles | None = None,
                   ops: ForwardOps | None = None) -> UlyssesMemory:
    """One rank's memory under Ulysses of ``degree`` (module docstring).

    Raises
    ------
    TransformError : the trace has no allocator records, has a backward pass, or its forward has
        no transformer block whose attention op has recorded shapes and at least ``degree`` query
        tokens; the ranks do not split its heads (:func:`~.memory.head_split`).
    """
    if not len(trace.memory):
        raise TransformError(f"{WHO}: {trace.source} has no allocator records (record with --memory)")
    ev = trace.events
    if backward_events(ev).any():
        raise TransformError(f"{WHO}: models a forward pass (DiT or long-context inference); {trace.source} has a "
                             f"backward pass, whose sequence-parallel gradients are not modelled")
    roles = block_roles(trace, WHO) if roles is None else roles
    ops = forward_ops(trace) if ops is None else ops
    rows = ops.hierarchy.rows
    names = ev["name"].astype(str).to_numpy()[rows]
    dims = trace.arg(Arg.INPUT_DIMS)[rows]
    types = trace.arg(Arg.INPUT_TYPES)[rows]
    sharded, ends = _split(trace, ops, names, dims, degree)
    if not sharded.any():
        raise TransformError(f"{WHO}: found no transformer block whose attention op has recorded shapes and at least "
                             f"{degree} query tokens in the forward of {trace.source} (record with --record-shapes); "
                             f"its memory cannot be split {degree} ways")
    mem = trace.memory
    gpu = on_gpu(mem)
    model_device = gpu if gpu.any() else np.ones(len(mem), dtype=bool)   # not the host's records of a GPU run
    pos = enclosing(ops.hierarchy, ev, mem)
    work = np.where((pos >= 0) & model_device, ops.work[np.maximum(pos, 0)], -1)
    allocs = roles.rows
    made_in = work[allocs]
    scale = np.where(roles.mask(BlockRole.ACTIVATION) & (made_in >= 0) & sharded[np.maximum(made_in, 0)],
                     1 / degree, 1.0)
    records_of = pd.Series(np.arange(len(mem))).groupby(work).indices
    allocs_of = pd.Series(allocs).groupby(made_in).indices
    gathers = []
    for end in ends:
        if end in allocs_of:
            last = int(allocs_of[end][-1])
            scale[last] = 1.0
            gathers.append((int(allocs[last]), int(mem["bytes"].to_numpy()[allocs[last]])))
    calls = []
    for p in np.flatnonzero(sharded).tolist():
        if p not in records_of or not is_attention(str(names[p])):
            continue
        heads = attention_op_heads(str(names[p]), dims[p])
        if heads is not None and head_split(heads[0], heads[1], degree) is not HeadSplit.OK:
            raise TransformError(f"{WHO}: ulysses splits the {heads[0]} attention heads ({heads[1]} KV heads) over "
                                 f"{degree} GPUs, which does not divide them")
        moved = _attention_bytes(str(names[p]), dims[p], types[p], degree)
        if moved is not None:
            records = records_of[p]
            calls.append(AttentionCall(int(records[0]), int(records[-1]), (moved[0], moved[1], moved[2]), moved[3]))
    return UlyssesMemory(degree, roles, scale, tuple(calls), tuple(gathers))


def _exchange(name: str, nbytes: int) -> list[tuple[str | int, int]]:
    """One all-to-all's records: send and receive buffers, the reshaped copy, the two freed."""
    return [(f"{name} send", nbytes), (f"{name} receive", nbytes), (name, nbytes), (f"{name} send", 0),
            (f"{name} receive", 0)]


def _bursts(um: UlyssesMemory, gpu: np.ndarray) -> list[tuple[tuple[int, bool], list[tuple[str | int, int]], str]]:
    """Each burst of buffers one rank makes and frees at one place: ``((row, after), records, op)``."""
    def size(row: int, nbytes: int) -> int:
        return gpu_block_bytes(nbytes) if gpu[row] else nbytes

    out: list[tuple[tuple[int, bool], list[tuple[str | int, int]], str]] = []
    for call in um.calls:
        q, k, v = (size(call.first, b) for b in call.qkv_bytes)
        qkv: list[tuple[str | int, int]] = [*_exchange("q", q), *_exchange("k", k), *_exchange("v", v),
                                             ("q", 0), ("k", 0), ("v", 0)]
        out.append(((call.first, False), qkv, "(Ulysses all-to-all: Q, K, V)"))
        o = size(call.last, call.out_bytes)
        out.append(((call.last, True), [*_exchange("o", o), ("o", 0)], "(Ulysses all-to-all: output)"))
    for row, nbytes in um.gathers:
        part = size(row, nbytes // um.degree)
        parts: list[tuple[str | int, int]] = [(i, n) for n in (part, 0) for i in range(um.degree)]
        out.append(((row, True), parts, "(Ulysses all-gather)"))
    return out


def _most_held(records: list[tuple[str | int, int]]) -> int:
    """The most bytes a burst holds at once."""
    held: dict[str | int, int] = {}
    most = 0
    for block, nbytes in records:
        if nbytes:
            held[block] = nbytes
        else:
            held.pop(block, None)
        most = max(most, sum(held.values()))
    return most


def ulysses_batch_peaks(trace: Trace, degree: int, roles: BlockRoles | None = None,
                        ops: ForwardOps | None = None) -> BatchPeaks | None:
    """One Ulysses rank's GPU memory at any batch (what the plan sweep reads for sp > 1): the
    per-token activations at 1/P (:func:`~whatif.transforms.optimizations.batch_memory.batch_peaks`
    with :meth:`UlyssesMemory.scaling`) and each burst of buffers at its most, growing with the
    batch; None without GPU records.

    Raises
    ------
    TransformError : as :func:`ulysses_memory`.
    """
    um = ulysses_memory(trace, degree, roles, ops)
    peaks = batch_peaks(trace, um.roles, um.scaling())
    if peaks is None:
        return None
    gpu = on_gpu(trace.memory)
    return with_transients(trace, peaks, [(at[0], at[1], _most_held(records)) for at, records, _ in _bursts(um, gpu)])


def sequence_parallel_memory_edit(trace: Trace, degree: int) -> RecordEdit:
    """The allocator records of one rank of Ulysses of ``degree`` (:func:`ulysses_memory`): the
    per-token activations of the blocks at ``1/P``, each attention call's all-to-all buffers and
    each all-gather's receive blocks added.

    Raises
    ------
    TransformError : as :func:`ulysses_memory`.
    """
    um = ulysses_memory(trace, degree)
    editor = RecordEditor(trace.memory)
    scale_blocks(editor, um.scaling())
    for at, records, op in _bursts(um, on_gpu(trace.memory)):
        editor.add_burst(at, records, op)
    sizes = trace.memory["bytes"].to_numpy()[um.roles.rows]
    less = float((sizes * (1 - um.scale)).sum())
    what = (f"sequence_parallel(ulysses, degree={degree}): {int((um.scale < 1).sum()):,} activation blocks at "
            f"1/{degree} ({less / 2**20:,.1f} MiB fewer allocated), the all-to-all buffers of {len(um.calls):,} "
            f"attention calls and {len(um.gathers):,} all-gathers added")
    return editor.edit(what)
