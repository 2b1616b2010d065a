"""What ``autocast`` does to memory: an fp32 program's allocator records as the same program makes
them under ``torch.autocast(dtype=bf16|fp16)``.

Each forward op that does work (:mod:`whatif.transforms.parallel.forward_ops`) gets a **rule**
from what autocast does to it (:mod:`whatif.core.autocast`, PyTorch's ``autocast_mode.cpp``):

* **lowered** (a GEMM, convolution or attention op): computes and outputs the autocast dtype;
* **upcast** (attention by SDPA's math backend, ``_scaled_dot_product_attention_math``): autocast
  lowers its inputs, but the backend computes in fp32 whatever its inputs
  (``torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp``, off by default since PyTorch 2.5:
  "upcast to fp32"): its inner blocks stay fp32, its output is cast down;
* **fp32** (autocast's fp32 list: norms' kernels, softmax, losses, ``exp``…): fp32;
* **widest** (an elementwise op of two or more tensors: a residual ``add``): fp32, taken as the
  residual stream's;
* **keeps** (every other op: GELU, a copy): its input's dtype, the output of the work op before it.

Then each allocation of the fp32 recording (``Trace.memory``; roles of
:func:`~.batch_memory.block_roles`):

* **A forward activation** is held at ``b/4`` of its bytes (``b``: the autocast dtype's element
  size) when its op outputs the autocast dtype (lowered, or keeps fed by one); an upcast op's
  blocks stay whole but its output, ``b/4`` after a transient fp32 block of its size.
* **A backward activation**, made by the autograd node of forward op ``f``: a block freed inside
  the node (a temporary) is in the dtype ``f`` computes in; one that outlives the node (the
  gradient it passes back) in the dtype of ``f``'s input, after a transient block in the compute
  dtype where the two differ (the ``ToCopyBackward0`` of a cast).
* **A parameter's gradient** made by a lowered op's node stays fp32 (master weights), after a
  transient block of its elements in the autocast dtype (the GEMM's output before its cast).
* Everything else (parameters, optimizer state, what is held to the end): as recorded.

And the casts autocast adds, each a new block of the autocast dtype (:func:`autocast_casts`):
a lowered op's **weight** copy is held until the op's autograd node has run (the node saves it;
without a backward, until the step's forward ends: the cast cache); its **bias** copy until the
forward ends (the cast cache; no node saves it); the copy of an **fp32 activation** it takes
(one not made by a lowered op) until its node has run (saved for the weight's gradient), or to the
op's end without a backward. An fp32-list op fed the autocast dtype casts it up: a transient
fp32 block over the op. An upcast op's fp32 copies of its inputs are transient over the op.

Left out: the fp32 activation a lowered op casts is freed early when nothing else saved it (a
norm's output: held as recorded, so the prediction errs high by its size); one activation fed to
several lowered ops (separate Q, K and V projections) is cast once per op, taken as fed by the
op before (one cast); the autograd engine's cast of a gradient into a lower-precision branch of a
residual add; CPU type promotion's temporary copies; non-float blocks (a dropout mask) made by an
op that outputs the autocast dtype, taken as halved; autocast's own dispatch and a weight used by
two lowered ops (cast once, counted twice). The op lists are CUDA's: on the CPU, autocast's fp32
list is different (norms and softmax run in the autocast dtype when fed it), which matters only
where such an op takes a lowered output.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import pandas as pd

from whatif.core.autocast import CastRole, autocast_casts, is_fp32_op
from whatif.core.dtypes import ELEMENT_BYTES, compute_dtype, conversion_target
from whatif.core.kernels import KernelClass, classify_kernel, float_tensors, op_key
from whatif.depgraph.hierarchy import autograd_nodes, enclosing, inherit, record_steps
from whatif.tracer.args import Arg
from whatif.tracer.memory import (
    GPU_DEVICE_TYPES,
    BlockScaling,
    RecordEdit,
    RecordEditor,
    gpu_block_bytes,
    on_gpu,
    scale_blocks,
)
from whatif.tracer.trace import Trace

from ..base import TransformError
from ..parallel.forward_ops import ForwardOps, forward_ops, positions
from .batch_memory import BlockRole, BlockRoles, block_roles
from .flash_attention import MATH_OP

FP32_BYTES = 4
LOWERED_CLASSES = frozenset({KernelClass.GEMM.value, KernelClass.CONV.value, KernelClass.ATTENTION.value})
CONVERSIONS = frozenset({"to", "_to_copy"})
CAST_OP = "aten::_to_copy"
"""The op an added cast block is said to be made in."""


class Rule(IntEnum):
    """What autocast does to a forward work op (module docstring)."""

    LOWERED = 0
    UPCAST = 1
    FP32 = 2
    WIDEST = 3
    KEEPS = 4
    TO_FP32 = 5


@dataclass(frozen=True)
class OpDtypes:
    """Per position of a :class:`ForwardOps` hierarchy that is a work op: its :class:`Rule`
    (-1 elsewhere), whether it computes in the autocast dtype (``computes_low``), outputs it
    (``outputs_low``), is fed it (``fed_low``: the work op before it outputs it), and whether its
    first floating-point input was recorded in 16 bits (``recorded_low``)."""

    rule: np.ndarray
    computes_low: np.ndarray
    outputs_low: np.ndarray
    fed_low: np.ndarray
    recorded_low: np.ndarray

    def input_low(self, w: int) -> bool:
        """Whether the input whose gradient ``w``'s node passes back is in the autocast dtype
        (a widest op's is taken as the fp32 residual stream's)."""
        return bool(self.fed_low[w]) and self.rule[w] != Rule.WIDEST


def _rule(name: str, types: list, concrete: list, math_inside: bool) -> Rule:
    if op_key(name) in CONVERSIONS and conversion_target(types, concrete) in ("fp32", "double"):
        return Rule.TO_FP32
    tensors = len([t for t in types if compute_dtype(t) is not None])
    cls = classify_kernel(name, name).value
    if cls in LOWERED_CLASSES:
        return Rule.UPCAST if math_inside else Rule.LOWERED
    if is_fp32_op(name):
        return Rule.FP32
    if cls == KernelClass.ELEMENTWISE.value and tensors > 1:
        return Rule.WIDEST
    return Rule.KEEPS


def _listed(value: object) -> list:
    return list(value) if isinstance(value, (list, tuple)) else []


def op_dtypes(trace: Trace, ops: ForwardOps) -> OpDtypes:
    """The :class:`OpDtypes` of ``trace``'s forward work ops, each sequence in the order it ran."""
    ev = trace.events
    rows = ops.hierarchy.rows
    n = len(rows)
    names = ev["name"].astype(str).to_numpy()[rows]
    types, concrete = trace.arg(Arg.INPUT_TYPES), trace.arg(Arg.CONCRETE_INPUTS)
    work = np.flatnonzero(ops.work == np.arange(n))
    inside = ops.work >= 0
    math_in = np.zeros(n, dtype=bool)
    is_math = np.asarray([op_key(x) == MATH_OP for x in names], dtype=bool)
    math_in[ops.work[inside & is_math]] = True
    rule = np.full(n, -1, dtype=np.int64)
    recorded = np.zeros(n, dtype=bool)
    for w in work.tolist():
        r = int(rows[w])
        kinds = _listed(types[r])
        rule[w] = _rule(str(names[w]), kinds, _listed(concrete[r]), bool(math_in[w]))
        first = next((d for d in map(compute_dtype, kinds) if d is not None), None)
        recorded[w] = first is not None and first.bytes == 2
    computes = np.zeros(n, dtype=bool)
    outputs = np.zeros(n, dtype=bool)
    fed = np.zeros(n, dtype=bool)
    ts = ev["ts_ns"].to_numpy()[rows]
    for w in work[np.argsort(ts[work], kind="stable")].tolist():
        b = int(ops.before[w])
        fed[w] = b >= 0 and outputs[b]
        computes[w] = rule[w] == Rule.LOWERED or (rule[w] == Rule.KEEPS and fed[w])
        outputs[w] = computes[w] or rule[w] == Rule.UPCAST
    return OpDtypes(rule, computes, outputs, fed, recorded)


