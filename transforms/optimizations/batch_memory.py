"""What ``batch`` does to memory: the blocks that hold a sample's data grow with the batch, the
ones made from parameters do not.

Each allocation of a trace's allocator records (``Trace.memory``) gets a :class:`BlockRole` from
where it was made (its step, the step's backward window) and the op that made it (the innermost
enclosing aten op that was given a tensor, with its recorded ``Input Dims``):

* **outside** a ``ProfilerStep`` window (on a rank that has them): as recorded;
* **after the backward** (from the end of the step's last autograd node to the step's end:
  gradient clipping, the optimizer, ``zero_grad``): as recorded;
* **gradient**: made in the backward and still held after its last node (a parameter's ``.grad``;
  activation gradients are freed inside the backward): as recorded;
* **held to the end**: made before the backward (or in a step without one) and never freed while
  recording (parameters made in the first step, state and caches kept for good; activations are
  freed in their step): as recorded;
* **weight gradient**: in the backward, the GEMM of an autograd node whose output has a
  parameter's shape and that contracts over a token count (the rows a forward GEMM with a weight
  multiplies; of several such GEMMs the last, and without one the node's last GEMM with a
  parameter-shaped output); a reduction the size of a parameter (a bias's gradient); a block the
  size of its op's own parameter input (a norm's or convolution's weight gradient): as recorded;
* **parameter**: an op whose every floating-point tensor of more than one element has a parameter's
  shape (autocast's copy of a weight, a norm over gradients), or a factory op (``empty``,
  ``randn``…) outside any op given a tensor and asked for a parameter's shape (its ``Concrete
  Inputs``: a weight made, then converted): as recorded;
* **activation**: every other block made in a step (activations, saved tensors, their gradients,
  temporaries): ``factor`` × its bytes (rounded up to the caching allocator's 512 bytes on a GPU).

A parameter's shape is one the trace's forward ops take as a parameter argument
(:func:`~whatif.core.kernels.param_args`: GEMM and convolution weights and biases, norm weights,
embedding tables), either way round for 2-D ones. A trace without ``ProfilerStep`` windows is one
step. Left out, and why it matters: blocks that do not hold a sample yet are made from
activation-shaped data (a causal mask of S × S, position embeddings of S rows) grow too; an
activation with a parameter's exact shape made by a non-GEMM op counts as a parameter (a
``[tokens, hidden]`` tensor when tokens = hidden; GEMMs are told by role, not shape); a weight
gradient computed outside its autograd node's GEMMs (a custom autograd function's) grows; a cache
preallocated for a batch and kept (a static KV cache) is held to the end and stays. Reserved
memory is not predicted (``whatif memory``), and neither is fragmentation.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np
import pandas as pd

from whatif.core.dtypes import compute_dtype
from whatif.core.kernels import GEMM_OPS, op_key, param_args, tensor_shape, tensor_shapes
from whatif.depgraph.hierarchy import (
    OUTSIDE_STEPS,
    CpuHierarchy,
    autograd_nodes,
    build_hierarchy,
    enclosing,
    inherit,
    record_steps,
    step_windows,
)
from whatif.tracer.args import Arg
from whatif.tracer.kinds import EventKind
from whatif.tracer.memory import (
    UNKNOWN,
    BlockScaling,
    RecordEdit,
    RecordEditor,
    allocated_bytes,
    held_before_bytes,
    on_gpu,
    scaled_edit,
)
from whatif.tracer.trace import Trace

from ..base import TransformError

REDUCTIONS = frozenset({"sum", "mean", "sum_to_size"})
"""Ops whose output in the backward can be a broadcast parameter's gradient (a bias's)."""
ELEMENT_BYTES = (2, 4, 8)
"""The element sizes a parameter's gradient can have (16-bit, fp32, and fp64 CPU accumulators)."""


class BlockRole(str, Enum):
    """Why an allocation grows with the batch or not (module docstring)."""

    ACTIVATION = "activation"
    PARAMETER = "parameter"
    WEIGHT_GRADIENT = "weight gradient"
    GRADIENT = "gradient"
    PERSISTENT = "held to the end"
    AFTER_BACKWARD = "after the backward"
    OUTSIDE = "outside steps"


