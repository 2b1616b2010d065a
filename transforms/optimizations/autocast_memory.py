"""What ``autocast`` does to memory: an fp32 program's allocator records as the same program makes
them under ``torch.autocast(dtype=bf16|fp16)``; and what ``precision`` to bf16/fp16 does, the
program converted to the dtype (``converted``: ``model.to(dtype)``).

Each forward op that does work (:mod:`whatif.transforms.parallel.forward_ops`) gets a **rule**
from what autocast does to it (:mod:`whatif.core.autocast`, PyTorch's ``autocast_mode.cpp``):

* **lowered** (a GEMM, convolution or attention op): computes and outputs the autocast dtype;
* **upcast** (attention by SDPA's math backend, ``_scaled_dot_product_attention_math``): autocast
  lowers its inputs, but the backend computes in fp32 whatever its inputs
  (``torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp``, off by default since PyTorch 2.5):
  its inner blocks stay fp32, its output is cast down at its end;
* **fp32** (autocast's fp32 list: norms, softmax, losses, ``exp``…): fp32;
* **widest** (an elementwise op of two or more tensors: a residual ``add``): fp32, taken as the
  residual stream's;
* **to fp32** (``x.float()``: an ``aten::to`` whose ``Concrete Inputs`` name fp32): fp32; a no-op
  on an fp32 tensor, a copy of a lower-precision one;
* **keeps** (every other op: GELU, a copy): its input's dtype, the output of the work op before it.

Then each allocation of the fp32 recording (``Trace.memory``; roles of
:func:`~.batch_memory.block_roles`):

* **A forward activation** is held at ``b/4`` of its bytes (``b``: the autocast dtype's element
  size) when its op outputs the autocast dtype (lowered, or keeps fed by one); an upcast op's
  blocks stay whole, but its output is made in fp32 and cast down when the op ends.
* **A backward activation**, made by the autograd node of forward op ``f`` (matched by
  ``Sequence number``): one freed before ``f``'s last node ends is in the dtype ``f`` computes in;
  one that outlives it (the gradient ``f`` passes back) is made in that dtype and cast to the
  dtype of ``f``'s input when its node ends (``ToCopyBackward0``; the copy is made before the
  original is freed). The backward of a view or reshape is in its op's output dtype.
* **A parameter's gradient** made by a lowered op's node is the GEMM's output in the autocast
  dtype, cast to fp32 when the node ends (master weights and their gradients stay fp32).
* Everything else (parameters, optimizer state, what is held to the end): as recorded.

And the copies autocast makes (:func:`~whatif.core.autocast.autocast_casts`), each a new block
allocated before the op's first allocation: a lowered op's **weight** copy is held until the op's
autograd node has run (the node saves it; without a backward, until the forward ends: the cast
cache); its **bias** copy until the forward ends (the cast cache; no node saves it); the copy of an
**fp32 activation** it takes (one not made by a lowered op) until its node has run (saved for the
weight's gradient), or to the op's end without a backward. That fp32 activation (a norm's output),
recorded as freed while the op's node ran (the op saved it, nothing after it did), is freed right
after the cast instead. An fp32-list op fed the autocast dtype casts it up (an fp32 copy over the
op); an upcast op makes fp32 copies of its inputs (over the op) and, in its backward, of its
output's gradient (over its nodes, less the 16-bit gradient it replaces); ``x.float()`` of a
lower-precision tensor makes an fp32 one, held to the end of the next op that takes a tensor of
its size.

A **converted** program casts nothing before an op: every op computes in the dtype of what it is
given (a parameter's, 16-bit; the first op's input, an embedding table, too) but an upcast op
(fp32 inside, its output cast down) and what follows a ``.float()``; every block made from
parameters (their gradients, optimizer state, what the optimizer and clipping make, what is held
to the end or was allocated before the recording) is in the dtype too, but one-element blocks (an
optimizer's step count) and blocks off the rank's main device (a GPU trace's host copies). Under
both, a block of integers keeps its bytes: one made by a factory asked for an integer or bool
type (its ``Concrete Inputs``), or by an op given only integer tensors (a copy of the token ids).

On a CPU trace, what the CPU allocates in 16 bits and a GPU does not is added too: each 16-bit
``mm``/``addmm``'s fp32 accumulator, and the fp32 copy a mixed-dtype elementwise op makes of its
16-bit operand (:data:`CPU_ACCUMULATOR_PAD_BYTES`).

Left out: the upcast op's 16-bit copy of its attention probabilities, returned and dropped inside
the op (a transient over the op's end); the fp32 activation a lowered op casts is freed right
after the cast when the op's node was its last holder (a later forward use keeps it alive a
little longer); one activation fed to several lowered ops (separate Q, K and V projections) is
cast once per op, taken as fed by the op before it (one cast); the autograd engine's cast of a
gradient into a lower-precision branch of a residual add; non-float blocks made without a dtype
argument by an op that outputs the autocast dtype, taken as halved; a weight used by two lowered
ops (cast once, counted twice); in a converted program, a ``.float()`` after the backward
(clipping's fp32 norms): taken as 16-bit. The op lists are CUDA's: on the CPU, autocast's fp32
list is different (norms and softmax run in the autocast dtype when fed it), which matters only
where such an op takes a lowered output.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, IntEnum

import numpy as np
import pandas as pd

from whatif.core.autocast import AUTOCAST_DTYPES, LOWERED_CLASSES, CastRole, autocast_casts, is_fp32_op
from whatif.core.dtypes import ELEMENT_BYTES, compute_dtype, conversion_target, element_bytes, factory_dtype
from whatif.core.kernels import KernelClass, classify_kernel, float_tensors, op_key, param_args
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

FP32_BYTES = int(ELEMENT_BYTES["fp32"])
CONVERSIONS = frozenset({"to", "_to_copy"})
CAST_OP = "aten::_to_copy"
"""The op an added cast block is said to be made in."""
_LOOK_AHEAD = 4   # work ops walked forward to find what takes a converted tensor


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
    (``outputs_low``), is fed it (``fed_low``: the work op before it outputs it), whether its
    first floating-point input was recorded in 16 bits (``recorded_low``), whether what it makes
    is not floating-point (``integer``, :func:`makes_integers`); and whether the program is
    converted to the dtype (``converted``) or autocast."""

    rule: np.ndarray
    computes_low: np.ndarray
    outputs_low: np.ndarray
    fed_low: np.ndarray
    recorded_low: np.ndarray
    integer: np.ndarray
    converted: bool

    def input_low(self, w: int) -> bool:
        """Whether the input whose gradient ``w``'s node passes back is in the autocast dtype
        (under autocast a widest op's is taken as the fp32 residual stream's)."""
        return bool(self.fed_low[w]) and (self.converted or self.rule[w] != Rule.WIDEST)