@dataclass(frozen=True)
class AddedBlock:
    """A cast's copy, a block the autocast run makes that the fp32 run does not: ``nbytes``
    allocated at ``alloc_at`` and freed at ``free_at`` (each ``(row of Trace.memory, after)``),
    before the forward work op at position ``made_in`` of the :class:`ForwardOps` hierarchy."""

    nbytes: int
    alloc_at: tuple[int, bool]
    free_at: tuple[int, bool]
    made_in: int


@dataclass(frozen=True)
class Recast:
    """An allocation (position ``i`` into the roles' rows) made in one dtype and cast to another
    when ``at`` is reached (a row of ``Trace.memory``, after it): ``first`` bytes from its
    allocation to ``at``, ``then`` bytes from ``at`` to its free (the copy made before the
    original is freed)."""

    i: int
    first: int
    then: int
    at: tuple[int, bool]


@dataclass(frozen=True)
class AutocastMemory:
    """Each allocation's bytes under autocast over its recorded bytes (``factors``, aligned with
    ``roles.rows``; 1 for a recast one), the allocations cast at some point (``recasts``), the
    blocks autocast adds (``added``) and the allocations freed earlier than recorded
    (``freed_early``, positions into ``roles.rows``, each freed at its ``freed_at``)."""

    dtype: str
    roles: BlockRoles
    factors: np.ndarray
    recasts: tuple[Recast, ...]
    added: tuple[AddedBlock, ...]
    freed_early: np.ndarray
    freed_at: tuple[tuple[int, bool], ...]

    def scaling(self) -> BlockScaling:
        return BlockScaling(self.roles.rows, self.factors)


