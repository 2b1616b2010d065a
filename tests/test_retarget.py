"""Retargeting kernels to another GPU (whatif.hardware.retarget, whatif.predictors.pairs and the
gpu transform's fit_from)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _cost_data import TRACES, VIDUR, bench_module, need

from whatif.api import analyze, make_context
from whatif.core.dtypes import DType
from whatif.core.errors import WhatifError
from whatif.depgraph.graph import GPU_WORK_KINDS, TaskKind, kind_codes
from whatif.hardware.devices import Achievable, get_device
from whatif.hardware.retarget import (
    FADE_DECADES,
    Curve,
    PairedKernels,
    fit_curve,
    fit_retarget,
    retarget_ns,
)
from whatif.hardware.roofline import achievable_time_ns, fixed_latency_ns, roofline_time_ns
from whatif.predictors.pairs import op_calls, paired_ops
from whatif.tracer.host import host_time_ratio
from whatif.transforms.base import TransformError
from whatif.transforms.optimizations.gpu import Gpu
from whatif.transforms.scenario import Scenario

A100, H100, A40 = get_device("A100_SXM_80GB"), get_device("H100_SXM"), get_device("A40")
HF = TRACES / "tracelens"
BERT = "gaunernst_bert-small-uncased__1016001.json.gz"
FALCON = "Falconsai_nsfw_image_detection__1016002.json.gz"


def _with_achievable(dev, gemm_tflops: float, small_tflops: float, stream_gbps: float, launch: float = 2_000.0):
    ach = Achievable(gemm_flops={DType.BF16: gemm_tflops * 1e12}, small_gemm_flops={DType.BF16: small_tflops * 1e12},
                     stream_bw_bytes_per_s=stream_gbps * 1e9, l2_bw_bytes_per_s=0.0, launch_ns=launch,
                     link_bw_bytes_per_s=0.0, pcie_bw_bytes_per_s=0.0, sources={"test": "made up"})
    return replace(dev, achievable=ach)


def test_same_gpu_is_the_identity_and_there_and_back_too():
    dur = np.array([1_500.0, 80_000.0, 3e6])
    args = (["elementwise", "gemm", "gemm"], ["bf16"] * 3, [1e6, 1e11, 5e12], [4e6, 1e8, 3e9])
    assert (retarget_ns(dur, *args, A100, A100) == dur).all()
    there = retarget_ns(dur, *args, A100, H100)
    assert np.allclose(retarget_ns(there, *args, H100, A100), dur, rtol=1e-9)


def test_a_kernel_keeps_its_efficiency():
    # a large bf16 GEMM at 60 % of the source's achievable rate runs at 60 % of the destination's
    src = _with_achievable(A100, 280, 150, 1700)
    dst = _with_achievable(H100, 700, 300, 3000)
    flops, nbytes = 2 * 8192.0 ** 3, 3 * 8192.0 ** 2 * 2
    ideal_src = achievable_time_ns(flops, nbytes, src, "bf16", "gemm")
    measured = fixed_latency_ns(src) + ideal_src / 0.6
    got = retarget_ns([measured], ["gemm"], ["bf16"], [flops], [nbytes], src, dst)[0]
    ideal_dst = achievable_time_ns(flops, nbytes, dst, "bf16", "gemm")
    assert got == pytest.approx(fixed_latency_ns(dst) + ideal_dst / 0.6, rel=1e-9)
    # a memory-bound kernel moves by the streaming-bandwidth ratio, not the datasheet one
    add = retarget_ns([fixed_latency_ns(src) + 100_000], ["elementwise"], ["bf16"], [1e7], [1e8], src, dst)[0]
    assert add == pytest.approx(fixed_latency_ns(dst) + 100_000 * 1700 / 3000)


def test_achievable_rate_between_small_and_large_gemm():
    dev = _with_achievable(H100, 700, 300, 3000)
    small, large = 2 * 1024.0 ** 3, 2 * 8192.0 ** 3
    assert dev.achievable_matrix_flops("bf16", small / 10) == pytest.approx(300e12)
    assert dev.achievable_matrix_flops("bf16", large * 10) == pytest.approx(700e12)
    mid = dev.achievable_matrix_flops("bf16", 2 * 2896.0 ** 3)      # halfway in log FLOPs
    fixed_s = small / 300e12 - small * (large / 700e12 - small / 300e12) / (large - small)
    assert fixed_s > 0 and mid == pytest.approx(2 * 2896.0 ** 3 / (fixed_s + 2 * 2896.0 ** 3 * (
        (large / 700e12 - small / 300e12) / (large - small))), rel=1e-9)
    assert (300e12 * 700e12) ** 0.5 < mid < 700e12    # above the log-linear curve: the fixed cost fades
    # no figure for fp8: its datasheet peak; a device without figures: its datasheet roofline
    assert dev.achievable_matrix_flops("fp8", large) == H100.peak_flops("fp8")
    bare = replace(A40, achievable=None)
    assert achievable_time_ns(1e12, 1e9, bare, "fp16", "gemm") == roofline_time_ns(1e12, 1e9, bare, "fp16", "gemm")
    assert achievable_time_ns(1e12, 1e9, A40, "fp16", "gemm") > roofline_time_ns(1e12, 1e9, A40, "fp16", "gemm")


def test_faster_destination_never_slower():
    slow = _with_achievable(A100, 250, 100, 1500)
    fast = _with_achievable(A100, 500, 200, 3000, launch=1_000.0)
    rng = np.random.default_rng(0)
    n = 200
    flops, nbytes = 10 ** rng.uniform(5, 13, n), 10 ** rng.uniform(4, 10, n)
    cls = rng.choice(["gemm", "elementwise", "attention", "reduction"], n)
    dur = 1_000 + 10 ** rng.uniform(2, 7, n)
    moved = retarget_ns(dur, cls, ["bf16"] * n, flops, nbytes, replace(slow, name="SLOW"), replace(fast, name="FAST"))
    assert (moved <= dur + 1e-6).all()


def test_curve_fit_and_fade():
    c = fit_curve(np.r_[np.zeros(40), np.ones(40)], np.r_[np.full(40, 0.5), np.full(40, 0.1)])
    assert c.knots == (0.0, 1.0) and c.values == (0.5, 0.1) and c.samples == 80 and c.x_max == 1.0
    half = FADE_DECADES / 2
    faded = Curve((0.0,), (0.3,), 1, 0.0).at(np.array([-5.0, 0.0, half, 2.0]))
    assert faded.tolist() == pytest.approx([0.3, 0.3, 0.15, 0.0])
    with pytest.raises(ValueError, match="no finite points"):
        fit_curve(np.array([np.nan]), np.array([1.0]))


def test_fit_recovers_a_residual_by_family():
    rng = np.random.default_rng(1)
    n = 120
    flops = 10 ** rng.uniform(8, 11, n)
    frame = pd.DataFrame({"family": ["aten::mm"] * n, "kernel_class": "gemm", "dtype": "bf16", "flops": flops,
                          "bytes": flops / 200, "src_ns": 0.0, "dst_ns": 0.0})
    frame["src_ns"] = 2_000 + flops / 150e12 * 1e9
    work = (frame["kernel_class"], frame["dtype"], frame["flops"], frame["bytes"])
    base = retarget_ns(frame["src_ns"], *work, A100, H100)
    fixed = np.minimum(frame["src_ns"], fixed_latency_ns(A100)) * fixed_latency_ns(H100) / fixed_latency_ns(A100)
    frame["dst_ns"] = fixed + (base - fixed) * 1.3          # the destination is 30 % slower than its roofline says
    fit = fit_retarget(PairedKernels(frame), A100, H100)
    assert set(fit.families) == {"aten::mm"} and set(fit.classes) == {"gemm"}
    got = retarget_ns(frame["src_ns"], *work, A100, H100, fit, frame["family"])
    assert np.allclose(got, frame["dst_ns"], rtol=1e-6)
    other = retarget_ns(frame["src_ns"][:3], ["elementwise"] * 3, ["bf16"] * 3, frame["flops"][:3],
                        frame["bytes"][:3], A100, H100, fit, ["aten::add"] * 3)    # no curve: roofline ratio only
    plain = retarget_ns(frame["src_ns"][:3], ["elementwise"] * 3, ["bf16"] * 3, frame["flops"][:3],
                        frame["bytes"][:3], A100, H100)
    assert np.allclose(other, plain)
    with pytest.raises(ValueError, match="moves A100_SXM_80GB to H100_SXM"):
        retarget_ns([1.0], ["gemm"], ["bf16"], [1.0], [1.0], H100, A100, fit)
    with pytest.raises(ValueError, match="lack column"):
        PairedKernels(frame.drop(columns=["dst_ns"]))


def test_paired_ops_of_a_real_pair():
    need(HF)
    calls = op_calls(analyze(HF / "hf_h100" / BERT).trace)
    assert len(calls) > 20 and (calls["gpu_ns"] > 0).all() and "aten::addmm" in set(calls["family"])
    pairs = paired_ops(analyze(HF / "hf_h100" / BERT).trace, analyze(HF / "hf_mi300" / BERT).trace)
    f = pairs.frame
    assert len(f) >= 10 and (f["src_ns"] > 0).all() and (f["dst_ns"] > 0).all()
    assert "gemm" in set(f["kernel_class"]) and f["flops"].notna().all()


def _apply(path: Path, transform: Gpu):
    a = analyze(path)
    return a.graph, Scenario("t", [transform]).apply(a.graph, make_context(a.trace))[-1]


def test_gpu_fit_from_its_own_pair_lands_on_the_measured_gpu_time():
    """BERT H100 -> MI300X fitted on BERT's own pair (in sample: the plumbing from two traces to
    the fitted curves to the moved kernels): the GPU busy time lands within 3 % of the measured
    one, far closer than without the fit (bench/whatif_gpu.py scores the honest leave-one-out)."""
    need(HF)
    src, dst = HF / "hf_h100" / BERT, HF / "hf_mi300" / BERT
    measured = analyze(dst).graph

    def busy(g) -> float:
        t = g.tasks
        return float(t["dur_ns"][t["kind"].isin(kind_codes(GPU_WORK_KINDS)) & (t["step"] >= 0)].sum())
    _, plain = _apply(src, Gpu(device="MI300X"))
    _, fitted = _apply(src, Gpu(device="MI300X", fit_from=[f"{src}={dst}"]))
    target = busy(measured)
    assert abs(busy(fitted) / target - 1) < 0.03 < abs(busy(plain) / target - 1)


def test_gpu_fit_from_refusals(tmp_path: Path):
    need(HF)
    src = HF / "hf_h100" / BERT
    with pytest.raises(TransformError, match="is not 'TRACE_ON_SOURCE=TRACE_ON_DESTINATION'"):
        _apply(src, Gpu(device="MI300X", fit_from=["just_one.json"]))
    with pytest.raises(TransformError, match="was recorded on H100_SXM, not MI300X"):
        _apply(src, Gpu(device="MI300X", fit_from=[f"{HF / 'hf_h100' / FALCON}={HF / 'hf_h100' / FALCON}"]))
    with pytest.raises(TransformError, match=r"fit_from: .*no such file"):
        _apply(src, Gpu(device="MI300X", fit_from=[f"{tmp_path / 'a.json'}={tmp_path / 'b.json'}"]))


@pytest.mark.slow
def test_vidur_families_within_goal_leave_one_model_out():
    need(VIDUR)
    bench = bench_module("cost_gpu_to_gpu")
    errors = bench.retargeted(bench.paired(), fitted=True)
    medians = errors.groupby(["direction", "family"])["err"].median()
    assert len(medians) == 10 and (medians <= bench.FAMILY_GOAL_PCT).all(), medians.to_dict()


def test_host_ratio_of_the_same_program_on_two_hosts():
    need(HF)
    h100, mi300 = analyze(HF / "hf_h100" / BERT).trace, analyze(HF / "hf_mi300" / BERT).trace
    there = host_time_ratio(h100, mi300)
    back = host_time_ratio(mi300, h100)
    assert there.matched_ops >= 20 and 0.5 < there.coverage <= 1.0
    assert 0.7 < there.time_ratio < 1.0            # the MI300X machine runs BERT's CPU ops faster
    assert there.time_ratio * back.time_ratio == pytest.approx(1.0, rel=0.15)
    assert host_time_ratio(h100, h100).time_ratio == pytest.approx(1.0)


def test_host_ratio_refuses_unrelated_programs(tmp_path: Path):
    need(HF)
    h100 = analyze(HF / "hf_h100" / BERT).trace
    other = analyze(need(TRACES / "tracelens" / "mi210_gpu_only.json.gz")).trace
    with pytest.raises(WhatifError, match="CPU ops of the same name and shapes"):
        host_time_ratio(h100, other)


def test_gpu_host_from_scales_the_cpu_side():
    need(HF)
    src, dst = HF / "hf_h100" / BERT, HF / "hf_mi300" / BERT
    g, out = _apply(src, Gpu(device="MI300X", host_from=str(dst)))
    ratio = host_time_ratio(analyze(src).trace, analyze(dst).trace).time_ratio
    cpu = g.tasks["kind"].isin([int(TaskKind.CPU_CALL), int(TaskKind.CPU_WORK)]).to_numpy()
    before, after = g.tasks["dur_ns"].to_numpy()[cpu], out.tasks["dur_ns"].to_numpy()[cpu]
    assert np.allclose(after, np.rint(before * ratio), atol=1)
    with pytest.raises(TransformError, match="host_speed or host_from, not both"):
        _apply(src, Gpu(device="MI300X", host_from=str(dst), host_speed=2.0))