def _listed(value: object) -> list:
    return list(value) if isinstance(value, (list, tuple)) else []


def _rule(name: str, types: list, concrete: list, math_inside: bool) -> Rule:
    if op_key(name) in CONVERSIONS and conversion_target(types, concrete) == "fp32":
        return Rule.TO_FP32
    cls = classify_kernel(name, name).value
    if cls in LOWERED_CLASSES:
        return Rule.UPCAST if math_inside else Rule.LOWERED
    if is_fp32_op(name):
        return Rule.FP32
    if cls == KernelClass.ELEMENTWISE.value and sum(compute_dtype(t) is not None for t in types) > 1:
        return Rule.WIDEST
    return Rule.KEEPS


def makes_integers(trace: Trace, ops: ForwardOps, at: np.ndarray) -> np.ndarray:
    """Per position in ``at`` (of ``ops``' hierarchy; -1: none, False): what the op makes is not
    floating-point: it is a factory asked for an integer or bool type
    (:func:`~whatif.core.dtypes.factory_dtype`), or it is given tensors and none of them is."""
    rows = ops.hierarchy.rows
    names = trace.events["name"].astype(str).to_numpy()
    types, concrete = trace.arg(Arg.INPUT_TYPES), trace.arg(Arg.CONCRETE_INPUTS)
    known = at >= 0
    distinct = np.unique(at[known])
    integer = np.zeros(len(distinct), dtype=bool)
    for k, p in enumerate(distinct.tolist()):
        r = int(rows[p])
        made = factory_dtype(str(names[r]), _listed(concrete[r]))
        kinds = [t for t in _listed(types[r]) if element_bytes(t) is not None]
        integer[k] = (compute_dtype(made) is None if made is not None
                      else bool(kinds) and all(compute_dtype(t) is None for t in kinds))
    out = np.zeros(len(at), dtype=bool)
    out[known] = integer[np.searchsorted(distinct, at[known])]
    return out


def op_dtypes(trace: Trace, ops: ForwardOps, converted: bool = False) -> OpDtypes:
    """The :class:`OpDtypes` of ``trace``'s forward work ops, each sequence in the order it ran,
    under autocast, or with the program ``converted`` to the dtype: then every op but an upcast
    one computes in the dtype of its input, the first op's being 16-bit, until a ``.float()``; an
    op given a parameter (an embedding table, a norm's weight) in the parameter's, 16-bit. An
    integer op passes on the dtype of what came before it."""
    ev = trace.events
    rows = ops.hierarchy.rows
    n = len(rows)
    names = ev["name"].astype(str).to_numpy()[rows]
    types, concrete = trace.arg(Arg.INPUT_TYPES), trace.arg(Arg.CONCRETE_INPUTS)
    work = np.flatnonzero(ops.work == np.arange(n))
    math_in = np.zeros(n, dtype=bool)
    is_math = np.asarray([op_key(x) == MATH_OP for x in names], dtype=bool)
    math_in[ops.work[(ops.work >= 0) & is_math]] = True
    rule = np.full(n, -1, dtype=np.int64)
    recorded = np.zeros(n, dtype=bool)
    integer = np.zeros(n, dtype=bool)
    integer[work] = makes_integers(trace, ops, work)
    for w in work.tolist():
        r = int(rows[w])
        kinds = _listed(types[r])
        rule[w] = _rule(str(names[w]), kinds, _listed(concrete[r]), bool(math_in[w]))
        first = next((d for d in map(compute_dtype, kinds) if d is not None), None)
        recorded[w] = first is not None and first.bytes == 2
    dims = trace.arg(Arg.INPUT_DIMS)
    given = np.zeros(n, dtype=bool)
    if converted:
        given[work] = [bool(param_args(str(names[w]), dims[int(rows[w])])) for w in work.tolist()]
    computes = np.zeros(n, dtype=bool)
    outputs = np.zeros(n, dtype=bool)
    fed = np.zeros(n, dtype=bool)
    ts_ns = ev["ts_ns"].to_numpy()[rows]
    for w in work[np.argsort(ts_ns[work], kind="stable")].tolist():
        b = int(ops.before[w])
        fed[w] = outputs[b] if b >= 0 else converted
        if integer[w]:   # an index's op: the float tensors after it are what came before it
            outputs[w] = fed[w]
            continue
        # an op given a parameter computes in the parameter's dtype: 16-bit once converted
        takes = (given[w] and converted) or fed[w]
        follows = converted or rule[w] == Rule.KEEPS
        computes[w] = rule[w] == Rule.LOWERED or (follows and rule[w] not in (Rule.UPCAST, Rule.TO_FP32) and takes)
        outputs[w] = computes[w] or rule[w] == Rule.UPCAST
    return OpDtypes(rule, computes, outputs, fed, recorded, integer, converted)