class _Timelines:
    """Each device's allocator records in order, to place a block at a time."""

    def __init__(self, memory: pd.DataFrame) -> None:
        self.ts = memory["ts_ns"].to_numpy()
        columns = memory[["rank", "device_type", "device_id"]].to_numpy()
        self.groups: dict[tuple[int, int, int], np.ndarray] = {}
        for idx in memory.groupby(["rank", "device_type", "device_id"], sort=False).indices.values():
            rank, kind, device = columns[idx[0]].tolist()
            self.groups[(rank, kind, device)] = np.asarray(idx)
        self.key = np.zeros(len(memory), dtype=np.int64)
        self.keys = list(self.groups)
        for i, idx in enumerate(self.groups.values()):
            self.key[idx] = i

    def first_from(self, rank: int, t: int) -> tuple[int, bool] | None:
        """Right before the first record at or after ``t`` on ``rank``'s main device (its GPU with
        the most records, else its CPU); None when there is none."""
        mine = [k for k in self.keys if k[0] == rank]
        if not mine:
            return None
        gpus = [k for k in mine if k[1] in GPU_DEVICE_TYPES]
        key = max(gpus or mine, key=lambda k: (len(self.groups[k]), k))
        idx = self.groups[key]
        at = int(np.searchsorted(self.ts[idx], t, side="left"))
        return (int(idx[at]), False) if at < len(idx) else (int(idx[-1]), True)

    def last_by(self, row: int, t: int) -> tuple[int, bool]:
        """Right after the last record of ``row``'s device at or before ``t`` (never before ``row``)."""
        idx = self.groups[self.keys[self.key[row]]]
        at = int(np.searchsorted(self.ts[idx], t, side="right")) - 1
        return max(int(idx[max(at, 0)]), row), True


