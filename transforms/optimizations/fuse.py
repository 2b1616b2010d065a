"""``fuse``: fuse chains of memory-bound kernels into one kernel each (torch.compile/Inductor-style
vertical fusion; MetaFlow, TASO and dPRO search the same rewrite).

**Which kernels.** A chain is a run of kernels that follow each other on one stream, were launched
by consecutive launch calls of one thread (no other launch, synchronization or cross-thread
dependency on that thread in between; or by the same graph launch), belong to one step, and whose
intermediate results feed only the next kernel (a member other than the first has no dependency
but its stream predecessor and its launch; a member other than the last has no dependent but its
stream successor). By default the members are memory-bound (``elementwise``, ``normalization``,
``reduction`` kernel classes: activations, residual adds, norms, softmax) and a chain is cut into
pieces of at most ``max_chain`` and kept from ``min_chain`` kernels on; ``pattern`` instead names
the consecutive kernels (one regex per kernel name, matched left to right, without overlap).

**Fused time** (Daydream's "Scale" of a fused op, priced with the trace's own calibrated roofline):

    T_fused = t0 + U / BW,   clipped to  max_i T_i <= T_fused <= sum_i T_i

* ``t0`` = :func:`~whatif.hardware.roofline.fixed_latency_ns` of the recorded GPU (its
  achievable launch figure, 2 us without one): the one fixed launch-to-retire latency a kernel
  pays whatever its size (the same one every cost model subtracts before scaling).
* ``BW`` = ``ctx.cost.memory_bandwidth_bytes_per_s``: the median achieved DRAM bandwidth of the
  trace's memory-bound kernels (the device's achievable streaming bandwidth when too few).
* ``U``, the unique DRAM bytes the fused kernel moves: it reads the chain's external inputs once
  and writes its final output once; intermediates are neither written nor re-read. With ``b_i``
  the bytes of member i (``ctx.cost.kernel_facts``: from recorded shapes, else duration x BW),
  an elementwise kernel over tensors of size S reading k inputs moves b = (k + 1) S, so each link
  i -> i+1 saves 2 S_i (one write, one read) with

      S_i = min(b_i / w_i, b_{i+1} / r_{i+1})

  ``w`` = 3 for elementwise (binary op: 2 reads + 1 write; exact for binary chains, conservative
  for unary ones), 2 for normalization/copy (1 read + 1 write), infinite for a reduction (its
  output is small: S = 0); ``r`` = 2 for a consumer that writes a same-size output, 1 for a
  reduction. A link touching a compute-bound member (``pattern`` mode: GEMM epilogues) saves only
  S_i, and a compute-bound member keeps its busy time. Then

      U = max(sum_i b_i - sum_links saving_i,  max_i b_i,  max_i (T_i - t0) BW)

  so the fused kernel is never faster than its slowest member's memory traffic, and never slower
  than running the members back to back.

One launch replaces many (``edit.fuse`` with ``drop_launches``): the other members' launch calls
leave the CPU thread; the CPU gaps (Python work between ops) stay, as Daydream's Remove keeps them.

Sources: Daydream (Zhu et al., USENIX ATC 2020) for the graph rewrite and Scale/Remove semantics;
kernel fusion as in MetaFlow (Jia et al., MLSys 2019), TASO (Jia et al., SOSP 2019) and dPRO
(Hu et al., MLSys 2022), where a fused memory-bound op costs its unique bytes at memory bandwidth.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from whatif.core.kernels import KernelClass
from whatif.depgraph.graph import EdgeKind, TaskGraph, TaskKind
from whatif.hardware.devices import find_device
from whatif.hardware.roofline import fixed_latency_ns

from ..base import Transform, TransformContext, TransformError
from ..edit import fuse as fuse_tasks
from ..needs import Need
from ..registry import register
from ..select import Selector, kernel_classes

CHAIN_CLASSES = (KernelClass.ELEMENTWISE.value, KernelClass.NORMALIZATION.value, KernelClass.REDUCTION.value)
COMPUTE_CLASSES = (KernelClass.GEMM.value, KernelClass.CONV.value, KernelClass.ATTENTION.value)
# bytes of a kernel per byte of its output tensor (w), and per byte of an input it consumes (r)
_WRITE_RATIO = {KernelClass.ELEMENTWISE.value: 3.0, KernelClass.NORMALIZATION.value: 2.0,
                KernelClass.COPY.value: 2.0, KernelClass.MEMSET.value: np.inf, KernelClass.REDUCTION.value: np.inf}
_READ_RATIO = {KernelClass.REDUCTION.value: 1.0}


def order_position(graph: TaskGraph, kinds: tuple[int, ...]) -> np.ndarray:
    """Per task: its position along its thread/stream chain (edges of ``kinds``), 0 for the first.
    Pointer doubling: O(log chain length) vectorized passes."""
    n = len(graph.tasks)
    e = graph.edges
    sel = e["kind"].isin(kinds).to_numpy()
    anc = np.full(n, -1, dtype=np.int64)
    anc[e["dst"].to_numpy()[sel]] = e["src"].to_numpy()[sel]
    dist = (anc >= 0).astype(np.int64)
    act = np.flatnonzero(anc >= 0)
    while len(act):
        a = anc[act]
        dist[act] += dist[a]
        anc[act] = anc[a]
        act = act[anc[act] >= 0]
    return dist


def name_mask(names: pd.Series, pattern: str) -> np.ndarray:
    """Per row: whether ``pattern`` (a regex) is found in the name; one search per distinct name."""
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise TransformError(f"bad pattern {pattern!r}: {exc}") from None
    if isinstance(names.dtype, pd.CategoricalDtype):
        codes, uniques = names.cat.codes.to_numpy(), names.cat.categories
    else:
        codes, uniques = pd.factorize(names)
    hit = np.fromiter((bool(rx.search(str(c))) for c in uniques), dtype=bool, count=len(uniques))
    return np.where(codes >= 0, hit[np.maximum(codes, 0)], False)


def fusable_links(graph: TaskGraph) -> tuple[np.ndarray, np.ndarray]:
    """Per task: its stream successor (-1 if none) and whether the two may fuse (see the module
    docstring: same stream and step, consecutive launches, private intermediate)."""
    t, e = graph.tasks, graph.edges
    n = len(t)
    src, dst, ek = e["src"].to_numpy(), e["dst"].to_numpy(), e["kind"].to_numpy()
    kind, res, step = t["kind"].to_numpy(), t["resource"].to_numpy(), t["step"].to_numpy()
    stream = ek == int(EdgeKind.STREAM)
    succ = np.full(n, -1, dtype=np.int64)
    succ[src[stream]] = dst[stream]
    launch = ek == int(EdgeKind.LAUNCH)
    launcher = np.full(n, -1, dtype=np.int64)
    launcher[dst[launch]] = src[launch]
    n_launch_in = np.bincount(dst[launch], minlength=n)
    # Significant CPU tasks: launches, waits, markers, and anything with a non-thread dependency.
    sig = np.zeros(n, dtype=bool)
    sig[src[launch]] = True
    other = ~np.isin(ek, [int(EdgeKind.THREAD), int(EdgeKind.LAUNCH), int(EdgeKind.LAUNCH_QUEUE)])
    sig[dst[other]] = True
    sig[src[other]] = True
    sig |= np.isin(kind, [int(TaskKind.WAIT), int(TaskKind.MARKER)])
    cpu = np.isin(kind, [int(TaskKind.CPU_CALL), int(TaskKind.CPU_WORK), int(TaskKind.WAIT), int(TaskKind.MARKER)])
    sig &= cpu
    pos = order_position(graph, (int(EdgeKind.THREAD),))
    s_ids = np.flatnonzero(sig)
    s_ids = s_ids[np.lexsort((pos[s_ids], res[s_ids]))]
    next_sig = np.full(n, -1, dtype=np.int64)
    same = res[s_ids[1:]] == res[s_ids[:-1]]
    next_sig[s_ids[:-1][same]] = s_ids[1:][same]
    # A member's only dependency besides its stream predecessor is its launch, and its only
    # dependent is its stream successor.
    counted = ek != int(EdgeKind.LAUNCH_QUEUE)  # a full launch queue waits on any kernel, fused or not
    n_in = np.bincount(dst[counted], minlength=n)
    n_out = np.bincount(src[counted], minlength=n)
    k1 = np.flatnonzero((succ >= 0) & (kind == int(TaskKind.KERNEL)))
    k2 = succ[k1]
    l1, l2 = launcher[k1], launcher[k2]
    ok = ((kind[k2] == int(TaskKind.KERNEL)) & (step[k1] == step[k2]) & (l1 >= 0) & (l2 >= 0)
          & (n_launch_in[k1] == 1) & (n_launch_in[k2] == 1) & (n_out[k1] == 1) & (n_in[k2] == 2)
          & ((l1 == l2) | (next_sig[np.maximum(l1, 0)] == l2)))
    link = np.zeros(n, dtype=bool)
    link[k1[ok]] = True
    return succ, link


def chains(graph: TaskGraph, member: np.ndarray, min_chain: int, max_chain: int) -> tuple[np.ndarray, np.ndarray]:
    """Maximal runs of fusable ``member`` kernels, cut into pieces of at most ``max_chain``;
    returns (task ids in chain order, chain label per id) for pieces of ``min_chain`` or more."""
    succ, link = fusable_links(graph)
    n = len(member)
    link = link & member & member[np.maximum(succ, 0)] & (succ >= 0)
    pred = np.full(n, -1, dtype=np.int64)
    pred[succ[link]] = np.flatnonzero(link)
    inchain = member & ((pred >= 0) | link)
    # chain head and distance to it, by pointer doubling
    root = np.where(pred >= 0, pred, np.arange(n))
    dist = (pred >= 0).astype(np.int64)
    act = np.flatnonzero(pred >= 0)
    while len(act):
        r = root[act]
        dist[act] += dist[r]
        root[act] = root[r]
        act = act[root[root[act]] != root[act]]
    ids = np.flatnonzero(inchain)
    head = root[ids]
    piece = dist[ids] // max_chain
    order = np.lexsort((dist[ids], piece, head))
    ids, head, piece = ids[order], head[order], piece[order]
    key = head * (n // max(min_chain, 1) + 2) + piece
    _, label, size = np.unique(key, return_inverse=True, return_counts=True)
    keep = size[label] >= max(min_chain, 2)
    return ids[keep], label[keep]


def pattern_chains(graph: TaskGraph, member: np.ndarray, pattern: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Non-overlapping runs of fusable kernels whose names match ``pattern`` one by one."""
    succ, link = fusable_links(graph)
    names = graph.tasks["name"]
    start = np.flatnonzero(member & name_mask(names, pattern[0]))
    runs = [start]
    cur = start
    for rx in pattern[1:]:
        ok = (cur >= 0) & link[np.maximum(cur, 0)]
        nxt = np.where(ok, succ[np.maximum(cur, 0)], -1)
        good = (nxt >= 0) & member[np.maximum(nxt, 0)] & name_mask(names, rx)[np.maximum(nxt, 0)]
        cur = np.where(good, nxt, -1)
        runs.append(cur)
    mat = np.stack(runs, axis=1) if len(start) else np.empty((0, len(pattern)), dtype=np.int64)
    mat = mat[(mat >= 0).all(axis=1)]
    used = np.zeros(len(member), dtype=bool)
    picked = []
    pos = order_position(graph, (int(EdgeKind.STREAM),))
    res = graph.tasks["resource"].to_numpy()
    for row in mat[np.lexsort((pos[mat[:, 0]], res[mat[:, 0]]))] if len(mat) else mat:
        if not used[row].any():   # left to right along each stream: overlapping matches lose
            used[row] = True
            picked.append(row)
    if not picked:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    arr = np.asarray(picked, dtype=np.int64)
    return arr.ravel(), np.repeat(np.arange(len(arr)), arr.shape[1])


