"""sequence_parallel (Ulysses, Ring, Torus): published volumes and graph changes on a DiT-like trace."""
from __future__ import annotations

import numpy as np
import pytest
from _llm_tracegen import llm_trace
from test_parallel import step_ns, transformer_trace

from whatif.api import analyze, make_context
from whatif.depgraph.graph import EdgeKind, TaskKind
from whatif.hardware.devices import find_device
from whatif.hardware.roofline import fixed_latency_ns
from whatif.predictors.replay import replay
from whatif.transforms.base import TransformError
from whatif.transforms.parallel.layers import find_blocks
from whatif.transforms.parallel.sequence import (
    SequenceParallel,
    nccl_p2p_sm_share,
    online_softmax_merge_ns,
    ring_block_bytes,
    ring_block_flops,
    ring_hidden,
    ring_min_block_tokens,
    ulysses_elements_per_gpu,
)

N, H = 32768, 3072     # DiT-like: 32k tokens (e.g. video latents), hidden 3072 = 24 heads x 128


def test_published_volumes() -> None:
    assert ulysses_elements_per_gpu(N, H, 8) == 4 * N * H / 8
    f, b = 989e12, 450e9                 # H100 bf16 peak, NVLink per direction
    c = ring_min_block_tokens(f, b)
    assert c == pytest.approx(f / b)     # block size c >= F/B for 2-byte elements
    assert ring_hidden(int(c) + 1, H, f, b) and not ring_hidden(int(c) - 1, H, f, b)
    assert ring_block_flops(1024, H) / ring_block_bytes(1024, H) == pytest.approx(1024 / 1)


@pytest.fixture(scope="module")
def dit(tmp_path_factory):
    return analyze(transformer_trace(tmp_path_factory.mktemp("sp") / "dit.json.gz", layers=2, tokens=N, hidden=H,
                                     ffn=4 * H))


def comm_names(g) -> list[str]:
    return g.tasks.loc[g.tasks["kind"] == int(TaskKind.COMM), "name"].astype(str).tolist()


def test_ulysses_graph(dit) -> None:
    g, ctx = dit.graph, make_context(dit.trace)
    h = SequenceParallel(mode="ulysses", degree=8, topology="dgx_h100").apply(g, ctx)
    names = comm_names(h)
    assert len(names) == 4          # two all-to-alls per block
    qkv_mib = N * 3 * H * 2 / 8 / 2**20
    assert sum(f"qkv ({qkv_mib:.2f} MiB x8)" in n for n in names) == 2
    assert sum(f"out ({N * H * 2 / 8 / 2**20:.2f} MiB x8)" in n for n in names) == 2
    # Q,K,V + O per GPU = 4·N·h/P elements: the published Ulysses volume
    assert (qkv_mib + N * H * 2 / 8 / 2**20) * 2**20 / 2 == ulysses_elements_per_gpu(N, H, 8)
    r = replay(h)
    attn = find_blocks(g).query("part == 'attention'")["task"].to_numpy()
    comm = np.flatnonzero(h.tasks["kind"].to_numpy() == int(TaskKind.COMM))
    assert r.start_ns[attn[0]] >= r.end_ns[comm[0]] and r.start_ns[comm[1]] >= r.end_ns[attn[0]]
    assert step_ns(h) < step_ns(g) / 4
    with pytest.raises(TransformError, match="heads"):
        SequenceParallel(mode="ulysses", degree=32, heads=24).apply(g, ctx)


def test_ring_graph_hides_transfer_on_nvlink(dit) -> None:
    g, ctx = dit.graph, make_context(dit.trace)
    h = SequenceParallel(mode="ring", degree=8, topology="dgx_h100").apply(g, ctx)
    names = comm_names(h)
    assert len(names) == 2 * 7 and all("ring hops" in n for n in names)
    blocks = h.tasks["name"].astype(str).str.contains("ring attention block").to_numpy()
    assert blocks.sum() == 2 * 7
    hop = np.flatnonzero(h.tasks["kind"].to_numpy() == int(TaskKind.COMM))
    e = h.edges
    assert all(((e["src"] == x) & (e["kind"] == int(EdgeKind.FLOW))).any() for x in hop)   # each hop feeds a block
    # 4k-token blocks on H100/NVLink: compute >= transfer, so the ring costs about T/P
    blk = int(h.tasks.loc[blocks, "dur_ns"].iat[0])
    assert max(int(h.tasks["dur_ns"].iat[x]) for x in hop) < blk
    assert step_ns(h) < step_ns(g) / 4


