"""``pipeline_parallel``: transformer layers split into p stages; one representative stage modeled.

The representative rank keeps its stage's blocks (:func:`~.layers.find_blocks`; stage ``s`` holds
blocks ``[s·n/p, (s+1)·n/p)`` of each step's n blocks, the kernels before the first block —
embedding — on stage 0, those after the last — final norm, LM head, sampling — on stage p−1);
the other stages' kernels, the collectives that follow them (:func:`with_their_collectives`: a
dropped layer's tensor-parallel all-reduces) and their launch calls are removed. Activations cross stage boundaries
by send/recv (COMM tasks on a ``pp comm`` stream, priced by ``CostModel.collective_time_ns``;
``m`` messages of ``1/m`` of the block output per direction and step).

* **Training** (``schedule = 1f1b | gpipe``): with m micro-batches each stage idles for p−1
  micro-batch slots per step; bubble fraction ``(p−1)/(m+p−1)`` for both GPipe (Huang et al. 2019)
  and 1F1B / PipeDream-Flush (Narayanan et al. 2021), which differ in the activations they hold
  (m vs p micro-batches). The step gets an idle ``pipeline bubble`` task of ``(p−1)·T_stage/m``
  on the compute stream (T_stage: the stage's GPU time per step); backward sends the gradient of
  each boundary activation back.
* **Serving** (``schedule = serving``): the step's sequences (the trace's batch: the in-flight
  sequences whose KV cache the GPUs hold) pass the p stages in m micro-batches (``micro_batches``,
  0 = p, the fewest that keep every stage busy) — at **equal in-flight sequences**, not p batches
  of the trace's size (that would need p× the KV memory). Each kernel of the stage runs m times
  at 1/m of its activations (FLOPs/m, bytes ``(B − W)/m + W``: every micro-batch reads the
  weights; ``CostModel.kernel_time_ns``), so a step is ``m·T_stage(B/m)``; with m < p a decode
  micro-batch's next token waits for its previous one to leave the last stage, and the stage idles
  ``(p−m)·T_stage(B/m)`` (a ``pipeline bubble`` task). The stage's collectives run m times on 1/m
  of their message (``collective_part_ns``: each pays the latency; the message from
  ``collective_messages``: a transform's label or the trace's record). Prefill (compute-bound: ``T(B/m) ≈ T(B)/m``)
  keeps PP's ×p; decode (weight-bound: ``T(B/m) ≈ T(B)``) gains little — Seesaw's reason to
  decode under TP. A request's latency is p stage slots plus p−1 hops (in the change log).

**Backward** (:func:`backward_stage_plan`): the backward's gradient GEMMs and attention backward
are mapped to the forward's blocks (:func:`~.layers.backward_blocks`, as ``tensor_parallel`` maps
them); the backward runs the layers in reverse, so stage ``s`` keeps the backward from its blocks'
first mapped kernel up to stage ``s − 1``'s first — the last stage also the loss (and LM head)
backward before its blocks', stage 0 the embedding backward after them. The split is by start
time over every stream (a data-parallel bucket's all-reduce inside the backward goes with the
stage whose window it starts in). The kernels after the backward (the optimizer, gradient
clipping, zeroing) are scaled to ``1/p`` (they touch only this stage's parameters). A backward
that cannot be mapped (another GEMM count, recomputation) keeps ``1/p`` of every backward kernel
and of the kernels after it, scaled. The backward's kernels are marked before the removals
(:func:`~.layers.keep_backward_mask`), so that what remains is still known as backward. The
stage's transfers go on its ``pp comm`` stream in time order: activation in, activation out,
gradient in, gradient out.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from whatif.core import limits
from whatif.core.kernels import CollectiveKind, collective_kind
from whatif.core.work import WorkShare
from whatif.depgraph.graph import EdgeKind, TaskGraph, TaskKind
from whatif.tracer.memory import RecordEdit

from ..base import CostModel, Transform, TransformContext, TransformError
from ..edit import note, remove, scale, set_duration, set_follows, splice_tasks
from ..placement import Placement
from ..registry import register
from .comm import (
    Collective,
    OnTopology,
    collective_messages,
    collective_part_ns,
    comm_stream,
    insert_tasks,
)
from .layers import backward_blocks, backward_mask, find_blocks, gemm_io_bytes, keep_backward_mask
from .pp_memory import (
    TRAINING_MICRO_BATCHES,
    Schedule,
    default_micro_batches,
    in_flight,
    pipeline_memory_edit,
    schedule_of,
    stage_of,
)
from .sharding import batch_part_ns, record_split
from .tensor import prev_on_resource


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """Idle share of a pipelined training step: ``(p−1)/(m+p−1)`` (GPipe; 1F1B the same)."""
    return (stages - 1) / (micro_batches + stages - 1)


def pipelined_step_ns(stage_ns: float, stages: int, micro_batches: int) -> float:
    """Step time of a stage doing ``stage_ns`` of work per step in m micro-batches:
    ``(m+p−1)·stage_ns/m`` — i.e. ``stage_ns / (1 − bubble_fraction)``."""
    return stage_ns * (micro_batches + stages - 1) / micro_batches


def _staged_blocks(graph: TaskGraph, b: pd.DataFrame, stages: int) -> pd.DataFrame:
    """``b`` (:func:`~.layers.find_blocks` rows) with ``step``, ``layer_in_step``, ``n`` (blocks in
    the step) and ``stage``: stage ``s`` holds blocks ``[s·n/p, (s+1)·n/p)`` of its step."""
    t = graph.tasks
    steps = t["step"].to_numpy()
    b = b.assign(step=steps[b["task"].to_numpy()])
    first = b.groupby(["rank", "step", "block"])["task"].transform("min")
    b = b.assign(first=first)
    order = b.drop_duplicates(["rank", "step", "block"]).sort_values("first")
    order = order.assign(layer_in_step=order.groupby(["rank", "step"]).cumcount(),
                         n=order.groupby(["rank", "step"])["block"].transform("size"))
    b = b.merge(order[["rank", "step", "block", "layer_in_step", "n"]], on=["rank", "step", "block"])
    return b.assign(stage=stage_of(b["layer_in_step"].to_numpy(), b["n"].to_numpy(), stages))


def stage_plan(graph: TaskGraph, stages: int, stage: int,
               blocks: pd.DataFrame | None = None) -> tuple[np.ndarray, pd.DataFrame]:
    """(kernels of the other stages, blocks of this stage with ``layer_in_step`` and ``stage``);
    ``blocks``: the graph's :func:`~.layers.find_blocks`, when the caller has them."""
    b = find_blocks(graph) if blocks is None else blocks
    if b.empty:
        raise TransformError("pipeline_parallel: found no transformer block (an attention kernel followed by a GEMM); "
                             "see docs/multi-gpu.md for the heuristic")
    t = graph.tasks
    steps = t["step"].to_numpy()
    b = _staged_blocks(graph, b, stages)
    if stages > int(b["n"].min()):
        raise TransformError(f"pipeline_parallel: {stages} stages for {int(b['n'].min())} blocks per step would leave "
                             f"a stage empty")
    keep = b["stage"] == stage
    if not keep.any():
        raise TransformError(f"pipeline_parallel: {stages} stages for {int(b['n'].max())} blocks per step leave "
                             f"stage {stage} empty")
    drop = set(b.loc[~keep, "task"].tolist())
    kinds = t["kind"].to_numpy()
    bw = backward_mask(graph)
    start = t["measured_start_ns"].to_numpy()
    measured = start >= 0
    for (rank, step), blk in b.groupby(["rank", "step"]):
        k = np.flatnonzero((kinds == int(TaskKind.KERNEL)) & (t["rank"].to_numpy() == rank) & (steps == step) & ~bw
                           & measured)
        blk = blk[measured[blk["task"].to_numpy()]]
        if blk.empty:
            continue
        s0, s1 = start[blk["task"]].min(), start[blk["task"]].max()
        mine_bw = bw & (t["rank"].to_numpy() == rank) & (steps == step) & (kinds == int(TaskKind.KERNEL))
        end = start[mine_bw].min() if mine_bw.any() else np.iinfo(np.int64).max   # the forward's end
        if stage > 0:
            drop |= set(k[start[k] < s0].tolist())
        if stage < stages - 1:   # final norm, LM head, sampling; the optimizer after a backward stays (1/p)
            drop |= set(k[(start[k] > s1) & (start[k] < end)].tolist())
    return _with_inserted(graph, np.asarray(sorted(drop), dtype=np.int64)), b[keep]