class Added(str, Enum):
    """What an added block is."""

    CAST = "a cast's copy"
    ACCUMULATOR = "a CPU GEMM's fp32 accumulator"
    PROMOTION = "a CPU mixed-dtype op's fp32 copy"


@dataclass(frozen=True)
class AddedBlock:
    """A block the 16-bit run makes that the fp32 run does not (a cast's copy, a CPU GEMM's
    accumulator): ``nbytes`` allocated at ``alloc_at`` and freed at ``free_at`` (each ``(row of
    Trace.memory, after)``), made for the op at position ``made_in`` of the :class:`ForwardOps`
    hierarchy; what it is, ``kind``."""

    nbytes: int
    alloc_at: tuple[int, bool]
    free_at: tuple[int, bool]
    made_in: int
    kind: Added = field(default_factory=lambda: Added.CAST)

    @property
    def op(self) -> str | None:
        """The op the block is said to be made in: a copy's ``aten::_to_copy``, an accumulator's
        GEMM (its anchor's, None)."""
        return None if self.kind is Added.ACCUMULATOR else CAST_OP


@dataclass(frozen=True)
class Recast:
    """An allocation (position ``i`` into the roles' rows) made in one dtype and cast to another
    when ``at`` is reached (a row of ``Trace.memory``, after it): ``first_bytes`` from its
    allocation to ``at``, ``then_bytes`` from ``at`` to its free (the copy is made before the
    original is freed)."""

    i: int
    first_bytes: int
    then_bytes: int
    at: tuple[int, bool]


@dataclass(frozen=True)
class AutocastMemory:
    """Each allocation's bytes under autocast over its recorded bytes (``factors``, aligned with
    ``roles.rows``; 1 for a recast one), the allocations cast on the way (``recasts``), the
    blocks autocast adds (``added``), the allocations freed earlier than recorded
    (``freed_early``, positions into ``roles.rows``, each freed at its ``freed_at``) and what was
    allocated before the recording over its recorded bytes (``before``: the parameters and
    optimizer state of a converted program are in the dtype)."""

    roles: BlockRoles
    factors: np.ndarray
    recasts: tuple[Recast, ...]
    added: tuple[AddedBlock, ...]
    freed_early: np.ndarray
    freed_at: tuple[tuple[int, bool], ...]
    before: float

    def scaling(self) -> BlockScaling:
        """The factors, and ``before`` for what was allocated before the recording, as a
        :class:`~whatif.tracer.memory.BlockScaling` (what ``scale_blocks`` takes)."""
        return BlockScaling(self.roles.rows, self.factors, self.before)