def test_three_modes_across_two_machines(dit) -> None:
    g, ctx = dit.graph, make_context(dit.trace)
    t = {m: step_ns(SequenceParallel(mode=m, degree=16, topology="dgx_h100").apply(g, ctx))
         for m in ("ulysses", "ring", "torus")}
    h = SequenceParallel(mode="torus", degree=16, topology="dgx_h100").apply(g, ctx)
    names = comm_names(h)
    assert sum("all_to_all" in n for n in names) == 4 and sum("one-sided" in n for n in names) == 2
    assert all(v < step_ns(g) for v in t.values())
    assert t["torus"] <= min(t["ulysses"], t["ring"])          # StreamFusion's point
    with pytest.raises(TransformError, match="mode"):
        SequenceParallel(mode="spiral").apply(g, ctx)
    with pytest.raises(TransformError, match="multiple"):
        SequenceParallel(mode="ring", degree=12).apply(g, ctx)


def test_usp_volume_feasibility_and_heads(dit) -> None:
    """USP over 2 machines of 8: Ulysses inside a machine (all-to-alls among 8), a ring of 2 across
    (one hop per block); 24 heads allow a Ulysses group of 8 but not of 16."""
    g, ctx = dit.graph, make_context(dit.trace)
    h = SequenceParallel(mode="usp", degree=16, topology="dgx_h100", heads=24).apply(g, ctx)
    names = comm_names(h)
    qkv_mib = N * 3 * H * 2 / 16 / 2**20
    assert sum(f"qkv ({qkv_mib:.2f} MiB x8)" in n for n in names) == 2 and sum("x8" in n for n in names) == 4
    assert sum("usp ring hops" in n for n in names) == 2
    assert step_ns(h) < step_ns(g)
    with pytest.raises(TransformError, match="24 attention heads over 16 GPUs"):
        SequenceParallel(mode="ulysses", degree=16, heads=24).apply(g, ctx)
    with pytest.raises(TransformError, match="24 attention heads over 16 GPUs"):
        SequenceParallel(mode="usp", degree=32, ulysses_degree=16, heads=24).apply(g, ctx)
    with pytest.raises(TransformError, match="must divide the degree"):
        SequenceParallel(mode="usp", degree=16, ulysses_degree=3).apply(g, ctx)
    SequenceParallel(mode="torus", degree=16, heads=24).apply(g, ctx)       # 8-way split inside a machine
    ring = SequenceParallel(mode="usp", degree=16, ulysses_degree=1).apply(g, ctx)   # USP(1x16) = Ring-16
    assert step_ns(ring) == step_ns(SequenceParallel(mode="ring", degree=16).apply(g, ctx))


def test_ring_bytes_are_gqa_aware(tmp_path) -> None:
    """K and V are 2·H_kv/(H + 2·H_kv) of the QKV output: with 8 KV heads of 32, a quarter of MHA's."""
    from _llm_tracegen import llm_trace

    hop = {}
    for kv in (32, 8):
        a = analyze(llm_trace(tmp_path / f"kv{kv}.json.gz", new_tokens=16384, kv_tokens=16384, layers=1,
                              kv_heads=kv, steps=1))
        h = SequenceParallel(mode="ring", degree=16, topology="dgx_h100").apply(a.graph, make_context(a.trace))
        comm = h.tasks[h.tasks["kind"] == int(TaskKind.COMM)]
        hop[kv] = int(comm["dur_ns"].max())
    assert hop[8] < 0.4 * hop[32]
    with pytest.raises(TransformError, match="32 attention heads over 64 GPUs"):   # heads read from the shapes
        SequenceParallel(mode="ulysses", degree=64).apply(a.graph, make_context(a.trace))