def _with_inserted(graph: TaskGraph, dropped: np.ndarray) -> np.ndarray:
    """``dropped`` and the kernels a transform inserted (no measured start: ``overlap``'s
    nano-batches) after one of them on its stream: each goes with the nearest measured kernel before
    it, where a time rule cannot place it."""
    t = graph.tasks
    kinds, start = t["kind"].to_numpy(), t["measured_start_ns"].to_numpy()
    inserted = np.flatnonzero((kinds == int(TaskKind.KERNEL)) & (start < 0))
    if not len(inserted):
        return dropped
    anchor = prev_on_resource(graph, inserted)
    for _ in range(len(inserted)):   # past other inserted tasks to a measured one
        pending = (anchor >= 0) & (start[np.maximum(anchor, 0)] < 0)
        if not pending.any():
            break
        anchor[pending] = prev_on_resource(graph, anchor[pending])
    gone = np.zeros(len(t), dtype=bool)
    gone[dropped] = True
    follow = inserted[(anchor >= 0) & gone[np.maximum(anchor, 0)]]
    return np.union1d(dropped, follow)


def backward_stage_plan(graph: TaskGraph, stages: int, stage: int,
                        blocks: pd.DataFrame | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """(backward kernels of the other stages, the kernels after the backward: optimizer, clipping) per
    (rank, step), from the backward mapped to the forward's blocks (:func:`~.layers.backward_blocks`); None
    when the backward cannot be mapped. The backward runs the layers in reverse, so stage ``s`` holds
    the backward from its blocks' first mapped kernel up to stage ``s − 1``'s first: the last stage
    also the loss (and LM head) backward before its blocks', stage 0 the embedding backward after.
    ``blocks``: the graph's :func:`~.layers.find_blocks`, when the caller has them."""
    blocks = find_blocks(graph) if blocks is None else blocks
    mapped = backward_blocks(graph, blocks)
    if mapped is None or mapped.empty:
        return None
    staged = _staged_blocks(graph, blocks, stages).drop_duplicates(["rank", "step", "block"])
    t = graph.tasks
    start, steps, ranks = t["measured_start_ns"].to_numpy(), t["step"].to_numpy(), t["rank"].to_numpy()
    mapped = mapped.assign(step=steps[mapped["task"].to_numpy()], start=start[mapped["task"].to_numpy()])
    mapped = mapped.merge(staged[["rank", "step", "block", "stage"]], on=["rank", "step", "block"])
    kern = t["kind"].to_numpy() == int(TaskKind.KERNEL)
    bw = backward_mask(graph) & kern
    drop, tail = [], []
    for (rank, step), m in mapped.groupby(["rank", "step"]):
        first = m.groupby("stage")["start"].min()
        if len(first) != stages:
            return None
        lo = -np.inf if stage == stages - 1 else float(first[stage])
        hi = np.inf if stage == 0 else float(first[stage - 1])
        k = np.flatnonzero(bw & (ranks == rank) & (steps == step) & (start >= 0))
        drop.extend(k[(start[k] < lo) | (start[k] >= hi)].tolist())
        last = start[k].max()
        tail.extend(np.flatnonzero(kern & (ranks == rank) & (steps == step) & (start > last)).tolist())
    return np.asarray(sorted(drop), dtype=np.int64), np.asarray(sorted(tail), dtype=np.int64)


def with_their_collectives(graph: TaskGraph, kernels: np.ndarray) -> np.ndarray:
    """``kernels`` and the collectives that go with them. A collective goes with the kernel whose
    data it carries: an all-gather with the kernel it feeds (its FLOW or stream successor that is no
    collective: a sequence-parallel all-gather before a layer's GEMM), every other one with the
    kernel it follows (an all-reduce or reduce-scatter after a layer's GEMM, the parts ``overlap``
    splits it into); one linked only to collectives takes its neighbour's kernel. So a dropped
    layer's collectives, inserted by ``tensor_parallel`` or recorded on the compute stream, go with
    it."""
    t, e = graph.tasks, graph.edges
    n = len(t)
    comm = t["kind"].to_numpy() == int(TaskKind.COMM)
    kern = t["kind"].to_numpy() == int(TaskKind.KERNEL)
    codes, uniques = pd.factorize(t["name"].astype(str).to_numpy())
    gathers = np.asarray([collective_kind(None, str(u)) is CollectiveKind.ALL_GATHER for u in uniques],
                         dtype=bool)[codes] & comm
    link = e[e["kind"].isin([int(EdgeKind.FLOW), int(EdgeKind.STREAM)]).to_numpy()]
    src, dst, flow = link["src"].to_numpy(), link["dst"].to_numpy(), (link["kind"] == int(EdgeKind.FLOW)).to_numpy()
    anchor = np.full(n, -1, dtype=np.int64)
    # weakest first, so that a stronger link overwrites it: the other side by stream, by FLOW, then
    # the side the collective belongs to by stream, by FLOW
    for own_side in (False, True):
        for by_flow in (False, True):
            into = comm[dst] & kern[src] & (flow == by_flow) & (gathers[dst] != own_side)   # from its producer
            out = comm[src] & kern[dst] & (flow == by_flow) & (gathers[src] == own_side)    # to its consumer
            anchor[dst[into]] = src[into]
            anchor[src[out]] = dst[out]
    both = comm[src] & comm[dst] & flow
    for _ in range(int(comm.sum())):   # chains of collectives take a neighbour's kernel
        fwd = both & (anchor[src] < 0) & (anchor[dst] >= 0)
        back = both & (anchor[dst] < 0) & (anchor[src] >= 0)
        if not fwd.any() and not back.any():
            break
        anchor[src[fwd]] = anchor[dst[fwd]]
        anchor[dst[back]] = anchor[src[back]]
    gone = np.zeros(n, dtype=bool)
    gone[kernels] = True
    follow = np.flatnonzero(comm & (anchor >= 0) & gone[np.maximum(anchor, 0)])
    return np.union1d(np.asarray(kernels, dtype=np.int64), follow)


def _launches(graph: TaskGraph, kernels: np.ndarray) -> np.ndarray:
    """Launch calls whose every launch goes to one of ``kernels``."""
    e = graph.edges
    lau = e[e["kind"] == int(EdgeKind.LAUNCH)]
    gone = np.isin(lau["dst"].to_numpy(), kernels)
    calls = lau.assign(gone=gone).groupby("src")["gone"].all()
    return calls[calls].index.to_numpy(np.int64)


@register
@dataclass
class PipelineParallel(OnTopology, Transform):
    name = "pipeline_parallel"
    description = ("pipeline parallelism: one stage's layers, send/recv between stages, GPipe/1F1B bubbles "
                   "or request pipelining")

    degree: int = field(default=2, metadata={"minimum": 1, "help": "pipeline stages p", "maximum": limits.MAX_GPUS})
    micro_batches: int = field(default=0, metadata={"minimum": 0,
        "help": f"micro-batches m per step; 0 = {TRAINING_MICRO_BATCHES} for training, p for serving",
        "maximum": limits.MAX_PARTS})
    schedule: str = field(default="1f1b", metadata={"help": "1f1b | gpipe (training) | serving (request pipelining)"})
    stage: int = field(default=-1, metadata={
        "minimum": -1, "help": "stage modeled (0..p-1); -1 = the last (it holds the LM head)"})
    topology: str = field(default="dgx_h100", metadata={"help": "topology preset for the send/recv"})

    def _check(self) -> int:
        schedule_of(self.schedule, self.name)
        s = self.degree - 1 if self.stage < 0 else self.stage
        if s >= self.degree:
            raise TransformError(f"{self.name}: stage {s} >= degree {self.degree}")
        return s

    @property
    def m(self) -> int:
        """Micro-batches per step (``micro_batches``, or its default for the schedule)."""
        return self.micro_batches or default_micro_batches(schedule_of(self.schedule, self.name), self.degree)

    def placement(self, placement: Placement, graph: TaskGraph, ctx: TransformContext) -> Placement:
        return placement.spread(pipeline=self.degree)

    def memory_edit(self, graph: TaskGraph) -> RecordEdit | None:
        """The allocator records of the modeled stage (:func:`~.pp_memory.pipeline_memory_edit`)."""
        return pipeline_memory_edit(self.recorded_trace(graph), self.degree, self._check(), self.m, self.schedule)

    def match(self, graph: TaskGraph, ctx: TransformContext) -> np.ndarray:
        return stage_plan(graph, self.degree, self._check())[0]

    def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
        s = self._check()
        if self.degree == 1:
            return graph
        p = self.degree
        blocks = find_blocks(graph)
        drop, mine = stage_plan(graph, p, s, blocks)
        cost = ctx.require_cost(self.name)
        tasks = mine["task"].to_numpy(np.int64)
        facts = cost.kernel_facts(graph, tasks)
        _, _, out = gemm_io_bytes(graph, tasks, np.nan_to_num(facts["bytes"]), np.nan_to_num(facts["weight_bytes"]))
        act = mine.assign(out=out).loc[lambda d: d["part"] == "attn_out"].groupby(["rank", "step"])["out"].max()
        bw = np.flatnonzero(backward_mask(graph) & (graph.tasks["kind"].to_numpy() == int(TaskKind.KERNEL)))
        g = graph
        if len(bw):
            g, drop = self._backward(keep_backward_mask(graph, reason=f"{self.label()}: the backward's kernels, "
                                                                      f"kept through the stage's removals"),
                                     bw, s, drop, blocks, cost)
        drop = with_their_collectives(g, _with_inserted(g, drop))
        ids = np.concatenate([drop, _launches(g, drop)])
        g = remove(g, ids, reason=f"{self.label()}: {len(drop)} kernels of the other {p - 1} stages")
        training = schedule_of(self.schedule, self.name) is not Schedule.SERVING
        if not training:
            g = self._micro_batched(g, ctx)
        return self._comm_and_bubble(g, ctx, act, s, training=training, backward=len(bw) > 0)

    def _backward(self, graph: TaskGraph, bw: np.ndarray, s: int, drop: np.ndarray,
                  blocks: pd.DataFrame, cost: CostModel) -> tuple[TaskGraph, np.ndarray]:
        """The graph with this stage's backward and its share of the optimizer, and the kernels to
        remove: the other stages' backward (:func:`backward_stage_plan`) and the optimizer at 1/p (it
        updates this stage's parameters); where the backward cannot be mapped to blocks, every
        backward kernel and the optimizer at 1/p."""
        p = self.degree
        plan = backward_stage_plan(graph, p, s, blocks)
        if plan is not None:
            other, tail = plan
            facts = cost.kernel_facts(graph, tail)
            g = set_duration(graph, tail, np.rint(cost.kernel_time_ns(graph, tail, np.nan_to_num(facts["flops"]) / p,
                                                                      np.nan_to_num(facts["bytes"]) / p)),
                             reason=f"{self.label()}: this stage's share of the optimizer (1/{p} of the parameters; "
                                    f"each kernel keeps its launch latency)")
            g = record_split(g, tail, WorkShare(1 / p, 1 / p, 1 / p, 1 / p),
                             reason=f"{self.label()}: the optimizer updates this stage's parameters")
            return g, np.union1d(drop, other)
        t = graph.tasks
        key = t["rank"].to_numpy() * (1 << 32) + t["step"].to_numpy()
        kern = np.flatnonzero(t["kind"].to_numpy() == int(TaskKind.KERNEL))
        start = t["measured_start_ns"].to_numpy()
        last = {int(k): int(start[bw[key[bw] == k]].max()) for k in np.unique(key[bw])}
        tail = kern[[start[i] > last.get(int(key[i]), np.iinfo(np.int64).max) for i in kern]]
        g = scale(graph, np.concatenate([bw, tail]), 1.0 / p,
                  reason=f"{self.label()}: this stage's share of the backward and optimizer (backward not mapped "
                         f"to blocks)")
        return g, drop

    def _micro_batched(self, g: TaskGraph, ctx: TransformContext) -> TaskGraph:
        """Each remaining kernel as m back-to-back runs at 1/m of its activations; each collective
        (a tensor-parallel all-reduce of the stage's layers) as m of 1/m of its message."""
        m = self.m
        if m == 1:
            return g
        cost = ctx.require_cost(self.name)
        kinds = g.tasks["kind"].to_numpy()
        kern = np.flatnonzero(kinds == int(TaskKind.KERNEL))
        g = set_duration(g, kern, np.rint(m * batch_part_ns(cost, g, kern, m)).astype(np.int64),
                         reason=f"{self.label()}: the step's sequences in {m} micro-batches, each kernel "
                                f"{m} times at 1/{m} of its activations (weights read each time)")
        g = record_split(g, kern, WorkShare(flops=1 / m, activation_bytes=1 / m, weight_bytes=1.0, output_bytes=1 / m,
                                            rows=1 / m, launches=float(m)),
                         reason=f"{self.label()}: each kernel stands for {m} launches on 1/{m} of the rows")
        comm = np.flatnonzero(kinds == int(TaskKind.COMM))
        if not len(comm):
            return g
        dur = g.tasks["dur_ns"].to_numpy()
        parts = [m * collective_part_ns(ctx, self.name, int(dur[c]), message, m, self.topology)
                 for c, message in zip(comm.tolist(), collective_messages(g, comm))]
        return set_duration(g, comm, np.asarray(parts, dtype=np.int64),
                            reason=f"{self.label()}: each collective m = {m} times at 1/{m} of its message, one per "
                                   f"micro-batch (each pays the latency)")

    def _comm_and_bubble(self, g: TaskGraph, ctx: TransformContext, act: pd.Series, s: int, *, training: bool,
                         backward: bool) -> TaskGraph:
        p, m = self.degree, self.m
        t = g.tasks
        kern = np.flatnonzero(t["kind"].to_numpy() == int(TaskKind.KERNEL))
        bw = backward_mask(g)
        hops, anchors, bubbles = [], [], []
        for (rank, step), nbytes in zip(act.index.tolist(), act.to_numpy().tolist()):
            k = kern[(t["rank"].to_numpy()[kern] == rank) & (t["step"].to_numpy()[kern] == step)]
            if not len(k):
                continue
            k = k[np.argsort(t["measured_start_ns"].to_numpy()[k], kind="stable")]
            bwd = k[bw[k]]
            fwd = k[~bw[k]]
            if len(bwd):   # the optimizer after the backward is no forward kernel
                fwd = fwd[t["measured_start_ns"].to_numpy()[fwd] < t["measured_start_ns"].to_numpy()[bwd[0]]]
            one = Collective("send_recv", float(nbytes) / m, 2, self.topology).time_ns(ctx, self.name) * m
            grads = backward and len(bwd) > 0
            # on the stage's comm stream in time order: activation in, activation out, gradient in, out
            if s > 0:
                hops.append((int(rank), -1, int(fwd[0]), one, "recv activation"))
            if s < p - 1:
                hops.append((int(rank), int(fwd[-1]), -1, one, "send activation"))
                if grads:
                    hops.append((int(rank), -1, int(bwd[0]), one, "recv gradient"))
            if s > 0 and grads:
                hops.append((int(rank), int(bwd[-1]), -1, one, "send gradient"))
            busy = int(t["dur_ns"].to_numpy()[k].sum())
            idle = (p - 1) * busy / m if training else max(0, p - m) * busy / m
            if idle > 0:
                anchors.append(int(k[-1]))
                bubbles.append([int(round(idle))])
        for rank in sorted({h[0] for h in hops}):
            mine = [h for h in hops if h[0] == rank]
            g, res = comm_stream(g, rank, "pp comm")
            g, _ = insert_tasks(g, resource=res, after=[h[1] for h in mine], before=[h[2] for h in mine],
                                dur_ns=[h[3] for h in mine], names=[f"pp {h[4]} ({m} x send_recv)" for h in mine],
                                reason=f"{self.label()}: {len(mine)} stage-boundary transfers",
                                priced_on=self.topology_gpu(), ctx=ctx)
        if anchors:
            why = (f"bubble (p-1)/(m+p-1) = {bubble_fraction(p, m):.3f} of the step; activations held: "
                   f"{in_flight(schedule_of(self.schedule, self.name), p, s, m)} micro-batches" if training else
                   f"{m} micro-batches for {p} stages: each decode micro-batch waits for its previous token, "
                   f"the stage idles {p - m} of {p} slots")
            g, ids = splice_tasks(g, anchors=anchors, durs=bubbles, name=f"pipeline bubble ({self.schedule}, idle)",
                                  deps=[[-1]] * len(anchors), reason=f"{self.label()}: {why}")
            g = set_follows(g, np.concatenate(ids), (p - 1) / m if training else max(0, p - m) / m,
                            reason=f"{self.label()}: the bubble follows the stage's kernels through later transforms")
        if not training:
            hop = max((h[3] for h in hops), default=0)
            g = note(g, "request pipelining",
                     reason=f"{self.label()}: steady state at the trace's in-flight sequences, {m} micro-batches "
                            f"in the {p} stages; a request's latency = {p} stage slots + {p - 1} hops of "
                            f"{hop / 1e3:.1f} us")
        return g
