import doctest

import numpy as np
import pytest
from _cost_data import TRACES, need

import whatif.core.kernels as kernels
from whatif.core.dtypes import element_bytes
from whatif.core.kernels import KernelClass as K
from whatif.core.kernels import classify_kernel, op_flops_bytes


def test_doctests():
    assert doctest.testmod(kernels).failed == 0


@pytest.mark.parametrize("name,op,expected", [
    ("sm80_xmma_gemm_f16f16_f16f32_f32_nn_n_tilesize128x128x32_stage4_warpsize2x2x1", None, K.GEMM),
    ("ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn", None, K.GEMM),
    ("nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT", None, K.GEMM),
    ("volta_sgemm_128x64_nn", None, K.GEMM),
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT96x96x128_MI16x16x1_SN", None, K.GEMM),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>>", None, K.ATTENTION),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", None, K.ATTENTION),
    ("aiter::fmha_fwd_hd128_bf16_rtz", None, K.ATTENTION),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", None,
     K.ELEMENTWISE),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, MeanOps>>", None,
     K.REDUCTION),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>", None,
     K.NORMALIZATION),
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, true>", None,
     K.NORMALIZATION),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", None, K.COLLECTIVE),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", None, K.COLLECTIVE),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", None,
     K.MEMSET),
    ("void at::native::elementwise_kernel<128, 2, direct_copy_kernel_cuda>", None, K.COPY),
    ("igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt128x128x32", None, K.CONV),
    ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw", None, K.CONV),
    ("triton_poi_fused_add_mul_0", None, K.ELEMENTWISE),
    ("triton_red_fused_add_mean_mul_pow_rsqrt_0", None, K.NORMALIZATION),
    ("triton_per_fused_sum_3", None, K.REDUCTION),
    ("triton_poi_fused__to_copy_1", None, K.COPY),
    ("create_flashinfer_kv_indices_triton", None, K.COPY),   # SGLang's page-table gather before attention
    ("void paged_attention_ll4mi_QKV_mfma16_kernel<0, __hip_bfloat16>", None, K.ATTENTION),
    ("triton__0d1d2d", "aten::mm", K.GEMM),
    ("some_unknown_kernel", "aten::addmm", K.GEMM),
    ("some_unknown_kernel", None, K.OTHER),
])
def test_classify(name, op, expected):
    assert classify_kernel(name, op) is expected


def test_mm_flops_bytes_by_hand():
    # (64x128) @ (128x32) in bf16: 2*64*128*32 FLOPs; (64*128 + 128*32 + 64*32) * 2 bytes
    assert op_flops_bytes("aten::mm", [[64, 128], [128, 32]], ["c10::BFloat16"] * 2) == \
        (2 * 64 * 128 * 32, (64 * 128 + 128 * 32 + 64 * 32) * 2)


def test_bmm_linear_matmul_and_sdpa():
    assert op_flops_bytes("aten::bmm", [[4, 8, 16], [4, 16, 2]], ["float", "float"])[0] == \
        2 * 4 * 8 * 16 * 2
    f, b = op_flops_bytes("aten::linear", [[2, 3, 16], [32, 16], [32]], ["float"] * 3)
    assert f == 2 * 6 * 32 * 16 + 6 * 32 and b == (6 * 16 + 16 * 32 + 6 * 32 + 32) * 4   # bias: one add each
    assert op_flops_bytes("aten::matmul", [[5, 7], [7]], ["float", "float"])[0] == 2 * 5 * 7
    f, b = op_flops_bytes("aten::scaled_dot_product_attention",
                          [[4, 12, 197, 64]] * 3 + [[], []], ["c10::BFloat16"] * 3 + ["", ""])
    assert f == 4 * 4 * 12 * 197 * 197 * 64 and b == 4 * (4 * 12 * 197 * 64) * 2


def test_memory_bound_ops():
    # out-of-place add reads 2 tensors, writes 1
    assert op_flops_bytes("aten::add", [[10, 10], [10, 10], []], ["float", "float", "Scalar"]) == \
        (100, 1200)
    _f, b = op_flops_bytes("aten::layer_norm", [[8, 64], [], [64], [64], [], []],
                          ["c10::Half", "", "c10::Half", "c10::Half", "Scalar", ""])
    assert b == 2 * 8 * 64 * 2 + 6 * 64 * 2   # TraceLens's: mean, var, γ, β read; mean, var written
    assert op_flops_bytes("aten::gelu", [[4, 4]], ["float"]) == (16, 2 * 16 * 4)   # one FLOP per element
    assert op_flops_bytes("aten::softmax", [[2, 3], [], []], ["float", "Scalar", ""])[1] == 48


def test_dtype_and_unknowns():
    assert element_bytes("c10::Float8_e4m3fn") == 1 and element_bytes("double") == 8
    assert op_flops_bytes("aten::mm", [[2, 3], [4, 5]], ["float", "float"]) is None  # mismatch
    assert op_flops_bytes("aten::frobnicate", [[2, 3]], ["float"]) is None
    assert op_flops_bytes("aten::mm", None, None) is None


@pytest.mark.shared
def test_real_trace_kernels_classified():
    from whatif.tracer import load_trace
    path = need(TRACES / "hta" / "nccl_data_a100_rank0of2.json.gz")
    ev = load_trace(path).events
    names = ev.loc[ev["kind"] == 5, "name"].astype(str).unique()
    classes = [classify_kernel(n) for n in names]
    assert K.COLLECTIVE in classes and K.GEMM in classes and K.ELEMENTWISE in classes
    assert sum(c is K.OTHER for c in classes) / len(classes) < 0.1


@pytest.mark.shared
def test_real_trace_shapes_priced():
    from whatif.tracer import load_trace
    path = need(TRACES / "tracelens" / "hf_h100")
    files = sorted(path.glob("*.json*"))
    if not files:
        pytest.skip(f"no trace in {path}")
    trace = load_trace(files[0])
    ev = trace.events
    rows = np.flatnonzero((ev["kind"] == 0) & ev["name"].astype(str).isin(["aten::mm", "aten::addmm", "aten::linear"]))
    priced = [op_flops_bytes(n, a.get("Input Dims"), a.get("Input type"))
              for n, a in zip(ev["name"].astype(str).to_numpy()[rows], trace.raw_args(rows)) if isinstance(a, dict)]
    assert priced and sum(p is not None for p in priced) / len(priced) > 0.9