def test_head_split_after_tensor_parallel_sees_the_rank_heads(tmp_path) -> None:
    """After tensor_parallel 4, a rank computes 8 of the 32 query heads and 2 of the 8 KV heads:
    a 16-way Ulysses split no longer divides them (it did on the whole model), a 4-way one does (its
    KV heads replicated), and tensor parallelism's head share is recorded in the work state."""
    from _llm_tracegen import llm_trace

    from whatif.core.work import current_shares
    from whatif.transforms.parallel.memory import block_heads, block_heads_now
    from whatif.transforms.parallel.tensor import TensorParallel

    a = analyze(llm_trace(tmp_path / "gqa.json.gz", new_tokens=4096, kv_tokens=4096, layers=2, kv_heads=8, steps=1))
    ctx = make_context(a.trace)
    SequenceParallel(mode="ulysses", degree=16).apply(a.graph, ctx)
    tp = TensorParallel(degree=4, topology="dgx_h100").apply(a.graph, ctx)
    blocks = find_blocks(tp)
    assert block_heads(tp, blocks)[:2] == (32, 8) and block_heads_now(tp, blocks)[:2] == (8, 2)
    attn = blocks.loc[blocks["part"] == "attention", "task"].to_numpy()
    assert {s.heads for s in current_shares(tp.tasks, attn)} == {0.25}
    with pytest.raises(TransformError, match="8 attention heads over 16 GPUs"):
        SequenceParallel(mode="ulysses", degree=16).apply(tp, ctx)
    SequenceParallel(mode="ulysses", degree=4).apply(tp, ctx)
    with pytest.raises(TransformError, match="degree 16 does not divide the 8 attention heads"):
        TensorParallel(degree=16, topology="dgx_h100").apply(tp, ctx)           # TP after TP
    sp = SequenceParallel(mode="ulysses", degree=16).apply(a.graph, ctx)
    assert block_heads_now(sp, find_blocks(sp))[:2] == (2, 1)
    with pytest.raises(TransformError, match="degree 4 does not divide the 2 attention heads"):
        TensorParallel(degree=4, topology="dgx_h100").apply(sp, ctx)            # TP after Ulysses
    ring = SequenceParallel(mode="ring", degree=4).apply(a.graph, ctx)          # a ring splits no heads
    assert block_heads_now(ring, find_blocks(ring))[:2] == (32, 8)


def test_two_sided_hops_pay_a_handshake_and_sms(dit) -> None:
    """A usp ring hop is a two-sided NCCL send/recv: the K, V transfer plus the receiver's ready
    message, and its kernel's 4 SMs slow the attention block it overlaps; torus' one-sided chunk
    of the same bytes pays only the transfer, and its overlapped blocks keep every SM."""
    from whatif.hardware.devices import find_device
    from whatif.transforms.parallel.sequence import NCCL_P2P_CTAS, nccl_p2p_sm_share

    g, ctx = dit.graph, make_context(dit.trace)       # an A100 trace: on the A100 preset, no link move
    share = nccl_p2p_sm_share(ctx)
    assert share == NCCL_P2P_CTAS / find_device(ctx.device).sm_count and 0 < share < 0.05
    usp = SequenceParallel(mode="usp", degree=16, topology="dgx_a100", heads=24).apply(g, ctx)
    torus = SequenceParallel(mode="torus", degree=16, topology="dgx_a100", heads=24).apply(g, ctx)

    def hop_ns(h) -> int:
        comm = h.tasks[h.tasks["kind"].to_numpy() == int(TaskKind.COMM)]
        return int(comm.loc[comm["name"].str.contains("hops|one-sided"), "dur_ns"].iloc[0])

    def local_attention_ns(h) -> int:
        b = find_blocks(h)
        return int(h.tasks["dur_ns"].to_numpy()[b.loc[b["part"] == "attention", "task"].to_numpy()].sum())

    latency = int(round(ctx.require_cost("t").collective_time_ns("send_recv", 0.0, 2, "dgx_a100", 1)))
    assert hop_ns(usp) == hop_ns(torus) + latency                 # same bytes; the handshake on top
    assert local_attention_ns(usp) == pytest.approx(local_attention_ns(torus) / (1 - share), rel=0.01)
    assert step_ns(torus) < step_ns(usp)