def autocast_memory(trace: Trace, dtype: str = "bf16") -> AutocastMemory:
    """The :class:`AutocastMemory` of ``trace`` (an fp32 program) under autocast to ``dtype``
    (module docstring).

    Raises
    ------
    TransformError : as :func:`~.batch_memory.block_roles`, or the trace's forward has no op
        autocast lowers (a GEMM, convolution or attention op).
    """
    roles = block_roles(trace, "autocast")
    ops = forward_ops(trace)
    dt = op_dtypes(trace, ops)
    lowered = np.flatnonzero((dt.rule == Rule.LOWERED) | (dt.rule == Rule.UPCAST))
    if not len(lowered):
        raise TransformError(f"autocast: found no GEMM, convolution or attention op in the forward of "
                             f"{trace.source}; its memory does not change under autocast")
    already = int(dt.recorded_low[lowered].sum())
    if already:
        raise TransformError(f"autocast: {already:,} of the {len(lowered):,} GEMM, convolution and attention ops in "
                             f"the forward of {trace.source} already take 16-bit inputs; autocast's memory is "
                             f"predicted from an fp32 program")
    low = float(ELEMENT_BYTES[dtype])
    ev, mem = trace.events, trace.memory
    h = ops.hierarchy
    ts = ev["ts_ns"].to_numpy()[h.rows]
    end = ts + ev["dur_ns"].to_numpy()[h.rows]
    spans = _spans(trace, ops, ts, end)
    node = inherit(positions(np.isin(h.rows, autograd_nodes(ev))), h.parent)
    allocs = roles.rows
    pos = enclosing(h, ev, mem.iloc[allocs])
    at = np.maximum(pos, 0)
    made = np.where(pos >= 0, ops.made_by[at], -1)
    of = np.where(made >= 0, ops.work[np.maximum(made, 0)], -1)   # the forward work op of a backward block
    work = np.where((pos >= 0) & (made < 0), ops.work[at], -1)    # the work op of a forward block
    sizes = mem["bytes"].to_numpy()[allocs]
    mem_ts = mem["ts_ns"].to_numpy()
    free_ts = np.where(roles.frees >= 0, mem_ts[np.maximum(roles.frees, 0)], np.iinfo(np.int64).max)
    lines = _Timelines(mem)
    factors = np.ones(len(allocs))
    recasts: list[Recast] = []
    activation = roles.mask(BlockRole.ACTIVATION)
    half = low / FP32_BYTES

    def recast(i: int, first: float, then: float, until_ns: int) -> None:
        row = int(allocs[i])
        recasts.append(Recast(i, int(round(sizes[i] * first)), int(round(sizes[i] * then)),
                              lines.last_by(row, until_ns)))

    # forward activations: an upcast op's output is made in fp32 and cast down at the op's end
    fwd = np.flatnonzero(activation & (work >= 0))
    factors[fwd[dt.outputs_low[work[fwd]] & (dt.rule[work[fwd]] != Rule.UPCAST)]] = half
    upcast = fwd[dt.rule[work[fwd]] == Rule.UPCAST]
    for w in np.unique(work[upcast]).tolist():
        mine = upcast[work[upcast] == w]
        outlive = mine[free_ts[mine] > end[w]]
        if len(outlive):
            recast(int(outlive[-1]), 1.0, half, int(end[w]))
    # backward activations: in the dtype their op computes in; the gradient an op passes back is
    # cast to its input's dtype when its node ends (ToCopyBackward0)
    bwd = np.flatnonzero(activation & (of >= 0))
    for i, f, m in zip(bwd.tolist(), of[bwd].tolist(), made[bwd].tolist()):
        if ops.loose[m]:   # the backward of a view or reshape of f's output: in f's output dtype
            factors[i] = half if dt.outputs_low[f] else 1.0
            continue
        compute = half if dt.computes_low[f] else 1.0
        held = half if dt.input_low(f) else 1.0
        if held == compute or free_ts[i] <= spans.node_end[f]:
            factors[i] = compute
        else:
            recast(i, compute, held, int(end[node[at[i]]]))
    # a lowered op's parameter gradients: its GEMM's output, cast to fp32 when its node ends
    grads = roles.mask(BlockRole.GRADIENT) | roles.mask(BlockRole.WEIGHT_GRADIENT)
    for i in np.flatnonzero(grads & (of >= 0)).tolist():
        if dt.rule[of[i]] != Rule.LOWERED or node[at[i]] < 0:
            continue
        if free_ts[i] > end[node[at[i]]]:
            recast(i, half, 1.0, int(end[node[at[i]]]))
        else:
            factors[i] = half

    casts, early = _casts(trace, ops, dt, roles, work, low, lines, ts, end, spans)
    at_early = np.asarray(sorted(early), dtype=np.int64)
    factors[at_early] = 1.0
    return AutocastMemory(dtype, roles, factors, tuple(recasts), tuple(casts), at_early,
                          tuple(early[i] for i in at_early.tolist()))


