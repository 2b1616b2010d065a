"""Two traces' CPU op trees aligned, so GPU time compares op by op across vendors.

Every GPU activity belongs to the CPU call that launched it and so to that call's enclosing
operators: aten ops (with their input shapes), ``nn.Module`` frames, annotations and the
``ProfilerStep`` window. :func:`op_tree` keeps those nodes (pruned to the ones with GPU work below
them, children in program order) and :func:`align_ops` matches the two trees top-down, as a
diff of call trees: under each matched pair of parents the ordered children are aligned by
(kind, name, input shapes), then the matched children are aligned the same way. Kernel names
play no part, so an H100 trace (cuBLAS ``sm90_xmma_gemm…``) aligns with an MI300X trace
(hipBLASLt ``Cijk_…``) of the same program.

An op whose lowering differs by vendor (``aten::scaled_dot_product_attention`` calling
``aten::_scaled_dot_product_flash_attention`` on one, ``…_efficient_attention`` on the other)
leaves those children unmatched; their kernels count for the deepest matched op above them, the
lowest common node of TraceLens's TraceDiff. A kernel launched right under a matched module,
annotation or step (no op between: Triton kernels recorded into a CUDA graph) is matched work of
that node. Any other kernel (below nodes that exist on one side only, or with no launch call in
the file) is one-sided work, reported under the topmost unmatched node that holds it. Names
compare without step numbers and without the hashes that name compiled graphs.
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from difflib import SequenceMatcher
from enum import IntEnum

import numpy as np
import pandas as pd

from whatif.analysis import Analysis
from whatif.core.kernels import KernelClass, classify_kernel
from whatif.depgraph.graph import EdgeKind
from whatif.depgraph.hierarchy import build_hierarchy
from whatif.summary import GPU_KINDS
from whatif.tracer.args import Arg
from whatif.tracer.kinds import EventKind
from whatif.tracer.kineto import step_number

MODULE_PREFIX = "nn.Module: "
STEP_KEY = "ProfilerStep#*"
NO_OP = "(no CPU op)"
HASH = re.compile(r"\b(?=[0-9a-z]*[0-9])(?=[0-9a-z]*[a-z])[0-9a-z]{20,}\b")


class NodeKind(IntEnum):
    OP = 0          # aten / framework operator
    MODULE = 1      # nn.Module python frame
    ANNOTATION = 2  # record_function / user annotation
    STEP = 3        # ProfilerStep#N window (aligned whatever its N)


@dataclass(frozen=True)
class GpuRows:
    """The GPU work of the steps that count (the whole trace without step markers), one entry
    per activity: its graph task, measured time and kernel class; ``steps`` divides to per step."""

    task: np.ndarray
    ns: np.ndarray
    kernel_class: list[KernelClass]
    steps: int


def counted_rows(a: Analysis) -> np.ndarray:
    """Which rows of ``a.steps`` a comparison counts: the included ones (warm-up and partial steps
    left out unless ``a.options`` says), every step when none is."""
    inc = a.steps["included"].to_numpy(dtype=bool)
    return inc if inc.any() else np.ones(len(inc), dtype=bool)


def counted_gpu_tasks(a: Analysis) -> tuple[pd.DataFrame, int]:
    """Rows of ``a.graph.tasks`` for the measured GPU work attributed to a step that counts (all
    of it when no such work exists), and how many steps that is (at least 1)."""
    t = a.graph.tasks
    gpu = t[t["kind"].isin(GPU_KINDS) & (t["measured_start_ns"] >= 0)]
    keep = a.steps[counted_rows(a)]
    keys = set(zip(keep["rank"].tolist(), keep["step"].tolist()))
    in_steps = gpu[[k in keys for k in zip(gpu["rank"].tolist(), gpu["step"].tolist())]]
    return (in_steps if len(in_steps) else gpu), max(len(keys), 1)


def _gpu_rows(a: Analysis) -> GpuRows:
    sel, steps = counted_gpu_tasks(a)
    names = sel["name"].astype(str)
    cls = {n: classify_kernel(n) for n in sorted(set(names))}
    return GpuRows(task=sel.index.to_numpy(dtype=np.int64),
                   ns=(sel["measured_end_ns"] - sel["measured_start_ns"]).to_numpy(dtype=np.int64),
                   kernel_class=[cls[n] for n in names], steps=steps)


@dataclass(frozen=True)
class OpTree:
    """The CPU nodes that hold GPU work, parents before children (node index order).

    ``roots``: per rank, the top-level nodes of its threads (:func:`_by_thread`); ``gpu_node``: per
    entry of ``gpu``, the innermost node above its launch call, -1 when none (no launch call, or
    a call outside every operator)."""

    kind: np.ndarray
    name: list[str]
    shapes: list[str]
    parent: np.ndarray
    children: list[list[int]]
    roots: dict[int, list[int]]
    gpu: GpuRows
    gpu_node: np.ndarray

    def label(self, node: int) -> str:
        """The node's name as the two traces compare it (:func:`label`)."""
        return label(NodeKind(int(self.kind[node])), self.name[node])

    def keys(self) -> list[tuple[int, str, str]]:
        """Per node, what must be equal for two nodes to match: kind, label, input shapes."""
        kinds = list(NodeKind)
        return [(k, label(kinds[k], n), s) for k, n, s in zip(self.kind.tolist(), self.name, self.shapes)]