@pytest.mark.parametrize("mode", ["usp", "torus"])
def test_transfers_wait_for_the_all_to_all_and_the_output_for_every_block(dit, mode) -> None:
    """A usp ring hop (and a torus transfer) sends K, V as the all-to-all leaves them, so the first
    one waits for that all-to-all; the output all-to-all sends the attention output, so it waits
    for the last block computed on received K, V. Until 2026-11-28 the first hop ran beside the
    all-to-all and the output all-to-all beside the received blocks."""
    g, ctx = dit.graph, make_context(dit.trace)
    h = SequenceParallel(mode=mode, degree=16, topology="dgx_h100", heads=24).apply(g, ctx)
    r = replay(h)
    names = h.tasks["name"].astype(str)
    rank0 = (h.tasks["rank"] == h.tasks["rank"].min()).to_numpy()

    def ids(pattern: str) -> np.ndarray:
        return np.flatnonzero(names.str.contains(pattern, regex=False).to_numpy() & rank0)

    qkv, out = ids("sp all_to_all qkv"), ids("sp all_to_all out")
    first_hops = ids("1/")
    first_hops = first_hops[h.tasks["kind"].to_numpy()[first_hops] == int(TaskKind.COMM)]
    blocks = ids(f"{mode} attention block")
    assert len(qkv) == len(out) == len(first_hops) == 2 and len(blocks) >= 2
    assert (r.start_ns[np.sort(first_hops)] >= r.end_ns[np.sort(qkv)]).all()
    per_block = len(blocks) // len(out)            # the received blocks of one transformer block, in order
    last_blocks = np.sort(blocks).reshape(len(out), per_block)[:, -1]
    assert (r.start_ns[np.sort(out)] >= r.end_ns[last_blocks]).all()


def test_received_blocks_pay_the_online_softmax_merge(dit) -> None:
    """Each block computed on received K, V merges its output into the running one (fp32, 10 bytes
    per output element) and the last also pays the two casts: the ring's blocks exceed the local
    block's share by exactly that, Ulysses (one block) pays none, and the merge grows with the
    output bytes at the trace's memory bandwidth."""
    g, ctx = dit.graph, make_context(dit.trace)
    h = SequenceParallel(mode="ring", degree=4, topology="dgx_h100").apply(g, ctx)
    t = h.tasks
    rank0 = (t["rank"] == t["rank"].min()).to_numpy()
    names = t["name"].astype(str)
    received = np.flatnonzero(names.str.contains("ring attention block").to_numpy() & rank0)
    local = np.flatnonzero(names.str.contains("flash").to_numpy() & rank0 & (t["kind"] == int(TaskKind.KERNEL)))
    out_bytes = N * H * 2 / 4                                    # bf16 attention output per GPU
    merge, casts = online_softmax_merge_ns(ctx, h, out_bytes)
    bw = ctx.require_cost("test").memory_bandwidth_bytes_per_s(h)
    assert merge - merge_fixed(ctx) == pytest.approx(10 * (out_bytes / 2) / bw * 1e9, abs=1)
    durs = t["dur_ns"].to_numpy()
    per_layer = received.reshape(2, 3)                           # 2 blocks, P - 1 = 3 received each
    beside_hop = durs[local[0]]                                  # the local block, slowed by the hop's SMs
    assert durs[per_layer[0, 0]] - merge == pytest.approx(beside_hop, abs=2)
    alone = beside_hop * (1 - nccl_p2p_sm_share(ctx))            # the last: no hop beside it, the casts added
    assert durs[per_layer[0, 2]] - merge - casts == pytest.approx(alone, abs=2)
    two = online_softmax_merge_ns(ctx, h, 2 * out_bytes)
    assert two[0] - merge == pytest.approx(merge - merge_fixed(ctx), abs=1)
    u = SequenceParallel(mode="ulysses", degree=4, topology="dgx_h100", heads=24).apply(g, ctx)
    assert not u.tasks["name"].astype(str).str.contains("attention block").any()


def merge_fixed(ctx) -> float:
    return fixed_latency_ns(find_device(ctx.device) if ctx.device else None)


def test_each_rank_gets_its_own_all_to_alls(tmp_path) -> None:
    """A two-rank graph: every rank's stream holds its own blocks' all-to-alls, once (until
    2026-11-28 every rank's all-to-alls were inserted on each rank's stream)."""
    run = tmp_path / "two_ranks"
    run.mkdir()
    for r in (0, 1):
        llm_trace(run / f"rank{r}.json.gz", new_tokens=4096, kv_tokens=4096, layers=2, hidden=3072, heads=24,
                  ffn=8192, steps=1, rank=r, world_size=2)
    a = analyze(run)
    usp = SequenceParallel(mode="usp", degree=4, ulysses_degree=2, topology="dgx_h100")
    h = usp.apply(a.graph, make_context(a.trace))
    t = h.tasks
    a2a = t["name"].astype(str).str.startswith("sp all_to_all").to_numpy()
    for rank in (0, 1):
        mine = a2a & (t["rank"] == rank).to_numpy()
        assert mine.sum() == 4                                     # 2 blocks x (QKV, output)
        assert set(h.resources.loc[t["resource"].to_numpy()[mine], "rank"]) == {rank}