@dataclass(frozen=True)
class _Spans:
    """Per position of a :class:`ForwardOps` hierarchy that is a forward work op: when the
    autograd nodes it made start and end (-1: none), and when its step's forward ends."""

    node_start: np.ndarray
    node_end: np.ndarray
    forward_end: np.ndarray


def _spans(trace: Trace, ops: ForwardOps, ts: np.ndarray, end: np.ndarray) -> _Spans:
    ev = trace.events
    rows = ops.hierarchy.rows
    n = len(rows)
    steps = record_steps(ev, ev)[rows]
    ranks = ev["rank"].to_numpy()[rows]
    by = np.where(ops.made_by >= 0, ops.work[np.maximum(ops.made_by, 0)], -1)
    mine = by >= 0
    node_end = np.full(n, -1, dtype=np.int64)
    np.maximum.at(node_end, by[mine], end[mine])
    node_start = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(node_start, by[mine], ts[mine])
    node_start[node_end < 0] = -1
    first_backward: dict[tuple[int, int], int] = {}
    for p in np.flatnonzero(mine).tolist():
        key = (int(ranks[p]), int(steps[p]))
        first_backward[key] = min(first_backward.get(key, int(ts[p])), int(ts[p]))
    forward_end = np.asarray([first_backward.get((int(r), int(s)), int(e)) for r, s, e in zip(ranks, steps, end)],
                             dtype=np.int64)
    return _Spans(node_start, node_end, forward_end)


def _casts(trace: Trace, ops: ForwardOps, dt: OpDtypes, roles: BlockRoles, work: np.ndarray, low: float,
           lines: _Timelines, ts: np.ndarray, end: np.ndarray,
           spans: _Spans) -> tuple[list[AddedBlock], dict[int, tuple[int, bool]]]:
    """The cast blocks autocast adds before the forward's lowered, upcast and fp32-list ops, and
    the fp32 activations a lowered op's cast frees early (allocation position -> the place of its
    free): a block of the cast's elements × 4, made before the op and freed, as recorded, while
    the op's autograd node ran (the op saved it, nothing after it did)."""
    ev, mem = trace.events, trace.memory
    rows = ops.hierarchy.rows
    names = ev["name"].astype(str).to_numpy()
    dims, types = trace.arg(Arg.INPUT_DIMS), trace.arg(Arg.INPUT_TYPES)
    ranks = ev["rank"].to_numpy()[rows]
    allocs = roles.rows
    sizes = mem["bytes"].to_numpy()[allocs]
    mem_ts = mem["ts_ns"].to_numpy()
    made_ts = mem_ts[allocs]
    free_ts = np.where(roles.frees >= 0, mem_ts[np.maximum(roles.frees, 0)], -1)
    forward_activation = roles.mask(BlockRole.ACTIVATION) & (work >= 0)
    first_alloc: dict[int, int] = {}
    for i, w in enumerate(work.tolist()):
        if w >= 0 and w not in first_alloc:
            first_alloc[w] = int(allocs[i])
    out: list[AddedBlock] = []
    early: dict[int, tuple[int, bool]] = {}
    for w in np.flatnonzero(dt.rule >= 0).tolist():
        rule = Rule(int(dt.rule[w]))
        if rule in (Rule.KEEPS, Rule.WIDEST) or (rule in (Rule.FP32, Rule.TO_FP32) and not dt.fed_low[w]):
            continue
        r = int(rows[w])
        if rule == Rule.TO_FP32:   # a no-op on the fp32 tensor, a copy of the lower-precision one
            tensors = float_tensors(dims[r] or [], types[r] or [])
            start = lines.first_from(int(ranks[w]), int(ts[w]))
            if tensors and start is not None:
                consumer = int(ops.after[w])
                until = int(end[consumer]) if consumer >= 0 else int(end[w])
                out.append(AddedBlock(tensors[0][1] * FP32_BYTES, start, lines.last_by(start[0], until), w))
            continue
        if w not in first_alloc:
            continue
        anchor = first_alloc[w]
        start = (anchor, False)
        op_end = lines.last_by(anchor, int(end[w]))
        fwd_end = lines.last_by(anchor, int(spans.forward_end[w]) - 1)
        saved = lines.last_by(anchor, int(spans.node_end[w])) if spans.node_end[w] >= 0 else None
        for c in autocast_casts(str(names[r]), dims[r], types[r], fed_by_low=bool(dt.fed_low[w])):
            if c.to_fp32:
                out.append(AddedBlock(c.numel * FP32_BYTES, start, op_end, w))
                continue
            if rule == Rule.UPCAST:
                free = op_end
            elif c.role is CastRole.BIAS:
                free = fwd_end
            elif c.role is CastRole.WEIGHT:
                free = saved or fwd_end
            else:
                free = saved or op_end
                if saved is not None:
                    fp32 = c.numel * FP32_BYTES
                    in_node = (free_ts >= spans.node_start[w]) & (free_ts <= spans.node_end[w])
                    held = np.flatnonzero(forward_activation & (made_ts <= ts[w]) & in_node
                                          & np.isin(sizes, [fp32, gpu_block_bytes(fp32)]))
                    if len(held):
                        early[int(held[-1])] = (anchor, True)
            out.append(AddedBlock(int(round(c.numel * low)), start, free, w))
        if rule == Rule.UPCAST:
            for _, numel, _ in float_tensors(dims[r] or [], types[r] or [])[:3]:
                out.append(AddedBlock(numel * FP32_BYTES, start, op_end, w))
    return out, early