def label(kind: NodeKind, name: str) -> str:
    """A node's name without what differs between two runs of one program: the step number, and
    in annotations the hashes that name compiled graphs.

    >>> label(NodeKind.STEP, "ProfilerStep#7")
    'ProfilerStep#*'
    >>> label(NodeKind.ANNOTATION, "## Call CompiledFxGraph fvjmd63htmfdi5w7aufk2x5kqz7y6tcoyia5 ##")
    '## Call CompiledFxGraph * ##'
    """
    if kind == NodeKind.STEP:
        return STEP_KEY
    return HASH.sub("*", name) if kind == NodeKind.ANNOTATION else name


def _launchers(a: Analysis, tasks: np.ndarray) -> np.ndarray:
    """Per GPU task, the event row of the call that launched it, -1."""
    e = a.graph.edges
    launch = e[e["kind"] == int(EdgeKind.LAUNCH)].drop_duplicates("dst")
    call = pd.Series(launch["src"].to_numpy(), index=launch["dst"].to_numpy()).reindex(tasks)
    has = call.notna().to_numpy()
    rows = np.full(len(tasks), -1, dtype=np.int64)
    rows[has] = a.graph.tasks["event"].to_numpy()[call.to_numpy()[has].astype(np.int64)]
    return rows


def _shape_text(dims: object) -> str:
    return str(dims) if isinstance(dims, list) else ""


def _by_thread(nodes: list[int], ts: list[int], thread: list[tuple[int, int]]) -> list[int]:
    """Top-level nodes thread after thread (threads in the order they first launch GPU work,
    ids differ between runs), each thread's in start order: timing does not interleave them.

    >>> _by_thread([0, 1, 2, 3], [10, 5, 20, 30], [(1, 1), (1, 2), (1, 1), (1, 2)])
    [1, 3, 0, 2]
    """
    first: dict[tuple[int, int], tuple[int, int]] = {}
    for u in nodes:
        first[thread[u]] = min(first.get(thread[u], (ts[u], u)), (ts[u], u))
    order = {u: (first[thread[u]], ts[u], u) for u in nodes}
    return sorted(nodes, key=order.__getitem__)


