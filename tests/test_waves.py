"""A GEMM's waves: split by rows it pays a partly empty last wave in every part (wave
quantization), so a split of few tokens loses and one of many nearly halves; TokenWeave's overlap
follows (a loss at 256 tokens, a gain at 1k-4k); the fused collective's SM share replaces the
generic interference."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from _cost_data import VIDUR, bench_module, need
from _llm_tracegen import llm_trace

from whatif.api import analyze, make_context
from whatif.core.kernels import GEMM_TILE, gemm_shape
from whatif.depgraph.graph import EdgeKind, TaskKind
from whatif.hardware.roofline import expected_waves, wave_tail_ratio
from whatif.predictors.replay import replay
from whatif.predictors.steps import step_times
from whatif.transforms.base import TransformContext, TransformError
from whatif.transforms.parallel.comm import overlapped_compute_slowdown
from whatif.transforms.parallel.overlap import Overlap
from whatif.transforms.parallel.sharding import batch_part_ns
from whatif.transforms.parallel.tensor import TensorParallel
from whatif.transforms.select import kernel_classes

H100 = "H100_SXM"


def step_ns(graph) -> int:
    return int(step_times(replay(graph))["predicted_ns"].sum())


def test_gemm_shape_and_tiles() -> None:
    g = gemm_shape("aten::mm", [[300, 4096], [4096, 1280]], ["c10::BFloat16"] * 2)
    assert (g.m, g.n, g.k, g.batch) == (300, 1280, 4096, 1)
    assert g.output_tiles == 3 * 10                                        # ⌈300/128⌉·⌈1280/128⌉
    assert gemm_shape("aten::bmm", [[8, 256, 64], [8, 64, 256]], []).output_tiles == 8 * 2 * 2
    assert gemm_shape("aten::mm", [[300, 4096], [1024, 1280]], []) is None   # does not multiply
    assert gemm_shape("aten::add", [[4, 4], [4, 4]], []) is None


def test_wave_tail_ratio_limits() -> None:
    assert expected_waves(0.0) == pytest.approx(0.5)
    # a tiny GEMM's halves each cost nearly the whole; a huge one's halves half of it
    assert wave_tail_ratio(0.01, 0.005) == pytest.approx((1 + 100) / (1 + 50))
    assert wave_tail_ratio(1000.0, 500.0) == pytest.approx(1.0, abs=1e-3)
    # growing by rows: blocks fill the last wave first, so time grows less than the rows
    assert wave_tail_ratio(0.25, 1.0) < 1.0
    assert float(wave_tail_ratio(np.nan, 1.0)) == 1.0


@pytest.fixture(scope="module")
def tp8(tmp_path_factory):
    """TokenWeave's setup: Llama-70B-like layers on 8x H100, TP 8, at 256 and 4,096 tokens."""
    out = {}
    for tokens in (256, 4096):
        a = analyze(llm_trace(tmp_path_factory.mktemp("waves") / f"tw{tokens}.json.gz", new_tokens=tokens,
                              kv_tokens=tokens, layers=2, hidden=8192, heads=64, kv_heads=8, ffn=28672, steps=1,
                              device=H100))
        ctx = make_context(a.trace)
        out[tokens] = (TensorParallel(degree=8, topology="dgx_h100").apply(a.graph, ctx), ctx)
    return out


def _gemm_split_penalty(graph, ctx) -> float:
    """Two halves' time over the whole's, summed over the GEMMs."""
    kern = np.flatnonzero((graph.tasks["kind"].to_numpy() == int(TaskKind.KERNEL))
                          & (kernel_classes(graph) == "gemm"))
    half = batch_part_ns(ctx.cost, graph, kern, 2)
    return float(2 * half.sum() / graph.tasks["dur_ns"].to_numpy()[kern].sum())


def test_split_penalty_shrinks_with_the_tokens(tp8) -> None:
    small, large = (_gemm_split_penalty(*tp8[t]) for t in (256, 4096))
    facts = tp8[256][1].cost.kernel_facts(tp8[256][0], np.arange(len(tp8[256][0].tasks)))
    gemm_waves = facts["waves"][np.isfinite(facts["waves"])]
    assert len(gemm_waves) and gemm_waves.max() < 1.5             # TP-8 GEMMs of 256 tokens: about a wave
    assert small > 1.2                                            # each half pays a near-empty wave
    assert 1.0 <= large < 1.06                                    # tens of waves: halves nearly halve
    kern = np.flatnonzero(tp8[256][0].tasks["kind"].to_numpy() == int(TaskKind.KERNEL))
    no_tail = batch_part_ns(tp8[256][1].cost, tp8[256][0], kern, 2, wave_tail=False)
    assert (batch_part_ns(tp8[256][1].cost, tp8[256][0], kern, 2) >= no_tail - 1e-6).all()


