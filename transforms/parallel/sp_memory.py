"""What ``sequence_parallel`` does to memory in Ulysses, Ring and USP mode: one rank of
sequence parallelism of degree ``P``, with Ulysses (Jacobs et al. 2023) over ``U`` of the ranks and
Ring attention (Liu et al. 2023) over ``R = P/U`` (Ulysses: ``U = P``; Ring: ``U = 1``; USP, Fang &
Zhao 2024: between), holds the whole model and ``1/P`` of every per-token activation of the
transformer blocks, plus the all-to-alls' buffers and the ring's K, V blocks and running output.

Read from a forward-only recording (DiT or long-context inference; a backward is refused, as the
transform refuses it) with its shapes (``--record-shapes``):

* **Which ops run on the rank's tokens**: the trace's forward work ops and transformer blocks
  (:mod:`.forward_ops`: the heuristic ``tensor_parallel`` runs on kernels) with, for the first
  block of each run of blocks, its lead-in (the work ops before it back to the first GEMM or
  convolution: a DiT block's norm and modulation before its QKV GEMM). Of these, an op is
  **per token** when a tensor it is given, not of a parameter's shape, has a dimension other than
  its last equal to the attention's tokens per sequence ``N`` or to all its tokens ``B·N`` (read
  from the attention ops' shapes, :func:`~whatif.core.kernels.attention_sequences`); the others (the adaLN
  modulation of a DiT, computed from one conditioning vector per sample) run whole on every rank,
  and so does a forward whose attention has fewer query tokens than ranks (a decode step).
* **Activations made in a per-token op** of the blocks are ``1/P`` of their recorded bytes:
  GEMM, norm and elementwise outputs hold ``N/P`` tokens, and attention runs on ``H/U`` heads of
  ``N/R`` query tokens, so its output is ``1/P``. Under Ulysses alone what attention makes inside
  the call (the math backend's ``S×S`` scores too) is ``1/P``; with a ring the call is the ring's
  (below), so what the recorded call frees before it ends is not made. Everything else
  (parameters, the embedding and final layers outside the blocks, per-sample tensors) is as
  recorded.
* **The all-to-alls' buffers** (``U > 1``), as yunchang's ``SeqAllToAll4D`` (the Ulysses under xDiT) and
  DeepSpeed's ``_SeqAllToAll`` make them: each of Q, K and V is copied contiguous into a send
  buffer, received into a buffer of the same size, and the received one reshaped into one more
  copy, which attention reads; the send and receive buffers are freed once it is made. So right
  before each attention call three blocks of Q's bytes on a rank (``q``: its recorded bytes /
  ``P``) come and two go, then K's, then V's; the three reshaped copies stand for the QKV output
  (freed in the program, held in the recording's place). After the call the output's all-to-all
  makes the same three blocks of its bytes, the last standing for the copy the recording makes
  when the output is flattened. K and V hold ``⌈H_kv/U⌉`` KV heads of ``N/R`` tokens on a rank (a
  KV head replicated when the Ulysses ranks outnumber them, as the transform prices it), and a
  head split the transform refuses is refused here too.
* **The ring** (``R > 1``), as ring-flash-attention's ``ring_flash_attn_forward`` runs it without a
  mask (:func:`ring_records`, one burst before the call, its blocks kept as Python keeps the
  tensors): K and V copied contiguous first when the recording shows them strided (a fused QKV
  projection's views; ``Input Strides``) and ``U = 1``; each of ``R`` steps but the last receives
  the previous rank's K and V into new buffers while sending its own, and the block it held is
  freed once they have arrived (unless the caller still holds it); each step's attention makes its
  output (``O``: the output's bytes / ``P``) and fp32 log-sum-exp (``L``: ``B·H·N/P`` × 4), and folds
  them into a running fp32 output: the first step's output itself (converted when 16-bit), each
  later one ``out - sigmoid(lse_b - lse)·(out - out_b)`` and ``lse - logsigmoid(lse - lse_b)``,
  whose temporaries (three of ``O`` in fp32, five of ``L``, and on the CPU ``log_sigmoid``'s buffer) are
  made and freed in that order, the previous output and log-sum-exp freed when the new ones are
  returned. The last output, converted back to the input's dtype, stands for the recorded one.
* **The all-gather after the last block** (each rank's tokens gathered for the final layer, which
  runs whole): ``P`` receive blocks holding the whole hidden state are made and freed after the
  last per-token op, and that op's output is kept whole (the gathered tensor from then on).

Left out: Torus (StreamFusion's; "memory not modelled"), buffers a communication library holds
outside PyTorch's allocator (NCCL's; gloo's), an attention kernel's workspace inside each ring
step (the CPU flash kernel's per-thread buffers: tens of KiB), a fused update (the JIT-scripted
``_update_out_and_lse`` on a GPU may make fewer temporaries), a copy the recording makes to flatten
an attention output laid out by head which a ring's token-major output does not need, a sharded
op's output briefly held whole before the gather, and ops whose activations only coincidentally
have ``N`` in a non-last dimension.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from whatif.core.kernels import (
    KernelClass,
    attention_sequences,
    classify_kernel,
    float_tensors,
    is_attention,
    tensor_shapes,
)
from whatif.depgraph.hierarchy import enclosing
from whatif.tracer.args import Arg
from whatif.tracer.memory import BlockScaling, Burst, Record, RecordEdit, on_gpu, scaled_edit
from whatif.tracer.trace import Trace

from ..base import TransformError
from ..optimizations.batch_memory import (
    BatchPeaks,
    BlockRole,
    BlockRoles,
    backward_events,
    batch_peaks,
    block_roles,
    is_param_shape,
    with_transients,
)
from .forward_ops import ForwardOps, forward_ops
from .memory import HeadSplit, attention_op_heads, head_split

WHO = "sequence_parallel"
MODELLED_MODES = ("ulysses", "ring", "usp")
"""The ``sequence_parallel`` modes whose memory this module models (torus is not)."""
STOPS = frozenset({KernelClass.GEMM.value, KernelClass.CONV.value, KernelClass.ATTENTION.value})
"""Work-op classes a block's lead-in does not reach past."""