class _Timelines:
    """Each device's allocator records in order, to place a block at a time."""

    def __init__(self, memory: pd.DataFrame) -> None:
        self.ts_ns = memory["ts_ns"].to_numpy()
        columns = memory[["rank", "device_type", "device_id"]].to_numpy()
        self.groups: dict[tuple[int, int, int], np.ndarray] = {}
        for idx in memory.groupby(["rank", "device_type", "device_id"], sort=False).indices.values():
            rank, kind, device = columns[idx[0]].tolist()
            self.groups[(rank, kind, device)] = np.asarray(idx)
        self.indices = list(self.groups.values())
        self.device = np.zeros(len(memory), dtype=np.int64)
        for i, idx in enumerate(self.indices):
            self.device[idx] = i
        keys = list(self.groups)
        self.main: dict[int, int] = {}
        for rank in {k[0] for k in keys}:
            mine = [k for k in keys if k[0] == rank]
            gpus = [k for k in mine if k[1] in GPU_DEVICE_TYPES]
            self.main[rank] = keys.index(max(gpus or mine, key=lambda k: (len(self.groups[k]), k)))

    def on_main(self, rows: np.ndarray, ranks: np.ndarray) -> np.ndarray:
        """Per row: on its rank's main device (the GPU with the most records, else the CPU)."""
        return self.device[rows] == np.asarray([self.main.get(int(r), -1) for r in ranks], dtype=np.int64)

    def first_from(self, rank: int, t_ns: int) -> tuple[int, bool] | None:
        """Right before the first record at or after ``t_ns`` on ``rank``'s main device; None
        when the rank has no record."""
        if rank not in self.main:
            return None
        idx = self.indices[self.main[rank]]
        at = int(np.searchsorted(self.ts_ns[idx], t_ns, side="left"))
        return (int(idx[at]), False) if at < len(idx) else (int(idx[-1]), True)

    def last_by(self, row: int, t_ns: int) -> tuple[int, bool]:
        """Right after the last record of ``row``'s device at or before ``t_ns`` (never before ``row``)."""
        idx = self.indices[self.device[row]]
        at = int(np.searchsorted(self.ts_ns[idx], t_ns, side="right")) - 1
        return max(int(idx[max(at, 0)]), row), True


@dataclass(frozen=True)
class _Spans:
    """Per position of a :class:`ForwardOps` hierarchy that is a forward work op: when the
    autograd nodes it made start and end (-1: none), and when its forward ends (the next backward
    on its rank starts, else its step's last forward op ends)."""

    node_start_ns: np.ndarray
    node_end_ns: np.ndarray
    forward_end_ns: np.ndarray


def _spans(trace: Trace, ops: ForwardOps, ts_ns: np.ndarray, end_ns: np.ndarray) -> _Spans:
    ev = trace.events
    rows = ops.hierarchy.rows
    n = len(rows)
    ranks = ev["rank"].to_numpy()[rows]
    steps = record_steps(ev, ev)[rows]
    by = np.where(ops.made_by >= 0, ops.work[np.maximum(ops.made_by, 0)], -1)
    mine = by >= 0
    node_end = np.full(n, -1, dtype=np.int64)
    np.maximum.at(node_end, by[mine], end_ns[mine])
    node_start = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(node_start, by[mine], ts_ns[mine])
    node_start[node_end < 0] = -1
    forward = ops.forward & (ops.work >= 0)
    last_forward = pd.Series(end_ns[forward]).groupby([ranks[forward], steps[forward]]).max().to_dict()
    forward_end = np.full(n, -1, dtype=np.int64)
    work = np.flatnonzero(ops.work == np.arange(n))
    for rank in np.unique(ranks[work]).tolist():
        starts = np.sort(ts_ns[mine & (ranks == rank)])
        at = work[ranks[work] == rank]
        nxt = np.searchsorted(starts, ts_ns[at], side="left")
        fallback = np.asarray([last_forward.get((rank, int(s)), int(e)) for s, e in zip(steps[at], end_ns[at])],
                              dtype=np.int64)
        forward_end[at] = (np.where(nxt < len(starts), starts[np.minimum(nxt, len(starts) - 1)], fallback)
                           if len(starts) else fallback)
    return _Spans(node_start, node_end, forward_end)


@dataclass(frozen=True)
class _Context:
    """What the parts of :func:`autocast_memory` read: per allocation (aligned with
    ``roles.rows``) its innermost op's position ``pos``, the forward work op it is made in
    (``work``) or whose autograd node makes it (``of``), ``made`` (the node's forward op),
    ``node`` (the node's position), bytes and times, ``floating`` (not made as integers:
    :func:`makes_integers` of its innermost op); per hierarchy position start and end."""

    trace: Trace
    ops: ForwardOps
    dt: OpDtypes
    roles: BlockRoles
    low_ratio: float
    lines: _Timelines
    spans: _Spans
    ts_ns: np.ndarray
    end_ns: np.ndarray
    pos: np.ndarray
    work: np.ndarray
    of: np.ndarray
    made: np.ndarray
    node: np.ndarray
    sizes: np.ndarray
    made_ns: np.ndarray
    free_ns: np.ndarray
    rank: np.ndarray
    floating: np.ndarray

    def recast(self, i: int, first: float, then: float, until_ns: int) -> Recast:
        row = int(self.roles.rows[i])
        return Recast(i, int(round(self.sizes[i] * first)), int(round(self.sizes[i] * then)),
                      self.lines.last_by(row, until_ns))


