"""``overlap``: split compute→collective regions into n nano-batches so one nano-batch's
communication overlaps the next one's compute (NanoFlow, OSDI 2025; TokenWeave, MLSys 2026).

A *region* is a collective inserted after a kernel (a ``COMM`` task with a FLOW edge from its
producer kernel and one to its consumer kernel: what ``tensor_parallel``/``sequence_parallel``
insert, and what :func:`detach_collectives` makes of a trace's own forward collectives that run on
a compute stream between two compute kernels — a TP rank's all-reduce as vLLM and SGLang launch
it) together with the compute *segment* that feeds it: the kernels on the producer's stream
from the previous region's consumer (or the step's first kernel) to the producer. With n
nano-batches:

* each segment kernel is re-priced at ``1/n`` of its activations (weights are read by every
  nano-batch: FLOPs/n, bytes ``(B − W)/n + W``; ``CostModel.kernel_time_ns``): the original kernels
  become nano-batch 1, and n−1 tasks of the segment's nano-batch time follow them on the stream;
* the collective becomes n collectives of ``bytes/n`` (``CostModel.collective_time_ns``: each pays
  the latency again), chained on the comm stream, collective j after compute nano-batch j;
* nano-batch j of the next segment waits for collective j (nano-batch 1 is the original consumer);
  after the last region the consumer waits for all of them;
* concurrent compute and communication contend for SMs and memory bandwidth: each compute
  nano-batch is slowed by ``1 + (φ − 1)·f``, f the fraction of its time beside a collective part
  (:mod:`~whatif.transforms.beside`: nano-batch j+1 beside part j of its own region, nano-batch 1
  of a segment beside the previous region's last part, ``f = min(1, part/nano-batch)``, kept at the
  durations a later transform leaves), and every collective part by φ: the **interference factor**
  φ ≥ 1. Default: φ
  calibrated from the trace (:func:`~whatif.transforms.sharing.calibrated_interference`: median
  slowdown of kernels that overlap a collective vs the same kernels alone) when it has such pairs,
  else ``DEFAULT_INTERFERENCE`` (1.15, an assumption: BACKGROUND's "more than the max, less than the
  sum"); the segment kernels are then out of the replay's own re-pricing beside collectives
  (:mod:`whatif.transforms.sharing`), which would count it twice. With ``comm_sms`` = c
  > 0 (a collective kernel that holds c SMs, as TokenWeave's fused AllReduce–RMSNorm on 2–8 SMs of
  an 8×H100 does), the interference is that kernel's share instead: φ = ``1 / (1 − c/SMs)`` for
  the compute (:func:`~.comm.overlapped_compute_slowdown`), the collective parts at their own
  speed; with ``fuse_norm`` the residual add and norm after each collective run inside it, on
  1/ranks of the tokens and its c SMs (:mod:`.fused_norm`: TokenWeave's fused kernel; with
  ``nano_batches = 1`` the fused kernel without the split);
* each segment kernel's nano-batch is priced with its waves (``batch_part_ns``): a GEMM of a few
  waves pays a partly empty last wave in every nano-batch, so splitting few tokens loses
  (TokenWeave's reason for wave-aware splits, which this equal split leaves out).

Since compute stays on one stream and communication on another, the replay never predicts less
than ``max(compute, communication)``; with φ > 1 and per-part latencies it can be worse than not
splitting, which is the trade-off NanoFlow's and TokenWeave's auto-search make.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from whatif.core import limits
from whatif.core.kernels import collective_kind
from whatif.core.work import WorkShare
from whatif.depgraph.graph import EdgeKind, ResourceKind, TaskGraph, TaskKind
from whatif.depgraph.schema import DEVICE_COLUMN

from ..base import Transform, TransformContext, TransformError
from ..beside import set_beside
from ..edit import add_edges, remove, remove_edges, set_duration, set_follows, splice_tasks
from ..needs import Need
from ..registry import register
from ..sharing import collective_mask, graph_interference, priced_by_transform
from .comm import (
    OnTopology,
    collective_messages,
    collective_part_ns,
    comm_sm_share,
    comm_stream,
    insert_tasks,
    next_on_resource,
    overlapped_compute_slowdown,
)
from .fused_norm import absorbed_part_ns, fusable, remove_absorbed
from .layers import backward_mask
from .sharding import batch_part_ns, record_split
from .tensor import prev_on_resource

PART_NAME = "collective part"   # how the collective parts overlap splices are named
TOKENWEAVE_SMS = 8   # SMs of TokenWeave's fused AllReduce-RMSNorm on an 8x H100 (MLSys 2026: 2-8)
NCCL_NVLS_CTAS = 16  # NCCL's NVLS all-reduce: NCCL_NVLS_NCHANNELS channels by default, one CTA (SM) each (nvls.cc)


def _same_stream_collectives(graph: TaskGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(collective kernels, the compute kernel before each, the one after) of the forward's
    collectives that run on a compute stream between two compute kernels (those of activations, a
    tensor-parallel all-reduce; a backward's all-reduce sums gradients, which no token split
    divides)."""
    t = graph.tasks
    kinds = t["kind"].to_numpy()
    collective = collective_mask(graph)
    on_stream = graph.resources["kind"].to_numpy()[t["resource"].to_numpy()] == int(ResourceKind.STREAM)
    coll = np.flatnonzero(collective & on_stream)
    if not len(coll):
        return coll, coll, coll
    before, after = prev_on_resource(graph, coll), next_on_resource(graph, coll)
    forward = (kinds == int(TaskKind.KERNEL)) & ~collective & ~backward_mask(graph)   # a backward's are gradients
    ok = (before >= 0) & (after >= 0) & forward[np.maximum(before, 0)] & forward[np.maximum(after, 0)]
    return coll[ok], before[ok], after[ok]