@dataclass(frozen=True)
class AttentionCall:
    """One attention op of the sharded blocks: the first and last allocator records inside it
    (rows of ``Trace.memory``), the bytes on one rank of Q, K and V and of the output (what the
    all-to-alls move; K and V also the ring's blocks), of the running fp32 output and the fp32
    log-sum-exp a ring step makes, whether K and V are strided views in the recording, and the
    first allocation inside it (its buffers grow with that block when another what-if scales it:
    :class:`~whatif.tracer.memory.Burst`)."""

    first: int
    last: int
    qkv_bytes: tuple[int, int, int]
    out_bytes: int
    out_fp32_bytes: int
    lse_bytes: int
    strided_kv: bool
    follows: int = -1


@dataclass(frozen=True)
class SequenceMemory:
    """One rank's memory under sequence parallelism of ``degree`` with Ulysses over ``ulysses``
    of the ranks: each allocation's share (``scale``, aligned with ``roles.rows``), the attention
    calls whose all-to-alls and ring add buffers, and the all-gathers (the record after which each
    happens and the bytes it receives)."""

    degree: int
    ulysses: int
    roles: BlockRoles
    scale: np.ndarray
    calls: tuple[AttentionCall, ...]
    gathers: tuple[tuple[int, int], ...]

    @property
    def ring(self) -> int:
        return self.degree // self.ulysses

    def scaling(self) -> BlockScaling:
        return BlockScaling(self.roles.rows, self.scale)


def per_token(dims: object, tokens: frozenset[int], params: frozenset[tuple[int, ...]] = frozenset()) -> bool:
    """Whether an op given tensors of shapes ``dims`` works per token: a tensor of two or more
    dimensions, not of a parameter's shape (``params``; a matrix either way round), has one other
    than its last in ``tokens``.

    >>> per_token([[4, 256, 192], [1, 256, 192]], frozenset({256, 1024})), per_token([[4, 192]], frozenset({256}))
    (True, False)
    >>> per_token([[4, 256]], frozenset({256})), per_token([[1024, 192]], frozenset({256, 1024}))
    (False, True)
    >>> per_token([[2, 64], [64, 128]], frozenset({64})), per_token([[2, 64], [64, 128]], frozenset({64}), {(128, 64)})
    (True, False)
    """
    return any(len(d) >= 2 and any(x in tokens for x in d[:-1]) and not is_param_shape(d, params)
               for d in tensor_shapes(dims))


