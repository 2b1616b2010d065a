"""The ``precision`` and ``gpu`` optimizations, the trace cost model behind them, and ``whatif devices``.

Hand-made traces: per step one ``aten::mm`` launching a GEMM kernel and one ``aten::add``
launching an elementwise kernel, with record_shapes-style ``Input Dims``/``Input type``; then
the direction of the effect on real shared traces.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
from tracegen import KinetoTrace

from whatif.api import Analysis, analyze, make_context, predict
from whatif.cli import COMMANDS
from whatif.commands import devices as devices_command
from whatif.depgraph.graph import TaskGraph, TaskKind
from whatif.hardware.devices import get_device
from whatif.hardware.retarget import retarget_ns
from whatif.hardware.roofline import fixed_latency_ns
from whatif.predictors.costs import TraceCostModel
from whatif.transforms.base import TransformContext, TransformError
from whatif.transforms.optimizations.gpu import Gpu
from whatif.transforms.optimizations.precision import Precision
from whatif.transforms.scenario import Scenario
from whatif.transforms.select import Selector

A100, H100 = get_device("A100_SXM_80GB"), get_device("H100_SXM")
N = 4096
FIXED_NS = fixed_latency_ns(A100)   # the recorded GPU's fixed kernel latency
GEMM_US, ADD_US, GEMV_US = 8000, 120, 30


def ops_trace(types: str = "float", gpu_name: str = "NVIDIA A100-SXM4-80GB", steps: int = 2) -> KinetoTrace:
    """Per step: a 4096³ GEMM (aten::mm), a 4096² add (aten::add), a decode GEMV (1×4096 @ 4096²),
    launched 60 us apart and queued on the stream (GPU-bound)."""
    tr = KinetoTrace(gpu_name=gpu_name)
    t, corr, gpu_free = 0, 1, 0
    for s in range(steps):
        begin = t
        t += 10
        for op, kernel, dims, dur in (("aten::mm", "ampere_sgemm_128x64_nn", [[N, N], [N, N]], GEMM_US),
                                      ("aten::add", "vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>",
                                       [[N, N], [N, N], []], ADD_US),
                                      ("aten::mm", "gemv2T_kernel", [[1, N], [N, N]], GEMV_US)):
            ext = 100 + corr
            tr.op(op, t, 30, args={"External id": ext, "Input Dims": dims,
                                   "Input type": [types] * 2 + ([] if len(dims) == 2 else ["Scalar"])})
            tr.runtime("cudaLaunchKernel", t + 5, 20, corr=corr)
            start = max(t + 30, gpu_free)
            tr.gpu(kernel, start, dur, corr=corr, **{"External id": ext})
            gpu_free = start + dur
            corr += 1
            t += 60
        tr.step(s, begin, t - begin)
    return tr


@pytest.fixture(scope="module")
def fp32_a100(tmp_path_factory: pytest.TempPathFactory) -> Analysis:
    return analyze(ops_trace().write(tmp_path_factory.mktemp("prec") / "fp32.json.gz"))


def kernel(graph: TaskGraph, prefix: str) -> np.ndarray:
    names = graph.tasks["name"].astype(str).to_numpy()
    ids = np.flatnonzero(np.char.startswith(names.astype(str), prefix))
    assert len(ids), prefix
    return ids


def busy_ratio(before: TaskGraph, after: TaskGraph, ids: np.ndarray, fixed_after: float = FIXED_NS) -> float:
    """(T' − F')/(T − F) averaged over ``ids``: the factor on the scalable part (F, F' the fixed
    kernel latencies of the GPUs before and after)."""
    b = before.tasks["dur_ns"].to_numpy()[ids].astype(float)
    a = after.tasks["dur_ns"].to_numpy()[ids].astype(float)
    return float(np.mean((a - fixed_after) / (b - FIXED_NS)))


def apply(analysis: Analysis, *transforms) -> TaskGraph:
    ctx = make_context(analysis.trace)
    return Scenario("t", list(transforms)).apply(analysis.graph, ctx)[-1]


def test_facts_from_recorded_shapes(fp32_a100: Analysis) -> None:
    g = fp32_a100.graph
    cost = TraceCostModel(fp32_a100.trace)
    gemm, add = kernel(g, "ampere_sgemm"), kernel(g, "vectorized_elementwise")
    f = cost.kernel_facts(g, np.concatenate([gemm, add]))
    assert list(f["kernel_class"]) == ["gemm"] * 2 + ["elementwise"] * 2
    assert f["flops"][0] == 2 * N ** 3 and f["bytes"][0] == 3 * N * N * 4 and f["weight_bytes"][0] == N * N * 4
    assert f["bytes"][2] == 3 * N * N * 4 and f["weight_bytes"][2] == 0
    assert list(f["dtype"]) == ["fp32"] * 4 and not f["estimated"].any()
    assert list(f["device"]) == ["A100_SXM_80GB"] * 4


def test_bf16_gemm_by_peak_ratio_add_by_byte_ratio(fp32_a100: Analysis) -> None:
    g = fp32_a100.graph
    before = [c for c in g.changes]
    out = apply(fp32_a100, Precision(dtype="bf16"))
    # the achievable rates of each dtype at this GEMM's size: above the datasheet's 1/16, since a
    # small bf16 GEMM loses more of its rate to ramp-up and tail than an fp32 one
    rates = A100.achievable_matrix_flops("fp32", 2.0 * N ** 3) / A100.achievable_matrix_flops("bf16", 2.0 * N ** 3)
    assert rates > A100.peak_flops("fp32") / A100.peak_flops("bf16")
    # a compute-bound GEMM before and after keeps its share of the achievable rate: the rate ratio
    assert busy_ratio(g, out, kernel(g, "ampere_sgemm")) == pytest.approx(rates, rel=1e-3)
    assert busy_ratio(g, out, kernel(g, "vectorized_elementwise")) == pytest.approx(0.5, rel=0.01)
    # the input graph is unchanged; the change log says what happened
    assert g.changes == before and "cost_precision" not in g.tasks
    assert out.changes[-1].transform == "precision" and out.changes[-1].after_ns < out.changes[-1].before_ns
    assert (out.tasks["cost_precision"].to_numpy()[kernel(g, "ampere_sgemm")] == "bf16").all()
    # and the step gets faster
    assert predict(fp32_a100, [Precision(dtype="bf16")]).scenarios[0].steps["predicted_ns"].sum() \
        < fp32_a100.steps["predicted_ns"].sum()


def test_a_16_bit_program_is_not_converted_again(tmp_path: Path) -> None:
    """Converting a program whose GEMMs already run in 16 bits is refused (its fp32 kernels are
    ones it computes in fp32 on purpose), as its memory is; so is converting twice. Chosen kernels
    already at or below the target are unchanged."""
    a = analyze(ops_trace(types="c10::BFloat16").write(tmp_path / "bf16.json.gz"))
    with pytest.raises(TransformError, match=r"GEMM, convolution and attention kernels already run in 16 bits"):
        apply(a, Precision(dtype="fp16"))
    out = apply(a, Precision(dtype="fp16", select=Selector(kernel_class="gemm")))
    assert (out.tasks["dur_ns"].to_numpy() == a.graph.tasks["dur_ns"].to_numpy()).all()
    b = analyze(ops_trace().write(tmp_path / "fp32.json.gz"))
    assert (apply(b, Precision(dtype="bf16")).tasks["dur_ns"].to_numpy() < b.graph.tasks["dur_ns"].to_numpy()).any()
    with pytest.raises(TransformError, match="already run in 16 bits"):
        apply(b, Precision(dtype="bf16"), Precision(dtype="bf16"))


def test_int4_weight_only_shrinks_decode_gemv_by_weight_bytes(tmp_path: Path) -> None:
    a = analyze(ops_trace(types="c10::BFloat16").write(tmp_path / "bf16.json.gz"))
    out = apply(a, Precision(dtype="int4_weight"))
    g = a.graph
    # a GEMV reads its weights: 4 bits / 16 bits of them
    assert busy_ratio(g, out, kernel(g, "gemv2T")) == pytest.approx(0.25, rel=0.05)
    assert busy_ratio(g, out, kernel(g, "ampere_sgemm")) == 1.0          # compute-bound: weight bytes do not matter
    assert busy_ratio(g, out, kernel(g, "vectorized_elementwise")) == 1.0  # activations stay bf16
    int8w = apply(a, Precision(dtype="int8", weight_only=True))
    assert busy_ratio(g, int8w, kernel(g, "gemv2T")) == pytest.approx(0.5, rel=0.02)


def test_refusals(fp32_a100: Analysis, tmp_path: Path) -> None:
    with pytest.raises(TransformError, match=r"A100_SXM_80GB has no native fp8"):
        apply(fp32_a100, Precision(dtype="fp8"))
    with pytest.raises(TransformError, match="int4_weight"):
        apply(fp32_a100, Precision(dtype="int4"))
    with pytest.raises(TransformError, match="weight_only needs dtype int8 or fp8"):
        apply(fp32_a100, Precision(dtype="bf16", weight_only=True))
    v100 = analyze(ops_trace(gpu_name="Tesla V100-SXM2-16GB").write(tmp_path / "v100.json.gz"))
    with pytest.raises(TransformError, match=r"no native bf16 rate \(use dtype='fp16'\)"):
        apply(v100, Precision(dtype="bf16"))
    odd = analyze(ops_trace(gpu_name="Imaginary GPU 9000").write(tmp_path / "odd.json.gz"))
    with pytest.raises(TransformError, match="not in the device catalog"):
        apply(odd, Precision(dtype="bf16"))
    with pytest.raises(TransformError, match="not in the device catalog"):
        apply(odd, Gpu(device="H100_SXM"))
    with pytest.raises(TransformError, match="unknown GPU 'a toaster'"):
        apply(fp32_a100, Gpu(device="a toaster"))
    with pytest.raises(TransformError, match="needs cost models"):
        Precision(dtype="bf16").apply(fp32_a100.graph, TransformContext())


def test_gpu_a100_to_h100(fp32_a100: Analysis) -> None:
    g = fp32_a100.graph
    out = apply(fp32_a100, Gpu(device="NVIDIA H100 80GB HBM3"))       # trace-style names work too
    bw = A100.stream_bw_bytes_per_s / H100.stream_bw_bytes_per_s     # achievable streaming bandwidths
    h100_fixed = fixed_latency_ns(H100)
    assert busy_ratio(g, out, kernel(g, "vectorized_elementwise"), h100_fixed) == pytest.approx(bw, rel=0.01)
    flops = 2.0 * N ** 3                                              # compute-bound: achievable GEMM rates at its size
    rates = A100.achievable_matrix_flops("fp32", flops) / H100.achievable_matrix_flops("fp32", flops)
    assert busy_ratio(g, out, kernel(g, "ampere_sgemm"), h100_fixed) == pytest.approx(rates, rel=0.01)
    # the transform prices each kernel as the retargeting function does: same efficiency on the destination
    add = kernel(g, "vectorized_elementwise")[0]
    moved = retarget_ns([ADD_US * 1000], ["elementwise"], ["fp32"], [N * N], [3 * N * N * 4], A100, H100)
    assert out.tasks["dur_ns"].iat[add] == pytest.approx(moved[0], abs=1)
    # CPU unchanged, change log present, input unchanged
    cpu = g.tasks["kind"].isin([int(TaskKind.CPU_CALL), int(TaskKind.CPU_WORK)]).to_numpy()
    assert (out.tasks["dur_ns"].to_numpy()[cpu] == g.tasks["dur_ns"].to_numpy()[cpu]).all()
    assert out.changes[-1].transform == "gpu" and "cost_device" not in g.tasks
    assert (out.tasks["cost_device"].to_numpy()[kernel(g, "ampere")] == "H100_SXM").all()
    # same device: nothing changes
    same = apply(fp32_a100, Gpu(device="A100_SXM_80GB"))
    assert (same.tasks["dur_ns"].to_numpy() == g.tasks["dur_ns"].to_numpy()).all()


def test_gpu_then_precision_uses_the_new_device(fp32_a100: Analysis) -> None:
    out = apply(fp32_a100, Gpu(device="H100_SXM"), Precision(dtype="fp8"))   # fp8 exists on H100
    moved = apply(fp32_a100, Gpu(device="H100_SXM"))
    g = fp32_a100.graph
    assert busy_ratio(moved, out, kernel(g, "ampere_sgemm")) < 0.1           # fp32 -> fp8 on H100
    back = apply(fp32_a100, Gpu(device="H100_SXM"), Gpu(device="A100_SXM_80GB"))
    # there and back is the identity: each kernel keeps its efficiency both ways
    assert np.allclose(back.tasks["dur_ns"].to_numpy(), g.tasks["dur_ns"].to_numpy(), rtol=0.001, atol=2)


def test_host_speed_scales_cpu(fp32_a100: Analysis) -> None:
    g = fp32_a100.graph
    out = apply(fp32_a100, Gpu(device="A100_SXM_80GB", host_speed=2.0))
    calls = g.tasks["kind"].to_numpy() == int(TaskKind.CPU_CALL)
    assert np.allclose(out.tasks["dur_ns"].to_numpy()[calls], g.tasks["dur_ns"].to_numpy()[calls] / 2, atol=1)
    with pytest.raises(TransformError, match="host_speed must be a finite number > 0"):
        apply(fp32_a100, Gpu(device="H100_SXM", host_speed=0))


def test_selection_limits_the_change(fp32_a100: Analysis) -> None:
    g = fp32_a100.graph
    out = apply(fp32_a100, Precision(dtype="bf16", select=Selector(kind="kernel", kernel_class="gemm")))
    add = kernel(g, "vectorized_elementwise")
    assert (out.tasks["dur_ns"].to_numpy()[add] == g.tasks["dur_ns"].to_numpy()[add]).all()
    assert busy_ratio(g, out, kernel(g, "ampere_sgemm")) < 0.1


def test_devices_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert "devices" in COMMANDS
    flags = {"sources": False, "toml": False}
    assert devices_command.run(argparse.Namespace(name=None, **flags)) == 0
    out = capsys.readouterr().out
    assert "MI300X" in out and "1307.4" in out and "V100_SXM2_16GB" in out
    assert devices_command.run(argparse.Namespace(name="AMD Instinct MI300X VF", **flags)) == 0
    assert "MI300X" in capsys.readouterr().out
    assert devices_command.run(argparse.Namespace(name="no such gpu", **flags)) == 2


# -- real traces: the direction is right ----------------------------------------------------------
def _gpu_busy(graph: TaskGraph) -> int:
    t = graph.tasks
    return int(t["dur_ns"].to_numpy()[t["kind"].isin([4, 5, 6, 7]).to_numpy()].sum())


def test_real_traces_direction(shared_traces: Path) -> None:
    h100 = analyze(shared_traces / "tracelens/hf_h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    base = _gpu_busy(h100.graph)
    faster = {d: _gpu_busy(apply(h100, Gpu(device=d))) for d in ("MI300X", "B200", "H200")}
    assert all(v < base for v in faster.values()) and faster["B200"] < faster["H200"]
    assert _gpu_busy(apply(h100, Gpu(device="A100_SXM_80GB"))) > base
    fp8 = predict(h100, [Precision(dtype="fp8")]).scenarios[0]
    assert _gpu_busy(fp8.graph) < base
    assert fp8.steps["predicted_ns"].sum() <= h100.steps["predicted_ns"].sum()
    mi300 = analyze(shared_traces / "tracelens/hf_mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    assert _gpu_busy(apply(mi300, Gpu(device="H100_SXM"))) > _gpu_busy(mi300.graph)


def test_real_v100_amp(shared_traces: Path) -> None:
    v100 = analyze(shared_traces / "kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz")
    out = apply(v100, Precision(dtype="fp16"))
    assert _gpu_busy(out) < 0.7 * _gpu_busy(v100.graph)
    with pytest.raises(TransformError, match="V100"):
        apply(v100, Precision(dtype="bf16"))


def test_a_destination_too_small_for_the_recorded_peak_is_refused(tmp_path: Path) -> None:
    """With allocator records (record --memory), moving to a GPU with less memory than a device's
    allocated peak is refused in one line; a GPU with room, or a trace without records, is not."""
    gib = 1 << 30
    tr = ops_trace()
    tr.memory(15, 8 * gib, addr=1, total_allocated=60 * gib, total_reserved=64 * gib)
    tr.memory(40, -8 * gib, addr=1, total_allocated=52 * gib, total_reserved=64 * gib)
    big = analyze(tr.write(tmp_path / "big.json.gz"))
    with pytest.raises(TransformError, match=r"gpu: rank 0 GPU 0 held 60\.0 GiB allocated at its peak, more than "
                                             r"the A40's 48 GiB: the work does not fit"):
        apply(big, Gpu(device="A40"))
    assert len(apply(big, Gpu(device="H100_SXM")).tasks)  # 80 GB: fits
    with pytest.raises(TransformError, match=r"more than the RTX_2080_TI's 11 GiB"):  # a catalog name, as written
        apply(big, Gpu(device="RTX_2080_TI"))
    assert len(apply(fp32_a100_trace(tmp_path), Gpu(device="A40")).tasks)  # no records: not checked
    relative = ops_trace()  # sizes only (2021 traces): the peak is relative, so no verdict
    relative.memory(15, 60 * gib, addr=1)
    assert len(apply(analyze(relative.write(tmp_path / "rel.json.gz")), Gpu(device="A40")).tasks)


def fp32_a100_trace(tmp_path: Path) -> Analysis:
    return analyze(ops_trace().write(tmp_path / "plain.json.gz"))