def op_tree(a: Analysis) -> OpTree:
    """The op tree of one analyzed trace (see the module docstring)."""
    events = a.trace.events
    hier = build_hierarchy(events)
    rows = hier.rows
    kinds = events["kind"].to_numpy()[rows]
    names = np.asarray(events["name"].cat.categories.astype(str), dtype=object)[
        events["name"].cat.codes.to_numpy()[rows]]
    is_module = np.fromiter((n.startswith(MODULE_PREFIX) for n in names), dtype=bool, count=len(rows))
    keep = ((kinds == int(EventKind.CPU_OP)) | (kinds == int(EventKind.ANNOTATION))
            | ((kinds == int(EventKind.PYTHON)) & is_module))
    parent = hier.parent.tolist()
    kept_above = [-1] * len(rows)  # nearest kept strict ancestor (hierarchy rows are parents first)
    for i, p in enumerate(parent):
        if p >= 0:
            kept_above[i] = p if keep[p] else kept_above[p]

    gpu = _gpu_rows(a)
    pos_of_row = np.full(len(events), -1, dtype=np.int64)
    pos_of_row[rows] = np.arange(len(rows))

    def holders(tasks: np.ndarray) -> list[int]:
        call_rows = _launchers(a, tasks)
        call_pos = np.where(call_rows >= 0, pos_of_row[np.maximum(call_rows, 0)], -1)
        return [-1 if c < 0 else (c if keep[c] else kept_above[c]) for c in call_pos.tolist()]

    # the tree holds the nodes above all GPU work, counted steps or not, so a step boundary that
    # falls differently in the two traces does not change their trees
    t = a.graph.tasks
    used = np.zeros(len(rows), dtype=bool)
    for p in holders(t.index.to_numpy()[t["kind"].isin(GPU_KINDS).to_numpy()]):
        while p >= 0 and not used[p]:
            used[p] = True
            p = kept_above[p]
    gpu_pos = holders(gpu.task)
    pos = np.flatnonzero(used)
    node_of_pos = np.full(len(rows), -1, dtype=np.int64)
    node_of_pos[pos] = np.arange(len(pos))
    node_parent = np.asarray([node_of_pos[kept_above[p]] if kept_above[p] >= 0 else -1 for p in pos.tolist()],
                             dtype=np.int64)
    node_kind = np.select(
        [kinds[pos] == int(EventKind.CPU_OP), kinds[pos] == int(EventKind.PYTHON)],
        [int(NodeKind.OP), int(NodeKind.MODULE)], int(NodeKind.ANNOTATION)).astype(np.int8)
    node_name = [str(n) for n in names[pos]]
    is_step = np.asarray([step_number(n) is not None for n in node_name], dtype=bool)
    node_kind[is_step & (node_kind == int(NodeKind.ANNOTATION))] = int(NodeKind.STEP)
    dims = a.trace.arg(Arg.INPUT_DIMS)
    node_shapes = [_shape_text(dims[r]) if k == int(NodeKind.OP) else ""
                   for r, k in zip(rows[pos].tolist(), node_kind.tolist())]

    children: list[list[int]] = [[] for _ in range(len(pos))]
    top: dict[int, list[int]] = defaultdict(list)
    ranks = events["rank"].to_numpy()[rows[pos]]
    ts = events["ts_ns"].to_numpy()[rows[pos]].tolist()
    thread = list(zip(events["pid"].to_numpy()[rows[pos]].tolist(), events["tid"].to_numpy()[rows[pos]].tolist()))
    for u, p in enumerate(node_parent.tolist()):
        (children[p] if p >= 0 else top[int(ranks[u])]).append(u)
    roots = {r: _by_thread(us, ts, thread) for r, us in sorted(top.items())}
    gpu_node = np.asarray([node_of_pos[p] if p >= 0 else -1 for p in gpu_pos], dtype=np.int64)
    return OpTree(kind=node_kind, name=node_name, shapes=node_shapes, parent=node_parent, children=children,
                  roots=roots, gpu=gpu, gpu_node=gpu_node)