def _context(trace: Trace, roles: BlockRoles, ops: ForwardOps, dt: OpDtypes, dtype: str) -> _Context:
    ev, mem = trace.events, trace.memory
    h = ops.hierarchy
    ts_ns = ev["ts_ns"].to_numpy()[h.rows]
    end_ns = ts_ns + ev["dur_ns"].to_numpy()[h.rows]
    allocs = roles.rows
    pos = enclosing(h, ev, mem.iloc[allocs])
    at = np.maximum(pos, 0)
    made = np.where(pos >= 0, ops.made_by[at], -1)
    mem_ns = mem["ts_ns"].to_numpy()
    return _Context(
        trace, ops, dt, roles, ELEMENT_BYTES[dtype] / FP32_BYTES, _Timelines(mem), _spans(trace, ops, ts_ns, end_ns),
        ts_ns, end_ns, pos,
        work=np.where((pos >= 0) & (made < 0), ops.work[at], -1),
        of=np.where(made >= 0, ops.work[np.maximum(made, 0)], -1),
        made=made,
        node=inherit(positions(np.isin(h.rows, autograd_nodes(ev))), h.parent)[at],
        sizes=mem["bytes"].to_numpy()[allocs],
        made_ns=mem_ns[allocs],
        free_ns=np.where(roles.frees >= 0, mem_ns[np.maximum(roles.frees, 0)], np.iinfo(np.int64).max),
        rank=mem["rank"].to_numpy()[allocs],
        floating=~makes_integers(trace, ops, pos))


def _forward_factors(cx: _Context, factors: np.ndarray) -> list[Recast]:
    """Forward activations in their op's output dtype; an upcast op's output cast at its end."""
    fwd = np.flatnonzero(cx.roles.mask(BlockRole.ACTIVATION) & (cx.work >= 0) & cx.floating)
    w = cx.work[fwd]
    factors[fwd[cx.dt.outputs_low[w] & (cx.dt.rule[w] != Rule.UPCAST)]] = cx.low_ratio
    upcast = fwd[cx.dt.rule[w] == Rule.UPCAST]
    out = []
    for op in np.unique(cx.work[upcast]).tolist():
        mine = upcast[cx.work[upcast] == op]
        outlive = mine[cx.free_ns[mine] > cx.end_ns[op]]
        if len(outlive):
            out.append(cx.recast(int(outlive[-1]), 1.0, cx.low_ratio, int(cx.end_ns[op])))
    return out


def _backward_factors(cx: _Context, factors: np.ndarray) -> list[Recast]:
    """Backward activations in the dtype their op computes in; the gradient an op passes back
    cast to its input's dtype when its node ends (``ToCopyBackward0``)."""
    out = []
    for i in np.flatnonzero(cx.roles.mask(BlockRole.ACTIVATION) & (cx.of >= 0) & cx.floating).tolist():
        f = int(cx.of[i])
        if cx.ops.loose[cx.made[i]]:   # the backward of a view or reshape of f's output
            factors[i] = cx.low_ratio if cx.dt.outputs_low[f] else 1.0
            continue
        compute = cx.low_ratio if cx.dt.computes_low[f] else 1.0
        held = cx.low_ratio if cx.dt.input_low(f) else 1.0
        if held == compute or cx.free_ns[i] <= cx.spans.node_end_ns[f]:
            factors[i] = compute
        else:
            out.append(cx.recast(i, compute, held, int(cx.end_ns[cx.node[i]])))
    return out


SCALAR_BYTES = 8
"""A block of at most this many bytes holds one element (an optimizer's step count, a loss): its
dtype is its own, not the model's."""


def _gradient_factors(cx: _Context, factors: np.ndarray) -> list[Recast]:
    """Under autocast, a lowered op's parameter gradients: its GEMM's output, cast to fp32 when
    its node ends. In a converted program every block but the activations on the rank's main
    device (parameters, gradients, optimizer state, what the optimizer and clipping make, what is
    held to the end) is in the dtype, but one-element blocks (:data:`SCALAR_BYTES`)."""
    if cx.dt.converted:
        main = cx.lines.on_main(cx.roles.rows, cx.rank)
        lasting = ~cx.roles.mask(BlockRole.ACTIVATION) & cx.floating & main & (cx.sizes > SCALAR_BYTES)
        factors[lasting] = cx.low_ratio
        return []
    grads = cx.roles.mask(BlockRole.GRADIENT) | cx.roles.mask(BlockRole.WEIGHT_GRADIENT)
    out = []
    for i in np.flatnonzero(grads & (cx.of >= 0)).tolist():
        if cx.dt.rule[cx.of[i]] != Rule.LOWERED:
            continue
        node_end_ns = int(cx.end_ns[cx.node[i]])
        if cx.free_ns[i] > node_end_ns:
            out.append(cx.recast(i, cx.low_ratio, 1.0, node_end_ns))
        else:
            factors[i] = cx.low_ratio
    return out


def _first_allocations(cx: _Context) -> dict[int, int]:
    """Per forward work op: its first allocation on its rank's main device (a row of ``Trace.memory``)."""
    first: dict[int, int] = {}
    main = cx.lines.on_main(cx.roles.rows, cx.rank)
    for i in np.flatnonzero((cx.work >= 0) & main).tolist():
        first.setdefault(int(cx.work[i]), int(cx.roles.rows[i]))
    return first