def autocast_memory_edit(trace: Trace, dtype: str = "bf16") -> RecordEdit:
    """The allocator records of ``trace`` (an fp32 program) run under autocast to ``dtype``:
    each allocation at its :func:`autocast_memory` factor, at its place, and the blocks autocast
    adds (module docstring).

    Raises
    ------
    TransformError : as :func:`autocast_memory`.
    """
    model = autocast_memory(trace, dtype)
    editor = RecordEditor(trace.memory)
    scale_blocks(editor, model.scaling())
    sizes = trace.memory["bytes"].to_numpy()
    for i, free in zip(model.freed_early.tolist(), model.freed_at):
        row = int(model.roles.rows[i])
        editor.drop_block(row)
        editor.add_block(int(sizes[row]), (row, True), free, None)
    gpu = on_gpu(trace.memory)

    def block(row: int, nbytes: int) -> int:   # a GPU's caching allocator rounds up to 512 B
        return gpu_block_bytes(nbytes) if gpu[row] else nbytes

    for r in model.recasts:
        row = int(model.roles.rows[r.i])
        last = editor.free_of(row)
        editor.drop_block(row)
        editor.add_block(block(row, r.then), r.at, (last, True) if last is not None else None, CAST_OP)
        editor.add_block(block(row, r.first), (row, True), r.at, None)
    for b in model.added:
        editor.add_block(block(b.alloc_at[0], b.nbytes), b.alloc_at, b.free_at, CAST_OP)
    less = float((sizes[model.roles.rows] * (1 - model.factors)).sum())
    what = (f"autocast(dtype={dtype}): {int((model.factors < 1).sum()):,} blocks held in {dtype} "
            f"({less / 2**20:,.1f} MiB fewer bytes allocated), {len(model.recasts):,} made in one dtype and "
            f"cast to the other, {len(model.added):,} cast copies added "
            f"({sum(b.nbytes for b in model.added) / 2**20:,.1f} MiB allocated), {len(model.freed_early):,} fp32 "
            f"activations freed once cast")
    return editor.edit(what)