@dataclass(frozen=True)
class BlockRoles:
    """The role of each allocation (``rows`` of ``Trace.memory``), the record that frees it, and
    the parameter shapes read."""

    rows: np.ndarray
    codes: np.ndarray  # int8 per row: the role's position in BlockRole
    frees: np.ndarray  # int64 per row: the record that frees its block, -1 when none does
    param_shapes: frozenset[tuple[int, ...]]

    def mask(self, role: BlockRole) -> np.ndarray:
        """Per allocation (aligned with ``rows``): whether its role is ``role``."""
        return self.codes == list(BlockRole).index(role)

    def of(self, role: BlockRole) -> np.ndarray:
        """The rows of ``role``'s allocations."""
        return self.rows[self.mask(role)]

    def bytes_by_role(self, sizes: np.ndarray) -> dict[BlockRole, int]:
        """Bytes allocated per role (every allocation counted, freed or not), roles without one left out."""
        return {r: int(sizes[self.of(r)].sum()) for r in BlockRole if len(self.of(r))}


def _numel(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64))


def is_param_shape(shape: tuple[int, ...], params: frozenset[tuple[int, ...]]) -> bool:
    return shape in params or (len(shape) == 2 and shape[::-1] in params)


def _tensors(dims: object, types: object) -> list[tuple[tuple[int, ...], bool]]:
    """(shape, floating point) of an op's tensor arguments."""
    out = []
    kinds = types if isinstance(types, (list, tuple)) else ()
    for i, d in enumerate(dims if isinstance(dims, (list, tuple)) else ()):
        s = tensor_shape(d)
        if s is not None:
            out.append((s, compute_dtype(kinds[i] if i < len(kinds) else None) is not None))
    return out


def _factory_shape(concrete: object) -> tuple[int, ...] | None:
    """The size a factory op (``empty``, ``zeros``, ``randn``…) was given: its first concrete input.

    >>> _factory_shape(["[1152, 192]", "", "False"]), _factory_shape(["", "0"])
    ((1152, 192), None)
    """
    if not isinstance(concrete, (list, tuple)) or not concrete or not isinstance(concrete[0], str):
        return None
    text = concrete[0].strip()
    if not (text.startswith("[") and text.endswith("]")) or len(text) < 3:
        return None
    try:
        return tuple(int(x) for x in text[1:-1].split(","))
    except ValueError:
        return None


def gemm_output_shape(op: str, dims: object) -> tuple[int, ...] | None:
    """The output shape of a recorded ``mm`` or ``addmm`` (None for other ops or unknown shapes).

    >>> gemm_output_shape("aten::mm", [[8, 4], [4, 16]]), gemm_output_shape("aten::addmm", [[16], [8, 4], [4, 16]])
    ((8, 16), (8, 16))
    """
    key = op_key(op)
    if not isinstance(dims, (list, tuple)):
        return None
    pair = {"mm": (0, 1), "addmm": (1, 2)}.get(key)
    if pair is None or len(dims) <= pair[1]:
        return None
    a, b = tensor_shape(dims[pair[0]]), tensor_shape(dims[pair[1]])
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        return None
    return a[0], b[1]


def _windows(ev: pd.DataFrame, nodes: np.ndarray, steps: np.ndarray) -> pd.DataFrame:
    """Per (rank, step) (the index): the backward window, from the first autograd node's start to
    the last one's end (columns ``start``, ``end``); ``steps``: each event's step."""
    start = ev["ts_ns"].to_numpy()[nodes]
    frame = pd.DataFrame({"rank": ev["rank"].to_numpy()[nodes], "step": steps[nodes], "start": start,
                          "end": start + ev["dur_ns"].to_numpy()[nodes]})
    return frame.groupby(["rank", "step"]).agg(start=("start", "min"), end=("end", "max"))