def _conversion_copy(cx: _Context, w: int, tensors: list) -> AddedBlock | None:
    """The fp32 copy ``x.float()`` makes of a lower-precision tensor, held to the end of the next
    op (of :data:`_LOOK_AHEAD`) that takes a tensor of its size, else to its own end."""
    rank = int(cx.trace.events["rank"].to_numpy()[cx.ops.hierarchy.rows[w]])
    start = cx.lines.first_from(rank, int(cx.ts_ns[w]))
    if start is None:
        return None
    numel = tensors[0][1]
    dims, types = cx.trace.arg(Arg.INPUT_DIMS), cx.trace.arg(Arg.INPUT_TYPES)
    until_ns, nxt = int(cx.end_ns[w]), int(cx.ops.after[w])
    for _ in range(_LOOK_AHEAD):
        if nxt < 0:
            break
        r = int(cx.ops.hierarchy.rows[nxt])
        if any(n == numel for _, n, _ in float_tensors(dims[r] or [], types[r] or [])):
            until_ns = int(cx.end_ns[nxt])
            break
        nxt = int(cx.ops.after[nxt])
    return AddedBlock(numel * FP32_BYTES, start, cx.lines.last_by(start[0], until_ns), w)


def _autocast_copies(cx: _Context, w: int, rule: Rule, anchor: int) -> list[AddedBlock]:
    """The copies autocast makes before lowered op ``w`` (its weight's, bias's and an fp32
    activation's, each held as long as its holder keeps it: module docstring; an op without an
    autograd node, under ``torch.inference_mode``, holds its parameters' copies only while it runs)
    or fp32-list op ``w`` fed 16 bits (an fp32 copy over the op); ``anchor``: its first allocation."""
    r = int(cx.ops.hierarchy.rows[w])
    name = str(cx.trace.events["name"].iat[r])
    dims, types = cx.trace.arg(Arg.INPUT_DIMS), cx.trace.arg(Arg.INPUT_TYPES)
    start = (anchor, False)
    op_end = cx.lines.last_by(anchor, int(cx.end_ns[w]))
    forward_end = cx.lines.last_by(anchor, int(cx.spans.forward_end_ns[w]) - 1)
    saved = cx.lines.last_by(anchor, int(cx.spans.node_end_ns[w])) if cx.spans.node_end_ns[w] >= 0 else None
    out = []
    for c in autocast_casts(name, dims[r], types[r], fed_by_low=bool(cx.dt.fed_low[w])):
        if c.to_fp32:
            out.append(AddedBlock(c.numel * FP32_BYTES, start, op_end, w))
            continue
        if rule == Rule.UPCAST:
            free = op_end
        elif saved is None and c.role in (CastRole.WEIGHT, CastRole.BIAS):
            free = op_end   # inference_mode: no cast cache, no autograd holding the copy
        elif c.role is CastRole.BIAS:
            free = forward_end
        elif c.role is CastRole.WEIGHT:
            free = saved or forward_end
        else:
            free = saved or op_end
        out.append(AddedBlock(int(round(c.numel * FP32_BYTES * cx.low_ratio)), start, free, w))
    return out


def _upcast_copies(cx: _Context, w: int, tensors: list, anchor: int) -> list[AddedBlock]:
    """The fp32 copies SDPA's math backend makes of its 16-bit inputs (Q, K, V; over the op) and,
    in its backward, of the output's gradient (over its autograd nodes; less the 16-bit gradient
    it replaces, freed once copied)."""
    start = (anchor, False)
    op_end = cx.lines.last_by(anchor, int(cx.end_ns[w]))
    out = [AddedBlock(numel * FP32_BYTES, start, op_end, w) for _, numel, _ in tensors[:3]]
    if tensors and cx.spans.node_end_ns[w] >= 0:
        rank = int(cx.trace.events["rank"].to_numpy()[cx.ops.hierarchy.rows[w]])
        node_start = cx.lines.first_from(rank, int(cx.spans.node_start_ns[w]))
        if node_start is not None:
            grown = int(round(tensors[0][1] * FP32_BYTES * (1 - cx.low_ratio)))
            out.append(AddedBlock(grown, node_start, cx.lines.last_by(node_start[0], int(cx.spans.node_end_ns[w])), w))
    return out


def _casts(cx: _Context, first: dict[int, int]) -> list[AddedBlock]:
    """The copies made for the forward's lowered, upcast, fp32-list and ``.float()`` ops (module
    docstring): autocast's casts (none in a converted program), the math backend's fp32 copies,
    and ``.float()``'s of a 16-bit tensor."""
    rows = cx.ops.hierarchy.rows
    dims, types = cx.trace.arg(Arg.INPUT_DIMS), cx.trace.arg(Arg.INPUT_TYPES)
    out: list[AddedBlock] = []
    for w in np.flatnonzero(cx.dt.rule >= 0).tolist():
        rule, fed = Rule(int(cx.dt.rule[w])), bool(cx.dt.fed_low[w])
        r = int(rows[w])
        tensors = float_tensors(dims[r] or [], types[r] or [])
        if rule == Rule.TO_FP32:
            block = _conversion_copy(cx, w, tensors) if fed and tensors else None
            out += [block] if block is not None else []
            continue
        if w not in first:
            continue
        if not cx.dt.converted and (rule in (Rule.LOWERED, Rule.UPCAST) or (rule == Rule.FP32 and fed)):
            out += _autocast_copies(cx, w, rule, first[w])
        if rule == Rule.UPCAST:
            out += _upcast_copies(cx, w, tensors, first[w])
    return out