def detach_collectives(graph: TaskGraph, *, reason: str) -> TaskGraph:
    """``graph`` with the trace's own collective kernels that run on a compute stream between two
    forward compute kernels — a tensor-parallel all-reduce as vLLM and SGLang launch it — moved to
    a ``trace collectives`` stream of their rank: COMM tasks of the kernels' measured durations
    between the same two kernels (FLOW edges that keep the stream's gaps before and after the
    collective, so an unchanged replay is unchanged; the compute stream's edge between the two
    kernels carries both gaps), launched by the same calls (LAUNCH edges, their latency), with the waits that
    followed them (a synchronize, another stream's event wait) now after the new tasks, named
    ``<kind> (<MiB> MiB x<ranks>)`` where the trace records the message
    (:func:`~.comm.collective_messages`), so that ``overlap`` splits them
    as it splits the collectives the parallel transforms insert. A multi-rank graph's collectives
    (an arrival before each, linked across ranks) and those on a stream of their own are left."""
    coll, before, after = _same_stream_collectives(graph)
    if not len(coll):
        return graph
    t = graph.tasks
    names = t["name"].astype(str).to_numpy()
    labels = []
    for k, message in zip(coll.tolist(), collective_messages(graph, coll)):
        found = collective_kind(None, str(names[k]))
        labels.append(f"trace {message[0]} ({message[1] / 2**20:.4f} MiB x{message[2]})" if message is not None
                      else f"trace {found.value if found is not None else 'collective'} (size not recorded)")
    e = graph.edges
    order = e["kind"].isin([int(EdgeKind.STREAM), int(EdgeKind.THREAD)]).to_numpy()
    gap_before, gap_after = _stream_gaps_ns(e[order], coll)
    touching = ~order & (np.isin(e["src"].to_numpy(), coll) | np.isin(e["dst"].to_numpy(), coll))
    moved = e[touching]
    g = remove_edges(graph, touching, reason=reason)
    ranks, dur = t["rank"].to_numpy(), t["dur_ns"].to_numpy()
    priced_on = t[DEVICE_COLUMN].to_numpy(dtype=object) if DEVICE_COLUMN in t else np.full(len(t), None, dtype=object)
    new_id = np.full(len(t), -1, dtype=np.int64)
    for rank in np.unique(ranks[coll]).tolist():
        mine = np.flatnonzero(ranks[coll] == rank)
        g, res = comm_stream(g, int(rank), "trace collectives")
        g, ids = insert_tasks(g, resource=res, after=before[mine].tolist(), before=after[mine].tolist(),
                              dur_ns=dur[coll[mine]].tolist(), names=[labels[i] for i in mine.tolist()], reason=reason,
                              after_lat_ns=gap_before[mine].tolist(), before_lat_ns=gap_after[mine].tolist(),
                              priced_on=list(priced_on[coll[mine]]))
        new_id[coll[mine]] = ids
    src, dst = moved["src"].to_numpy(), moved["dst"].to_numpy()
    src, dst = np.where(new_id[src] >= 0, new_id[src], src), np.where(new_id[dst] >= 0, new_id[dst], dst)
    for kind in np.unique(moved["kind"].to_numpy()).tolist():   # launches, waits: now on the new tasks
        m = (moved["kind"] == kind).to_numpy()
        g = add_edges(g, src[m], dst[m], moved["lat_ns"].to_numpy()[m], kind=EdgeKind(int(kind)), reason=reason)
    return remove(g, coll, reason=reason)


