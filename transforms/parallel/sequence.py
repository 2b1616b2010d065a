"""``sequence_parallel``: Ulysses, Ring and Torus (StreamFusion) attention for DiT / long context.

Sequence parallelism of degree P splits the N tokens of every block over P GPUs: token-wise
work (GEMMs, norms, elementwise) of a block runs on N/P tokens (weights whole), and attention
needs every token, which the three modes get differently (one representative rank modeled):

* **ulysses** (DeepSpeed-Ulysses, Jacobs et al. 2023): an all-to-all turns the sequence shards
  of Q, K, V into head shards before attention and one turns the output back after it; per GPU
  per layer ``4·N·h/P`` elements (:func:`ulysses_elements_per_gpu`); P ≤ heads. Attention runs
  on H/P heads of the full sequence: T/P. The all-to-alls are on the critical path.
* **ring** (Ring Attention, Liu et al. 2023): each GPU keeps its Q block and passes K, V blocks
  of N/P tokens around a ring in P−1 hops, each hop overlapped with attention on the block it
  holds; the step takes ``t_blk + (P−1)·max(t_blk, t_hop)`` with ``t_blk = T/P²``. Transfer is
  hidden when block compute ≥ block transfer, i.e. block size ``c ≥ e·F/(2·B)`` (= F/B for 2-byte
  elements; :func:`ring_min_block_tokens`). Across machines every hop is paced by the slowest link
  (the NIC).
* **torus** (StreamFusion, arXiv 2601.20273): topology-aware — Ulysses all-to-all inside each
  machine (G GPUs on NVLink), and across the M machines the K, V chunks of the other machines
  arrive by one-sided transfers (no sender/receiver handshake: only the first pays the message
  latency) overlapped with attention on the chunks already present:
  ``a2a_intra + t_c + (M−1)·max(t_c, t_x) + a2a_intra(O)``, ``t_c = T/(P·M)``.
* **usp** (Unified Sequence Parallelism, Fang & Zhao 2024; xDiT's default): Ulysses over
  ``ulysses_degree`` u GPUs (0 = the GPUs of one machine, xDiT/yunchang's ``use_ulysses_low``
  placement) and Ring over the r = P/u groups: all-to-alls among u, then ``r−1`` two-sided hops of
  the K, V block (``2·N·h_kv·e/P`` bytes), each overlapped with attention on the block held,
  ``t_c = T/(P·r)``; hops cross machines when P exceeds one machine. The baseline torus is
  compared with: the best USP that can run.

**Two-sided vs one-sided** (StreamFusion's point): a ring or usp hop is a NCCL send/recv — it
pays a handshake, the receiver's ready message before the data (one more zero-byte message
latency of the link, NCCL's rendezvous for large messages), and its kernel holds
``NCCL_P2P_CTAS`` = 4 SMs (send and receive on NCCL_NCHANNELS_PER_NET_PEER = 2 channels each,
one CTA per channel) while the attention block it overlaps computes, which slows that block by
``1/(1 − 4/SMs)``. Torus' one-sided chunks (NVSHMEM-style puts) pay neither.

**Merging the blocks' outputs**: attention computed in several K, V blocks (ring, usp with r > 1,
torus across machines) merges each block's output into a running one by its log-sum-exp (online
softmax), a memory-bound pass outside the attention kernel. As ring-flash-attention's
``_update_out_and_lse`` does it (zhuzilin/ring-flash-attention ``ring_flash_attn/utils.py``, the
ring under xDiT's USP): the running output in fp32 is read and written and the block's bf16 output
read, 10 bytes per output element (:data:`MERGE_BYTES_PER_OUTPUT_BYTE` = 5 per byte of the bf16
output); the first block's output is cast to fp32 and the result back, 12 bytes per element
(:data:`CAST_BYTES_PER_OUTPUT_BYTE` = 6). Each pass costs the device's fixed kernel latency plus its
bytes at the trace's measured memory bandwidth (:func:`online_softmax_merge_ns`); a received block
carries its merge, the last one the two casts.

**Heads**: Ulysses' all-to-all gives each GPU H/u heads, so u must divide the query heads, and
divide the KV heads or be a multiple of them (a KV head replicated); checked on the attention op's
recorded shapes over a tensor-parallel split before (``heads`` overrides) for ulysses (u = P), usp
(u) and torus (u = GPUs per machine).
K, V bytes are GQA-aware: the QKV output holds ``(H + 2·H_kv)·d`` features, K and V ``2·H_kv·d``;
when the head split u exceeds H_kv each GPU holds a replicated KV head (``ceil(H_kv/u)·u/H_kv``
more). A trace with a backward pass is refused (the gradients are not modelled).

All three are graph edits: collectives and transfers are COMM tasks on their own streams with
FLOW dependencies, block computations are tasks on the compute stream, so overlap is simulated.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from whatif.core import limits
from whatif.core.kernels import KernelClass
from whatif.core.work import WorkShare
from whatif.depgraph.graph import TaskGraph
from whatif.hardware.devices import find_device
from whatif.hardware.roofline import fixed_latency_ns
from whatif.hardware.topology import presets
from whatif.tracer.memory import RecordEdit

from ..base import Transform, TransformContext, TransformError
from ..edit import add_edges, set_duration, splice_tasks
from ..registry import register
from ..sharing import priced_by_transform
from .comm import (
    OnTopology,
    comm_sm_share,
    comm_stream,
    insert_tasks,
    next_on_resource,
    overlapped_compute_slowdown,
)
from .layers import backward_mask, find_blocks, gemm_io_bytes
from .memory import HeadSplit, block_heads_now, head_split
from .sharding import record_split
from .sp_memory import MODELLED_MODES, sequence_parallel_memory_edit
from .tensor import prev_on_resource

MODES = ("ulysses", "ring", "torus", "usp")
NCCL_P2P_CTAS = 4   # a hop's send and receive on NCCL_NCHANNELS_PER_NET_PEER = 2 channels each, one CTA per channel
MERGE_BYTES_PER_OUTPUT_BYTE = 5   # fp32 running output read + written (8 B) and the block's bf16 output (2 B)
CAST_BYTES_PER_OUTPUT_BYTE = 6    # first block's output to fp32 (2 + 4 B) and the result back (4 + 2 B)


def ulysses_elements_per_gpu(seq_len: int, hidden: int, degree: int) -> float:
    """Elements one GPU sends per layer in Ulysses: all-to-alls of Q, K, V and the output, each
    ``N·h/P`` per GPU (the DeepSpeed-Ulysses paper's ``4Nh/P``, counting the local share too)."""
    return 4 * seq_len * hidden / degree


def ring_block_flops(block_tokens: int, hidden: int) -> float:
    """FLOPs of attention of one Q block against one K/V block of ``c`` tokens: ``4·c²·h``."""
    return 4.0 * block_tokens ** 2 * hidden


def ring_block_bytes(block_tokens: int, hidden: int, elem_bytes: int = 2) -> float:
    """Bytes of one K and V block: ``2·c·h·e``."""
    return 2.0 * block_tokens * hidden * elem_bytes


def ring_min_block_tokens(flops_per_s: float, link_bytes_per_s: float, elem_bytes: int = 2) -> float:
    """Smallest block size ``c`` (tokens) whose compute hides its transfer:
    ``4c²h/F ≥ 2chE/B`` ⇔ ``c ≥ E·F/(2B)`` (``F/B`` for 2-byte elements)."""
    return elem_bytes * flops_per_s / (2.0 * link_bytes_per_s)


def ring_hidden(block_tokens: int, hidden: int, flops_per_s: float, link_bytes_per_s: float,
                elem_bytes: int = 2) -> bool:
    """True when one block's attention takes at least as long as its K/V transfer."""
    return ring_block_flops(block_tokens, hidden) / flops_per_s >= \
        ring_block_bytes(block_tokens, hidden, elem_bytes) / link_bytes_per_s


def online_softmax_merge_ns(ctx: TransformContext, graph: TaskGraph, output_bytes: float,
                            transform: str = "sequence_parallel") -> tuple[int, int]:
    """(one merge, the two casts) in ns for an attention output of ``output_bytes`` (bf16) per GPU:
    the recorded GPU's fixed kernel latency per pass plus the bytes at the trace's measured memory
    bandwidth (the cost model's; the catalog's achievable figure when the trace has too few
    memory-bound kernels)."""
    dev = find_device(ctx.device) if ctx.device else None
    fixed = fixed_latency_ns(dev)
    bw = ctx.require_cost(transform).memory_bandwidth_bytes_per_s(graph)
    merge = fixed + MERGE_BYTES_PER_OUTPUT_BYTE * output_bytes / bw * 1e9
    casts = 2 * fixed + CAST_BYTES_PER_OUTPUT_BYTE * output_bytes / bw * 1e9
    return int(round(merge)), int(round(casts))


def nccl_p2p_sm_share(ctx: TransformContext) -> float:
    """Share of the recorded GPU's SMs a two-sided NCCL send/recv holds while it runs:
    ``NCCL_P2P_CTAS`` thread blocks (one SM each) of its SMs (the hardware catalog); 0 when the GPU
    is not in the catalog."""
    return comm_sm_share(ctx, NCCL_P2P_CTAS)


@register
@dataclass
class SequenceParallel(OnTopology, Transform):
    name = "sequence_parallel"
    description = "Ulysses / Ring / Torus (StreamFusion) sequence-parallel attention of degree P"

    mode: str = field(default="ulysses", metadata={"help": "ulysses | ring | torus | usp"})
    degree: int = field(default=8, metadata={
        "minimum": 1, "help": "GPUs sharing the sequence (P)", "maximum": limits.MAX_GPUS})
    topology: str = field(default="dgx_h100", metadata={"help": "topology preset; P > GPUs per machine spans machines"})
    heads: int = field(default=0, metadata={"minimum": 0,
        "help": "attention heads (KV heads taken equal); 0 = from the attention op's recorded shapes"})
    ulysses_degree: int = field(default=0, metadata={"minimum": 0,
        "help": "usp: GPUs of the Ulysses group u (ring over P/u); 0 = the GPUs of one machine",
        "maximum": limits.MAX_GPUS})

    def match(self, graph: TaskGraph, ctx: TransformContext) -> np.ndarray:
        return find_blocks(graph)["task"].to_numpy(np.int64)

    def _layout(self) -> tuple[int, int]:
        machines = {name.value: topo.gpus_per_machine for name, topo in presets().items()}
        if self.topology not in machines:
            raise TransformError(f"{self.name}: unknown topology {self.topology!r} (presets: "
                                 f"{', '.join(machines)})")
        g = min(self.degree, machines[self.topology])
        if self.degree % g:
            raise TransformError(f"{self.name}: degree {self.degree} is not a multiple of the {g} GPUs per machine")
        return self.degree // g, g

    def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
        if self.mode not in MODES:
            raise TransformError(f"{self.name}: unknown mode {self.mode!r} (modes: {', '.join(MODES)})")
        machines, per = self._layout()
        blocks = find_blocks(graph)
        if blocks.empty:
            raise TransformError(f"{self.name}: found no transformer block (an attention kernel followed by a "
                                 f"GEMM); see docs/multi-gpu.md for the heuristic")
        if self.degree == 1:
            return graph
        self._forward_only(graph)
        heads, kv_heads = self._heads(graph, blocks)
        self._check_heads(heads, kv_heads, per)
        cost = ctx.require_cost(self.name)
        p = self.degree
        tasks = blocks["task"].to_numpy(np.int64)
        attention = (blocks["part"] == "attention").to_numpy()
        if self.attention_steps(machines, per) > 1:   # beside ring hops or torus transfers: priced below
            graph = priced_by_transform(graph, tasks[attention], reason=f"{self.label()}: the attention blocks' "
                                        f"interference with the hops is priced here (none for one-sided transfers)")
        facts = cost.kernel_facts(graph, tasks)
        nbytes = np.nan_to_num(np.asarray(facts["bytes"], dtype=float))
        gemm = facts["kernel_class"] == KernelClass.GEMM.value
        weight = np.where(gemm, np.nan_to_num(np.asarray(facts.get("weight_bytes", np.zeros(len(tasks))), float)), 0)
        inp, w, out = gemm_io_bytes(graph, tasks, nbytes, weight)
        flops = np.nan_to_num(np.asarray(facts["flops"], dtype=float))
        # token-wise work on N/P tokens (weights whole); attention: T/P for the whole core
        new_dur = cost.kernel_time_ns(graph, tasks, flops / p, inp / p + w + out / p, rows=1 / p)
        g = set_duration(graph, tasks, np.rint(new_dur).astype(np.int64),
                         reason=f"{self.label()}: block work on 1/{p} of the tokens")
        u = self.ulysses_group(per)
        token_share = WorkShare(flops=1 / p, activation_bytes=1 / p, weight_bytes=1.0, output_bytes=1 / p, rows=1 / p)
        head_share = WorkShare(flops=1 / p, activation_bytes=1 / p, weight_bytes=1.0, output_bytes=1 / p, heads=1 / u,
                               rows=1 / p)
        g = record_split(g, tasks, [head_share if a else token_share for a in attention],
                         reason=f"{self.label()}: each GPU's share of the block work (attention: 1/{u} of the heads)")
        b = blocks.assign(in_bytes=inp, out_bytes=out, dur=np.rint(new_dur).astype(np.int64))
        kv_share = 2 * kv_heads / (heads + 2 * kv_heads) if heads else 2 / 3
        if kv_heads and u > 1:   # fewer KV heads than the head split: each GPU holds a replicated one
            kv_share *= math.ceil(kv_heads / u) * u / kv_heads
        return self._attention(g, ctx, b, machines, per, kv_share)

    def memory_edit(self, graph: TaskGraph) -> RecordEdit | None:
        """One rank's allocator records under Ulysses, Ring or USP
        (:func:`~.sp_memory.sequence_parallel_memory_edit`); Torus is not modelled (None)."""
        if self.mode not in MODELLED_MODES or self.degree == 1:
            return None
        return sequence_parallel_memory_edit(self.recorded_trace(graph), self.degree, self.ulysses_ranks())

    def ulysses_ranks(self) -> int:
        """The ranks each Ulysses all-to-all spans (:meth:`ulysses_group` on the topology's machines).

        Raises
        ------
        TransformError : an unknown topology, or a degree that does not fill its machines.
        """
        return self.ulysses_group(self._layout()[1])

    def _forward_only(self, graph: TaskGraph) -> None:
        if backward_mask(graph).any():
            raise TransformError(f"{self.name}: models a forward pass (DiT or long-context inference); the trace has a "
                                 f"backward pass, whose sequence-parallel gradients are not modelled")

    def _heads(self, graph: TaskGraph, blocks: pd.DataFrame) -> tuple[int, int]:
        """(query heads, KV heads) one GPU computes: ``heads`` when given, else the recorded
        attention shapes over a tensor-parallel split before (:func:`~.memory.block_heads_now`);
        (0, 0) when unknown."""
        if self.heads:
            return self.heads, self.heads
        found = block_heads_now(graph, blocks)
        return (found[0], found[1]) if found else (0, 0)

    def ulysses_group(self, per: int) -> int:
        """GPUs over which heads are split: P (ulysses), u (usp), a machine's (torus), 1 (ring)."""
        if self.mode == "ulysses":
            return self.degree
        if self.mode == "usp":
            return self.ulysses_degree or per
        return per if self.mode == "torus" else 1

    def attention_steps(self, machines: int, per: int) -> int:
        """Blocks each GPU's attention is computed in: one per ring step (P/u for ring and usp), one
        per machine's chunk (torus), one for ulysses."""
        if self.mode in ("ring", "usp"):
            return self.degree // self.ulysses_group(per)
        return machines if self.mode == "torus" else 1

    def _check_heads(self, heads: int, kv_heads: int, per: int) -> None:
        u = self.ulysses_group(per)
        if self.mode == "usp" and (u < 1 or self.degree % u):
            raise TransformError(f"{self.name}: usp's ulysses_degree {u} must divide the degree {self.degree}")
        if not heads or u == 1:
            return
        split = head_split(heads, kv_heads, u)
        if split is HeadSplit.HEADS:
            raise TransformError(f"{self.name}: {self.mode} splits the {heads} attention heads over {u} GPUs, which "
                                 f"does not divide them (a ring, or a usp whose ulysses degree divides them, can run)")
        if split is HeadSplit.KV_HEADS:
            raise TransformError(f"{self.name}: {self.mode}'s {u}-way head split neither divides the {kv_heads} KV "
                                 f"heads nor is a multiple of them")

    def _price(self, ctx: TransformContext, kind: str, nbytes: float, ranks: int, per: int | None) -> int:
        cost = ctx.require_cost(self.name)
        return int(round(cost.collective_time_ns(kind, float(nbytes), ranks, self.topology, per)))

    def _attention(self, g: TaskGraph, ctx: TransformContext, b: pd.DataFrame, machines: int, per: int,
                   kv_share: float) -> TaskGraph:
        p = self.degree
        sm_share = nccl_p2p_sm_share(ctx)
        every = np.arange(len(g.tasks))
        succ, pred = next_on_resource(g, every), prev_on_resource(g, every)
        a2a_plan: list[tuple[int, int, int, int, str, int]] = []   # (key, after, before, dur, name, rank)
        splice_anchor: list = []
        core_dur: dict[int, int] = {}
        steps = self.attention_steps(machines, per)
        for _, blk in b.groupby(["rank", "block"]):
            core = blk[blk["part"] == "attention"]
            if core.empty:
                continue
            first, last = int(core["task"].min()), int(core["task"].max())
            t_attn = int(core["dur"].sum())                                  # T/P on this GPU
            qkv = float(blk.loc[blk["part"] == "qkv", "out_bytes"].sum()) / p   # Q, K, V per GPU
            o = float(blk.loc[blk["part"] == "attn_out", "in_bytes"].sum()) / p
            kv = qkv * kv_share                                              # K, V of the QKV output
            before, after = int(pred[first]), int(succ[last])
            rank = int(blk["rank"].to_numpy()[0])
            if self.mode == "ulysses":
                a2a_plan.append((first * 2, before, first, self._price(ctx, "all_to_all", qkv, p, per),
                                 f"qkv ({qkv / 2**20:.2f} MiB x{p})", rank))
                a2a_plan.append((last * 2 + 1, last, after, self._price(ctx, "all_to_all", o, p, per),
                                 f"out ({o / 2**20:.2f} MiB x{p})", rank))
                continue
            qkv_a2a = -1   # the key of the all-to-all whose output the first transfer sends (-1: none)
            if self.mode in ("ring", "usp"):
                u = self.ulysses_group(per)
                if u > 1:
                    qkv_a2a = first * 2
                    a2a_plan.append((first * 2, before, first, self._price(ctx, "all_to_all", qkv, u, min(u, per)),
                                     f"qkv ({qkv / 2**20:.2f} MiB x{u})", rank))
                    a2a_plan.append((last * 2 + 1, last, after, self._price(ctx, "all_to_all", o, u, min(u, per)),
                                     f"out ({o / 2**20:.2f} MiB x{u})", rank))
                hop_per = 1 if machines > 1 else 2
                handshake = self._price(ctx, "send_recv", 0.0, 2, hop_per)   # the receiver's ready message
                hops = [self._price(ctx, "send_recv", kv, 2, hop_per) + handshake] * (steps - 1)
            else:   # torus: intra-machine all-to-all, inter-machine one-sided chunks
                qkv_a2a = first * 2
                a2a_plan.append((first * 2, before, first, self._price(ctx, "all_to_all", qkv, per, per),
                                 f"qkv ({qkv / 2**20:.2f} MiB x{per})", rank))
                a2a_plan.append((last * 2 + 1, last, after, self._price(ctx, "all_to_all", o, per, per),
                                 f"out ({o / 2**20:.2f} MiB x{per})", rank))
                chunk = kv   # K, V of the other machine's N/M tokens for this GPU's H/G heads: 2·N·h·e/P
                full = self._price(ctx, "send_recv", chunk, 2, 1) if machines > 1 else 0
                latency = self._price(ctx, "send_recv", 0.0, 2, 1) if machines > 1 else 0
                hops = [full] + [max(full - latency, 0)] * (machines - 2) if machines > 1 else []
            share = max(t_attn // steps, 1)
            # a two-sided hop's NCCL kernel holds SMs while the block it overlaps computes
            slow = overlapped_compute_slowdown(sm_share) if self.mode != "torus" and hops else 1.0
            for tk in core["task"].to_numpy(np.int64).tolist():
                core_dur[tk] = int(round(int(g.tasks["dur_ns"].to_numpy()[int(tk)]) // steps * slow))
            merge, casts = online_softmax_merge_ns(ctx, g, o, self.name) if hops else (0, 0)
            blocks_after = [int(round(share * slow)) + merge] * (len(hops) - 1) + [share + merge + casts] \
                if hops else []
            splice_anchor.append((rank, last, before, blocks_after, hops, qkv_a2a))
        if core_dur:
            ids = np.asarray(sorted(core_dur), dtype=np.int64)
            g = set_duration(g, ids, np.asarray([core_dur[k] for k in ids.tolist()]),
                             reason=f"{self.label()}: attention on the local block")
            if steps > 1:
                g = record_split(g, ids, WorkShare(1 / steps, 1 / steps, 1.0, 1 / steps),
                                 reason=f"{self.label()}: the local block's share of the attention")
        a2a_ids: dict[int, int] = {}
        for rank in sorted({x[5] for x in a2a_plan}):
            g, res = comm_stream(g, rank, f"sp {self.mode} all-to-all")
            plan = sorted(x for x in a2a_plan if x[5] == rank)
            g, ids = insert_tasks(g, resource=res, after=[x[1] for x in plan], before=[x[2] for x in plan],
                                  dur_ns=[x[3] for x in plan], names=[f"sp all_to_all {x[4]}" for x in plan],
                                  reason=f"{self.label()}: {len(plan)} all-to-alls",
                                  priced_on=self.topology_gpu(), ctx=ctx)
            a2a_ids.update({x[0]: int(i) for x, i in zip(plan, ids.tolist())})
        if any(x[4] for x in splice_anchor):
            g = self._blocks_and_hops(g, splice_anchor, a2a_ids, ctx)
        return g

    def _blocks_and_hops(self, g: TaskGraph, plan: list[tuple[int, int, int, list[int], list[int], int]],
                         a2a_ids: dict[int, int], ctx: TransformContext) -> TaskGraph:
        """Hop transfers chained on a stream, the first of each block after the all-to-all whose
        output it sends (usp, torus); block computations spliced after the local one, each waiting
        for its hop."""
        label = "sp torus one-sided" if self.mode == "torus" else f"sp {self.mode} ring hops"
        hop_ids: list[np.ndarray] = [np.empty(0, np.int64)] * len(plan)
        for rank in sorted({x[0] for x in plan}):
            mine = [i for i, x in enumerate(plan) if x[0] == rank]
            g, res = comm_stream(g, rank, label)
            after, durs, names, extra = [], [], [], []
            for i in mine:
                hops, pre = plan[i][4], plan[i][2]
                after += [pre] + [-1] * (len(hops) - 1) if hops else []
                extra += [[a2a_ids.get(plan[i][5], -1)]] + [[]] * (len(hops) - 1) if hops else []
                durs += hops
                names += [f"{label} {j + 1}/{len(hops)}" for j in range(len(hops))]
            g, ids = insert_tasks(g, resource=res, after=after, before=[-1] * len(durs), dur_ns=durs, names=names,
                                  reason=f"{self.label()}: {len(durs)} transfers", extra_after=extra,
                                  priced_on=self.topology_gpu(), ctx=ctx)
            k = 0
            for i in mine:
                hop_ids[i] = ids[k:k + len(plan[i][4])]
                k += len(plan[i][4])
        g, blocks = splice_tasks(g, anchors=[x[1] for x in plan], durs=[x[3] for x in plan],
                                 name=f"{self.mode} attention block", deps=[h.tolist() for h in hop_ids],
                                 reason=f"{self.label()}: attention on the received blocks")
        # the output all-to-all sends the attention output: all of it, the received blocks' included
        out = [(int(ids[-1]), a2a_ids[x[1] * 2 + 1]) for x, ids in zip(plan, blocks)
               if len(ids) and x[1] * 2 + 1 in a2a_ids]
        if out:
            g = add_edges(g, [s for s, _ in out], [d for _, d in out],
                          reason=f"{self.label()}: the output all-to-all after the last received block")
        return g