def match_nodes(before: OpTree, after: OpTree) -> np.ndarray:
    """Per node of ``before``, its matched node of ``after`` (-1: only in ``before``). Ranks pair
    in order; under matched parents, children pair along the longest matching blocks of their
    ordered keys (:class:`difflib.SequenceMatcher`, no junk heuristic).

    A tree matches itself node for node:

    >>> t = OpTree(kind=np.array([3, 0, 0]), name=["ProfilerStep#1", "aten::mm", "aten::relu"],
    ...            shapes=["", "[[2, 2]]", "[[2, 2]]"], parent=np.array([-1, 0, 0]), children=[[1, 2], [], []],
    ...            roots={0: [0]}, gpu=GpuRows(np.zeros(0), np.zeros(0), [], 1), gpu_node=np.zeros(0))
    >>> match_nodes(t, t).tolist()
    [0, 1, 2]
    """
    match = np.full(len(before.name), -1, dtype=np.int64)
    ids: dict[tuple[int, str, str], int] = {}
    key_a = [ids.setdefault(k, len(ids)) for k in before.keys()]
    key_b = [ids.setdefault(k, len(ids)) for k in after.keys()]
    stack = [(before.roots[ra], after.roots[rb]) for ra, rb in zip(before.roots, after.roots)]
    while stack:
        ca, cb = stack.pop()
        sm = SequenceMatcher(None, [key_a[u] for u in ca], [key_b[u] for u in cb], autojunk=False)
        for i, j, size in sm.get_matching_blocks():
            for k in range(size):
                u, v = ca[i + k], cb[j + k]
                match[u] = v
                stack.append((before.children[u], after.children[v]))
    return match


@dataclass(frozen=True)
class OpSide:
    """One side of an op group: instances per step, GPU time per step, and that time by kernel class."""

    count: float
    ns: float
    classes: dict[KernelClass, float]


@dataclass(frozen=True)
class MatchedOp:
    """Matched nodes of one (kind, name, input shapes), over all their instances: aten ops, and
    modules, annotations or steps for the GPU work launched right under them (no op between)."""

    kind: NodeKind
    name: str
    shapes: str
    before: OpSide
    after: OpSide


@dataclass(frozen=True)
class OneSidedOp:
    """GPU work with no matched op above it, by the topmost unmatched node holding it;
    ``under``: the deepest matched node above that (a module, an annotation, a step), if any."""

    name: str
    shapes: str
    under: str | None
    side: OpSide


@dataclass(frozen=True)
class OpAlignment:
    """GPU time per step of both traces split into matched and one-sided work. Each side's
    matched plus one-sided time is its total: ``total_ns``; ``matched_op_ns``: the part of
    ``matched_ns`` under a matched aten op (the rest is launched right under a matched module,
    annotation or step); ``ops``: how many aten ops hold GPU work on each side (whole trace),
    ``ops_matched``: how many of them were matched."""

    matched: list[MatchedOp]
    only_before: list[OneSidedOp]
    only_after: list[OneSidedOp]
    total_ns: tuple[float, float]
    matched_ns: tuple[float, float]
    matched_op_ns: tuple[float, float]
    ops: tuple[int, int]
    ops_matched: int


