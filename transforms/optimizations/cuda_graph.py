"""``cuda_graph``: capture a region's kernel launches into CUDA/HIP graphs, one graph launch per
step (per contiguous piece of the region per step).

**What a captured region is.** On each CPU thread, walk the region's launch calls in program
order. A *capture* runs from one launch call to the last launch call before the next *barrier*:
a synchronization (a call that waits on GPU work, the waiting half of a blocking copy), a step
marker, a dependency on another thread, a launch of GPU work outside the region, or a collective
(NCCL/RCCL kernels stay eager, as vLLM's piecewise graphs keep them). A region with a blocking
sync or copy therefore splits into several graphs around it instead of being refused: capture
would fail on the sync, so real code graphs the pieces between syncs. Captures of fewer than
``min_kernels`` GPU tasks are left alone.

**The rewrite** (each step logged in the change log):

* the first launch call of a capture becomes the graph launch: ``cudaGraphLaunch`` (or
  ``hipGraphLaunch`` on a HIP trace), lasting ``T_launch`` below;
* every other CPU task between the capture's first and last launch on that thread (launch calls,
  ``cudaFuncSetAttribute``/event calls, operator work) is removed, and so are the CPU gaps
  between them: a replayed graph runs no Python. The gap before the first launch and after the
  last one stay (the code around the graph still runs);
* every GPU task of the capture depends on the graph launch (a LAUNCH edge) with its own
  measured launch latency, now counted from the graph launch's end: that latency absorbs the
  trace's CPU-GPU clock offset, and a task that waited far longer than a launch takes keeps that
  wait (the graph would not remove whatever delayed it). Stream order keeps the tasks in order,
  and the device idle between two consecutive captured tasks on a stream becomes
  ``min(measured idle, kernel_gap)``: the device, not the CPU, dispatches a graph's nodes.
  Kernels keep their durations.

**Launch cost** (CPU time of one ``cudaGraphLaunch`` for a capture of n GPU tasks):

    T_launch = a + b * n

By default ``a``, ``b`` are fitted (least squares, both >= 0) on the trace's own graph launch
calls (``cudaGraphLaunch``/``hipGraphLaunch`` that launch GPU work): e.g. a = 2.0 us, b = 14.9 us
per node on ``hta/negative_queue_a100_rank0of16`` (under the profiler), b = 1.2 us per node on
``tracelens/vllm_decode_full_graph_execution_mi300x`` (one 421-node ``hipGraphLaunch`` of 507 us).
A trace without graph launches uses a = ``DEFAULT_LAUNCH_US`` = 10 us, b = 0: about one eager
launch call (HTA reports 5-20 us of CPU per launch); NVIDIA's "Getting Started with CUDA Graphs"
(developer.nvidia.com/blog/cuda-graphs, 2019) shows one graph launch costing about one kernel
launch whatever the number of kernels, and "Constant Time Launch for Straight-Line CUDA Graphs"
(CUDA 12.6, 2024) makes the launch time independent of the node count for straight-line graphs.
Set ``launch_us`` and ``launch_per_kernel_us`` to override. ``kernel_gap_us`` = 1 us: the
device-side gap between graph nodes (the gaps between the 421 graph kernels of the vLLM MI300X
trace are < 1 us; eager back-to-back kernels in the shared H100 traces idle ~2.7 us).
Graph launches already in the trace are left as they are.

Sources: BACKGROUND.md (CUDA graphs remove CPU launch overhead and the GPU idle it causes, the
kernels are unchanged); Daydream (Zhu et al., USENIX ATC 2020) Remove/Insert semantics; NVIDIA
CUDA Programming Guide, "CUDA Graphs" (stream capture is illegal across synchronizing calls).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from whatif.core.limits import MAX_DURATION_NS
from whatif.depgraph.graph import (
    LOCAL_GPU_WORK_KINDS,
    EdgeKind,
    TaskGraph,
    TaskKind,
    kind_codes,
)

from ..base import Transform, TransformContext, TransformError
from ..edit import add_edges, durations_ns, remove, remove_edges, rename, set_duration
from ..needs import Need
from ..registry import register
from ..select import Selector
from .fuse import name_mask, order_position

MAX_DURATION_US = MAX_DURATION_NS // 1000   # a duration the graph can hold
DEFAULT_LAUNCH_US = 10.0   # one graph launch on the CPU when the trace has none (see docstring)

CAPTURED = kind_codes(LOCAL_GPU_WORK_KINDS)
CPU_KINDS = (int(TaskKind.CPU_CALL), int(TaskKind.CPU_WORK), int(TaskKind.WAIT), int(TaskKind.MARKER))
GRAPH_LAUNCH = r"(?:cuda|hip)GraphLaunch"


def graph_launch_cost_ns(graph: TaskGraph) -> tuple[float, float, int]:
    """CPU time of one graph launch as ``a + b * nodes`` (ns, ns per GPU task), fitted by least
    squares (a, b >= 0) on the trace's own graph launch calls that launch GPU work; with one graph
    size only, ``b = dur / nodes`` when that size is > 1 (HIP-like, all per node), else ``a = dur``.
    Returns (a, b, number of measured launches); (nan, nan, 0) when the trace has none."""
    t, e = graph.tasks, graph.edges
    le = e[e["kind"].to_numpy() == int(EdgeKind.LAUNCH)]
    nodes = le.groupby("src").size()
    calls = nodes.index.to_numpy()
    hit = name_mask(t["name"], GRAPH_LAUNCH)[calls] & (t["event"].to_numpy()[calls] >= 0)
    if not hit.any():
        return float("nan"), float("nan"), 0
    n = nodes.to_numpy()[hit].astype(float)
    d = t["dur_ns"].to_numpy()[calls[hit]].astype(float)
    if len(np.unique(n)) == 1:
        med = float(np.median(d))
        return (0.0, med / n[0], len(n)) if n[0] > 1 else (med, 0.0, len(n))
    a, b = np.linalg.lstsq(np.c_[np.ones_like(n), n], d, rcond=None)[0]
    if a < 0:
        a, b = 0.0, float((n * d).sum() / (n * n).sum())
    if b < 0:
        a, b = float(np.median(d)), 0.0
    return float(a), float(b), len(n)


@dataclass
class Captures:
    """The captures found in a graph (see the module docstring); arrays of task ids."""

    head: np.ndarray          # per capture: the launch call that becomes the graph launch
    removed: np.ndarray       # CPU tasks inside captures, other than the heads
    gpu: np.ndarray           # GPU tasks launched by captures
    gpu_capture: np.ndarray   # per GPU task: index of its capture
    inner_thread: np.ndarray  # mask over graph.edges: THREAD edges inside a capture
    inner_stream: np.ndarray  # mask over graph.edges: STREAM edges between GPU tasks of one capture
    calls: np.ndarray         # launch calls replaced (heads included)


def find_captures(graph: TaskGraph, region: np.ndarray, min_kernels: int) -> Captures:
    t, e = graph.tasks, graph.edges
    n = len(t)
    kind, res, step = t["kind"].to_numpy(), t["resource"].to_numpy(), t["step"].to_numpy()
    src, dst, ek = e["src"].to_numpy(), e["dst"].to_numpy(), e["kind"].to_numpy()
    in_region = np.zeros(n, dtype=bool)
    in_region[region] = True
    launch = ek == int(EdgeKind.LAUNCH)
    capturable = np.isin(kind, CAPTURED) & in_region
    # good launch calls: all of their GPU work is capturable, and they are not graph launches
    # already (those stay as they are)
    is_launch = np.zeros(n, dtype=bool)
    is_launch[src[launch]] = True
    bad = np.zeros(n, dtype=bool)
    bad[src[launch & ~capturable[dst]]] = True
    bad |= is_launch & name_mask(t["name"], GRAPH_LAUNCH)
    good = is_launch & ~bad
    cpu = np.isin(kind, CPU_KINDS)
    barrier = cpu & ((is_launch & bad) | np.isin(kind, [int(TaskKind.WAIT), int(TaskKind.MARKER)]))
    other = ~np.isin(ek, [int(EdgeKind.THREAD), int(EdgeKind.LAUNCH), int(EdgeKind.LAUNCH_QUEUE)])
    barrier[dst[other]] |= cpu[dst[other]]
    barrier[src[other]] |= cpu[src[other]]
    # CPU tasks per thread in program order; a capture = from a good launch to the last good
    # launch before the next barrier (or step change).
    pos = order_position(graph, (int(EdgeKind.THREAD),))
    ids = np.flatnonzero(cpu)
    ids = ids[np.lexsort((pos[ids], res[ids]))]
    new_seg = np.r_[True, (res[ids[1:]] != res[ids[:-1]]) | (step[ids[1:]] != step[ids[:-1]])] | barrier[ids]
    seg = np.cumsum(new_seg) - 1
    gl = good[ids]
    idx = np.arange(len(ids))
    first = pd.Series(np.where(gl, idx, len(ids))).groupby(seg).transform("min").to_numpy()
    last = pd.Series(np.where(gl, idx, -1)).groupby(seg).transform("max").to_numpy()
    inside = (idx >= first) & (idx <= last) & (~barrier[ids] | (idx == first))  # a barrier may open one
    # GPU work of each capture, and the size filter
    cap_of = np.full(n, -1, dtype=np.int64)
    cap_of[ids[inside]] = seg[inside]
    le = launch & (cap_of[src] >= 0)
    gpu, gcap = dst[le], cap_of[src[le]]
    n_gpu = np.bincount(gcap, minlength=int(seg.max()) + 1 if len(seg) else 0)
    keep_cap = n_gpu >= max(min_kernels, 1)
    cap_of[cap_of >= 0] = np.where(keep_cap[cap_of[cap_of >= 0]], cap_of[cap_of >= 0], -1)
    sel = keep_cap[gcap]
    gpu, gcap = gpu[sel], gcap[sel]
    head = ids[(idx == first) & inside & keep_cap[seg]]
    head_cap = cap_of[head]
    members = np.flatnonzero(cap_of >= 0)
    is_head = np.zeros(n, dtype=bool)
    is_head[head] = True
    # dense capture index, GPU order per stream within a capture
    dense = np.full(int(seg.max()) + 1 if len(seg) else 0, -1, dtype=np.int64)
    dense[head_cap] = np.arange(len(head))
    gcap = dense[gcap]
    inner = (ek == int(EdgeKind.THREAD)) & (cap_of[src] >= 0) & (cap_of[src] == cap_of[dst])
    gcap_of = np.full(n, -1, dtype=np.int64)
    gcap_of[gpu] = gcap
    inner_stream = (ek == int(EdgeKind.STREAM)) & (gcap_of[src] >= 0) & (gcap_of[src] == gcap_of[dst])
    return Captures(head=head, removed=members[~is_head[members]], gpu=gpu, gpu_capture=gcap,
                    inner_thread=inner, inner_stream=inner_stream, calls=members[good[members]])


@register
@dataclass
class CudaGraph(Transform):
    name = "cuda_graph"
    description = "Capture a region's launches in CUDA graphs: one graph launch per step replaces per-kernel launches"
    requires = (Need.GPU_KERNELS,)

    @classmethod
    def candidates(cls, graph: TaskGraph, ctx: TransformContext) -> list[Transform]:
        return [cls()]

    region: Selector = field(default_factory=Selector, metadata={
        "help": "which GPU work to capture (a step, phase, layer…); default: every step"})
    launch_us: float | None = field(default=None, metadata={"minimum": 0, "maximum": MAX_DURATION_US,
        "help": "fixed CPU time of one graph launch, us (default: fitted on the trace's graph launches, else 10)"})
    launch_per_kernel_us: float | None = field(default=None, metadata={"minimum": 0, "maximum": MAX_DURATION_US,
        "help": "graph-launch CPU time per captured GPU task, us (default: fitted with launch_us, else 0)"})
    kernel_gap_us: float = field(default=1.0, metadata={
        "minimum": 0, "maximum": MAX_DURATION_US, "help": "device-side dispatch per graph node, us"})
    min_kernels: int = field(default=2, metadata={"minimum": 1, "help": "smallest capture worth a graph (GPU tasks)"})

    def match(self, graph: TaskGraph, ctx: TransformContext) -> np.ndarray:
        c = find_captures(graph, self.region(graph), self.min_kernels)
        return np.sort(np.concatenate([c.head, c.removed, c.gpu]))

    def launch_cost_ns(self, graph: TaskGraph) -> tuple[float, float]:
        """CPU time of one graph launch: (fixed ns, ns per captured GPU task)."""
        if self.launch_us is None and self.launch_per_kernel_us is None:
            a, b, count = graph_launch_cost_ns(graph)
            return (a, b) if count else (DEFAULT_LAUNCH_US * 1000.0, 0.0)
        return (self.launch_us or 0.0) * 1000.0, (self.launch_per_kernel_us or 0.0) * 1000.0

    def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
        c = find_captures(graph, self.region(graph), self.min_kernels)
        if not len(c.head):
            raise TransformError(f"cuda_graph: the region ({self.region}) has no {max(self.min_kernels, 1)}+ GPU tasks "
                                 f"launched back to back from one thread between synchronizations")
        t = graph.tasks
        per_cap = np.bincount(c.gpu_capture, minlength=len(c.head))
        fixed, per_node = self.launch_cost_ns(graph)
        launch = durations_ns(fixed + per_cap * per_node)
        cpu_time = int(t["dur_ns"].to_numpy()[np.concatenate([c.head, c.removed])].sum())
        gaps = int(graph.edges["lat_ns"].to_numpy()[c.inner_thread].sum())
        label = self.label()
        hip = name_mask(t["name"], "^hip")[c.calls].mean() > 0.5
        g = set_duration(graph, c.head, launch,
                         reason=f"{label}: {len(c.calls):,} launch calls -> {len(c.head):,} graph launches")
        g = rename(g, c.head, "hipGraphLaunch" if hip else "cudaGraphLaunch", reason=f"{label}: graph launches")
        # inside a capture: program order stays without its CPU gaps; every GPU task hangs off the
        # graph launch; stream order stays with device idle <= kernel_gap
        e = graph.edges
        old_launch = (e["kind"].to_numpy() == int(EdgeKind.LAUNCH)) & np.isin(e["dst"].to_numpy(), c.gpu)
        inner, stream = e[c.inner_thread], e[c.inner_stream]
        gap_ns = round(self.kernel_gap_us * 1000)
        g = remove_edges(g, c.inner_thread | old_launch | c.inner_stream,
                         reason=f"{label}: per-kernel launches, CPU gaps and device gaps inside captures")
        g = add_edges(g, inner["src"].to_numpy(), inner["dst"].to_numpy(), 0, EdgeKind.THREAD,
                      reason=f"{label}: program order inside captures, no gap ({gaps / 1e6:.3f} ms removed)")
        # each GPU task keeps its measured launch latency, now counted from the graph launch
        lat = pd.Series(e["lat_ns"].to_numpy()[old_launch], index=e["dst"].to_numpy()[old_launch])
        lat = lat.groupby(level=0).min().reindex(c.gpu).fillna(0).to_numpy().astype(np.int64)
        g = add_edges(g, c.head[c.gpu_capture], c.gpu, lat, EdgeKind.LAUNCH,
                      reason=f"{label}: {len(c.gpu):,} GPU tasks launched by {len(c.head):,} graphs")
        g = add_edges(g, stream["src"].to_numpy(), stream["dst"].to_numpy(),
                      np.minimum(stream["lat_ns"].to_numpy(), gap_ns), EdgeKind.STREAM,
                      reason=f"{label}: stream order inside graphs, idle <= {self.kernel_gap_us:g} us")
        return remove(g, c.removed,
                      reason=f"{label}: {len(c.removed):,} CPU tasks replayed by the graphs "
                             f"({cpu_time / 1e6:.3f} ms of CPU time and {gaps / 1e6:.3f} ms of gaps gone)")
