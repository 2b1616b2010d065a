"""The forward pass of a trace read from its CPU ops: the ops that do work, in the order they ran,
each with its transformer block and tensor-parallel role, and the forward op behind each autograd
node of the backward. What the parallel memory models (:mod:`.tp_memory`, :mod:`.pp_memory`)
give each allocation a share by.

A **work op** is an outermost forward CPU op whose name has a kernel class other than ``other``
(a GEMM, attention, a norm, a reduction, an elementwise op, a copy…). The work ops of each rank's
and step's forward form a sequence; the transformer blocks of
:func:`~whatif.transforms.parallel.layers.sequence_rows` (the heuristic ``tensor_parallel`` and
``pipeline_parallel`` run on kernels) give each its role and block. Ops inside a work op are
that op; other forward ops (views, reshapes: **loose** ops) belong to the work op before them.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from whatif.core.dtypes import element_bytes
from whatif.core.kernels import KernelClass, classify_kernel, param_args, weight_arg
from whatif.depgraph.hierarchy import CpuHierarchy, autograd_nodes, build_hierarchy, inherit, record_steps
from whatif.tracer.args import Arg, int_values
from whatif.tracer.kinds import EventKind
from whatif.tracer.memory import BEFORE_THE_RECORDING, BlockScaling, RecordEdit, gpu_block_bytes, scaled_edit
from whatif.tracer.trace import Trace

from ..optimizations.batch_memory import BlockRole, BlockRoles, backward_events
from .layers import sequence_rows
from .sharding import Role

ROLES = list(Role)


def positions(mask: np.ndarray) -> np.ndarray:
    """Each position where ``mask`` holds, -1 elsewhere (what :func:`inherit` passes down).

    >>> positions(np.array([True, False, True])).tolist()
    [0, -1, 2]
    """
    return np.where(mask, np.arange(len(mask)), -1)


def outermost(mask: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Per position of a hierarchy: ``mask`` holds there and at none of its ancestors.

    >>> outermost(np.array([True, True, False, True]), np.array([-1, 0, -1, 2])).tolist()
    [True, False, False, True]
    """
    above = inherit(positions(mask), parent)
    return mask & (np.where(parent >= 0, above[np.maximum(parent, 0)], -1) < 0)