def _anchors(tree: OpTree, matched: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per node: the deepest matched node at or above it, and the topmost unmatched node on the
    way up to that (-1 when the node is matched)."""
    n = len(tree.name)
    anchor = np.full(n, -1, dtype=np.int64)
    top = np.full(n, -1, dtype=np.int64)
    for u, p in enumerate(tree.parent.tolist()):
        if matched[u]:
            anchor[u] = u
        else:
            anchor[u] = anchor[p] if p >= 0 else -1
            top[u] = u if p < 0 or matched[p] else top[p]
    return anchor, top


@dataclass
class _Acc:
    instances: set[int]
    ns: int
    classes: dict[KernelClass, int]

    def add(self, instance: int, ns: int, cls: KernelClass) -> None:
        self.instances.add(instance)
        self.ns += ns
        self.classes[cls] = self.classes.get(cls, 0) + ns

    def side(self, steps: int, count: int | None = None) -> OpSide:
        return OpSide(count=(len(self.instances) if count is None else count) / steps, ns=self.ns / steps,
                      classes={c: v / steps for c, v in sorted(self.classes.items(), key=lambda kv: kv[0].value)})


def _new() -> _Acc:
    return _Acc(set(), 0, {})


_Group = tuple[int, str, str]  # kind, label, shapes


def _split(tree: OpTree, matched: np.ndarray, pair_of: np.ndarray
           ) -> tuple[dict[_Group, _Acc], dict[tuple[str, str, str | None], _Acc]]:
    """Each GPU entry of ``tree`` into its matched group (keyed by kind, label and shapes;
    instances are pair ids ``pair_of[node]``) or its one-sided group. An entry is matched when
    the deepest matched node above it is an aten op, or when its own node is matched."""
    anchor, top = _anchors(tree, matched)
    kinds, op = tree.kind.tolist(), int(NodeKind.OP)
    on_node: dict[_Group, _Acc] = defaultdict(_new)
    alone: dict[tuple[str, str, str | None], _Acc] = defaultdict(_new)
    for i, (node, ns, cls) in enumerate(zip(tree.gpu_node.tolist(), tree.gpu.ns.tolist(), tree.gpu.kernel_class)):
        if node < 0:  # counted per activity
            alone[(NO_OP, "", None)].add(-1 - i, ns, cls)
            continue
        an = int(anchor[node])
        if an >= 0 and (kinds[an] == op or an == node):
            on_node[(kinds[an], tree.label(an), tree.shapes[an])].add(int(pair_of[an]), ns, cls)
            continue
        holder = int(top[node])
        under = tree.label(an) if an >= 0 else None
        alone[(tree.label(holder), tree.shapes[holder], under)].add(holder, ns, cls)
    return on_node, alone


def align_ops(before: Analysis, after: Analysis) -> OpAlignment:
    """Match the op trees of ``before`` and ``after`` and split each side's GPU time per step
    (of the steps that count) into matched ops and one-sided work."""
    a, b = op_tree(before), op_tree(after)
    match = match_nodes(a, b)
    matched_a = match >= 0
    matched_b = np.zeros(len(b.name), dtype=bool)
    matched_b[match[matched_a]] = True
    pair_a = np.arange(len(a.name), dtype=np.int64)  # a pair's id: its before node
    pair_b = np.full(len(b.name), -1, dtype=np.int64)
    pair_b[match[matched_a]] = np.flatnonzero(matched_a)
    op_a, alone_a = _split(a, matched_a, pair_a)
    op_b, alone_b = _split(b, matched_b, pair_b)
    matched = []
    for group in sorted(set(op_a) | set(op_b)):
        sa, sb = op_a.get(group, _new()), op_b.get(group, _new())
        pairs = len(sa.instances | sb.instances)
        matched.append(MatchedOp(kind=NodeKind(group[0]), name=group[1], shapes=group[2],
                                 before=sa.side(a.gpu.steps, pairs), after=sb.side(b.gpu.steps, pairs)))
    matched.sort(key=lambda m: (-max(m.before.ns, m.after.ns), m.kind, m.name, m.shapes))

    def one_sided(groups: dict[tuple[str, str, str | None], _Acc], steps: int) -> list[OneSidedOp]:
        out = [OneSidedOp(name=n, shapes=s, under=u, side=acc.side(steps)) for (n, s, u), acc in groups.items()]
        return sorted(out, key=lambda o: (-o.side.ns, o.name, o.shapes, o.under or ""))

    is_op_a, is_op_b = a.kind == NodeKind.OP, b.kind == NodeKind.OP
    return OpAlignment(
        matched=matched, only_before=one_sided(alone_a, a.gpu.steps), only_after=one_sided(alone_b, b.gpu.steps),
        total_ns=(float(a.gpu.ns.sum()) / a.gpu.steps, float(b.gpu.ns.sum()) / b.gpu.steps),
        matched_ns=(sum(acc.ns for acc in op_a.values()) / a.gpu.steps,
                    sum(acc.ns for acc in op_b.values()) / b.gpu.steps),
        matched_op_ns=(sum(acc.ns for g, acc in op_a.items() if g[0] == NodeKind.OP) / a.gpu.steps,
                       sum(acc.ns for g, acc in op_b.items() if g[0] == NodeKind.OP) / b.gpu.steps),
        ops=(int(is_op_a.sum()), int(is_op_b.sum())), ops_matched=int((matched_a & is_op_a).sum()))