def test_tokenweave_loses_at_256_and_gains_at_4k(tp8) -> None:
    # at 256 tokens each half reads all of a TP-8 GEMM's weights near the memory roof (its rate is
    # the recorded TP-1 kernel's): the split loses ~12 %
    for tokens, lo, hi in ((256, 0.8, 1.0), (4096, 1.1, 1.3)):
        graph, ctx = tp8[tokens]
        base = step_ns(graph)
        got = base / step_ns(Overlap(nano_batches=2, comm_sms=8, topology="dgx_h100").apply(graph, ctx))
        assert lo <= got <= hi, (tokens, got)


def test_the_split_on_nccls_own_all_reduce_loses_more_at_256(tp8) -> None:
    """An engine splitting tokens with NCCL's NVLS all-reduce gives its 16 channels' SMs to the
    collective: more slowdown beside it than TokenWeave's 8-SM kernel, a loss at 256 tokens,
    still a gain at 4k."""
    from whatif.transforms.parallel.overlap import NCCL_NVLS_CTAS, TOKENWEAVE_SMS

    for tokens in (256, 4096):
        graph, ctx = tp8[tokens]
        base = step_ns(graph)
        nccl, tokenweave = (base / step_ns(Overlap(nano_batches=2, comm_sms=sms, topology="dgx_h100")
                                           .apply(graph, ctx)) for sms in (NCCL_NVLS_CTAS, TOKENWEAVE_SMS))
        assert nccl < tokenweave
        assert (nccl < 1.0) if tokens == 256 else (1.05 < nccl < tokenweave)


def test_comm_sms_replaces_the_interference(tp8) -> None:
    graph, ctx = tp8[4096]
    phi, phi_comm = Overlap(comm_sms=8).factors(graph, ctx)
    assert phi == pytest.approx(132 / 124) and phi_comm == 1.0          # the H100 SXM's 132 SMs
    assert Overlap(interference=1.3).factors(graph, ctx) == (1.3, 1.3)
    faster = step_ns(Overlap(comm_sms=2).apply(graph, ctx))
    assert faster <= step_ns(Overlap(comm_sms=32).apply(graph, ctx))    # fewer SMs taken, less slowdown
    with pytest.raises(TransformError, match="comm_sms must be an integer >= 0"):
        Overlap(comm_sms=-1)
    with pytest.raises(TransformError, match="cannot hold 100% of the SMs"):
        Overlap(comm_sms=132).apply(graph, ctx)
    with pytest.raises(TransformError, match="comm_sms or interference, not both"):
        Overlap(comm_sms=8, interference=1.2).apply(graph, ctx)
    unknown = TransformContext(device=None, cost=ctx.cost)
    with pytest.raises(TransformError, match="not in the hardware catalog"):
        Overlap(comm_sms=8).factors(graph, unknown)
    assert overlapped_compute_slowdown(0.0) == 1.0


@pytest.mark.shared
def test_wave_term_beats_the_roofline_alone_on_vidur_splits() -> None:
    """Vidur's measured A100 GEMMs of Llama-2-70B at 1/2 their tokens (256-1024 before the split),
    predicted from the whole: the wave term's median error is lower, and its split penalty near
    the measured one."""
    path = need(VIDUR / "compute" / "a100" / "meta-llama" / "Llama-2-70b-hf" / "mlp.csv")
    e = bench_module("wave_split").predict_model("a100", "Llama-2-70b-hf", path, GEMM_TILE)
    e = e[(e["r"] == 0.5) & e["tokens"].between(256, 1024)]
    assert len(e) > 50
    err = {c: float(np.median(np.abs(e[c] / e["actual"] - 1))) for c in ("rule", "no_waves")}
    assert err["rule"] < err["no_waves"]
    penalty = pd.Series({c: float(np.median(e[c] / e["dur_ns"] * 2)) for c in ("actual", "rule", "no_waves")})
    assert abs(penalty["rule"] - penalty["actual"]) < abs(penalty["no_waves"] - penalty["actual"])


def test_backward_gemms_keep_their_waves(tmp_path) -> None:
    """A weight gradient's tokens are its reduction dimension, so splitting the tokens leaves its
    output tiles: the backward GEMMs' micro-batches are priced without the wave term, the forward
    ones with it."""
    from whatif.transforms.parallel.layers import backward_mask

    a = analyze(llm_trace(tmp_path / "train.json.gz", new_tokens=512, kv_tokens=512, layers=2, backward=True,
                          steps=1, device=H100))
    ctx = make_context(a.trace)
    g = a.graph
    gemm = np.flatnonzero((g.tasks["kind"].to_numpy() == int(TaskKind.KERNEL)) & (kernel_classes(g) == "gemm"))
    bwd = backward_mask(g)[gemm]
    assert bwd.any() and (~bwd).any()
    tail, plain = batch_part_ns(ctx.cost, g, gemm, 4), batch_part_ns(ctx.cost, g, gemm, 4, wave_tail=False)
    np.testing.assert_allclose(tail[bwd], plain[bwd])
    assert (tail[~bwd] > plain[~bwd]).any()