def _in_windows(windows: pd.DataFrame, rank: np.ndarray, step: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """Per entry: whether ``ts`` lies in the backward window of its (rank, step)."""
    if not len(windows):
        return np.zeros(len(ts), dtype=bool)
    at = windows.index.get_indexer(pd.MultiIndex.from_arrays([rank, step]))
    safe = np.maximum(at, 0)
    return (at >= 0) & (ts >= windows["start"].to_numpy()[safe]) & (ts <= windows["end"].to_numpy()[safe])


def backward_events(ev: pd.DataFrame, windows: pd.DataFrame | None = None,
                    steps: np.ndarray | None = None) -> np.ndarray:
    """Per event of ``ev`` (``Trace.events``): whether it starts in its step's backward window,
    from the first autograd node's start to the last one's end (``windows`` and ``steps``, each
    event's step, when already computed)."""
    steps = record_steps(ev, ev) if steps is None else steps
    windows = _windows(ev, autograd_nodes(ev), steps) if windows is None else windows
    return _in_windows(windows, ev["rank"].to_numpy(), steps, ev["ts_ns"].to_numpy())


def _param_shapes(names: np.ndarray, dims: np.ndarray, rows: np.ndarray) -> frozenset[tuple[int, ...]]:
    out = set()
    for r in rows.tolist():
        d = dims[r]
        for i in param_args(str(names[r]), d):
            s = tensor_shape(d[i])
            if s is not None and _numel(s) > 1:
                out.add(s)
    return frozenset(out)


def _token_counts(names: np.ndarray, dims: np.ndarray, rows: np.ndarray) -> frozenset[int]:
    """The rows a forward GEMM with a weight multiplies: its activation's elements over its last dimension."""
    out = set()
    for r in rows.tolist():
        name, d = str(names[r]), dims[r]
        if op_key(name) not in GEMM_OPS:
            continue
        weights = param_args(name, d)
        if not weights:
            continue
        for i, x in enumerate(d):
            s = tensor_shape(x)
            if i not in weights and s is not None and len(s) >= 2:
                out.add(_numel(s[:-1]))
    return frozenset(out)


def block_roles(trace: Trace, who: str = "batch") -> BlockRoles:
    """The :class:`BlockRole` of every allocation in ``trace``'s allocator records (module docstring;
    ``who``: the transform that asks, named in the errors).

    Raises
    ------
    TransformError : the trace has no allocator records, records without block addresses, or no
        recorded shapes to tell parameters by.
    """
    mem, ev = trace.memory, trace.events
    if not len(mem):
        raise TransformError(f"{who}: {trace.source} has no allocator records (record with `whatif record --memory`)")
    allocs = mem["bytes"].to_numpy() > 0
    blind = int((allocs & (mem["addr"].to_numpy() == UNKNOWN)).sum())
    if blind:
        raise TransformError(f"{who}: {blind:,} of {int(allocs.sum()):,} allocator records of {trace.source} carry "
                             f"no block address (an early Kineto schema): their blocks cannot be paired with their "
                             f"frees")
    dims = trace.arg(Arg.INPUT_DIMS)
    kinds = ev["kind"].to_numpy()
    ops = kinds == int(EventKind.CPU_OP)
    shaped = ops & np.array([bool(tensor_shapes(d, members=True)) for d in dims], dtype=bool)
    if not shaped.any():
        raise TransformError(f"{who}: {trace.source} has no recorded shapes (record with `whatif record "
                             f"--record-shapes`)")
    names = ev["name"].astype(str).to_numpy()
    nodes = autograd_nodes(ev)
    ev_steps = record_steps(ev, ev)
    table = _windows(ev, nodes, ev_steps)
    in_backward = backward_events(ev, table, ev_steps)
    windows = {(int(r), int(s)): (int(a), int(b)) for (r, s), a, b in zip(table.index, table["start"], table["end"])}
    forward = np.flatnonzero(shaped & ~in_backward)
    params = _param_shapes(names, dims, forward)
    tokens = _token_counts(names, dims, forward)
    types, concrete = trace.arg(Arg.INPUT_TYPES), trace.arg(Arg.CONCRETE_INPUTS)

    hierarchy = build_hierarchy(ev)
    rows = np.flatnonzero(allocs)
    pos = enclosing(hierarchy, ev, mem.iloc[rows])
    shaped_pos = np.where(shaped[hierarchy.rows], np.arange(len(hierarchy.rows)), -1)
    # the nearest enclosing op that was given a tensor, and the nearest enclosing autograd node
    op_at = inherit(shaped_pos, hierarchy.parent)
    is_node = np.isin(hierarchy.rows, nodes)
    node_at = inherit(np.where(is_node, np.arange(len(hierarchy.rows)), -1), hierarchy.parent)

    editor = RecordEditor(mem)
    frees = np.array([f if f is not None else -1 for f in map(editor.free_of, rows.tolist())], dtype=np.int64)
    mem_ts, mem_rank, sizes = mem["ts_ns"].to_numpy(), mem["rank"].to_numpy(), mem["bytes"].to_numpy()
    steps = record_steps(ev, mem)
    has_steps = set(step_windows(ev))
    wgrad = _weight_gradients(hierarchy, node_at, names, dims, ops, params, tokens)
    roles: list[BlockRole] = [BlockRole.ACTIVATION] * len(rows)
    for i, (row, p, free) in enumerate(zip(rows.tolist(), pos.tolist(), frees.tolist())):
        r, s, t = int(mem_rank[row]), int(steps[row]), int(mem_ts[row])
        if s == OUTSIDE_STEPS and r in has_steps:
            roles[i] = BlockRole.OUTSIDE
            continue
        window = windows.get((r, s))
        if window is not None and t > window[1]:
            roles[i] = BlockRole.AFTER_BACKWARD
            continue
        backward = window is not None and t >= window[0]
        if window is not None and backward and (free < 0 or mem_ts[free] > window[1]):
            roles[i] = BlockRole.GRADIENT
            continue
        if free < 0:
            roles[i] = BlockRole.PERSISTENT
            continue
        at = int(op_at[p]) if p >= 0 else -1
        made = _factory_shape(concrete[hierarchy.rows[p]]) if p >= 0 and at < 0 else None
        if made is not None and is_param_shape(made, params):
            roles[i] = BlockRole.PARAMETER
            continue
        roles[i] = _op_role(at, hierarchy.rows, names, dims, types, params, backward, wgrad, int(sizes[row]))
    order = list(BlockRole)
    return BlockRoles(rows, np.array([order.index(r) for r in roles], dtype=np.int8), frees, params)


def _gemm_facts(name: str, dims: object) -> tuple[tuple[int, ...] | None, int | None]:
    """A recorded ``mm``/``addmm``'s output shape and contraction size (None where unknown)."""
    out = gemm_output_shape(name, dims)
    if out is None or not isinstance(dims, (list, tuple)):
        return out, None
    a = tensor_shape(dims[1 if op_key(name) == "addmm" else 0])
    return out, a[1] if a is not None else None


def _weight_gradients(hierarchy: CpuHierarchy, node_at: np.ndarray, names: np.ndarray, dims: np.ndarray,
                      ops: np.ndarray, params: frozenset[tuple[int, ...]], tokens: frozenset[int]) -> set[int]:
    """The positions of the backward GEMMs that compute a weight's gradient: per autograd node,
    of its GEMMs whose output has a parameter's shape, the one that contracts over a token count
    (the last such one if several do), else the last one."""
    per_node: dict[int, list[tuple[int, bool]]] = {}
    for p in np.flatnonzero(node_at >= 0).tolist():
        r = int(hierarchy.rows[p])
        if not ops[r] or op_key(str(names[r])) not in GEMM_OPS:
            continue
        out, k = _gemm_facts(str(names[r]), dims[r])
        if out is not None and is_param_shape(out, params):
            per_node.setdefault(int(node_at[p]), []).append((p, k in tokens))
    found = set()
    for gemms in per_node.values():
        contracting = [p for p, over_tokens in gemms if over_tokens]
        found.add((contracting or [p for p, _ in gemms])[-1])
    return found


def _op_role(at: int, ev_rows: np.ndarray, names: np.ndarray, dims: np.ndarray, types: np.ndarray,
             params: frozenset[tuple[int, ...]], backward: bool, wgrad: set[int], nbytes: int) -> BlockRole:
    if at < 0:
        return BlockRole.ACTIVATION
    r = int(ev_rows[at])
    name, d = str(names[r]), dims[r]
    key = op_key(name)
    if key in GEMM_OPS:
        return BlockRole.WEIGHT_GRADIENT if backward and at in wgrad else BlockRole.ACTIVATION
    tensors = _tensors(d, types[r])
    big = [(s, f) for s, f in tensors if _numel(s) > 1]
    if big and all(f and is_param_shape(s, params) for s, f in big):
        return BlockRole.PARAMETER
    if backward:
        # a reduction's output the size of any parameter (a bias's gradient), or a block the size of
        # the op's own parameter input (a norm's or convolution's weight gradient)
        own = [s for s, f in big if f and is_param_shape(s, params)]
        numels = {_numel(p) for p in params} if key in REDUCTIONS else {_numel(s) for s in own}
        if any(nbytes == n * e for n in numels for e in ELEMENT_BYTES):
            return BlockRole.WEIGHT_GRADIENT
    return BlockRole.ACTIVATION


@dataclass(frozen=True)
class BatchPeaks:
    """Each GPU's allocated bytes after each of its records as recorded (``allocated``) and the
    activation bytes live then (``live``, :func:`block_roles`): at ``k`` × the batch the allocated
    bytes after a record are ``allocated + (k − 1) · live`` (block rounding left out: under 512 bytes
    a block). Several timelines (a pipeline's stages) are one :class:`BatchPeaks` by :meth:`of_all`."""

    allocated: tuple[np.ndarray, ...]
    live: tuple[np.ndarray, ...]

    @classmethod
    def of_all(cls, parts: Sequence[BatchPeaks]) -> BatchPeaks:
        """The timelines of ``parts`` side by side: the peak is the highest of any, the largest
        batch the least of any."""
        return cls(tuple(a for p in parts for a in p.allocated), tuple(v for p in parts for v in p.live))

    def peak_bytes(self, factor: float) -> int:
        """The highest allocated bytes of any GPU at ``factor`` × the batch (0 without records)."""
        return max((int((a + (factor - 1) * v).max()) for a, v in zip(self.allocated, self.live) if len(a)),
                   default=0)

    def largest_factor(self, capacity_bytes: float) -> float:
        """The largest multiple of the batch whose allocated bytes stay within ``capacity_bytes``
        on every GPU (``inf`` when no activation is ever live): the least of
        ``1 + (C − allocated) / live`` over the records with activations live."""
        best = float("inf")
        for allocated, live in zip(self.allocated, self.live):
            grows = live > 0
            if grows.any():
                best = min(best, float((1 + (capacity_bytes - allocated[grows]) / live[grows]).min()))
        return max(best, 0.0)


def gpu_devices(memory: pd.DataFrame) -> list[np.ndarray]:
    """The rows of ``memory`` (``Trace.memory``) of each GPU of each rank, in time order; the
    order of :class:`BatchPeaks`' timelines."""
    gpu = np.flatnonzero(on_gpu(memory))
    groups = memory.iloc[gpu].groupby(["rank", "device_type", "device_id"], sort=False).indices.values()
    return [gpu[np.asarray(rows)] for rows in groups]


def batch_peaks(trace: Trace, roles: BlockRoles, scaling: BlockScaling | None = None) -> BatchPeaks | None:
    """The :class:`BatchPeaks` of ``trace``'s GPUs (None without GPU records). With ``scaling``
    (a share of each allocation's bytes kept, e.g. on one rank of a parallel plan, what was
    allocated before the recording at ``before`` × it, and blocks allocated earlier), of the
    records so edited (block rounding left out)."""
    mem = trace.memory
    gpu = on_gpu(mem)
    if not gpu.any():
        return None
    sizes = mem["bytes"].to_numpy()
    kept = np.ones(len(roles.rows))
    before = 1.0
    if scaling is not None:
        at = np.searchsorted(roles.rows, scaling.rows)
        if not np.array_equal(roles.rows[np.minimum(at, len(roles.rows) - 1)], scaling.rows):
            raise ValueError("batch_peaks: the scaling's rows are not allocations of these block roles")
        kept[at] = scaling.factors
        before = scaling.before
    active = roles.mask(BlockRole.ACTIVATION)
    freed = roles.frees >= 0
    delta = np.zeros(len(mem))
    delta[roles.rows[active]] += sizes[roles.rows[active]] * kept[active]
    np.subtract.at(delta, roles.frees[active & freed], sizes[roles.rows[active & freed]] * kept[active & freed])
    less = np.zeros(len(mem))
    less[roles.rows] += sizes[roles.rows] * (1 - kept)
    np.subtract.at(less, roles.frees[freed], sizes[roles.rows[freed]] * (1 - kept[freed]))
    if scaling is not None and len(scaling.moved):
        at = np.searchsorted(roles.rows, scaling.moved)
        held = sizes[scaling.moved] * kept[at]
        grows = active[at]
        np.subtract.at(less, scaling.to, held)
        np.add.at(less, scaling.moved, held)
        np.add.at(delta, scaling.to[grows], held[grows])
        np.subtract.at(delta, scaling.moved[grows], held[grows])
    allocated, live = [], []
    for at in gpu_devices(mem):
        records = mem.iloc[at]
        allocated.append(allocated_bytes(records)[0] - np.cumsum(less[at]) - held_before_bytes(records) * (1 - before))
        live.append(np.cumsum(delta[at]))
    return BatchPeaks(tuple(allocated), tuple(live))


def with_transients(trace: Trace, peaks: BatchPeaks, transients: Sequence[tuple[int, bool, int]]) -> BatchPeaks:
    """``peaks`` (of ``trace``'s GPUs, :func:`batch_peaks`) with activation bytes held for a moment
    at some records: each ``(row, after, bytes)`` of ``Trace.memory`` adds a point right after the
    record (or right before it: before a device's first, its allocated bytes less the record's)
    whose allocated and live activation bytes are that moment's plus ``bytes`` (a burst of buffers
    made and freed there, which grows with the batch); rows not on a GPU are left out. A peak and
    a largest batch are over points, so the points need no order."""
    mem = trace.memory
    device = np.full(len(mem), -1, dtype=np.int64)
    place = np.zeros(len(mem), dtype=np.int64)
    for g, rows in enumerate(gpu_devices(mem)):
        device[rows], place[rows] = g, np.arange(len(rows))
    sizes = mem["bytes"].to_numpy()
    extra: list[list[tuple[float, float]]] = [[] for _ in peaks.allocated]
    for row, after, nbytes in transients:
        g, i = int(device[row]), int(place[row])
        if g < 0:
            continue
        at = i if after else i - 1
        base = (peaks.allocated[g][at], peaks.live[g][at]) if at >= 0 else (peaks.allocated[g][0] - sizes[row], 0.0)
        extra[g].append((base[0] + nbytes, base[1] + nbytes))
    allocated = tuple(np.concatenate([a, [x for x, _ in e]]) for a, e in zip(peaks.allocated, extra))
    live = tuple(np.concatenate([v, [y for _, y in e]]) for v, e in zip(peaks.live, extra))
    return BatchPeaks(allocated, live)


def largest_factor(trace: Trace, roles: BlockRoles, capacity_bytes: float) -> float | None:
    """The largest multiple of the recorded batch whose allocated bytes stay within
    ``capacity_bytes`` on every GPU of the trace (None without GPU records; ``inf`` when no
    activation is ever live): :meth:`BatchPeaks.largest_factor`."""
    peaks = batch_peaks(trace, roles)
    return peaks.largest_factor(capacity_bytes) if peaks is not None else None


def batch_memory_edit(trace: Trace, factor: float, capacity: tuple[str, float] | None = None) -> RecordEdit:
    """The allocator records at ``factor`` × the batch: each activation block (:func:`block_roles`)
    allocated ``factor`` × its bytes, at its place, freed at its free; every other block as recorded.
    With ``capacity`` (the GPU's name and bytes), the line says the largest batch that fits
    (:func:`largest_factor`).

    Raises
    ------
    TransformError : as :func:`block_roles`.
    """
    roles = block_roles(trace)
    mem = trace.memory
    sizes = mem["bytes"].to_numpy()
    grow = roles.of(BlockRole.ACTIVATION)
    by_role = roles.bytes_by_role(sizes)
    kept = ", ".join(f"{r.value} {b / 2**20:,.1f}" for r, b in by_role.items() if r is not BlockRole.ACTIVATION)
    grown = by_role.get(BlockRole.ACTIVATION, 0) / 2**20
    what = (f"batch(factor={factor:g}): {len(grow):,} activation blocks ({grown:,.1f} MiB allocated) at "
            f"{factor:g}x their bytes; as recorded (MiB allocated): {kept or 'none'}")
    fits = largest_factor(trace, roles, capacity[1]) if capacity is not None else None
    if capacity is not None and fits is not None:
        what += (f"; the largest batch that fits in the {capacity[0]}'s {capacity[1] / 2**30:,.0f} GiB: "
                 + ("any (no activation is recorded on a GPU)" if fits == float("inf") else
                    f"{fits:,.2f}x the recorded one"))
    return scaled_edit(mem, BlockScaling(np.sort(grow), np.full(len(grow), float(factor))), what)