def fused_durations(graph: TaskGraph, ids: np.ndarray, label: np.ndarray, ctx: TransformContext,
                    transform: str = "fuse") -> tuple[np.ndarray, float, float]:
    """Per chain (sorted label order): the fused duration (ns, see the module docstring); and the
    DRAM bytes of the members before and after fusion."""
    cost = ctx.require_cost(transform)
    facts = cost.kernel_facts(graph, ids)
    cls = np.asarray(facts["kernel_class"], dtype=object)
    b = np.nan_to_num(np.asarray(facts["bytes"], dtype=float), nan=0.0)
    bw = float(cost.memory_bandwidth_bytes_per_s(graph))
    dur = graph.tasks["dur_ns"].to_numpy()[ids].astype(float)
    t0 = fixed_latency_ns(find_device(ctx.device))
    busy = np.maximum(dur - t0, 0.0)
    compute = np.isin(cls, COMPUTE_CLASSES)
    b_mem = np.where(compute, 0.0, b)
    w = np.asarray([_WRITE_RATIO.get(c, 3.0) for c in cls])
    r = np.asarray([_READ_RATIO.get(c, 2.0) for c in cls])
    g = np.unique(label, return_inverse=True)[1]
    same = g[1:] == g[:-1]                        # links i -> i+1 inside a chain
    size = np.minimum(b[:-1] / w[:-1], b[1:] / r[1:])
    both_mem = ~compute[:-1] & ~compute[1:]
    saving = np.where(same, np.where(both_mem, 2.0, np.where(compute[:-1] & compute[1:], 0.0, 1.0)) * size, 0.0)
    n_g = int(g.max()) + 1 if len(g) else 0
    total = np.bincount(g, weights=b_mem, minlength=n_g)
    saved = np.bincount(g[:-1], weights=saving, minlength=n_g) if len(g) > 1 else np.zeros(n_g)
    biggest = np.zeros(n_g)
    np.maximum.at(biggest, g, b_mem)
    slowest = np.zeros(n_g)
    np.maximum.at(slowest, g, np.where(compute, 0.0, busy) * bw * 1e-9)
    moved = np.maximum(total - saved, biggest)     # DRAM bytes of the fused kernel
    unique = np.maximum(moved, slowest)
    compute_busy = np.bincount(g, weights=np.where(compute, busy, 0.0), minlength=n_g)
    fused = t0 + compute_busy + unique / bw * 1e9
    longest = np.zeros(n_g)
    np.maximum.at(longest, g, dur)
    fused = np.clip(fused, longest, np.bincount(g, weights=dur, minlength=n_g))
    return np.rint(fused).astype(np.int64), float(total.sum()), float(moved.sum())