def _stream_gaps_ns(order: pd.DataFrame, tasks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per task: the latency of its stream edge in and of its stream edge out (0 where none)."""
    lat = order["lat_ns"].to_numpy()
    into = pd.Series(lat, index=order["dst"].to_numpy())
    out = pd.Series(lat, index=order["src"].to_numpy())
    return (into.reindex(tasks).fillna(0).to_numpy(np.int64), out.reindex(tasks).fillna(0).to_numpy(np.int64))


def _follows(reg: pd.DataFrame) -> np.ndarray:
    """Per region: whether it comes right after the previous region on the same stream in the same
    step (its segment starts at that region's consumer)."""
    res, step = reg["res"].to_numpy(), reg["step"].to_numpy()
    return np.r_[False, (res[1:] == res[:-1]) & (step[1:] == step[:-1])]


def _regions(graph: TaskGraph) -> pd.DataFrame:
    """One row per region: ``comm``, ``producer``, ``consumer``, ``segment`` (kernel ids)."""
    t, e = graph.tasks, graph.edges
    kinds = t["kind"].to_numpy()
    flow = e[e["kind"] == int(EdgeKind.FLOW)]
    is_comm = kinds[flow["dst"].to_numpy()] == int(TaskKind.COMM)
    src_k = kinds[flow["src"].to_numpy()] == int(TaskKind.KERNEL)
    into = flow[is_comm & src_k].drop_duplicates("dst")
    outof = flow[(kinds[flow["src"].to_numpy()] == int(TaskKind.COMM))
                 & (kinds[flow["dst"].to_numpy()] == int(TaskKind.KERNEL))].drop_duplicates("src")
    reg = into.rename(columns={"dst": "comm", "src": "producer"})[["comm", "producer"]].merge(
        outof.rename(columns={"src": "comm", "dst": "consumer"})[["comm", "consumer"]], on="comm")
    if reg.empty:
        return reg
    start = t["measured_start_ns"].to_numpy()
    reg = reg.assign(start=start[reg["producer"].to_numpy()], res=t["resource"].to_numpy()[reg["producer"].to_numpy()],
                     step=t["step"].to_numpy()[reg["producer"].to_numpy()])
    reg = reg.sort_values(["res", "start", "comm"], ignore_index=True)
    prev = prev_on_resource(graph, np.arange(len(t)))
    segs = []
    for i, row in enumerate(reg.itertuples()):
        stop = int(reg["consumer"].iat[i - 1]) if i and reg["res"].iat[i - 1] == row.res \
            and reg["step"].iat[i - 1] == row.step else -1
        seg, cur = [], int(row.producer)
        while cur >= 0 and kinds[cur] == int(TaskKind.KERNEL) and int(t["step"].to_numpy()[cur]) == row.step:
            seg.append(cur)
            if cur == stop:
                break
            cur = int(prev[cur])
        segs.append(np.asarray(seg[::-1], dtype=np.int64))
    return reg.assign(segment=segs)


@register
@dataclass
class Overlap(OnTopology, Transform):
    name = "overlap"
    description = "nano-batch compute/communication overlap (NanoFlow, TokenWeave) with an interference factor"
    requires = (Need.COLLECTIVES,)

    @classmethod
    def candidates(cls, graph: TaskGraph, ctx: TransformContext) -> list[Transform]:
        """2 and 4 nano-batches, the interference calibrated from the trace (or the default); and
        TokenWeave's (2 splits, the fused AllReduce-RMSNorm on :data:`TOKENWEAVE_SMS` SMs) where a
        forward all-reduce feeds a residual add and norm (:func:`~.fused_norm.absorbed_kernels`)
        and the GPU's SMs are known."""
        out: list[Transform] = [cls(nano_batches=n) for n in (2, 4)]
        if comm_sm_share(ctx, TOKENWEAVE_SMS) > 0:
            g = detach_collectives(graph, reason="overlap: candidates")
            reg = _regions(g)
            if any(len(k) for k, _ in fusable(g, reg["comm"].to_numpy(), reg["consumer"].to_numpy())):
                out.append(cls(nano_batches=2, comm_sms=TOKENWEAVE_SMS, fuse_norm=True))
        return out

    nano_batches: int = field(default=2, metadata={"minimum": 1, "help": "nano-batches n per region (TokenWeave: 2)",
                                                     "maximum": limits.MAX_PARTS})
    interference: float = field(default=0.0, metadata={"minimum": 0,
        "help": "slowdown of concurrent compute and communication (>= 1); 0 = the graph's (the interference "
                "transform's, else calibrated from the trace, else 1.15)"})
    topology: str = field(default="dgx_h100", metadata={"help": "topology preset that prices the collective parts"})
    comm_sms: int = field(default=0, metadata={"minimum": 0,
        "help": "SMs the collective kernel holds (TokenWeave: 2-8); > 0 replaces the interference: compute "
                "slowed by SMs/(SMs - comm_sms), collectives at their own speed (fewer than the GPU's SMs)",
        "maximum": limits.MAX_GPU_SMS})
    fuse_norm: bool = field(default=False, metadata={
        "help": "TokenWeave's fused AllReduce + residual add + RMSNorm: the add and norm after each collective "
                "run inside it, on each rank's 1/ranks of the tokens, on its comm_sms SMs (needs comm_sms)"})

    def factors(self, graph: TaskGraph, ctx: TransformContext) -> tuple[float, float]:
        """(slowdown of overlapped compute, slowdown of the collective parts)."""
        if self.comm_sms and self.interference:
            raise TransformError(f"{self.name}: give comm_sms or interference, not both (comm_sms prices the "
                                 f"interference from the collective's SMs)")
        if not self.comm_sms:
            phi = self.factor(graph)
            return phi, phi
        share = comm_sm_share(ctx, self.comm_sms)
        if share == 0:
            raise TransformError(f"{self.name}: comm_sms needs the GPU's SM count, and the trace's GPU "
                                 f"({ctx.device or 'unnamed'}) is not in the hardware catalog")
        try:
            return overlapped_compute_slowdown(share), 1.0
        except TransformError as e:
            raise TransformError(f"{self.name}: comm_sms={self.comm_sms}: {e}") from None

    def factor(self, graph: TaskGraph) -> float:
        if self.interference:
            if self.interference < 1:
                raise TransformError(f"{self.name}: interference must be >= 1 (got {self.interference})")
            return float(self.interference)
        return graph_interference(graph)

    def _absorb_norms(self, graph: TaskGraph, ctx: TransformContext,
                      reg: pd.DataFrame) -> tuple[TaskGraph, pd.DataFrame, np.ndarray, np.ndarray]:
        """``graph`` without the residual adds and norms the collectives absorb, its regions, per
        region the ns each collective part gains (:mod:`.fused_norm`), and whether it absorbed any."""
        comms = reg["comm"].to_numpy()
        found = fusable(graph, comms, reg["consumer"].to_numpy())
        gain = {c: absorbed_part_ns(graph, ctx, ks, ranks, self.nano_batches, self.comm_sms)
                for c, (ks, ranks) in zip(comms.tolist(), found) if len(ks)}
        if not gain:
            raise TransformError(f"{self.name}: fuse_norm found no residual add or token norm right after an "
                                 f"all-reduce whose size is known; nothing to fuse")
        kept = [ks for ks, _ in found]
        n_kernels = int(sum(len(k) for k in kept))
        g, new_comms = remove_absorbed(graph, comms, kept, reason=f"{self.label()}: {n_kernels} residual adds and "
                                                                  f"norms now run inside {len(gain)} collectives")
        per_comm = dict(zip(new_comms.tolist(), (gain.get(c) for c in comms.tolist())))
        reg = _regions(g)
        got = [per_comm.get(int(c)) for c in reg["comm"].to_numpy()]
        return (g, reg, np.asarray([0 if x is None else x for x in got], dtype=np.int64),
                np.asarray([x is not None for x in got], dtype=bool))

    def match(self, graph: TaskGraph, ctx: TransformContext) -> np.ndarray:
        r = _regions(graph)
        found = np.concatenate([*r["segment"], r["comm"].to_numpy()]) if len(r) else np.empty(0, np.int64)
        return np.unique(np.concatenate([found, _same_stream_collectives(graph)[0]]))

    def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
        n = self.nano_batches
        if n == 1 and not self.fuse_norm:
            return graph
        if self.fuse_norm and not self.comm_sms:
            raise TransformError(f"{self.name}: fuse_norm needs comm_sms, the SMs the fused collective runs the "
                                 f"norm on (TokenWeave: 2-8)")
        phi, phi_comm = self.factors(graph, ctx)
        if graph.tasks["name"].astype(str).str.startswith(PART_NAME).any():
            raise TransformError(f"{self.name}: the graph's collectives are split already (overlap was applied "
                                 f"before); apply it once, with the nano-batches wanted")
        graph = detach_collectives(graph, reason=f"{self.label()}: the trace's collectives between compute kernels "
                                                 f"of one stream, moved to a stream of their own to be split")
        reg = _regions(graph)
        if reg.empty:
            raise TransformError(f"{self.name}: no collective between two kernels to overlap; apply tensor_parallel "
                                 f"or sequence_parallel first (they insert the collectives); a trace's own collectives "
                                 f"are split when they run on a compute stream between two forward kernels of a "
                                 f"one-rank graph")
        cost = ctx.require_cost(self.name)
        graph, reg, absorbed_ns, fused = self._absorb_norms(graph, ctx, reg) if self.fuse_norm \
            else (graph, reg, np.zeros(len(reg), dtype=np.int64), np.zeros(len(reg), dtype=bool))
        seg_all = np.unique(np.concatenate(list(reg["segment"])))
        graph = priced_by_transform(graph, seg_all, reason=f"{self.label()}: the nano-batches' interference is "
                                                           f"priced here")
        nano = batch_part_ns(cost, graph, seg_all, n)
        where = [np.searchsorted(seg_all, seg) for seg in reg["segment"]]
        per_seg = np.asarray([nano[w].sum() for w in where])
        comms = reg["comm"].to_numpy()
        comm_dur = [collective_part_ns(ctx, self.name, int(graph.tasks["dur_ns"].to_numpy()[c]), message, n,
                                       self.topology)
                    for c, message in zip(comms.tolist(), collective_messages(graph, comms))]
        parts = np.asarray([int(round(d * phi_comm)) + int(a) for d, a in zip(comm_dur, absorbed_ns)], dtype=np.int64)
        g = set_duration(graph, seg_all, nano, reason=f"{self.label()}: nano-batch 1 at 1/{n} of the activations")
        g = record_split(g, seg_all, WorkShare(flops=1 / n, activation_bytes=1 / n, weight_bytes=1.0,
                                               output_bytes=1 / n, rows=1 / n),
                         reason=f"{self.label()}: nano-batch 1 does 1/{n} of the segment's rows")
        g, nano_ids = splice_tasks(g, anchors=reg["producer"].tolist(), durs=[[int(s)] * (n - 1) for s in per_seg],
                                   name=f"nano-batch compute (x{phi:.2f} interference at full overlap)",
                                   deps=[[-1] * (n - 1)] * len(reg),
                                   reason=f"{self.label()}: nano-batches 2..{n} of each segment")
        if n > 1:   # later nano-batches follow what later transforms do to nano-batch 1 (a GPU move)
            g = set_follows(g, np.concatenate(nano_ids), 1.0,
                            of=[seg for seg in reg["segment"] for _ in range(n - 1)],
                            reason=f"{self.label()}: nano-batches 2..{n} at nano-batch 1's time")
        order = np.argsort(comms)
        g = set_duration(g, comms[order], parts[order], reason=f"{self.label()}: collective part 1/{n}")
        comm_ids = [np.empty(0, dtype=np.int64)] * len(reg)
        for which, what in ((~fused, ""), (fused, " with residual add + norm")):
            idx = np.flatnonzero(which)
            if not len(idx):
                continue
            g, ids = splice_tasks(g, anchors=comms[idx].tolist(), durs=[[int(parts[i])] * (n - 1) for i in idx],
                                  name=f"{PART_NAME}{what} (of {n}, x{phi_comm:.2f} interference)",
                                  deps=[nano_ids[i].tolist() for i in idx], kind=TaskKind.COMM,
                                  reason=f"{self.label()}: collective parts 2..{n}{what}")
            for i, part_ids in zip(idx.tolist(), ids):
                comm_ids[i] = part_ids
        src, dst = [], []
        follows = _follows(reg)
        for i in range(len(reg)):
            nxt = i + 1 < len(reg) and follows[i + 1]
            for j in range(n - 1):   # nano-batch j+2 of the next segment waits for collective part j+2
                src.append(int(comm_ids[i][j]))
                dst.append(int(nano_ids[i + 1][j]) if nxt else int(reg["consumer"].to_numpy()[i]))
        g = add_edges(g, src, dst, kind=EdgeKind.FLOW, reason=f"{self.label()}: nano-batch data dependencies")
        after = np.where(follows & (n > 1), np.arange(len(reg)) - 1, -1)
        return set_beside(g, segments=list(reg["segment"]), followers=nano_ids,
                          parts=[np.r_[c, ids] for c, ids in zip(comms.tolist(), comm_ids)], after=after.tolist(),
                          phi=phi, reason=f"{self.label()}: compute nano-batches slowed x{phi:.2f} at full overlap "
                                          f"with a collective part, by the fraction of their time beside one")
