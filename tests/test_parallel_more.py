"""pipeline_parallel, data_parallel, overlap and reshard on hand-made traces (and shared ones)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _llm_tracegen import llm_trace

from whatif.api import analyze, make_context
from whatif.depgraph.graph import EdgeKind, TaskKind
from whatif.predictors.replay import replay
from whatif.predictors.steps import step_times
from whatif.transforms import registry
from whatif.transforms.base import TransformError
from whatif.transforms.parallel.data import DataParallel, bucket_sizes
from whatif.transforms.parallel.layers import backward_mask, find_blocks
from whatif.transforms.parallel.overlap import Overlap
from whatif.transforms.parallel.pipeline import (
    PipelineParallel,
    bubble_fraction,
    pipelined_step_ns,
)
from whatif.transforms.parallel.reshard import interleaved_static_rps, plans, search_reshard, step_phases
from whatif.transforms.parallel.tensor import TensorParallel
from whatif.transforms.sharing import DEFAULT_INTERFERENCE, calibrated_interference


def step_ns(graph) -> int:
    return int(step_times(replay(graph))["predicted_ns"].sum())


def kinds(graph, kind: TaskKind) -> np.ndarray:
    return np.flatnonzero(graph.tasks["kind"].to_numpy() == int(kind))


@pytest.fixture(scope="module")
def train(tmp_path_factory):
    return analyze(llm_trace(tmp_path_factory.mktemp("pp") / "train.json.gz", new_tokens=1024, kv_tokens=1024,
                             layers=4, backward=True, steps=1))


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    return analyze(llm_trace(tmp_path_factory.mktemp("pp") / "serve.json.gz", new_tokens=512, layers=4, steps=1))


def test_formulas() -> None:
    assert bubble_fraction(4, 4) == pytest.approx(3 / 7) and bubble_fraction(1, 8) == 0
    assert pipelined_step_ns(100.0, 4, 4) == pytest.approx(175.0)
    assert pipelined_step_ns(100.0, 4, 4) * (1 - bubble_fraction(4, 4)) == pytest.approx(100.0)
    assert bucket_sizes(60 * 2**20, 25 * 2**20) == [25 * 2**20, 25 * 2**20, 10 * 2**20]
    assert plans(8) == [(1, 8), (2, 4), (4, 2), (8, 1)]


def test_pipeline_keeps_one_stage_and_bubbles_shrink(train) -> None:
    g0, ctx = train.graph, make_context(train.trace)
    blocks0 = find_blocks(g0)["block"].nunique()
    steps = {}
    for m in (1, 4, 16):
        g = PipelineParallel(degree=4, micro_batches=m).apply(g0, ctx)
        assert find_blocks(g)["block"].nunique() == blocks0 // 4
        bubble = g.tasks[g.tasks["name"].astype(str).str.startswith("pipeline bubble")]
        assert len(bubble) == 1
        steps[m] = step_ns(g)
    assert steps[1] > steps[4] > steps[16]                                   # bubbles shrink with m
    g = PipelineParallel(degree=4, micro_batches=4, stage=1).apply(g0, ctx)  # a middle stage: recv+send, both ways
    comm = g.tasks.iloc[kinds(g, TaskKind.COMM)]["name"].astype(str)
    assert len(comm) == 4
    assert comm.str.contains("recv activation").sum() == 1 and comm.str.contains("send gradient").sum() == 1
    last = PipelineParallel(degree=4, micro_batches=4).apply(g0, ctx)
    assert len(kinds(last, TaskKind.COMM)) == 2                              # last stage: recv act, send grad
    with pytest.raises(TransformError, match="schedule"):
        PipelineParallel(schedule="zigzag").apply(g0, ctx)
    with pytest.raises(TransformError, match="empty"):
        PipelineParallel(degree=8).apply(g0, ctx)


def _hop_kernel(g, hop: str, into: bool) -> str:
    """The kernel a ``pp <hop>`` transfer feeds (``into``) or follows."""
    names, kinds_, edges = g.tasks["name"].astype(str), g.tasks["kind"].to_numpy(), g.edges
    (i,) = np.flatnonzero(names.str.startswith(f"pp {hop}").to_numpy())
    e = edges[(edges["src"] == i) if into else (edges["dst"] == i)]
    other = e["dst" if into else "src"].to_numpy()
    return str(names.iloc[int(other[kinds_[other] == int(TaskKind.KERNEL)][0])])


def test_pipeline_training_stages_keep_their_own_backward(train) -> None:
    """The backward runs the layers in reverse: each stage keeps its blocks' gradient GEMMs and
    attention backward (mapped to the forward's blocks), the last stage also the loss backward
    before them, stage 0 the embedding backward after them; the optimizer is scaled to 1/p. Every
    stage's graph replays: its stage-boundary transfers are in time order on the comm stream
    (activation in, out, gradient in, out), the optimizer after the backward is no forward kernel."""
    from whatif.transforms.parallel.layers import backward_blocks, backward_mask
    from whatif.transforms.parallel.pipeline import backward_stage_plan

    g0, ctx = train.graph, make_context(train.trace)
    kern = g0.tasks["kind"].to_numpy() == int(TaskKind.KERNEL)
    names = g0.tasks["name"].astype(str).to_numpy()
    bw = np.flatnonzero(backward_mask(g0) & kern)
    mapped = backward_blocks(g0, find_blocks(g0))
    per_block = mapped.groupby("block")["task"].apply(set)
    blocks = sorted(per_block.index)                      # 4 blocks, block i = layer i
    kept_total = []
    for stage in range(4):
        other, tail = backward_stage_plan(g0, 4, stage)
        kept = set(bw.tolist()) - set(other.tolist())
        kept_total.append(kept)
        mine = per_block[blocks[stage]]
        assert mine <= kept and not any(per_block[b] & kept for b in blocks if b != blocks[stage])
        extra = {str(n) for n in names[sorted(kept - mine)]}
        assert any("nll_loss_backward" in n for n in extra) == (stage == 3)
        assert any("embedding_backward" in n for n in extra) == (stage == 0)
        assert [str(n) for n in names[tail]] == ["void at::native::multi_tensor_apply_kernel<adam>"]
        g = PipelineParallel(degree=4, micro_batches=4, stage=stage).apply(g0, ctx)
        assert step_ns(g) > 0                               # replays: no cycle through the comm stream
        assert int(g.tasks["name"].astype(str).str.contains("_grad_").sum()) == 8   # one block's 4 gradient pairs
        assert int(backward_mask(g).sum()) == len(kept)                             # the mark survives the removals
        if stage < 3:
            assert "down_grad_input" in _hop_kernel(g, "recv gradient", into=True)   # before the first gradient
            assert "_grad_" not in _hop_kernel(g, "send activation", into=False)     # after the forward's last kernel
        if stage > 0:
            assert "qkv_grad_weight" in _hop_kernel(g, "send gradient", into=False)  # after the last gradient
    assert set().union(*kept_total) == set(bw.tolist()) and sum(map(len, kept_total)) == len(bw)   # a partition


def test_pipeline_backward_per_stage_over_two_steps(tmp_path) -> None:
    """Two training steps, 6 layers over 4 stages (1, 2, 1, 2 blocks): each stage keeps its blocks'
    gradient GEMMs in both steps, the stages' backward kernels partition the whole backward."""
    from whatif.transforms.parallel.layers import backward_mask
    from whatif.transforms.parallel.pipeline import backward_stage_plan

    a = analyze(llm_trace(tmp_path / "two.json.gz", new_tokens=512, kv_tokens=512, layers=6, backward=True, steps=2))
    g0, ctx = a.graph, make_context(a.trace)
    bw = set(np.flatnonzero(backward_mask(g0) & (g0.tasks["kind"].to_numpy() == int(TaskKind.KERNEL))).tolist())
    kept_all = []
    for stage, blocks in enumerate((1, 2, 1, 2)):
        other, _ = backward_stage_plan(g0, 4, stage)
        kept_all.append(bw - set(other.tolist()))
        g = PipelineParallel(degree=4, micro_batches=2, stage=stage).apply(g0, ctx)
        assert int(g.tasks["name"].astype(str).str.contains("_grad_").sum()) == 2 * 8 * blocks
        assert step_ns(g) > 0
    assert set().union(*kept_all) == bw and sum(map(len, kept_all)) == len(bw)


def test_pipeline_after_tensor_parallel_keeps_its_layers_all_reduces(serve) -> None:
    """TP 2 then PP 2 (serving, 2 micro-batches) on 4 layers: the stage keeps the all-reduces of its
    2 layers (2 each), not every layer's, and each is priced as 2 all-reduces of half the message
    (each paying the latency again)."""
    from whatif.transforms.parallel.comm import Collective

    g0, ctx = serve.graph, make_context(serve.trace)
    tp = TensorParallel(degree=2, topology="dgx_h100").apply(g0, ctx)
    tp_comm = kinds(tp, TaskKind.COMM)
    assert len(tp_comm) == 8
    g = PipelineParallel(degree=2, schedule="serving", micro_batches=2, topology="dgx_h100").apply(tp, ctx)
    names = g.tasks["name"].astype(str)
    ar = np.flatnonzero(names.str.startswith("tp all_reduce").to_numpy())
    assert len(ar) == 4                                                   # 2 layers x 2 all-reduces
    full = int(tp.tasks["dur_ns"].to_numpy()[tp_comm[0]])
    nbytes = 512 * 4096 * 2
    half = Collective("all_reduce", nbytes / 2, 2, "dgx_h100").time_ns(ctx, "t")
    whole = Collective("all_reduce", nbytes, 2, "dgx_h100").time_ns(ctx, "t")
    assert int(g.tasks["dur_ns"].to_numpy()[ar[0]]) == pytest.approx(2 * full * half / whole, abs=2)
    assert 2 * half > whole                                               # the second latency
    sp = TensorParallel(degree=2, sequence_parallel=True, topology="dgx_h100").apply(g0, ctx)
    for degree in (2, 4):
        for stage in range(degree):   # an all-gather goes with the GEMM it feeds, a reduce-scatter with its producer
            names = PipelineParallel(degree=degree, schedule="serving", stage=stage,
                                     topology="dgx_h100").apply(sp, ctx).tasks["name"].astype(str)
            assert int(names.str.contains("all_gather").sum()) == int(names.str.contains("reduce_scatter").sum()) \
                == 2 * 4 // degree


def test_pipeline_keeps_n_over_p_blocks_in_every_step(tmp_path) -> None:
    """Blocks are found per step: the kernels of step k+1 before its first block are not the tail of
    step k's last block (every later step kept n/p + 1 blocks, and its stage time nearly doubled)."""
    a = analyze(llm_trace(tmp_path / "pp8.json.gz", new_tokens=1024, kv_tokens=1024, layers=8, steps=3))
    g0, ctx = a.graph, make_context(a.trace)
    steps = g0.tasks["step"].to_numpy()
    b = find_blocks(g0)
    assert b.assign(step=steps[b["task"].to_numpy()]).groupby("step")["block"].nunique().tolist() == [8, 8, 8]
    base = step_times(replay(g0))["predicted_ns"].to_numpy()
    for stage in (0, 3, 7):
        g = PipelineParallel(degree=8, schedule="serving", stage=stage).apply(g0, ctx)
        kept = find_blocks(g)
        assert kept.assign(step=g.tasks["step"].to_numpy()[kept["task"].to_numpy()]).groupby("step")[
            "block"].nunique().tolist() == [1, 1, 1]
        pred = step_times(replay(g))["predicted_ns"].to_numpy()
        # every step is the same stage's work: later steps differ from step 0 as the baseline's do,
        # up to the stage's sends of one step (step 0 has no earlier send running beside it)
        comm = g.tasks["dur_ns"].to_numpy()[kinds(g, TaskKind.COMM)]
        sends_ns = comm.sum() / len(pred)
        assert sends_ns < 0.25 * pred[0]        # far below the doubled stage time this guards
        assert np.allclose(pred[1:] - pred[0], base[1:] - base[0], atol=1_000 + sends_ns)


def test_tensor_parallel_shards_the_backward(train) -> None:
    """TP on a training step: each forward GEMM's two gradient GEMMs and the attention backward are
    sharded (about halved at t = 2) and every block gets its backward all-reduces (after the QKV and
    MLP up/gate input gradients) besides the forward's two."""
    from whatif.transforms.parallel.layers import backward_blocks

    g0, ctx = train.graph, make_context(train.trace)
    blocks = find_blocks(g0)
    bwd = backward_blocks(g0, blocks)
    assert bwd is not None and len(bwd) == 4 * (8 + 1)          # 4 layers: 4 GEMMs x 2 gradients + attention
    g = TensorParallel(degree=2, topology="dgx_h100").apply(g0, ctx)
    d0, d1 = g0.tasks["dur_ns"].to_numpy(), g.tasks["dur_ns"].to_numpy()
    gemms = bwd.loc[bwd["part"] != "bwd_attention", "task"].to_numpy()
    assert 0.45 < d1[gemms].sum() / d0[gemms].sum() < 0.6
    attn = bwd.loc[bwd["part"] == "bwd_attention", "task"].to_numpy()
    assert 0.45 < d1[attn].sum() / d0[attn].sum() < 0.6
    comm = g.tasks.iloc[kinds(g, TaskKind.COMM)]
    assert len(comm) == 4 * 2 + 4 * 2 and comm["name"].astype(str).str.contains("all_reduce").all()
    # the pairing: each forward GEMM's gradients, layers in reverse order
    names = g0.tasks["name"].astype(str).to_numpy()
    for part, tag in (("bwd_qkv", "qkv_grad"), ("bwd_attn_out", "out_grad"), ("bwd_mlp_in", "gate_up_grad"),
                      ("bwd_mlp_down", "down_grad")):
        assert all(tag in n for n in names[bwd.loc[bwd["part"] == part, "task"].to_numpy()])
    order = bwd.sort_values("task")["block"].to_numpy()
    assert (np.diff(order) <= 0).all() and order[0] == blocks["block"].max()
    # a backward all-reduce runs after the QKV gradients of its block
    e = g.edges
    qkv_last = bwd[bwd["part"] == "bwd_qkv"].groupby("block")["task"].max().to_numpy()
    after = e[(e["kind"] == int(EdgeKind.FLOW)) & e["dst"].isin(comm.index)]["src"].to_numpy()
    assert set(qkv_last.tolist()) <= set(after.tolist())
    sp = TensorParallel(degree=2, topology="dgx_h100", sequence_parallel=True).apply(g0, ctx)
    names = sp.tasks.iloc[kinds(sp, TaskKind.COMM)]["name"].astype(str)
    assert names.str.contains("reduce_scatter").sum() == 16 and names.str.contains("all_gather").sum() == 16


def test_tensor_parallel_backward_mapping_is_checked(tmp_path: Path) -> None:
    """FlashAttention-2's backward is three kernels per layer (one core each), and a backward whose
    GEMMs do not pair with the forward's by FLOPs is refused, not mislabelled."""
    from whatif.transforms.parallel.layers import backward_blocks

    a = analyze(llm_trace(tmp_path / "fa2.json.gz", new_tokens=256, kv_tokens=256, layers=2, backward=True, steps=1,
                          fa_backward_kernels=3))
    ctx = make_context(a.trace)
    bwd = backward_blocks(a.graph, find_blocks(a.graph))
    assert bwd is not None and (bwd["part"] == "bwd_attention").sum() == 6
    TensorParallel(degree=2).apply(a.graph, ctx)
    # the same blocks with the gradient pairs' FLOPs made to disagree: refused
    bad = backward_blocks(a.graph, find_blocks(a.graph), lambda ids: np.arange(1, len(ids) + 1, dtype=float))
    assert bad is None


def test_attention_heads_only_from_fused_attention_ops() -> None:
    from whatif.transforms.parallel.memory import attention_op_heads

    assert attention_op_heads("aten::scaled_dot_product_attention", [[1, 32, 9, 128], [1, 8, 9, 128]]) == (32, 8, 128)
    assert attention_op_heads("aten::_flash_attention_forward", [[1, 9, 32, 128], [1, 9, 8, 128]]) == (32, 8, 128)
    assert attention_op_heads("vllm::flash_attn_varlen_func", [[90, 32, 128], [90, 8, 128]]) == (32, 8, 128)
    # an unfused bmm's dims do not say which one is the heads
    assert attention_op_heads("aten::bmm", [[32, 1024, 64], [32, 64, 1024]]) is None
    assert attention_op_heads("aten::matmul", [[1, 32, 9, 128], [1, 32, 128, 9]]) is None


def test_model_shape_counts_one_rank_forward(tmp_path: Path, train) -> None:
    from whatif.transforms.parallel.memory import model_shape

    w = 4 * (4 * 4096 ** 2 + 3 * 4096 * 11008) * 2            # 4 layers of forward weights, bf16
    assert model_shape(train.graph, make_context(train.trace)).weight_bytes == pytest.approx(w, rel=0.01)
    run = tmp_path / "two_ranks"
    run.mkdir()
    for r in (0, 1):
        llm_trace(run / f"rank{r}.json.gz", new_tokens=64, layers=4, steps=1, rank=r, world_size=2)
    a = analyze(run)
    assert a.graph.tasks["rank"].nunique() == 2
    assert model_shape(a.graph, make_context(a.trace)).weight_bytes == pytest.approx(w, rel=0.01)


def _unlaunched(path: Path, out: Path, correlations: set[int]) -> Path:
    """``path`` with the kernels of ``correlations`` left without their launch and op (as kernels
    launched before the profiler started, still running in its window)."""
    import gzip
    import json

    doc = json.loads(gzip.decompress(path.read_bytes()))
    kept = []
    for e in doc["traceEvents"]:
        corr = e.get("args", {}).get("correlation")
        if corr in correlations and e.get("cat") == "cuda_runtime":
            continue
        if corr in correlations and e.get("cat") == "kernel":
            e["args"].pop("External id", None)
        kept.append(e)
    doc["traceEvents"] = kept
    out.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return out


def test_model_shape_leaves_out_blocks_launched_before_the_trace(tmp_path: Path) -> None:
    """A step whose GPU timeline starts with the tail of an earlier forward (kernels with no launch
    and no op) holds the model's layers once: the unlaunched block is not a layer, and its GEMMs'
    time-based estimates are not weights (the shared Qwen1.5-0.5B H100 trace read 34 layers and
    6.7 GB of weights for its 24 layers and 0.61 GB)."""
    from whatif.transforms.parallel.memory import model_shape

    path = llm_trace(tmp_path / "t.json.gz", new_tokens=64, layers=5, steps=1)
    a = analyze(path)
    blocks = find_blocks(a.graph)
    rows = a.graph.tasks["event"].to_numpy()[blocks.loc[blocks["block"] == 0, "task"].to_numpy()]
    tail = {int(c) for c in a.trace.events["correlation"].to_numpy()[rows]}
    b = analyze(_unlaunched(path, tmp_path / "tail.json.gz", tail))
    assert find_blocks(b.graph)["block"].nunique() == 5                  # still found as a block
    shape = model_shape(b.graph, make_context(b.trace))
    w = 4 * (4 * 4096 ** 2 + 3 * 4096 * 11008) * 2
    assert shape.layers == 4 and shape.weight_bytes == pytest.approx(w, rel=0.01)
    assert not shape.assumptions


def _opless(path: Path, out: Path, keep: set[int]) -> Path:
    """``path`` with every kernel launched as before but without an op, except the kernels of the
    correlations in ``keep``: as a CUDA/HIP graph replays its kernels (one launch, no op each), with
    an eager kernel of another stream among them."""
    import gzip
    import json

    doc = json.loads(gzip.decompress(path.read_bytes()))
    for e in doc["traceEvents"]:
        args = e.get("args", {})
        if e.get("cat") in ("kernel", "cuda_runtime") and args.get("correlation") not in keep:
            args.pop("External id", None)
    out.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return out


def test_model_shape_counts_launched_blocks_without_ops(tmp_path: Path) -> None:
    """Kernels with a launch call but no op (a graph replay) are the model's layers: the blocks are
    not narrowed to those with an op. The shared SGLang Qwen3-8B trace (36 layers replayed by one
    hipGraphLaunch, one eager aten::neg kernel inside one layer) read as 1 layer from 2026-11-28
    (commit 14b4555) until 2026-11-29."""
    from whatif.transforms.parallel.memory import launched_blocks, model_shape

    path = llm_trace(tmp_path / "t.json.gz", new_tokens=64, layers=5, heads=32, kv_heads=8, steps=1)
    a = analyze(path)
    blocks = find_blocks(a.graph)
    attention = blocks.loc[(blocks["block"] == 2) & (blocks["part"] == "attention"), "task"].to_numpy()
    rows = a.graph.tasks["event"].to_numpy()[attention]
    b = analyze(_opless(path, tmp_path / "graph.json.gz",
                        {int(c) for c in a.trace.events["correlation"].to_numpy()[rows]}))
    blocks = find_blocks(b.graph)
    assert blocks["block"].nunique() == 5
    assert launched_blocks(b.graph, blocks)["block"].nunique() == 5
    shape = model_shape(b.graph, make_context(b.trace))
    assert (shape.layers, shape.heads, shape.kv_heads, shape.head_dim) == (5, 32, 8, 128)   # heads: block 2's op


def test_model_shape_says_when_weights_are_estimated(tmp_path: Path) -> None:
    """Without any recorded GEMM shape the weights are the GEMMs' time-based estimates, and the
    shape says so."""
    from whatif.transforms.parallel.memory import model_shape

    path = llm_trace(tmp_path / "t.json.gz", new_tokens=64, layers=2, steps=1)
    a = analyze(path)
    corr = {int(c) for c in a.trace.events["correlation"].to_numpy() if c == c and c >= 0}
    b = analyze(_unlaunched(path, tmp_path / "bare.json.gz", corr))
    shape = model_shape(b.graph, make_context(b.trace))
    assert shape.layers == 2 and shape.weight_bytes > 0
    assert [n for n in shape.assumptions if n.startswith("no GEMM shapes recorded: weights estimated")]
    assert [n for n in shape.assumptions if n.startswith("no attention shapes recorded")]


def test_the_heads_check_skips_attention_kernels_without_an_op(tmp_path: Path) -> None:
    """The heads come from the first attention kernels that have a launching op: on the Qwen H100
    trace the first 10 of 34 have none, and TP 3 and TP 64 passed for 16 heads (the CLI audit of
    2026-11-28)."""
    path = llm_trace(tmp_path / "t.json.gz", new_tokens=64, layers=12, heads=32, steps=1)
    a = analyze(path)
    blocks = find_blocks(a.graph)
    attention = blocks.loc[blocks["part"] == "attention", "task"].to_numpy()[:10]
    rows = a.graph.tasks["event"].to_numpy()[attention]
    b = analyze(_unlaunched(path, tmp_path / "first10.json.gz",
                            {int(c) for c in a.trace.events["correlation"].to_numpy()[rows]}))
    with pytest.raises(TransformError, match="degree 3 does not divide the 32 attention heads"):
        TensorParallel(degree=3).apply(b.graph, make_context(b.trace))


def test_tensor_parallel_checks_heads(tmp_path: Path) -> None:
    a = analyze(llm_trace(tmp_path / "gqa.json.gz", new_tokens=64, layers=2, heads=32, kv_heads=8, steps=1))
    ctx = make_context(a.trace)
    TensorParallel(degree=16).apply(a.graph, ctx)          # 2 query heads per rank, a KV head replicated
    with pytest.raises(TransformError, match="does not divide the 32 attention heads"):
        TensorParallel(degree=64).apply(a.graph, ctx)
    b = analyze(llm_trace(tmp_path / "gqa6.json.gz", new_tokens=64, layers=2, heads=24, hidden=3072, kv_heads=6,
                          steps=1))
    with pytest.raises(TransformError, match="neither divides the 6 KV heads"):
        TensorParallel(degree=4).apply(b.graph, make_context(b.trace))


def test_pipeline_serving_has_no_bubble(serve) -> None:
    ctx = make_context(serve.trace)
    g = PipelineParallel(degree=2, schedule="serving").apply(serve.graph, ctx)
    assert not g.tasks["name"].astype(str).str.startswith("pipeline bubble").any()
    assert step_ns(g) < 0.75 * step_ns(serve.graph) and "latency" in g.changes[-1].reason


def test_data_parallel_buckets(train) -> None:
    g0, ctx = train.graph, make_context(train.trace)
    g = DataParallel(degree=8, bucket_mb=25).apply(g0, ctx)
    comm = kinds(g, TaskKind.COMM)
    names = g.tasks["name"].astype(str).to_numpy()[comm]
    # 4 layers of (3h^2 + h^2 + 3*h*ffn) bf16 weights
    grads = 4 * (4 * 4096 ** 2 + 3 * 4096 * 11008) * 2
    assert len(comm) == len(bucket_sizes(grads, 25 * 2**20)) and all("all_reduce" in n and "x8" in n for n in names)
    # the optimizer (first kernel after the backward) waits for the last bucket
    opt = np.flatnonzero(g.tasks["name"].astype(str).str.contains("multi_tensor_apply").to_numpy())[0]
    e = g.edges
    assert ((e["src"] == comm[-1]) & (e["dst"] == opt) & (e["kind"] == int(EdgeKind.FLOW))).any()
    r = replay(g)
    assert r.start_ns[opt] >= r.end_ns[comm].max()
    assert step_ns(g) > step_ns(g0)
    assert step_ns(g) < step_ns(g0) + int(g.tasks["dur_ns"].to_numpy()[comm].sum())   # overlapped with backward
    with pytest.raises(TransformError, match="backward"):
        DataParallel(degree=2).apply(_fwd(train), ctx)
    assert DataParallel(degree=4, mode="serving").apply(g0, ctx).tasks.equals(g0.tasks)


def _fwd(train):
    from whatif.transforms.edit import remove
    from whatif.transforms.parallel.pipeline import backward_mask
    g = train.graph
    return remove(g, np.flatnonzero(backward_mask(g)), reason="forward only")


def test_overlap_splits_and_bounds(serve, tmp_path) -> None:
    # 2048 tokens: all-reduces of 16 MB, bandwidth-bound, so splitting them in two hides more than
    # the second call's latency costs (at 512 tokens NCCL's per-call latency makes it a loss)
    big = analyze(llm_trace(tmp_path / "serve2k.json.gz", new_tokens=2048, layers=4, steps=1))
    ctx = make_context(big.trace)
    tp = TensorParallel(degree=8, topology="dgx_a100").apply(big.graph, ctx)
    n_comm = len(kinds(tp, TaskKind.COMM))
    base = step_ns(tp)
    got = {}
    for phi in (1.0, 1.15):
        g = Overlap(nano_batches=2, interference=phi, topology="dgx_a100").apply(tp, ctx)
        assert len(kinds(g, TaskKind.COMM)) == 2 * n_comm
        assert len(g.tasks[g.tasks["name"].astype(str).str.startswith("nano-batch compute")]) == n_comm
        comp = g.tasks["dur_ns"].to_numpy()[kinds(g, TaskKind.KERNEL)].sum()
        comm = g.tasks["dur_ns"].to_numpy()[kinds(g, TaskKind.COMM)].sum()
        got[phi] = step_ns(g)
        assert got[phi] >= max(comp, comm)                   # never below max(compute, communication)
    assert got[1.0] < base and got[1.0] < got[1.15]          # overlap helps; interference costs
    with pytest.raises(TransformError, match="no collective"):
        Overlap().apply(serve.graph, ctx)
    with pytest.raises(TransformError, match="interference"):
        Overlap(interference=0.5).apply(tp, ctx)
    assert Overlap().factor(tp) == DEFAULT_INTERFERENCE     # no measured overlap in a hand-made trace


@pytest.mark.shared
def test_interference_calibrated_on_shared_traces(shared_traces: Path) -> None:
    phi, names = calibrated_interference(analyze(shared_traces / "hta" / "nccl_data_a100_rank0of2.json.gz").graph)
    assert phi is not None and 1.0 <= phi < 1.5 and names >= 5


def test_reshard_search(tmp_path: Path) -> None:
    a = analyze(llm_trace(tmp_path / "phased.json.gz", kv_tokens=1024, layers=8, batch=8, steps=5,
                          phases=("prefill", "decode", "decode", "decode", "decode")))
    ctx = make_context(a.trace)
    assert step_phases(a.graph, ctx).tolist() == ["prefill"] + ["decode"] * 4
    s = search_reshard(a.graph, ctx, gpus=8, prefill_batch=8, decode_batch=8, prompt_tokens=1024)
    assert len(s.table) == 16 and s.table["throughput_rps"].is_monotonic_decreasing
    same = s.table[s.table["prefill_plan"] == s.table["decode_plan"]]
    assert (same["transition_ms"] == 0).all() and (s.table.loc[s.table["prefill_plan"] != s.table["decode_plan"],
                                                               "transition_ms"] > 0).all()
    assert "req/s" in s.why and s.best["throughput_rps"] >= same["throughput_rps"].max()
    # transition: 2 x (W/G) / (PCIe (H100: 64 GB/s) shared by 2 GPUs); W = 8 layers of forward weights
    w = 8 * (4 * 4096 ** 2 + 3 * 4096 * 11008) * 2
    diff = s.table[s.table["prefill_plan"] != s.table["decode_plan"]].iloc[0]
    assert diff["transition_ms"] == pytest.approx(2 * w / 8 / 32e9 * 1e3, rel=1e-6)
    assert "reshard" in registry.names() and "pipeline_parallel" in registry.names()
    # Seesaw's premise: prefill fastest under the deepest pipeline, decode under the widest TP
    by_plan = s.table.drop_duplicates("prefill_plan").set_index("prefill_plan")["prefill_step_ms"]
    dec = s.table.drop_duplicates("decode_plan").set_index("decode_plan")["decode_step_ms"]
    assert by_plan.idxmin() == "tp1·pp8" and dec["tp8·pp1"] < dec["tp1·pp8"]


def test_interleaved_engine_stalls_decodes_behind_a_prefill_only_in_a_pipeline() -> None:
    """vLLM's static engine (prefill first, one scheduler per stage): with one stage the phases
    only alternate, so it serves what Seesaw's phase batching does; in a pipeline each prompt's
    prefill holds every decode behind it on each stage, and the loss grows with the prefill."""
    per_request = 50e-3 + 256 * 20e-3 / 256                      # one stage: prefill + o decodes / b
    assert interleaved_static_rps(1, 50e6, 20e6, 256, 256) == pytest.approx(1 / per_request, rel=0.01)
    phased = 1 / (12.5e-3 + 256 * 4 * 5e-3 / 256)                # 4 stages, the phases kept apart
    got = [interleaved_static_rps(4, pf, 5e6, 256, 256) for pf in (1e3, 12.5e6, 25e6)]
    # no prefill work, yet each prefill takes its engine's turn (its decodes pause): of 4 turns per
    # round x = 4·(b/o)/(4 + b/o) = 0.8 are prefills, so the full pipeline's 50 req/s x (4 − x)/4
    assert got[0] == pytest.approx(256 / (256 * 4 * 5e-3) * (4 - 0.8) / 4, rel=0.02)
    assert got[1] < 0.7 * phased and got[2] < got[1]
    assert interleaved_static_rps(4, 12.5e6, 5e6, 256, 256) == interleaved_static_rps(4, 12.5e6, 5e6, 256, 256)
    with pytest.raises(ValueError, match="positive"):
        interleaved_static_rps(0, 1e6, 1e6, 8, 8)


def test_reshard_prices_static_plans_as_an_interleaving_engine(tmp_path: Path) -> None:
    a = analyze(llm_trace(tmp_path / "phased.json.gz", kv_tokens=1024, layers=8, batch=8, steps=3,
                          phases=("prefill", "decode", "decode")))
    s = search_reshard(a.graph, make_context(a.trace), gpus=8, prefill_batch=8, decode_batch=64,
                       prompt_tokens=1024, output_tokens=64)
    t = s.table
    static = t["prefill_plan"] == t["decode_plan"]
    assert t.loc[static, "interleaved_rps"].notna().all() and t.loc[~static, "interleaved_rps"].isna().all()
    rows = t[static].set_index("prefill_plan")
    # TP alone: the phases alternate, the same throughput as with them batched
    assert rows.loc["tp8·pp1", "interleaved_rps"] == pytest.approx(rows.loc["tp8·pp1", "throughput_rps"], rel=0.02)
    # a pipeline stalls its decodes behind each prefill: below its phase-batched throughput
    assert rows.loc["tp1·pp8", "interleaved_rps"] < 0.8 * rows.loc["tp1·pp8", "throughput_rps"]
    assert "interleaves the phases" in s.why


def test_pipeline_decode_at_equal_in_flight_sequences(tmp_path: Path) -> None:
    """PP serving splits the trace's in-flight sequences into micro-batches: a weight-bound decode
    step barely shrinks (every micro-batch reads the stage's weights), a compute-bound prefill
    shrinks about p-fold; TP shrinks decode more than PP does."""
    got = {}
    for name, kw in (("decode", {"batch": 8, "new_tokens": 1, "kv_tokens": 2048}),
                     ("prefill", {"new_tokens": 1024, "kv_tokens": 1024})):
        a = analyze(llm_trace(tmp_path / f"{name}.json.gz", layers=8, steps=2, **kw))
        ctx = make_context(a.trace)
        base = step_ns(a.graph)
        got[name] = {"pp4": step_ns(PipelineParallel(degree=4, schedule="serving").apply(a.graph, ctx)) / base,
                     "pp4 m1": step_ns(PipelineParallel(degree=4, schedule="serving", micro_batches=1)
                                       .apply(a.graph, ctx)) / base,
                     "tp4": step_ns(TensorParallel(degree=4, topology="dgx_a100").apply(a.graph, ctx)) / base}
    assert got["decode"]["pp4"] > 0.6 and got["decode"]["tp4"] < 0.6 * got["decode"]["pp4"]
    assert got["prefill"]["pp4"] < 0.45 and got["prefill"]["pp4"] < got["prefill"]["tp4"]
    # one micro-batch for 4 stages: the stage idles 3 of 4 slots, a whole model's time per step
    assert got["decode"]["pp4 m1"] == pytest.approx(1.0, abs=0.05)


def test_memory_model_gqa_and_refusals(tmp_path: Path) -> None:
    from whatif.transforms.parallel.memory import model_shape, plan_memory

    a = analyze(llm_trace(tmp_path / "gqa.json.gz", kv_tokens=1024, layers=8, batch=8, steps=5, kv_heads=8,
                          phases=("prefill", "decode", "decode", "decode", "decode")))
    ctx = make_context(a.trace)
    shape = model_shape(a.graph, ctx)
    assert (shape.layers, shape.heads, shape.kv_heads, shape.head_dim, shape.hidden) == (8, 32, 8, 128, 4096)
    assert shape.kv_bytes_per_token == 2 * 8 * 8 * 128 * 2 and not shape.assumptions
    # TP beyond the KV heads replicates a KV head per rank instead of splitting it
    assert plan_memory(shape, tensor=16, pipeline=1, kv_tokens=1000, capacity_bytes=80e9).kv_bytes == \
        plan_memory(shape, tensor=8, pipeline=1, kv_tokens=1000, capacity_bytes=80e9).kv_bytes
    s = search_reshard(a.graph, ctx, gpus=8, prefill_batch=8, decode_batch=8, prompt_tokens=1024)
    assert any("8 KV heads" in x and "MiB" in x for x in s.assumptions)
    # GQA-8 of 32 heads: a quarter of the MHA KV, so 4x the requests per buffer fill
    mha = search_reshard(a.graph, ctx, gpus=8, prefill_batch=8, decode_batch=8, prompt_tokens=1024, kv_heads=32)
    assert mha.best["requests_per_cycle"] == pytest.approx(s.best["requests_per_cycle"] / 4, rel=0.01)
    # 16 GPUs, 6,000 sequences of 1,032 tokens: a KV head per rank at tp16 holds every layer's KV
    # (4.1 KB per token per rank, 25 GB), twice what tp8·pp2 holds (12.7 GB), on a 20 GB device
    tight = search_reshard(a.graph, ctx, gpus=16, prefill_batch=8, decode_batch=6000, prompt_tokens=1024,
                           output_tokens=8, capacity_gb=20)
    left = " ".join(x for x in tight.assumptions if "left out" in x)
    assert "tp16·pp1 left out for decode: weights" in left and "over by" in left and "tp8·pp2" not in left
    assert "tp16·pp1 left out for prefill" not in left                 # 8 prompts of 1,024 tokens fit
    assert "tp16·pp1" not in set(tight.table["decode_plan"]) and "tp8·pp2" in set(tight.table["decode_plan"])
    assert "tp16·pp1" in set(tight.table["prefill_plan"])                # a prefill plan still
    assert "tp1·pp16 left out: pipeline_parallel: 16 stages for 8 blocks" in left     # refused plans: a line
    # a plan the heads forbid is left out, not fatal (28 heads, 4 KV heads: no tp8)
    q = analyze(llm_trace(tmp_path / "q28.json.gz", kv_tokens=256, layers=2, batch=2, steps=2, heads=28,
                          hidden=3584, kv_heads=4, phases=("prefill", "decode")))
    s28 = search_reshard(q.graph, make_context(q.trace), gpus=8, prefill_batch=2, decode_batch=2, prompt_tokens=256)
    assert any("tp8·pp1 left out: tensor_parallel: degree 8 does not divide the 28" in x for x in s28.assumptions)
    assert set(s28.table["decode_plan"]) == {"tp4·pp2"}     # 2 layers: pp4 and pp8 leave stages empty
    with pytest.raises(TransformError, match=r"no prefill plan and decode plan of 8 GPUs both fit: .*over by"):
        search_reshard(a.graph, ctx, gpus=8, decode_batch=2000, prompt_tokens=1024, capacity_gb=2)


def test_reshard_one_phase_trace_states_assumption(serve) -> None:
    s = search_reshard(serve.graph, make_context(serve.trace), gpus=4)
    assert any("one phase" in x for x in s.assumptions)
    assert s.best["prefill_plan"] == s.best["decode_plan"]


def test_nanoflow_search_follows_the_sm_share_physics(tmp_path: Path) -> None:
    """Overlap pays only when kernels keep more speed than the share of the GPU they take: with
    every kernel's speed in proportion to its share nothing beats one kernel at a time; the gain
    grows as memory-bound work needs fewer SMs, NanoFlow's measured curves land between, and the
    GEMMs at the whole GPU bound every schedule."""
    from whatif.transforms.parallel.nanoflow import (
        GEMM_CURVE,
        NANOFLOW_GEMV,
        NANOFLOW_NETWORK,
        saturating_curve,
        search_nanoflow,
    )

    a = analyze(llm_trace(tmp_path / "dense.json.gz", batch=1024, new_tokens=1, kv_tokens=1024, layers=8, steps=1))
    ctx = make_context(a.trace)
    tp = TensorParallel(degree=8, topology="dgx_a100").apply(a.graph, ctx)
    got = {sigma: search_nanoflow(tp, ctx, topology="dgx_a100", memory_curve=saturating_curve(sigma),
                                  comm_curve=saturating_curve(0.05))
           for sigma in (1.0, 0.4, 0.1, 0.02)}
    speedups = [got[s].speedup for s in (1.0, 0.4, 0.1, 0.02)]
    assert all(x >= 1.0 for x in speedups)
    assert speedups == sorted(speedups) and speedups[-1] > 1.05
    linear = search_nanoflow(tp, ctx, topology="dgx_a100", memory_curve=GEMM_CURVE, comm_curve=GEMM_CURVE)
    assert linear.speedup == 1.0 and linear.best["gemm_share"] == 1.0 and not linear.overlapped
    measured = search_nanoflow(tp, ctx, topology="dgx_a100")
    assert 1.0 < measured.speedup < speedups[-1] and measured.overlapped
    assert any(NANOFLOW_GEMV.source in x for x in measured.assumptions)
    b = measured.best
    assert b["gemm_share"] + b["memory_share"] + b["comm_share"] == pytest.approx(1.0)
    parts = got[0.02].parts.mean()
    assert got[0.02].best["iteration_ns"] >= parts["gemm_ns"]          # GEMMs at the whole GPU bound it
    # without n = 1 the sequential iteration is still a schedule: never predicted slower than the trace
    only8 = search_nanoflow(tp, ctx, topology="dgx_a100", nano_batches=(8,))
    assert only8.speedup >= 1.0 and set(only8.table["nano_batches"]) == {1, 8}
    # each collective's parts are priced on the topology: NCCL's latency again for every part
    assert search_nanoflow(tp, ctx, topology="dgx_a100", nano_batches=(1, 4)).table.query(
        "nano_batches == 4")["comm_share"].gt(0).all()
    assert NANOFLOW_NETWORK.time_ns(40.0, 0.1) == 100.0 and NANOFLOW_GEMV.performance(1.0) == 1.0
    with pytest.raises(TransformError, match="share must be in"):
        NANOFLOW_GEMV.performance(0.0)
    with pytest.raises(TransformError, match="no GEMM"):
        search_nanoflow(_no_gemm_graph(tmp_path), ctx)


def test_mixed_prefill_decode_batch_is_sharded_and_searched(tmp_path: Path) -> None:
    """A dense batch that mixes phases (decode sequences plus a prompt, as continuous batching runs
    NanoFlow's 2,048-token batches) has two attention kernels per layer: tensor parallelism keeps one
    block per layer and splits both by heads, and NanoFlow's search counts the prompt's tokens in
    the GEMMs (more GEMM work per decode token: a larger share of the iteration)."""
    from whatif.transforms.parallel.nanoflow import search_nanoflow

    kw = dict(batch=256, new_tokens=1, kv_tokens=1024, layers=4, hidden=4096, heads=32, kv_heads=8, ffn=11008,
              steps=1)
    mixed = analyze(llm_trace(tmp_path / "mixed.json.gz", prefill_tokens=768, **kw))
    decode = analyze(llm_trace(tmp_path / "decode.json.gz", **kw))
    t = mixed.graph.tasks
    attention = np.flatnonzero(t["name"].str.contains("flash_fwd").to_numpy())
    assert len(attention) == 2 * 4
    blocks = find_blocks(mixed.graph)
    assert blocks["block"].nunique() == 4
    assert set(blocks.loc[blocks["task"].isin(attention), "role"]) == {"heads"}
    ctx = make_context(mixed.trace)
    tp = TensorParallel(degree=8, topology="dgx_a100").apply(mixed.graph, ctx)
    before, after = t["dur_ns"].to_numpy()[attention], tp.tasks["dur_ns"].to_numpy()[attention]
    assert (after < before).all()
    assert len(kinds(tp, TaskKind.COMM)) == 2 * 4
    dctx = make_context(decode.trace)
    tp_decode = TensorParallel(degree=8, topology="dgx_a100").apply(decode.graph, dctx)
    m, d = search_nanoflow(tp, ctx, topology="dgx_a100"), search_nanoflow(tp_decode, dctx, topology="dgx_a100")
    pm, pd_ = m.parts.mean(), d.parts.mean()
    assert pm["gemm_ns"] > 1.5 * pd_["gemm_ns"]          # 1,024 rows against 256
    assert pm["memory_ns"] > pd_["memory_ns"]             # the prompt's attention and token-wise kernels
    assert pm["gemm_ns"] / m.sequential_ns > pd_["gemm_ns"] / d.sequential_ns


def _no_gemm_graph(tmp_path: Path):
    from tracegen import KinetoTrace

    tr = KinetoTrace()
    tr.step(0, 0, 100)
    tr.runtime("cudaLaunchKernel", 10, 5, corr=1)
    tr.gpu("void at::native::vectorized_elementwise_kernel<4, add_kernel>", 20, 10, corr=1)
    return analyze(tr.write(tmp_path / "nogemm.json.gz")).graph


def test_data_parallel_buckets_only_steps_backward(shared_traces) -> None:
    """Backward kernels outside every step window (the 2021 ResNet-50 trace has some before its first
    and after its last step) are no step's: bucketed as one "step", their all-reduces were chained on
    the comm stream across the whole trace, and the replay found a cycle."""
    a = analyze(shared_traces / "kineto" / "resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz")
    assert (a.graph.tasks["step"].to_numpy()[backward_mask(a.graph)] < 0).any()
    g = DataParallel(degree=8, grad_bytes=10**9).apply(a.graph, make_context(a.trace))
    replay(g)                                                      # was: GraphError, a cycle
    comm = kinds(g, TaskKind.COMM)
    steps = set(g.tasks["step"].to_numpy()[comm].tolist())
    bw_steps = set(a.graph.tasks["step"].to_numpy()[backward_mask(a.graph)].tolist()) - {-1}
    assert steps == bw_steps and len(comm) == len(bw_steps) * len(bucket_sizes(10**9, 25 * 2**20))


@pytest.mark.parametrize("gpu", ["hf_h100", "hf_mi300"])
def test_model_shape_of_the_shared_qwen_traces(gpu: str) -> None:
    """Qwen1.5-0.5B (24 layers, hidden 1024, 16 heads; its layers' q/k/v/o and MLP GEMMs hold
    24 x 12.85 M bf16 weights = 0.62 GB, its token embedding 151,936 x 1,024 = 0.31 GB more; the
    traced forward has no LM head): read as such on both GPUs, not as 34 layers and 6.7 GB (its
    first step starts with ten layers of an earlier forward, unlaunched in the trace), nor without
    the embedding table (until 2026-11-28)."""
    from _cost_data import TRACES, need

    from whatif.transforms.parallel.memory import model_shape

    a = analyze(need(TRACES / "tracelens" / gpu / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"))
    shape = model_shape(a.graph, make_context(a.trace))
    assert (shape.layers, shape.hidden, shape.heads, shape.kv_heads) == (24, 1024, 16, 16)
    assert shape.weight_bytes == pytest.approx(24 * (4 * 1024 ** 2 + 3 * 1024 * 2816) * 2, rel=0.03)
    assert shape.table_bytes == 151936 * 1024 * 2


@pytest.mark.shared
def test_model_shape_of_the_shared_sglang_qwen3_trace(shared_traces: Path) -> None:
    """Qwen3-8B (36 layers, 32 query and 8 KV heads of 128, hidden 4096: 144 KiB of bf16 KV per
    token) decoded by SGLang on an MI300X, its layers replayed by one hipGraphLaunch with no op or
    shape: 36 layers (the iteration's 36 paged-attention cores), head size 128 and 4 query heads
    per KV head from the paged-attention kernel's template; only the hidden size comes from the
    output GEMMs' times (an estimate, 10 % high here: 36 heads, 9 KV heads). Read as 1 layer of 35
    KV heads, the KV capacity 8x too large, from 2026-11-28 until 2026-11-29."""
    from whatif.transforms.parallel.memory import model_shape

    a = analyze(shared_traces / "tracelens" / "sglang_qwen3_8b_decode_mi300x.json.gz")
    shape = model_shape(a.graph, make_context(a.trace))
    assert shape.layers == 36 and shape.head_dim == 128 and shape.heads == 4 * shape.kv_heads
    assert shape.kv_bytes_per_token == pytest.approx(2 * 36 * 8 * 128 * 2, rel=0.15)
    assert [n for n in shape.assumptions if "4 query heads per KV head from the attention kernel's name" in n]


def test_embedding_tables_are_held_not_read() -> None:
    """A replica holds its embedding tables (KV room shrinks by them per rank), and a lower
    precision of the GEMM weights leaves them as they are."""
    from dataclasses import replace

    from whatif.transforms.parallel.memory import ModelShape, kv_capacity_tokens, weights_per_rank_bytes
    from whatif.transforms.placement import Placement

    s = ModelShape(layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, weight_bytes=130e9)
    t = replace(s, table_bytes=8e9)
    tp8 = Placement(tensor=8)
    per_token = s.kv_bytes_per_rank_token(8, 1)
    assert kv_capacity_tokens(t, 80e9, tp8) == int((0.9 * 80e9 - 138e9 / 8) // per_token)
    assert kv_capacity_tokens(t, 80e9, tp8) < kv_capacity_tokens(s, 80e9, tp8)
    assert weights_per_rank_bytes(t, tp8.weights_scaled(0.5)) == pytest.approx((65e9 + 8e9) / 8)
    assert t.held_bytes == 138e9 and t.weight_bytes == 130e9