@register
@dataclass
class Fuse(Transform):
    name = "fuse"
    description = "Fuse chains of memory-bound kernels (or a named pattern) into one kernel: unique bytes, one launch"
    requires = (Need.GPU_KERNELS,)

    @classmethod
    def candidates(cls, graph: TaskGraph, ctx: TransformContext) -> list[Transform]:
        return [cls()]

    select: Selector | None = field(default=None, metadata={"help": "only kernels in this selection (a layer, phase…)"})
    min_chain: int = field(default=2, metadata={"minimum": 2, "help": "shortest chain to fuse (kernels)"})
    max_chain: int = field(default=16, metadata={"minimum": 2, "help": "longest fused kernel (longer chains are cut)"})
    pattern: list[str] | None = field(default=None, metadata={
        "help": "regexes matched against consecutive kernel names (any kernel class)"})

    def _chains(self, graph: TaskGraph) -> tuple[np.ndarray, np.ndarray]:
        if self.min_chain < 2 or self.max_chain < self.min_chain:
            raise TransformError(f"fuse: need 2 <= min_chain <= max_chain (got {self.min_chain}, {self.max_chain})")
        member = graph.tasks["kind"].to_numpy() == int(TaskKind.KERNEL)
        if self.select is not None:
            chosen = np.zeros(len(member), dtype=bool)
            chosen[self.select(graph)] = True
            member &= chosen
        if self.pattern is not None:
            if len(self.pattern) < 2:
                raise TransformError("fuse: a pattern names at least two consecutive kernels")
            return pattern_chains(graph, member, list(self.pattern))
        member &= np.isin(kernel_classes(graph), CHAIN_CLASSES)
        return chains(graph, member, self.min_chain, self.max_chain)

    def match(self, graph: TaskGraph, ctx: TransformContext) -> np.ndarray:
        return np.sort(self._chains(graph)[0])

    def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
        ids, label = self._chains(graph)
        if len(ids) == 0:
            what = f"kernels matching {self.pattern}" if self.pattern else "chains of memory-bound kernels"
            where = f" in {self.select}" if self.select is not None else ""
            raise TransformError(f"fuse: no {what}{where} run back to back from consecutive launches")
        dur, before, after = fused_durations(graph, ids, label, ctx, self.name)
        names = graph.tasks["name"].astype(str).to_numpy()[ids]
        g = np.unique(label, return_inverse=True)[1]
        starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
        fused_names = [f"fused[{n}]: " + " + ".join(names[s:s + n])
                       for s, n in zip(starts, np.diff(np.r_[starts, len(g)]))]
        reason = (f"{self.label()}: {len(starts):,} chains of {len(ids):,} kernels; DRAM traffic "
                  f"{before / 1e6:,.1f} -> {after / 1e6:,.1f} MB ({(before - after) / 1e6:,.1f} MB saved)")
        return fuse_tasks(graph, ids, dur, groups=g, name=fused_names, drop_launches=True, reason=reason)
