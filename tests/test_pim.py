"""pim_offload and the PIM device models (DCC, AttAcc) on hand-made decode/prefill traces."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _llm_tracegen import llm_trace

from whatif.api import analyze, make_context
from whatif.depgraph.graph import EdgeKind, ResourceKind, TaskKind
from whatif.hardware.pim import COMPUTE_UTIL, MEMORY_UTIL, get_pim
from whatif.predictors.replay import replay
from whatif.predictors.steps import step_times
from whatif.transforms import registry
from whatif.transforms.base import TransformError
from whatif.transforms.parallel.pim import PimOffload, search_pim


def step_ns(graph) -> int:
    return int(step_times(replay(graph))["predicted_ns"].sum())


@pytest.fixture(scope="module")
def decode(tmp_path_factory):
    return analyze(llm_trace(tmp_path_factory.mktemp("pim") / "decode.json.gz", batch=1, new_tokens=1))


@pytest.fixture(scope="module")
def prefill(tmp_path_factory):
    return analyze(llm_trace(tmp_path_factory.mktemp("pim") / "prefill.json.gz", batch=1, new_tokens=512))


def test_device_model_formulas() -> None:
    d = get_pim("attacc")
    ext = 5 * 650e9
    # within HBM's power budget (AttAcc's headline): x9 bank, x3 bank group; unconstrained x16, x8
    assert d.internal_bw("bank") == 9 * ext and d.internal_bw("bank_group") == 3 * ext \
        and d.internal_bw("buffer_die") == ext
    free = d.with_power_limit(False)
    assert free.internal_bw("bank") == 16 * ext and free.internal_bw("bank_group") == 8 * ext
    assert d.peak_flops("bank") == d.internal_bw("bank") * d.ops_per_byte
    # memory-bound: R / (0.81 BW); compute-bound: F / (0.85 P); + the command overhead
    assert d.kernel_time_ns(0, 1e9, "bank") == pytest.approx(1e9 / (MEMORY_UTIL * 9 * ext) * 1e9 + 1000)
    assert d.kernel_time_ns(1e12, 1, "bank") == pytest.approx(1e12 / (COMPUTE_UTIL * 9 * ext) * 1e9 + 1000)
    # links per direction: NVLink4 450 GB/s (900 both ways), PCIe Gen4 x16 32 GB/s (64 both ways); + 1 us
    assert d.transfer_ns(450e6) == pytest.approx(1e6 + 1000)
    assert d.with_link("pcie4").transfer_ns(32e6) == pytest.approx(1e6 + 1000)
    assert d.capacity_bytes() == 5 * 16e9
    assert d.rearrange_ns(1e9) == pytest.approx(2e9 / (MEMORY_UTIL * ext) * 1e9)
    assert get_pim("hbm_pim").levels() == ("bank_group", "buffer_die")
    with pytest.raises(ValueError, match="level"):
        get_pim("hbm_pim").internal_bw("bank")
    with pytest.raises(KeyError, match="unknown PIM device"):
        get_pim("toaster")


def test_search_offloads_decode_gemv_with_breakdown(decode) -> None:
    ctx = make_context(decode.trace)
    s = search_pim(decode.graph, ctx)
    b = s.breakdown
    assert s.level == "bank" and b["candidates"] == 20 and b["offloaded"] == 20   # 4 GEMMs + 1 SDPA per layer, 2x2
    off = s.offloaded()
    assert set(off["cls"]) == {"gemm", "attention"} and (off["intensity"] < 2).all()
    assert b["serial_ns"] < 0.5 * b["gpu_only_ns"]
    assert b["gpu_saved_ns"] == pytest.approx(off["gpu_ns"].sum())
    assert b["pim_ns"] > 0 and b["link_ns"] > 0 and {"row", "col"} & set(off["state"])
    assert set(s.candidates["level"]) == {"bank", "bank_group", "buffer_die"}
    # the joint search is never worse than offloading first and partitioning after
    assert (s.candidates["joint_ns"] <= s.candidates["offload_then_partition_ns"] + 1e-6).all()
    assert "offload 20 of 20" in s.summary()


def test_joint_search_beats_decoupled_when_layouts_are_rewritten(decode) -> None:
    """With weights rewritten every step (weight_reuse=1), rearrangement decides: the joint search
    moves to bank-group level and beats offload-then-partition at bank level (DCC's argument)."""
    s = search_pim(decode.graph, make_context(decode.trace), weight_reuse=1)
    c = s.candidates.set_index("level")
    assert s.level == "bank_group"
    assert c.loc["bank", "joint_ns"] < 0.9 * c.loc["bank", "offload_then_partition_ns"]
    assert s.breakdown["rearrange_ns"] > 0 and s.setup_ns == 0


def test_pim_helps_decode_not_prefill(decode, prefill) -> None:
    s = search_pim(prefill.graph, make_context(prefill.trace), max_intensity=1e9)   # even if allowed
    assert s.breakdown["offloaded"] == 0 and s.breakdown["serial_ns"] == s.breakdown["gpu_only_ns"]
    with pytest.raises(TransformError, match="no memory-bound"):
        PimOffload().apply(prefill.graph, make_context(prefill.trace))
    ctx = make_context(decode.trace)
    g = PimOffload().apply(decode.graph, ctx)
    assert step_ns(g) < 0.7 * step_ns(decode.graph)


def test_graph_edit_moves_kernels_and_inserts_tasks(decode) -> None:
    ctx = make_context(decode.trace)
    s = search_pim(decode.graph, ctx, weight_reuse=1)
    g = PimOffload(weight_reuse=1).apply(decode.graph, ctx)
    res = g.resources
    pim = np.flatnonzero(res["kind"].to_numpy() == int(ResourceKind.PIM))
    link = np.flatnonzero(res["kind"].to_numpy() == int(ResourceKind.LINK))
    assert len(pim) == 1 and len(link) == 2 and not res["ordered"].iat[pim[0]]   # a link per direction
    t = g.tasks
    off = s.offloaded()
    assert (t["resource"].to_numpy()[off["task"]] == pim[0]).all()
    assert (t["dur_ns"].to_numpy()[off["task"]] == np.rint(off["pim_ns"]).astype(int)).all()
    new = t.iloc[len(decode.graph.tasks):]
    names = new["name"].astype(str)
    assert len(new) == int((off["state"] == "col").sum()) + int((off["operand_ns"] > 0).sum()) \
        + int((s.plan["link_ns"] > 0).sum()) + int((s.plan["rearrange_ns"] > 0).sum())
    assert names.str.contains("pim reduce").sum() == int((off["state"] == "col").sum())
    for way in ("gpu->pim", "pim->gpu"):   # each direction on its own resource: full duplex
        on_way = new.loc[names.str.startswith(f"pim link {way}"), "resource"]
        assert len(on_way) and on_way.nunique() == 1 and int(on_way.iat[0]) in link.tolist()
    assert new.loc[names.str.startswith("pim link gpu->pim"), "resource"].iat[0] != \
        new.loc[names.str.startswith("pim link pim->gpu"), "resource"].iat[0]
    # no program order on a shared resource; each moved kernel keeps a data edge from its producer
    e = g.edges
    on_pim = t["resource"].to_numpy() == pim[0]
    order = e["kind"].isin([int(EdgeKind.STREAM), int(EdgeKind.THREAD)])
    assert not (on_pim[e["src"]] & on_pim[e["dst"]] & order).any()
    flows_in = e[(e["kind"] == int(EdgeKind.FLOW))].groupby("dst").size()
    assert all(flows_in.get(int(k), 0) >= 1 for k in off["task"])
    r = replay(g)   # the GPU kernel after an offloaded one waits for its result
    kern = decode.graph.tasks["kind"].to_numpy() == int(TaskKind.KERNEL)
    assert (r.end_ns >= r.start_ns).all()
    assert kern.sum() == (t["kind"].to_numpy()[: len(kern)] == int(TaskKind.KERNEL)).sum()


def test_given_choice_and_errors(decode) -> None:
    ctx = make_context(decode.trace)
    s = search_pim(decode.graph, ctx, level="buffer_die", partition="row", offload="all")
    assert s.level == "buffer_die" and (s.offloaded()["state"] == "row").all() and s.breakdown["offloaded"] == 20
    g = PimOffload(level="buffer_die", partition="row", offload="all").apply(decode.graph, ctx)
    assert step_ns(g) > step_ns(PimOffload().apply(decode.graph, ctx))     # x1 bandwidth: the searched plan wins
    assert "pim_offload" in registry.names()
    with pytest.raises(TransformError, match="level 'bank'"):
        search_pim(decode.graph, ctx, device="hbm_pim", level="bank")
    with pytest.raises(TransformError, match="unknown PIM device"):
        search_pim(decode.graph, ctx, device="toaster")
    with pytest.raises(TransformError, match="partition"):
        search_pim(decode.graph, ctx, partition="diagonal")


@pytest.mark.shared
def test_pim_on_shared_trace_gemms_are_not_memory_bound(shared_traces: Path) -> None:
    """HF Qwen1.5-0.5B on H100 is one prefill forward: its GEMMs have intensity ~300 FLOP/B, so
    nothing qualifies; allowed anyway, the search keeps everything on the GPU."""
    a = analyze(shared_traces / "tracelens" / "hf_h100" / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    ctx = make_context(a.trace)
    with pytest.raises(TransformError, match="no memory-bound"):
        search_pim(a.graph, ctx)
    s = search_pim(a.graph, ctx, max_intensity=1e9, classes=("gemm",))
    assert s.breakdown["candidates"] > 100 and s.breakdown["offloaded"] < 0.1 * s.breakdown["candidates"]


def test_capacity_refuses_what_does_not_fit(tmp_path) -> None:
    """The offloaded weights and KV cache must fit the PIM stacks: 8 layers of hidden 8192 hold
    8·(4·8192² + 3·8192·28672)·2 B = 15.6 GB of weights, and 64 sequences of 8,192 tokens a KV
    cache of 8·64·8192·(2·8192·2 B) = 137 GB — more than 5 stacks of 16 GB."""
    a = analyze(llm_trace(tmp_path / "big.json.gz", batch=64, new_tokens=1, kv_tokens=8192, layers=8,
                          hidden=8192, heads=64, ffn=28672, steps=1))
    ctx = make_context(a.trace)
    with pytest.raises(TransformError, match=r"need \d+\.\d GB but attacc's 5 stacks hold 80\.0 GB \(over by"):
        search_pim(a.graph, ctx, max_intensity=100)
    search_pim(a.graph, ctx, max_intensity=100, classes=("gemm",))   # the weights alone fit


def test_capacity_is_per_rank(tmp_path) -> None:
    """Each rank has its own PIM stacks: two ranks of ~50 GB each fit, where summing them would not."""
    run = tmp_path / "two_ranks"
    run.mkdir()
    for r in (0, 1):   # 8 layers, hidden 8192: 15.6 GB of weights; 24 sequences x 8,192 tokens: 51.5 GB of KV
        llm_trace(run / f"rank{r}.json.gz", batch=24, new_tokens=1, kv_tokens=8192, layers=8, hidden=8192, heads=64,
                  ffn=28672, steps=1, rank=r, world_size=2)
    a = analyze(run)
    s = search_pim(a.graph, make_context(a.trace), max_intensity=100)
    on = s.offloaded()
    per_rank = on.groupby("rank")["resident"].sum()
    assert len(per_rank) == 2 and (per_rank < 80e9).all() and per_rank.sum() > 80e9


def test_after_tensor_parallel_pim_sees_one_ranks_share(tmp_path) -> None:
    """tensor_parallel records each rank's share of a sharded kernel's work (``cost_work``), so a
    PIM offload after it holds 1/t of the weights and KV heads: the 137 GB KV cache of
    test_capacity_refuses_what_does_not_fit does not fit one GPU's stacks, its 1/8 does."""
    from whatif.transforms.parallel.tensor import TensorParallel
    a = analyze(llm_trace(tmp_path / "big.json.gz", batch=64, new_tokens=1, kv_tokens=8192, layers=8,
                          hidden=8192, heads=64, ffn=28672, steps=1))
    ctx = make_context(a.trace)
    whole = search_pim(a.graph, ctx, max_intensity=100, classes=("gemm",)).offloaded()
    tp = TensorParallel(degree=8, topology="dgx_h100").apply(a.graph, ctx)
    s = search_pim(tp, ctx, max_intensity=100)
    on = s.offloaded()
    attention = on["cls"] == "attention"
    gemm_w = on.loc[~attention, "resident"].sum()
    assert gemm_w == pytest.approx(whole["resident"].sum() / 8, rel=0.01)
    attn = on.loc[attention, "resident"]
    assert len(attn) == 8 and attn.sum() == pytest.approx(137.4e9 / 8, rel=0.02)