def _work_classes(names: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per CPU op row: its :class:`KernelClass` value read from its name, ``other`` where it does no work."""
    distinct = pd.unique(names[rows])
    by_name = {n: classify_kernel(n, n).value for n in distinct}
    return np.asarray([by_name[n] for n in names[rows]], dtype=object)


@dataclass(frozen=True)
class ForwardOps:
    """The forward of a trace, per position of ``hierarchy.rows`` (module docstring).

    Per position: ``forward`` (a forward CPU op, not an autograd node), ``work`` (the work
    op it is or lies inside of; for a loose op the work op before it; -1), ``loose``, ``role``
    (the :class:`Role` index of its work op; -1 outside every block), ``block`` (its work op's
    block in its sequence, or the last block before it; -1 before the first), ``blocks`` (blocks
    in its work op's sequence; 0 none), ``before`` / ``after`` (of a work op: the work op before /
    after it in its sequence; -1 none) and ``made_by`` (of an op inside an autograd node: the
    first forward op with the node's sequence number; -1). ``sequences``: each rank's and step's
    work ops in the order they ran, keyed ``(rank, step)``."""

    hierarchy: CpuHierarchy
    forward: np.ndarray
    work: np.ndarray
    loose: np.ndarray
    role: np.ndarray
    block: np.ndarray
    blocks: np.ndarray
    before: np.ndarray
    after: np.ndarray
    made_by: np.ndarray
    sequences: dict[tuple[int, int], np.ndarray]

    def producer(self, pos: np.ndarray) -> np.ndarray:
        """Per position in ``pos``: the work op that made its input (-1 unknown): the work op
        before it, or a loose op's own work op."""
        w = self.work[pos]
        return np.where(w < 0, -1, np.where(self.loose[pos], w, self.before[np.maximum(w, 0)]))

    def consumer(self, pos: np.ndarray) -> np.ndarray:
        """Per position in ``pos``: the work op that takes its output (-1 unknown): the work op
        after its own (a loose op's too)."""
        w = self.work[pos]
        return np.where(w < 0, -1, self.after[np.maximum(w, 0)])


def forward_ops(trace: Trace) -> ForwardOps:
    """The :class:`ForwardOps` of ``trace`` (module docstring)."""
    ev = trace.events
    hierarchy = build_hierarchy(ev)
    rows = hierarchy.rows
    n = len(rows)
    if not n:
        empty = np.zeros(0, dtype=np.int64)
        return ForwardOps(hierarchy, np.zeros(0, dtype=bool), empty, np.zeros(0, dtype=bool), empty, empty, empty,
                          empty, empty, empty, {})
    steps = record_steps(ev, ev)
    backward = backward_events(ev, steps=steps)
    names = ev["name"].astype(str).to_numpy()
    kinds = ev["kind"].to_numpy()[rows]
    nodes = np.isin(rows, autograd_nodes(ev))
    forward = (kinds == int(EventKind.CPU_OP)) & ~nodes & ~backward[rows]
    cls = np.where(forward, _work_classes(names, rows), KernelClass.OTHER.value)
    outer = np.flatnonzero(outermost(cls != KernelClass.OTHER.value, hierarchy.parent))
    ts = ev["ts_ns"].to_numpy()[rows]
    rank = ev["rank"].to_numpy()[rows]
    pos_steps = steps[rows]
    pos_names = names[rows]
    layers = np.full(n, None, dtype=object)
    role = np.full(n, -1, dtype=np.int64)
    block = np.full(n, -1, dtype=np.int64)
    blocks = np.zeros(n, dtype=np.int64)
    before = np.full(n, -1, dtype=np.int64)
    after = np.full(n, -1, dtype=np.int64)
    sequences: dict[tuple[int, int], np.ndarray] = {}
    frame = pd.DataFrame({"pos": outer, "rank": rank[outer], "step": pos_steps[outer], "ts": ts[outer]})
    for (r, s), seq in frame.groupby(["rank", "step"], sort=True):
        k = seq.sort_values(["ts", "pos"], kind="stable")["pos"].to_numpy()
        found: list[tuple[int, int, int, str, str]] = []
        count = sequence_rows(found, k, int(r), 0, cls, pos_names, pos_names, layers)
        for pos, _, b, _, value in found:
            role[pos] = ROLES.index(Role(value))
            block[pos] = b
        block[k] = np.maximum.accumulate(block[k])
        blocks[k] = count
        before[k[1:]], after[k[:-1]] = k[:-1], k[1:]
        sequences[(int(r), int(s))] = k
    work = inherit(positions(np.isin(np.arange(n), outer)), hierarchy.parent)
    loose = forward & (work < 0)
    at = np.flatnonzero(loose)
    for (r, s), group in pd.DataFrame({"pos": at, "rank": rank[at], "step": pos_steps[at]}).groupby(
            ["rank", "step"], sort=False):
        k = sequences.get((int(r), int(s)))
        if k is None:
            continue
        mine = group["pos"].to_numpy()
        prior = np.searchsorted(ts[k], ts[mine], side="right") - 1
        work[mine[prior >= 0]] = k[prior[prior >= 0]]
    loose &= work >= 0
    inside = np.maximum(work, 0)
    role = np.where(work >= 0, role[inside], -1)
    block = np.where(work >= 0, block[inside], -1)
    blocks = np.where(work >= 0, blocks[inside], 0)
    return ForwardOps(hierarchy, forward, work, loose, role, block, blocks, before, after,
                      _made_by(trace, hierarchy, backward, nodes), sequences)


def _made_by(trace: Trace, hierarchy: CpuHierarchy, backward: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """Per position: inside an autograd node, the first forward op with its rank and sequence number."""
    rows = hierarchy.rows
    seq = int_values(trace.arg(Arg.SEQUENCE_NUMBER), rows)
    ranks = trace.events["rank"].to_numpy()[rows]
    by_seq: dict[tuple[int, int], int] = {}
    for pos in np.flatnonzero(~backward[rows] & (seq >= 0)).tolist():
        by_seq.setdefault((int(ranks[pos]), int(seq[pos])), pos)
    made = np.full(len(rows), -1, dtype=np.int64)
    for pos in np.flatnonzero(nodes & (seq >= 0)).tolist():
        made[pos] = by_seq.get((int(ranks[pos]), int(seq[pos])), -1)
    node_at = inherit(positions(nodes), hierarchy.parent)
    return np.where(node_at >= 0, made[np.maximum(node_at, 0)], -1)


PARAMETER_BYTES = 4
"""Bytes an element of a parameter's master copy, gradient and optimizer state are taken to hold (fp32)."""


@dataclass(frozen=True)
class ParameterUses:
    """Each parameter a forward op is given (of nested ops given parameters, the outermost), one
    entry per use: the op's position, the parameter's elements, the bytes an element of its
    recorded type holds (:data:`PARAMETER_BYTES` when not recorded) and whether it is the op's weight."""

    pos: np.ndarray
    numel: np.ndarray
    recorded_bytes: np.ndarray
    weight: np.ndarray


def parameter_uses(trace: Trace, ops: ForwardOps) -> ParameterUses:
    """The :class:`ParameterUses` of ``trace``'s forward ops (parameters of more than one element)."""
    ev = trace.events
    names = ev["name"].astype(str).to_numpy()
    dims, types = trace.arg(Arg.INPUT_DIMS), trace.arg(Arg.INPUT_TYPES)
    rows = ops.hierarchy.rows
    given = np.asarray([bool(f) and bool(param_args(str(names[r]), dims[r])) for f, r in zip(ops.forward, rows)],
                       dtype=bool)
    out: list[tuple[int, int, int, bool]] = []
    for pos in np.flatnonzero(outermost(given, ops.hierarchy.parent)).tolist():
        r = int(rows[pos])
        name, d = str(names[r]), dims[r]
        kinds = types[r] if isinstance(types[r], (list, tuple)) else ()
        w = weight_arg(name, d)
        for i in param_args(name, d):
            numel = int(np.prod(d[i], dtype=np.int64))
            if numel > 1:
                out.append((pos, numel, int(element_bytes(kinds[i] if i < len(kinds) else None) or PARAMETER_BYTES),
                            i == w))
    table = np.asarray(out, dtype=np.int64).reshape(-1, 4)
    return ParameterUses(table[:, 0], table[:, 1], table[:, 2], table[:, 3].astype(bool))


@dataclass(frozen=True)
class LastingShares:
    """The share of a block made to last (a parameter, its gradient, optimizer state) by its
    bytes, on the CPU and on a GPU (sizes rounded up to :data:`GPU_BLOCK_BYTES`), and the
    parameters' share by elements (``before``: what was allocated before the recording)."""

    cpu: dict[int, float]
    gpu: dict[int, float]
    before: float

    def of(self, sizes: np.ndarray, on_gpu: np.ndarray) -> np.ndarray:
        """Per block (its bytes, whether on a GPU): its share, 1 where no parameter has its bytes."""
        return np.asarray([(self.gpu if g else self.cpu).get(int(b), 1.0) for b, g in zip(sizes, on_gpu)], dtype=float)


def lasting_shares(uses: ParameterUses, share: np.ndarray) -> LastingShares:
    """The :class:`LastingShares` when each use's parameter is held at ``share`` (aligned with
    ``uses``). A parameter's blocks hold :data:`PARAMETER_BYTES` an element (fp32 weights,
    gradients, optimizer state) or its recorded type's (a bf16 copy under autocast); a block
    whose bytes several parameters have takes their mean share, each counted as often as the
    forward uses it.

    >>> uses = ParameterUses(np.array([0, 1]), np.array([1024, 1024]), np.array([4, 4]), np.array([True, True]))
    >>> s = lasting_shares(uses, np.array([0.5, 1.0]))
    >>> s.cpu[4096], s.before
    (0.75, 0.75)
    """
    cpu: dict[int, list[float]] = {}
    gpu: dict[int, list[float]] = {}
    held = total = 0.0
    for numel, recorded, part in zip(uses.numel.tolist(), uses.recorded_bytes.tolist(), share.tolist()):
        for e in sorted({PARAMETER_BYTES, recorded}):
            for table, nbytes in ((cpu, numel * e), (gpu, gpu_block_bytes(numel * e))):
                acc = table.setdefault(nbytes, [0.0, 0.0])
                acc[0] += part
                acc[1] += 1
        held += part * numel
        total += numel
    return LastingShares({b: s / n for b, (s, n) in cpu.items()}, {b: s / n for b, (s, n) in gpu.items()},
                         held / total if total else 1.0)


def shares_edit(trace: Trace, roles: BlockRoles, scaling: BlockScaling, head: str, tail: str = "") -> RecordEdit:
    """The records of a parallel rank's ``scaling`` (factors aligned with ``roles.rows``:
    :func:`~whatif.tracer.memory.scaled_edit`) and its line: ``head``, the activation and other
    MiB it allocates less of, ``tail``, and the share kept of what was allocated before the
    recording when there was some."""
    sizes = trace.memory["bytes"].to_numpy()[roles.rows]
    activation = roles.mask(BlockRole.ACTIVATION)
    less = sizes * (1 - scaling.factors)
    what = (f"{head}{less[activation].sum() / 2**20:,.1f} MiB fewer activation bytes allocated, "
            f"{less[~activation].sum() / 2**20:,.1f} MiB fewer parameter, gradient and optimizer-state bytes{tail}")
    edit = scaled_edit(trace.memory, scaling, what)
    if (edit.added["op"] == BEFORE_THE_RECORDING).any():
        what += f"; what was allocated before the recording, taken as parameters, at {scaling.before:.1%} of its bytes"
    return replace(edit, what=what)