def _sharded(seq: np.ndarray, ops: ForwardOps, names: np.ndarray, dims: np.ndarray, tokens: frozenset[int],
             params: frozenset[tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
    """Per work op of one sequence: whether it runs on the rank's tokens (module docstring), and
    whether it is the last to before the gather (the next per-token op runs whole, or none follows)."""
    in_block = ops.role[seq] >= 0
    lead = np.zeros(len(seq), dtype=bool)
    for i in np.flatnonzero(in_block & ~np.r_[False, in_block[:-1]]).tolist():
        j = i - 1
        while j >= 0 and not in_block[j] and classify_kernel(str(names[seq[j]]), str(names[seq[j]])).value not in STOPS:
            lead[j] = True
            j -= 1
    token = np.asarray([per_token(dims[p], tokens, params) for p in seq.tolist()], dtype=bool)
    sharded = (in_block | lead) & token
    at = np.flatnonzero(token)
    last = np.zeros(len(seq), dtype=bool)
    last[at] = sharded[at] & ~np.r_[sharded[at][1:], False]
    return sharded, last


def _dense(dims: object, strides: object) -> bool:
    """Whether a tensor of shape ``dims`` with ``strides`` fills its span of memory (a copy of it
    to send is not needed); True when the strides are not recorded.

    >>> _dense([2, 4, 256, 48], [147456, 48, 576, 1]), _dense([2, 4, 256, 48], [49152, 48, 192, 1]), _dense([4], [])
    (False, True, True)
    """
    if not isinstance(dims, list) or not isinstance(strides, list) or len(dims) != len(strides):
        return True
    span = 1 + sum((int(d) - 1) * int(st) for d, st in zip(dims, strides) if int(d) > 0)
    return span == math.prod(int(d) for d in dims)


def attention_call(name: str, dims: object, types: object, strides: object, ulysses: int, ring: int,
                   records: tuple[int, int, int] = (-1, -1, -1)) -> AttentionCall | None:
    """An attention op's bytes on one rank of Ulysses over ``ulysses`` ranks and a ring over
    ``ring`` (:class:`AttentionCall`; ``records``: its first and last allocator records and its
    first allocation): Q and the
    output over ``P``, K and V ``⌈H_kv/U⌉`` KV heads of ``N/R`` tokens (a KV head replicated when
    the Ulysses ranks outnumber them, as the transform prices it); None without its shapes.

    >>> call = attention_call("aten::scaled_dot_product_attention", [[2, 8, 256, 64], [2, 2, 256, 64],
    ...                       [2, 2, 256, 64]], ["c10::BFloat16"] * 3, [], 4, 2)
    >>> call.qkv_bytes, call.out_bytes, call.out_fp32_bytes, call.lse_bytes
    ((65536, 32768, 32768), 65536, 131072, 2048)
    """
    kinds = types if isinstance(types, (list, tuple)) else None
    tensors = float_tensors(dims, kinds) if isinstance(dims, list) else []
    heads = attention_op_heads(name, dims)
    if len(tensors) < 3 or heads is None:
        return None
    (_, q, qt), (ki, k, kt), (vi, v, vt) = tensors[:3]
    degree, kv_heads = ulysses * ring, heads[1]
    kv_share = math.ceil(kv_heads / ulysses) / kv_heads / ring
    q_dims, v_dims = dims[tensors[0][0]], dims[vi]   # type: ignore[index]
    rows = q // int(q_dims[-1])   # B·H·N
    out = rows * int(v_dims[-1])
    given = strides if isinstance(strides, list) else []
    strided = any(not _dense(dims[i], given[i] if i < len(given) else None)   # type: ignore[index]
                  for i in (ki, vi))
    return AttentionCall(records[0], records[1],
                         (q * qt.bytes // degree, int(k * kt.bytes * kv_share), int(v * vt.bytes * kv_share)),
                         out * qt.bytes // degree, out * 4 // degree, rows * 4 // degree, strided, records[2])


def _split(ops: ForwardOps, names: np.ndarray, dims: np.ndarray, attention: np.ndarray, degree: int,
           params: frozenset[tuple[int, ...]]) -> tuple[np.ndarray, list[int]]:
    """Per position of ``ops``' hierarchy: whether the op runs on the rank's tokens; and the work
    ops after which the tokens are gathered."""
    sharded = np.zeros(len(names), dtype=bool)
    ends: list[int] = []
    for seq in ops.sequences.values():
        lengths = [attention_sequences(str(names[p]), dims[p]) for p in seq.tolist() if attention[p]]
        tokens = frozenset(x for found in lengths if found and found[0][0] >= degree   # fewer: not split
                           for x in (found[0][0], found[0][0] * len(found)))
        if not tokens:
            continue
        mine, last = _sharded(seq, ops, names, dims, tokens, params)
        sharded[seq[mine]] = True
        ends += seq[last].tolist()
    return sharded, ends


def sequence_memory(trace: Trace, degree: int, ulysses: int | None = None, roles: BlockRoles | None = None,
                    ops: ForwardOps | None = None) -> SequenceMemory:
    """One rank's memory under sequence parallelism of ``degree`` with Ulysses over ``ulysses``
    of the ranks (None: all of them) and a ring over the rest (module docstring).

    Raises
    ------
    TransformError : ``ulysses`` does not divide ``degree``; the trace has no allocator records,
        has a backward pass, or its forward has no transformer block whose attention op has
        recorded shapes and at least ``degree`` query tokens; the Ulysses ranks do not split its
        heads (:func:`~.memory.head_split`).
    """
    u = degree if ulysses is None else ulysses
    if u < 1 or degree % u:
        raise TransformError(f"{WHO}: the Ulysses degree {u} does not divide the degree {degree}")
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
    strides = trace.arg(Arg.INPUT_STRIDES)[rows]
    attention = np.asarray([is_attention(str(n)) for n in names], dtype=bool)
    sharded, ends = _split(ops, names, dims, attention, degree, roles.param_shapes)
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
    in_sharded = (made_in >= 0) & sharded[np.maximum(made_in, 0)]
    scale = np.where(roles.mask(BlockRole.ACTIVATION) & in_sharded, 1 / degree, 1.0)
    if degree > u:   # a ring's call replaces the recorded one: what it made and freed inside is not made
        freed_in = np.where(roles.frees >= 0, work[np.maximum(roles.frees, 0)], -2)
        scale[in_sharded & attention[np.maximum(made_in, 0)] & (freed_in == made_in)] = 0.0
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
        if p not in records_of or not attention[p]:
            continue
        heads = attention_op_heads(str(names[p]), dims[p])
        if u > 1 and heads is not None and head_split(heads[0], heads[1], u) is not HeadSplit.OK:
            raise TransformError(f"{WHO}: ulysses splits the {heads[0]} attention heads ({heads[1]} KV heads) over "
                                 f"{u} GPUs, which does not divide them")
        records = records_of[p]
        made = records[mem["bytes"].to_numpy()[records] > 0]
        call = attention_call(str(names[p]), dims[p], types[p], strides[p], u, degree // u,
                              (int(records[0]), int(records[-1]), int(made[0]) if len(made) else -1))
        if call is not None:
            calls.append(call)
    return SequenceMemory(degree, u, roles, scale, tuple(calls), tuple(gathers))


class _Frame:
    """Blocks made and freed as Python keeps tensors: names refer to blocks (``OUTSIDE``: one
    the caller holds), and a block is freed when the last name referring to it lets go;
    :meth:`new` and :meth:`free` are temporaries of an expression."""

    OUTSIDE = 0

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.refs: dict[str, int] = {}
        self._held: dict[int, int] = {}

    def new(self, nbytes: int) -> int:
        block = len(self.records) + 1
        self.records.append((block, nbytes))
        self._held[block] = 0
        return block

    def free(self, block: int) -> None:
        self.records.append((block, 0))

    def bind(self, name: str, block: int) -> None:
        if block != self.OUTSIDE:
            self._held[block] += 1
        self.drop(name)
        self.refs[name] = block

    def drop(self, *names: str) -> None:
        for name in names:
            block = self.refs.pop(name, self.OUTSIDE)
            if block != self.OUTSIDE:
                self._held[block] -= 1
                if not self._held[block]:
                    self.free(block)


def ring_records(steps: int, kv_bytes: tuple[int, int], out_bytes: int, out_fp32_bytes: int, lse_bytes: int, *,
                 converts: bool, copy_kv: bool, log_sigmoid_buffer: bool) -> list[Record]:
    """The blocks one rank's ring attention makes and frees, in order (``(block, bytes)``; 0
    frees it), as ring-flash-attention's ``ring_flash_attn_forward`` and ``update_out_and_lse`` do
    (module docstring): ``steps`` ring steps with K, V blocks of ``kv_bytes``, each step's output
    of ``out_bytes`` and fp32 log-sum-exp of ``lse_bytes``, a running output of ``out_fp32_bytes``;
    ``converts``: the output is 16-bit (converted to fp32 to be folded in, and back at the end);
    ``copy_kv``: K and V are copied contiguous first; ``log_sigmoid_buffer``: ``log_sigmoid``
    makes a buffer the size of its output (on the CPU). Every block is freed at the end: the
    returned output stands for the recorded call's.

    >>> records = ring_records(2, (8, 8), 16, 16, 4, converts=False, copy_kv=False, log_sigmoid_buffer=False)
    >>> burst = Burst((0, False), tuple(records), "ring", 0)   # K, V received (16), both steps' output
    >>> len(records), burst.most_held_bytes(gpu=False)       # and lse (40), the update's (36)
    (28, 92)
    """
    k_bytes, v_bytes = kv_bytes
    f = _Frame()
    f.bind("k", f.OUTSIDE)
    f.bind("v", f.OUTSIDE)
    if copy_kv:
        f.bind("k", f.new(k_bytes))
        f.bind("v", f.new(v_bytes))
    for step in range(steps):
        more = step + 1 < steps
        if more:
            f.bind("next_k", f.new(k_bytes))
            f.bind("next_v", f.new(v_bytes))
        block_out, block_lse = f.new(out_bytes), f.new(lse_bytes)   # both returned, then both bound
        f.bind("block_out", block_out)
        f.bind("block_lse", block_lse)
        f.bind("merge_out", f.new(out_fp32_bytes) if converts else block_out)
        if step == 0:
            new_out, new_lse = f.refs["merge_out"], f.refs["block_lse"]
        else:
            gap = f.new(lse_bytes)
            weight = f.new(lse_bytes)
            f.free(gap)
            diff = f.new(out_fp32_bytes)
            scaled = f.new(out_fp32_bytes)
            f.free(weight)
            f.free(diff)
            new_out = f.new(out_fp32_bytes)
            f.free(scaled)
            gap = f.new(lse_bytes)
            soft = f.new(lse_bytes)
            if log_sigmoid_buffer:
                f.free(f.new(lse_bytes))
            f.free(gap)
            new_lse = f.new(lse_bytes)
            f.free(soft)
        f.bind("result_out", new_out)
        f.bind("result_lse", new_lse)
        f.drop("merge_out")
        f.bind("out", new_out)
        f.bind("lse", new_lse)
        f.drop("result_out", "result_lse")
        if more:
            f.bind("k", f.refs["next_k"])
            f.bind("v", f.refs["next_v"])
    if converts:
        f.bind("result", f.new(out_bytes))
    f.drop("k", "v", "next_k", "next_v", "block_out", "block_lse", "out", "lse", "result")
    return f.records


def _exchange(name: str, nbytes: int) -> list[Record]:
    """One all-to-all's records: send and receive buffers, the reshaped copy, the two freed."""
    return [(f"{name} send", nbytes), (f"{name} receive", nbytes), (name, nbytes), (f"{name} send", 0),
            (f"{name} receive", 0)]


def _bursts(sm: SequenceMemory, gpu: np.ndarray) -> list[Burst]:
    """Each burst of buffers one rank makes and frees at one place (``gpu``: which records are a
    GPU's): the all-to-alls' and the ring's before and after each attention call (following its
    first allocation), the all-gathers' after the last per-token op (following its output)."""
    out: list[Burst] = []
    for call in sm.calls:
        q, k, v = call.qkv_bytes
        if sm.ulysses > 1:
            qkv = (*_exchange("q", q), *_exchange("k", k), *_exchange("v", v), ("q", 0), ("k", 0), ("v", 0))
            out.append(Burst((call.first, False), qkv, "(Ulysses all-to-all: Q, K, V)", call.follows))
        if sm.ring > 1:
            ring = ring_records(sm.ring, (k, v), call.out_bytes, call.out_fp32_bytes, call.lse_bytes,
                                converts=call.out_bytes != call.out_fp32_bytes,
                                copy_kv=sm.ulysses == 1 and call.strided_kv, log_sigmoid_buffer=not gpu[call.first])
            out.append(Burst((call.first, False), tuple(ring), "(Ring attention: K, V blocks, output, log-sum-exp)",
                             call.follows))
        if sm.ulysses > 1:
            out.append(Burst((call.last, True), (*_exchange("o", call.out_bytes), ("o", 0)),
                             "(Ulysses all-to-all: output)", call.follows))
    for row, nbytes in sm.gathers:
        part = nbytes // sm.degree
        parts = tuple((i, n) for n in (part, 0) for i in range(sm.degree))
        out.append(Burst((row, True), parts, "(sequence-parallel all-gather)", row))
    return out


def sp_batch_peaks(trace: Trace, degree: int, ulysses: int | None = None, roles: BlockRoles | None = None,
                   ops: ForwardOps | None = None) -> BatchPeaks | None:
    """One sequence-parallel rank's GPU memory at any batch (what the plan sweep reads for
    sp > 1): the per-token activations at 1/P
    (:func:`~whatif.transforms.optimizations.batch_memory.batch_peaks` with
    :meth:`SequenceMemory.scaling`) and each burst of buffers at its most, growing with the
    batch; None without GPU records.

    Raises
    ------
    TransformError : as :func:`sequence_memory`.
    """
    sm = sequence_memory(trace, degree, ulysses, roles, ops)
    peaks = batch_peaks(trace, sm.roles, sm.scaling())
    if peaks is None:
        return None
    gpu = on_gpu(trace.memory)
    return with_transients(trace, peaks, [(*b.at, b.most_held_bytes(bool(gpu[b.at[0]]))) for b in _bursts(sm, gpu)])


def sequence_parallel_memory_edit(trace: Trace, degree: int, ulysses: int | None = None) -> RecordEdit:
    """The allocator records of one rank of sequence parallelism of ``degree`` with Ulysses over
    ``ulysses`` of the ranks (None: all; :func:`sequence_memory`): the per-token activations of
    the blocks at ``1/P``, each attention call's all-to-all buffers and ring blocks and each
    all-gather's receive blocks added.

    Raises
    ------
    TransformError : as :func:`sequence_memory`.
    """
    sm = sequence_memory(trace, degree, ulysses)
    sizes = trace.memory["bytes"].to_numpy()[sm.roles.rows]
    less = float((sizes * (1 - sm.scale)).sum())
    mode = "ulysses" if sm.ring == 1 else "ring" if sm.ulysses == 1 else f"usp {sm.ulysses}x{sm.ring}"
    dropped = int((sm.scale == 0).sum())
    added = " and ".join(x for x, on in (("all-to-all buffers", sm.ulysses > 1), ("ring blocks", sm.ring > 1)) if on)
    what = (f"sequence_parallel({mode}, degree={degree}): {int(((sm.scale < 1) & (sm.scale > 0)).sum()):,} activation "
            f"blocks at 1/{degree}{f', {dropped:,} not made' if dropped else ''} ({less / 2**20:,.1f} MiB fewer "
            f"allocated), the {added} of {len(sm.calls):,} attention calls and {len(sm.gathers):,} all-gathers added")
    return scaled_edit(trace.memory, sm.scaling(), what, _bursts(sm, on_gpu(trace.memory)))
