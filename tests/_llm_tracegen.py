"""Hand-made decoder-only LLM forward passes (prefill or decode) with recorded shapes, for the
PIM and parallel tests: per layer norm, QKV GEMM, SDPA, out-proj, add, norm, gate/up, SiLU, down, add."""
from __future__ import annotations

from pathlib import Path

from tracegen import KinetoTrace

from whatif.hardware.devices import get_device
from whatif.hardware.roofline import achievable_time_ns, large_gemm_rate, weight_gemm_ns

PEAK, BW, FIXED_US, ELEM = 700e12, 3.0e12, 3.0, 2     # H100-like achieved rates, bf16
BF16 = "c10::BFloat16"


def llm_trace(path: Path, *, batch: int = 1, new_tokens: int = 1, kv_tokens: int = 2048, layers: int = 2,
              hidden: int = 4096, heads: int = 32, ffn: int = 11008, steps: int = 2,
              phases: tuple[str, ...] = (), backward: bool = False, kv_heads: int = 0,
              gpu_name: str = "NVIDIA H100 80GB HBM3", peak: float = PEAK, bw: float = BW,
              decode_batch: int = 0, fa_backward_kernels: int = 1, rank: int | None = None,
              world_size: int | None = None, device: str | None = None, tp_all_reduce: int = 0,
              fused_add_norm: bool = False, gemm_law: bool = False, prefill_tokens: int = 0) -> Path:
    """One forward per step of ``batch`` sequences of ``new_tokens`` tokens (1 = decode) attending
    to ``kv_tokens`` cached tokens. ``phases``: a ``phase:<name>`` annotation per step (cycled), in
    which case the tokens of a ``prefill`` step are ``kv_tokens`` and of a ``decode`` step 1.
    ``backward``: a training step — after the forward, the loss backward, each layer's backward in reverse (two GEMMs
    per forward GEMM under ``aten::mm``, flash-attention backward, SiLU backward), the embedding
    backward, then an optimizer kernel. ``kv_heads``: key/value heads (GQA when fewer than
    ``heads``; 0 = ``heads``). ``gpu_name``, ``peak`` (FLOP/s) and ``bw`` (bytes/s): the recorded
    GPU and the achieved rates of the kernel model. ``decode_batch``: sequences of a ``decode``
    phase step (0 = ``batch``). ``fa_backward_kernels``: 3 launches FlashAttention-2's backward as
    its three kernels (dot(dO, O), dQ/dK/dV, convert dQ). ``rank``/``world_size``: the
    ``distributedInfo`` of one rank's file. ``device``: a catalog GPU whose achievable roofline
    (:func:`whatif.hardware.roofline.achievable_time_ns`, the one the cost models price with) times
    the kernels instead of ``peak``/``bw``. ``tp_all_reduce`` g > 0: one rank of a tensor-parallel
    group of g, its block output all-reduced after the attention-output and MLP-down GEMMs by an
    NCCL kernel on the compute stream (as vLLM and SGLang launch it), its size recorded
    (``record_param_comms``: ``Collective name``, ``In msg nelems``, ``Group size``, ``dtype``) and
    its time a ring's ``2(g−1)/g`` of the bytes at 200 GB/s plus 10 us. ``fused_add_norm``: each
    residual add and the norm after it as vLLM's one ``fused_add_rms_norm`` kernel (reads the block
    output and the residual, writes both: 4 bytes per hidden value and token), the last layer's
    being the final norm. ``gemm_law`` (with ``device``): the weight GEMMs timed by the serving
    iteration model's law (:func:`whatif.hardware.roofline.weight_gemm_ns`: padded rows at the
    largest GEMMs' rate, overlapped with the weight reads; checked against Vidur's measured A100/A40
    GEMMs in bench/serving_op_laws.py) instead of the achievable roofline at their own size.
    ``prefill_tokens`` p > 0: a dense batch mixing phases, as continuous batching runs it: besides
    the ``batch`` sequences' ``new_tokens``, each step prefills one prompt of p tokens; the
    token-wise kernels run on both, and each layer adds a causal attention kernel of the prompt over
    itself (half of its square's FLOPs)."""
    tr = KinetoTrace(gpu_name=gpu_name, rank=rank, world_size=world_size)
    dev = get_device(device) if device is not None else None
    corr, ts, gpu_t = 0, 0.0, 0.0
    d = hidden // heads
    hkv = kv_heads or heads

    def kernel(name: str, flops: float, nbytes: float, op: str, dims, types, weights: float = 0.0) -> None:
        nonlocal corr, ts, gpu_t
        corr += 1
        tr._x("cpu_op", op, ts, 6, 100, 1, **{"Input Dims": dims, "Input type": types, "External id": corr})
        tr.runtime("cudaLaunchKernel", ts + 1, 4, corr=corr)
        if dev is not None and weights:
            rows = flops / (2.0 * weights)
            us = FIXED_US + float(weight_gemm_ns(weights, rows, ELEM, large_gemm_rate(dev, "bf16") / 1e9,
                                                 dev.stream_bw_bytes_per_s / 1e9)) / 1e3
        elif dev is not None:
            cls = "gemm" if "gemm" in name else "attention" if "flash" in name else "elementwise"
            us = FIXED_US + achievable_time_ns(flops, nbytes, dev, "bf16", cls) / 1e3
        else:
            us = FIXED_US + max(flops / peak, nbytes / bw) * 1e6
        start = max(gpu_t, ts + 8)
        tr.gpu(name, start, us, corr=corr, **{"External id": corr})
        gpu_t = start + us + 1
        ts += 8

    def all_reduce(nelems: int) -> None:
        nonlocal corr, ts, gpu_t
        corr += 1
        sizes = {"Collective name": "allreduce", "In msg nelems": nelems, "Out msg nelems": nelems,
                 "Group size": tp_all_reduce, "dtype": "BFloat16"}
        tr._x("cpu_op", "record_param_comms", ts, 6, 100, 1, **{"External id": corr}, **sizes)
        tr.runtime("cudaLaunchKernel", ts + 1, 4, corr=corr)
        us = 10 + 2 * (tp_all_reduce - 1) / tp_all_reduce * nelems * ELEM / 200e3
        start = max(gpu_t, ts + 8)
        tr.gpu("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", start, us, corr=corr,
               **{"External id": corr}, **sizes)
        gpu_t = start + us + 1
        ts += 8

    for s in range(steps):
        phase = phases[s % len(phases)] if phases else None
        m_tok = (kv_tokens if phase == "prefill" else 1) if phase else new_tokens
        b_step = (decode_batch or batch) if phase == "decode" else batch
        m = b_step * m_tok + prefill_tokens
        step_start = ts

        def gemm(tag: str, n: int, k: int, m: int = m) -> None:
            kernel(f"sm90_xmma_gemm_bf16bf16_bf16f32_{tag}", 2.0 * m * k * n, ELEM * (m * k + k * n + m * n),
                   "aten::mm", [[m, k], [k, n]], [BF16, BF16], weights=k * n if gemm_law else 0.0)

        def attention(b: int, q: int, kv: int, causal: bool = False) -> None:
            """SDPA of ``b`` sequences of ``q`` query tokens over ``kv`` keys (a causal mask halves the FLOPs)."""
            kernel("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>",
                   (2.0 if causal else 4.0) * b * heads * q * kv * d, ELEM * b * d * (2 * heads * q + 2 * hkv * kv),
                   "aten::scaled_dot_product_attention",
                   [[b, heads, q, d], [b, hkv, kv, d], [b, hkv, kv, d]], [BF16] * 3)

        def mem(name: str, nbytes: float, op: str, m: int = m) -> None:
            kernel(name, nbytes / ELEM, nbytes, op, [[m, hidden]], [BF16])

        def add_norm(norm: bool, m: int = m) -> None:
            if fused_add_norm:
                mem("void vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>", 4 * m * hidden * ELEM,
                    "_C::fused_add_rms_norm", m)
                return
            mem("void at::native::vectorized_elementwise_kernel<4, add_kernel>", 3 * m * hidden * ELEM, "aten::add", m)
            if norm:
                mem("void at::native::rms_norm_kernel<bf16>", 2 * m * hidden * ELEM, "aten::rms_norm", m)

        for layer in range(layers):
            if layer == 0 or not fused_add_norm:
                mem("void at::native::rms_norm_kernel<bf16>", 2 * m * hidden * ELEM, "aten::rms_norm")
            gemm("qkv", (heads + 2 * hkv) * d, hidden)
            attention(b_step, m_tok, kv_tokens)
            if prefill_tokens:
                attention(1, prefill_tokens, prefill_tokens, causal=True)
            gemm("out", hidden, hidden)
            if tp_all_reduce:
                all_reduce(m * hidden)
            add_norm(True)
            gemm("gate_up", 2 * ffn, hidden)
            mem("void at::native::silu_and_mul_kernel<bf16>", 3 * m * ffn * ELEM, "aten::silu")
            gemm("down", hidden, ffn)
            if tp_all_reduce:
                all_reduce(m * hidden)
            add_norm(False)
        if backward:
            mem("void at::native::nll_loss_backward_kernel<bf16>", 2 * m * hidden * ELEM, "aten::nll_loss_backward")
            for _ in range(layers):
                for tag, n, k in (("down", hidden, ffn), ("gate_up", 2 * ffn, hidden)):
                    gemm(f"{tag}_grad_input", k, n), gemm(f"{tag}_grad_weight", n, k)
                    if tag == "down":
                        mem("void at::native::silu_backward_kernel<bf16>", 3 * m * ffn * ELEM, "aten::silu_backward")
                gemm("out_grad_input", hidden, hidden), gemm("out_grad_weight", hidden, hidden)
                fa = ("void pytorch_flash::flash_bwd_kernel<128>",) if fa_backward_kernels == 1 else (
                    "void flash::flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<128>>",
                    "void flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128>>",
                    "void flash::flash_bwd_convert_dq_kernel<Flash_bwd_kernel_traits<128>>")
                for fa_name in fa:
                    kernel(fa_name, 10.0 * batch * heads * m_tok * kv_tokens * d / len(fa),
                           ELEM * batch * heads * d * 8 * kv_tokens / len(fa), "aten::_flash_attention_backward",
                           [[batch, m_tok, heads, d]] * 3, [BF16] * 3)
                gemm("qkv_grad_input", hidden, 3 * hidden), gemm("qkv_grad_weight", 3 * hidden, hidden)
            mem("void at::native::embedding_backward_kernel<bf16>", 2 * m * hidden * ELEM,
                "aten::embedding_dense_backward")
            mem("void at::native::multi_tensor_apply_kernel<adam>", 4 * layers * 8 * hidden * hidden * ELEM,
                "aten::_foreach_add_")
        tr.runtime("cudaDeviceSynchronize", ts, max(gpu_t, ts) - ts + 5, corr=100_000 + s)
        ts = max(gpu_t, ts) + 10
        if phase:
            tr.annotation(f"phase:{phase}", step_start - 0.5, ts - step_start)
        tr.step(s, step_start - 1, ts - step_start + 1)
        ts += 30
        gpu_t = ts
    return tr.write(path)