@pytest.mark.parametrize(("tokens", "gains"), [(256, False), (4096, True)])
def test_overlap_splits_a_traces_own_all_reduces(tmp_path, tokens: int, gains: bool) -> None:
    """A TP rank's trace whose NCCL all-reduces run on the compute stream (as vLLM and SGLang
    launch them): overlap moves them to a stream of their own, priced by the recorded
    message, and splits them like inserted collectives — a gain at 4k tokens, a loss at 256."""
    from whatif.transforms.parallel.overlap import detach_collectives

    a = analyze(llm_trace(tmp_path / "tp.json.gz", new_tokens=tokens, kv_tokens=tokens, layers=4, hidden=8192, heads=8,
                          kv_heads=1, ffn=3584, steps=1, device=H100, tp_all_reduce=8))
    g, ctx = a.graph, make_context(a.trace)
    moved = detach_collectives(g, reason="test")
    comm = moved.tasks[moved.tasks["kind"] == int(TaskKind.COMM)]
    mib = tokens * 8192 * 2 / 2**20
    assert comm["name"].astype(str).tolist() == [f"trace all_reduce ({mib:.4f} MiB x8)"] * 8
    assert set(moved.resources["name"].astype(str).to_numpy()[comm["resource"].to_numpy()]) == \
        {"trace collectives (rank 0)"}
    assert step_ns(moved) == step_ns(g)          # moved, not changed: the stream gaps travel with it
    launches = moved.edges[moved.edges["kind"] == int(EdgeKind.LAUNCH)]
    assert np.isin(comm.index.to_numpy(), launches["dst"].to_numpy()).all()   # still launched by their calls
    split = Overlap(nano_batches=2, comm_sms=8, topology="dgx_h100").apply(g, ctx)
    assert len(split.tasks[split.tasks["kind"] == int(TaskKind.COMM)]) == 16
    speedup = step_ns(g) / step_ns(split)
    assert speedup > 1.1 if gains else speedup < 1.0
    with pytest.raises(TransformError, match="split already"):
        Overlap(nano_batches=2, comm_sms=8, topology="dgx_h100").apply(split, ctx)
    if gains:   # then a pipeline stage keeps its own layers' nano-batches and collective parts
        from whatif.transforms.parallel.pipeline import PipelineParallel

        for stage in (0, 1):
            staged = PipelineParallel(degree=2, schedule="serving", micro_batches=1, stage=stage,
                                      topology="dgx_h100").apply(split, ctx)
            names = staged.tasks["name"].astype(str)
            assert int(names.str.startswith("nano-batch").sum()) == 4
            assert int(names.str.contains("trace all_reduce|collective part").sum()) == 8


def test_pipeline_micro_batches_reprice_a_traces_own_all_reduces(tmp_path) -> None:
    """A pipeline stage's micro-batches split the trace's own all-reduces too, priced by the size the
    trace records (each part pays the latency again), and keep only the stage's layers' ones."""
    from whatif.transforms.parallel.comm import Collective, collective_messages
    from whatif.transforms.parallel.pipeline import PipelineParallel

    a = analyze(llm_trace(tmp_path / "tp.json.gz", new_tokens=256, kv_tokens=256, layers=4, hidden=8192, heads=8,
                          kv_heads=1, ffn=3584, steps=1, device=H100, tp_all_reduce=8))
    g, ctx = a.graph, make_context(a.trace)
    comm = np.flatnonzero(g.tasks["kind"].to_numpy() == int(TaskKind.COMM))
    assert collective_messages(g, comm)[0] == ("all_reduce", 256 * 8192 * 2.0, 8)
    staged = PipelineParallel(degree=2, schedule="serving", micro_batches=2, topology="dgx_h100").apply(g, ctx)
    kept = np.flatnonzero(staged.tasks["kind"].to_numpy() == int(TaskKind.COMM))
    kept = kept[staged.tasks["name"].astype(str).to_numpy()[kept] != "pp recv activation (2 x send_recv)"]
    assert len(kept) == 4                                          # 2 layers x 2 all-reduces
    nbytes = 256 * 8192 * 2
    ratio = 2 * Collective("all_reduce", nbytes / 2, 8, "dgx_h100").time_ns(ctx, "t") / \
        Collective("all_reduce", nbytes, 8, "dgx_h100").time_ns(ctx, "t")
    before = int(g.tasks["dur_ns"].to_numpy()[comm[0]])
    assert int(staged.tasks["dur_ns"].to_numpy()[kept[0]]) == pytest.approx(before * ratio, abs=2)
    assert ratio > 1