def _early_frees(cx: _Context, first: dict[int, int], factors: np.ndarray,
                 recast: set[int]) -> dict[int, tuple[int, bool]]:
    """The fp32 activations a lowered op's cast frees early (allocation position -> the place of
    its free): per lowered op fed fp32 with a backward, the last block of its rank and device of
    the cast's elements × 4 bytes, made before the op and freed, as recorded, while the op's
    autograd nodes ran (the op saved it and nothing after it did); freed right after the cast."""
    early: dict[int, tuple[int, bool]] = {}
    if cx.dt.converted:
        return early
    names = cx.trace.events["name"].astype(str).to_numpy()
    dims, types = cx.trace.arg(Arg.INPUT_DIMS), cx.trace.arg(Arg.INPUT_TYPES)
    rows = cx.ops.hierarchy.rows
    device = cx.lines.device[cx.roles.rows]
    free = (cx.roles.mask(BlockRole.ACTIVATION) & (cx.work >= 0) & (factors == 1)
            & ~np.isin(np.arange(len(factors)), list(recast)))
    lowered = np.flatnonzero((cx.dt.rule == Rule.LOWERED) & ~cx.dt.fed_low & (cx.spans.node_end_ns >= 0))
    for w in lowered.tolist():
        if w not in first:
            continue
        r = int(rows[w])
        for c in autocast_casts(str(names[r]), dims[r], types[r], fed_by_low=False):
            if c.role is not CastRole.ACTIVATION:
                continue
            fp32_bytes = c.numel * FP32_BYTES
            held = np.flatnonzero(free & (device == cx.lines.device[first[w]]) & (cx.made_ns <= cx.ts_ns[w])
                                  & (cx.free_ns >= cx.spans.node_start_ns[w]) & (cx.free_ns <= cx.spans.node_end_ns[w])
                                  & np.isin(cx.sizes, [fp32_bytes, gpu_block_bytes(fp32_bytes)]))
            if len(held):
                early[int(held[-1])] = (first[w], True)
    return early


CPU_GEMM_OPS = frozenset({"mm", "addmm"})
"""The GEMM ops whose 16-bit CPU kernels allocate an fp32 accumulator (no 16-bit ``bmm`` ran in our recordings)."""
CPU_ACCUMULATOR_PAD_BYTES = 128
"""On the CPU, a 16-bit ``mm``/``addmm`` accumulates in an fp32 buffer of its output's elements ×
4 bytes + this, allocated after its output and freed before the op returns (PyTorch 2.13's CPU
build, every shape of our recordings, 2 × 192 to 4,096 × 1,152)."""


def _cpu_temporaries(cx: _Context, factors: np.ndarray, recasts: list[Recast]) -> list[AddedBlock]:
    """What a CPU allocates in 16 bits that a GPU does not (blocks of the CPU's records only): the
    fp32 accumulator of each 16-bit GEMM, forward and backward (its output's elements × 4 +
    :data:`CPU_ACCUMULATOR_PAD_BYTES`, after the output, to the op's end), and under autocast the
    fp32 copy an elementwise op of mixed dtypes (a residual add fed a 16-bit branch) makes of its
    16-bit operand before it computes (the size of its fp32 output, over the op)."""
    on_cpu = ~on_gpu(cx.trace.memory)[cx.roles.rows]
    names = cx.trace.events["name"].astype(str).to_numpy()[cx.ops.hierarchy.rows]
    low = factors == cx.low_ratio
    low[[r.i for r in recasts if r.first_bytes < cx.sizes[r.i]]] = True
    out: list[AddedBlock] = []
    seen: set[int] = set()
    for i in np.flatnonzero(on_cpu & low & (cx.pos >= 0)).tolist():
        p = int(cx.pos[i])
        if p in seen or op_key(str(names[p])) not in CPU_GEMM_OPS:
            continue
        seen.add(p)
        row = int(cx.roles.rows[i])
        out.append(AddedBlock(int(cx.sizes[i]) + CPU_ACCUMULATOR_PAD_BYTES, (row, True),
                              cx.lines.last_by(row, int(cx.end_ns[p])), p, Added.ACCUMULATOR))
    if cx.dt.converted:
        return out
    inside = np.where(cx.pos >= 0, ~cx.ops.loose[np.maximum(cx.pos, 0)], False)
    made = on_cpu & inside & cx.roles.mask(BlockRole.ACTIVATION)
    for w in np.flatnonzero((cx.dt.rule == Rule.WIDEST) & cx.dt.fed_low).tolist():
        mine = np.flatnonzero(made & (cx.work == w))
        if len(mine):
            row = int(cx.roles.rows[mine[0]])
            out.append(AddedBlock(int(cx.sizes[mine[0]]), (row, False), cx.lines.last_by(row, int(cx.end_ns[w])), w,
                                  Added.PROMOTION))
    return out


