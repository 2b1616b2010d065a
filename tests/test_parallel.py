"""Communication tasks, block detection and tensor_parallel on hand-made transformer traces."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tracegen import KinetoTrace

from whatif.api import analyze, make_context
from whatif.depgraph.graph import EdgeKind, TaskKind
from whatif.hardware.collectives import collective_time_ns
from whatif.hardware.topology import preset
from whatif.predictors.replay import replay
from whatif.predictors.steps import step_times
from whatif.tracer.measured_collectives import collective_points
from whatif.transforms import registry
from whatif.transforms.base import TransformError
from whatif.transforms.parallel.comm import Collective, comm_stream, insert_tasks
from whatif.transforms.parallel.layers import find_blocks
from whatif.transforms.parallel.tensor import TensorParallel

PEAK, BW, ELEM = 150e12, 1.5e12, 2   # FLOP/s and bytes/s the fake kernels reach; bf16


def transformer_trace(path: Path, layers: int = 2, tokens: int = 2048, hidden: int = 4096, ffn: int = 11008,
                      steps: int = 1, shapes: bool = True, nccl: bool = False,
                      gpu_name: str = "NVIDIA A100-SXM4-80GB") -> Path:
    """A pre-norm decoder forward pass per step: per layer norm, QKV, flash attention, out-proj,
    add, norm, gate/up, act, down, add; GEMMs launched by aten::mm with recorded shapes. With
    ``nccl``, one 8-rank all-reduce of the last output (as PyTorch records it) ends each step."""
    tr = KinetoTrace(rank=0, world_size=8 if nccl else 1, gpu_name=gpu_name)
    m, h = tokens, hidden
    corr, ts = 0, 0.0
    gpu_t = 0.0

    def kernel(name: str, dur_us: float, op: str | None = None, dims=None, types=None, **args) -> None:
        nonlocal corr, ts, gpu_t
        corr += 1
        if op is not None:
            tr._x("cpu_op", op, ts, 6, 100, 1, **({"Input Dims": dims, "Input type": types} if dims else {}),
                  **{"External id": corr})
        tr.runtime("cudaLaunchKernel", ts + 1, 4, corr=corr)
        start = max(gpu_t, ts + 8)
        tr.gpu(name, start, dur_us, corr=corr, **{"External id": corr}, **args)
        gpu_t = start + dur_us + 1
        ts += 8

    def gemm(name: str, n: int, k: int) -> None:
        us = max(2 * m * k * n / PEAK, ELEM * (m * k + k * n + m * n) / BW) * 1e6
        kernel(f"sm80_xmma_gemm_bf16bf16_bf16f32_{name}", us, "aten::mm", [[m, k], [k, n]],
               ["c10::BFloat16", "c10::BFloat16"])

    def mem(name: str, nbytes: float, op: str) -> None:
        kernel(name, nbytes / BW * 1e6 + 2, op, [[m, h]], ["c10::BFloat16"])

    for s in range(steps):
        step_start = ts
        kernel("void at::native::vectorized_elementwise_kernel<4, at::native::mul_kernel>", 2.0, "aten::mul",
               [[8]], ["c10::BFloat16"])     # a tiny kernel, as every real trace has
        for _ in range(layers):
            mem("void at::native::rms_norm_kernel<bf16>", 2 * m * h * ELEM, "aten::rms_norm")
            gemm("qkv", 3 * h, h)
            attn_us = 4 * m * m * h / PEAK * 1e6 / 2
            kernel("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>", attn_us,
                   "aten::_flash_attention_forward")
            gemm("out", h, h)
            mem("void at::native::vectorized_elementwise_kernel<4, add_kernel>", 3 * m * h * ELEM, "aten::add")
            mem("void at::native::rms_norm_kernel<bf16>", 2 * m * h * ELEM, "aten::rms_norm")
            gemm("gate_up", 2 * ffn, h)
            mem("void at::native::silu_and_mul_kernel<bf16>", 3 * m * ffn * ELEM, "aten::silu")
            gemm("down", h, ffn)
            mem("void at::native::vectorized_elementwise_kernel<4, add_kernel>", 3 * m * h * ELEM, "aten::add")
        mem("void at::native::rms_norm_kernel<bf16>", 2 * m * h * ELEM, "aten::rms_norm")
        if nccl:
            nbytes = m * h * ELEM
            kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                   collective_time_ns("all_reduce", nbytes, 8, preset("dgx_a100")) / 1000 * 1.2, None,
                   **{"Collective name": "allreduce", "In msg nelems": m * h, "Out msg nelems": m * h,
                      "Group size": 8, "dtype": "BFloat16"})
        tr.runtime("cudaDeviceSynchronize", ts, max(gpu_t, ts) - ts + 5, corr=10_000 + s)
        ts = max(gpu_t, ts) + 10
        tr.step(s, step_start - 1, ts - step_start + 1)
        ts += 30
        gpu_t = ts
    return tr.write(path)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return analyze(transformer_trace(tmp_path_factory.mktemp("tp") / "llama.json.gz"))


def step_ns(graph) -> int:
    return int(step_times(replay(graph))["predicted_ns"].sum())


def test_blocks_found_with_roles(llama) -> None:
    b = find_blocks(llama.graph)
    assert sorted(b["block"].unique()) == [0, 1]
    names = llama.graph.tasks["name"].astype(str).to_numpy()
    first = b[b["block"] == 0].set_index("part")["task"]
    assert ("qkv" in names[first["qkv"]] and "_out" in names[first["attn_out"]]) or "out" in names[first["attn_out"]]
    parts = b.groupby("part").size().to_dict()
    assert parts == {"qkv": 2, "attention": 2, "attn_out": 2, "mlp_in": 2, "mlp_down": 2, "mlp_elementwise": 2,
                     "block_other": 6}
    assert all("down" in names[t] for t in b.loc[b["part"] == "mlp_down", "task"])


def test_insert_collective_tasks_on_new_stream(llama) -> None:
    g = llama.graph
    ctx = make_context(llama.trace)
    g2, res = comm_stream(g, 0, "test comm")
    assert len(g2.resources) == len(g.resources) + 1 and bool(g2.resources["ordered"].iat[res])
    kernels = np.flatnonzero(g.tasks["kind"].to_numpy() == int(TaskKind.KERNEL))
    c = Collective("all_reduce", 32 << 20, 8, "dgx_a100")
    dur = c.time_ns(ctx, "test")
    g3, ids = insert_tasks(g2, resource=res, after=[kernels[1], kernels[5]], before=[kernels[2], -1],
                           dur_ns=[dur, dur], names=["ar0", "ar1"], reason="t")
    assert len(g3.tasks) == len(g.tasks) + 2 and (g3.tasks["kind"].to_numpy()[ids] == int(TaskKind.COMM)).all()
    e = g3.edges
    assert ((e["src"] == kernels[1]) & (e["dst"] == ids[0])).any()
    assert ((e["src"] == ids[0]) & (e["dst"] == kernels[2])).any()
    assert ((e["src"] == ids[0]) & (e["dst"] == ids[1]) & (e["kind"] == int(EdgeKind.STREAM))).any()
    r = replay(g3)
    assert r.start_ns[kernels[2]] >= r.end_ns[ids[0]] and r.start_ns[ids[0]] >= r.end_ns[kernels[1]]
    assert step_ns(g3) > step_ns(g)


def test_collective_pricing_uses_topology(llama) -> None:
    ctx = make_context(llama.trace)
    nv = Collective("all_reduce", 64 << 20, 8, "dgx_a100").time_ns(ctx, "t")
    pcie = Collective("all_reduce", 64 << 20, 8, "pcie_a100_8").time_ns(ctx, "t")
    assert pcie > 5 * nv > 0
    with pytest.raises(TransformError, match="unknown topology"):
        Collective("all_reduce", 1, 2, "nope").time_ns(ctx, "t")
    with pytest.raises(TransformError, match="unknown collective"):
        Collective("all_mix", 1, 2, "dgx_a100")


@pytest.mark.parametrize("sp", [False, True])
def test_tensor_parallel_graph(llama, sp: bool) -> None:
    g = llama.graph
    ctx = make_context(llama.trace)
    t = 4
    h = TensorParallel(degree=t, topology="dgx_a100", sequence_parallel=sp).apply(g, ctx)
    comm = np.flatnonzero(h.tasks["kind"].to_numpy() == int(TaskKind.COMM))
    names = h.tasks["name"].astype(str).to_numpy()[comm]
    if sp:
        assert len(comm) == 8 and sum("reduce_scatter" in n for n in names) == 4 \
            and sum("all_gather" in n for n in names) == 4
    else:
        assert len(comm) == 4 and all("all_reduce" in n for n in names)
    # message = block output: tokens x hidden x 2 bytes = 16 MiB
    assert all("16.00 MiB x4" in n for n in names)
    b = find_blocks(g)
    dur0, dur1 = g.tasks["dur_ns"].to_numpy(), h.tasks["dur_ns"].to_numpy()
    gemms = b.loc[b["part"].isin(["qkv", "attn_out", "mlp_in", "mlp_down"]), "task"].to_numpy()
    ratio = dur1[gemms] / dur0[gemms]
    assert ((ratio > 0.2) & (ratio < 0.45)).all()          # ~1/t, a little more for smaller GEMMs
    other = b.loc[b["part"] == "block_other", "task"].to_numpy()
    if sp:   # norms/adds on 1/t of the sequence (the shortest kernel is the roofline's floor)
        assert dur1[other].sum() < 0.8 * dur0[other].sum()
    else:
        assert (dur1[other] == dur0[other]).all()
    # every all-reduce/reduce-scatter runs after its row GEMM, before the next kernel
    r = replay(h)
    rows = b.loc[b["part"].isin(["attn_out", "mlp_down"]), "task"].to_numpy()
    for c in comm:
        preds = h.edges.loc[(h.edges["dst"] == c) & (h.edges["kind"] == int(EdgeKind.FLOW)), "src"].to_numpy()
        succs = h.edges.loc[(h.edges["src"] == c) & (h.edges["kind"] == int(EdgeKind.FLOW)), "dst"].to_numpy()
        assert len(preds) == 1 and len(succs) == 1
        assert r.start_ns[c] >= r.end_ns[preds[0]] and r.start_ns[succs[0]] >= r.end_ns[c]
        if "all_gather" not in h.tasks["name"].iat[c]:
            assert preds[0] in rows
    before, after = step_ns(g), step_ns(h)
    assert after < before                                   # compute shrinks more than NVSwitch comm adds
    slow = TensorParallel(degree=t, topology="pcie_a100_8", sequence_parallel=sp).apply(g, ctx)
    assert step_ns(slow) > after                            # PCIe all-reduces cost more


def test_tensor_parallel_registered_and_errors(tmp_path: Path, llama) -> None:
    assert "tensor_parallel" in registry.names()
    ctx = make_context(llama.trace)
    assert TensorParallel(degree=1).apply(llama.graph, ctx) is llama.graph
    with pytest.raises(TransformError, match="degree"):
        TensorParallel(degree=0).apply(llama.graph, ctx)
    tr = KinetoTrace()
    tr.step(0, 0, 100)
    tr.runtime("cudaLaunchKernel", 10, 5, corr=1)
    tr.gpu("void at::native::vectorized_elementwise_kernel<4, add_kernel>", 20, 10, corr=1)
    a = analyze(tr.write(tmp_path / "noblock.json.gz"))
    with pytest.raises(TransformError, match="no transformer block"):
        TensorParallel(degree=2).apply(a.graph, make_context(a.trace))


def test_trace_collectives_calibrate_pricing(tmp_path: Path) -> None:
    a = analyze(transformer_trace(tmp_path / "nccl.json.gz", layers=1, nccl=True, steps=3))
    pts = collective_points(a.trace)
    assert len(pts) == 3 and pts[0].kind == "all_reduce" and pts[0].ranks == 8
    assert pts[0].message_bytes == 2048 * 4096 * 2
    ctx = make_context(a.trace)
    got = Collective("all_reduce", pts[0].message_bytes, 8, "dgx_a100").time_ns(ctx, "t")
    model = collective_time_ns("all_reduce", pts[0].message_bytes, 8, preset("dgx_a100"))
    assert got == pytest.approx(1.2 * model, rel=0.02)      # the trace ran 20 % slower than the preset


@pytest.mark.shared
def test_tensor_parallel_on_shared_decode_trace(shared_traces: Path) -> None:
    a = analyze(shared_traces / "tracelens" / "sglang_qwen3_8b_decode_mi300x.json.gz")
    b = find_blocks(a.graph)
    counts = b.groupby("part").size()
    # Qwen3-8B's 36 layers, each with its QKV, output and MLP GEMMs (SGLang's Triton kv-indices
    # gather before the first layer is a copy, not a 37th attention core, since 2026-11-29)
    assert (counts["attn_out"], counts["qkv"], counts["mlp_down"]) == (36, 36, 36)
    ctx = make_context(a.trace)
    h = TensorParallel(degree=8, topology="mi300x_8").apply(a.graph, ctx)
    comm = h.tasks[h.tasks["kind"] == int(TaskKind.COMM)]
    assert len(comm) == counts["attn_out"] + counts["mlp_down"]
    assert step_ns(h) < step_ns(a.graph)