def autocast_memory(trace: Trace, dtype: str = "bf16", converted: bool = False) -> AutocastMemory:
    """The :class:`AutocastMemory` of ``trace`` (an fp32 program) under autocast to ``dtype``, or
    ``converted`` to it (module docstring).

    Raises
    ------
    TransformError : ``dtype`` is not bf16 or fp16; as :func:`~.batch_memory.block_roles`;
        the trace's forward has no op autocast lowers (a GEMM, convolution or attention op), or
        its lowered ops already take 16-bit inputs.
    """
    who = "precision" if converted else "autocast"
    if dtype not in AUTOCAST_DTYPES:
        raise TransformError(f"{who}: dtype {dtype!r} is not a 16-bit floating-point dtype; choose bf16 or fp16")
    roles = block_roles(trace, who)
    ops = forward_ops(trace)
    dt = op_dtypes(trace, ops, converted)
    lowered = np.flatnonzero((dt.rule == Rule.LOWERED) | (dt.rule == Rule.UPCAST))
    if not len(lowered):
        raise TransformError(f"{who}: found no GEMM, convolution or attention op in the forward of "
                             f"{trace.source}: no op whose memory 16 bits would change")
    already = int(dt.recorded_low[lowered].sum())
    if already:
        raise TransformError(f"{who}: {already:,} of the {len(lowered):,} GEMM, convolution and attention ops in "
                             f"the forward of {trace.source} already take 16-bit inputs; its memory in {dtype} is "
                             f"predicted from an fp32 program")
    cx = _context(trace, roles, ops, dt, dtype)
    factors = np.ones(len(roles.rows))
    recasts = _forward_factors(cx, factors) + _backward_factors(cx, factors) + _gradient_factors(cx, factors)
    first = _first_allocations(cx)
    early = _early_frees(cx, first, factors, {r.i for r in recasts})
    at_early = np.asarray(sorted(early), dtype=np.int64)
    # a GEMM's temporaries first: at its last record they come before the frees of its inputs' copies
    added = _cpu_temporaries(cx, factors, recasts) + _casts(cx, first)
    return AutocastMemory(roles, factors, tuple(recasts), tuple(added), at_early,
                          tuple(early[i] for i in at_early.tolist()), cx.low_ratio if converted else 1.0)


def autocast_memory_edit(trace: Trace, dtype: str = "bf16", converted: bool = False) -> RecordEdit:
    """The allocator records of ``trace`` (an fp32 program) run under autocast to ``dtype``:
    each allocation at its :func:`autocast_memory` factor, at its place (a GPU's rounded up to
    the caching allocator's 512 bytes), the recast ones in two parts, the early-freed ones freed
    at their new place, and the blocks autocast adds.

    Raises
    ------
    TransformError : as :func:`autocast_memory`.
    """
    model = autocast_memory(trace, dtype, converted)
    mem = trace.memory
    editor = RecordEditor(mem)
    scale_blocks(editor, model.scaling())
    sizes = mem["bytes"].to_numpy()
    gpu = on_gpu(mem)

    def block(row: int, nbytes: int) -> int:   # a GPU's caching allocator rounds up to 512 B
        return gpu_block_bytes(nbytes) if gpu[row] else nbytes

    for i, free in zip(model.freed_early.tolist(), model.freed_at):
        row = int(model.roles.rows[i])
        editor.drop_block(row)
        editor.add_block(int(sizes[row]), (row, True), free, None)
    for r in model.recasts:
        row = int(model.roles.rows[r.i])
        last = editor.free_of(row)
        editor.drop_block(row)
        editor.add_block(block(row, r.then_bytes), r.at, (last, True) if last is not None else None, CAST_OP)
        editor.add_block(block(row, r.first_bytes), (row, True), r.at, None)
    copies_bytes = 0
    for b in model.added:
        nbytes = block(b.alloc_at[0], b.nbytes)
        editor.add_block(nbytes, b.alloc_at, b.free_at, b.op)
        copies_bytes += nbytes if b.kind is Added.CAST else 0
    fewer_mib = float((sizes[model.roles.rows] * (1 - model.factors)).sum()) / 2**20
    held = f"{int((model.factors < 1).sum()):,} blocks held in {dtype} ({fewer_mib:,.1f} MiB fewer bytes allocated)"
    recast = f"{len(model.recasts):,} made in one dtype and cast to the other"
    n_copies = sum(b.kind is Added.CAST for b in model.added)
    copies = f"({copies_bytes / 2**20:,.1f} MiB allocated)"
    cpu_blocks = len(model.added) - n_copies
    cpu = f", {cpu_blocks:,} CPU temporaries in fp32 (its 16-bit GEMMs' accumulators, mixed-dtype copies)" \
        if cpu_blocks else ""
    before = (", what was allocated before the recording (the parameters, the optimizer's state) at "
              f"{model.before:.0%}" if model.before != 1 else "")
    if converted:
        what = (f"precision(dtype={dtype}), the model converted: {held}, {recast}, {n_copies:,} fp32 copies "
                f"added {copies} (SDPA math's upcasts, .float()){cpu}{before}")
    else:
        what = (f"autocast(dtype={dtype}): {held}, {recast}, {n_copies:,} cast copies added {copies}, "
                f"{len(model.freed_early):,} fp32 activations freed once cast{cpu}")
    return editor.edit(what)
