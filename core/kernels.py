"""Kernel understanding as pure functions: what class a GPU kernel is, and how much work an op does.

``classify_kernel`` reads kernel names as they appear in real Kineto traces (cuBLAS/cuBLASLt,
CUTLASS, cuDNN, nvjet, FlashAttention, PyTorch's ATen kernels, Triton/Inductor, NCCL/RCCL,
hipBLASLt/Tensile ``Cijk_*``, Composable Kernel, MIOpen) and, when given, the aten op that
launched the kernel. ``op_flops_bytes`` counts FLOPs and DRAM bytes of common aten ops from the
``Input Dims``/``Input type``/``Concrete Inputs`` a trace records with ``record_shapes=True``: the
one home of these formulas (docs/cost-models.md lists each with its source; ``bench/ops_flops.py``
checks them against TraceLens's perf models).

>>> classify_kernel("sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32_stage4")
<KernelClass.GEMM: 'gemm'>
>>> classify_kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)")
<KernelClass.COLLECTIVE: 'collective'>
>>> classify_kernel("triton_poi_fused_add_mul_0")
<KernelClass.ELEMENTWISE: 'elementwise'>
>>> op_flops_bytes("aten::mm", [[128, 256], [256, 512]], ["c10::BFloat16", "c10::BFloat16"])
(33554432, 458752)
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum

import numpy as np

from .dtypes import DEFAULT_ELEMENT_BYTES, DType, compute_dtype, element_bytes


class KernelClass(str, Enum):
    GEMM = "gemm"
    CONV = "conv"
    ATTENTION = "attention"
    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    NORMALIZATION = "normalization"
    COPY = "copy"
    MEMSET = "memset"
    COLLECTIVE = "collective"
    OTHER = "other"

    @property
    def compute_bound(self) -> bool:
        """Classes that usually run on matrix engines (priced by FLOPs first)."""
        return self in (KernelClass.GEMM, KernelClass.CONV, KernelClass.ATTENTION)


# Name rules, first match wins. Applied to the lower-cased name with C++ templates kept: order
# matters (collectives before everything, attention before gemm, conv before gemm, norm before
# reduce, ...). Patterns are searched anywhere in the name.
_NAME_RULES: list[tuple[KernelClass, str]] = [
    (KernelClass.ELEMENTWISE, r"quantize|dequant"),
    (KernelClass.COLLECTIVE, r"nccl|rccl|multimem_all_reduce|cross_device_reduce|all_?reduce|"
                             r"all_?gather|reduce_?scatter|alltoall|all_to_all|\bmscclpp"),
    (KernelClass.MEMSET, r"^memset|\bmemset|fillfunctor|_combined_routing_memset|zero_kernel"),
    # kv_indices: the page-table gathers an attention backend reads (SGLang's Triton
    # create_flashinfer_kv_indices_triton), copies that run before attention, not attention
    (KernelClass.COPY, r"^memcpy|\bmemcpy|direct_copy_kernel|copy_kernel|catarraybatchedcopy|"
                       r"copy_device_to_device|batched_transpose|transpose_|nchwtonhwc|nhwctonchw|"
                       r"recat_copy|reshape_and_cache|store_kvcache|gather_kernel|index_select|"
                       r"indexselect|scatter_gather|_to_copy_\d+$|copy_page_indices|embedding_codegen_forward|"
                       r"to_dense_representation|kv_indices"),
    (KernelClass.ATTENTION, r"flash_fwd|flash_bwd|flash_attn|fmha|attn_fwd|attn_bwd|attention|"
                            r"_fwd_kernel_stage|paged_attention|mha_fwd|mha_bwd|sdpa|"
                            r"efficient_attention|cutlass_.*attention|unified_attention|"
                            r"flashinfer|sage_?attn|sage_fwd|sage_quant|decode_attention"),
    (KernelClass.CONV, r"conv|fprop|dgrad|wgrad|winograd|implicit_gemm|igemm_(fwd|bwd|wrw)|"
                       r"scudnn|hcudnn|fft2d|fft1d|im2col|miopen.*(conv|gtc)|naive_conv|"
                       r"flip_filter|implicit_convolve|im2d2col|col2im"),
    (KernelClass.NORMALIZATION, r"layer_?norm|rms_?norm|rmsnorm|group_?norm|groupnorm|batch_?norm|"
                                r"bn_fw|bn_bw|welford|instance_?norm|gammabeta|rowwisemoments|"
                                r"computefusedparams|computebackwardfusedparams|computeinternalgradients|"
                                r"cucomputepartgradgammabeta|cucomputegradgammabeta|"
                                r"softmax|log_softmax|normalize"),
    (KernelClass.GEMM, r"gemm|gemv|\bcijk_|^cijk_|cublas|cutlass|nvjet|xmma|\bbmm_|^bmm|matmul|"
                       r"_mm_|\bmm_kernel|hipblaslt|ck_tile.*gemm|wvsplitk|splitkreduce|"
                       r"dot_kernel|magma_"),
    (KernelClass.REDUCTION, r"reduce|reduction|sum_kernel|mean_kernel|argmax|argmin|topk|"
                            r"_topk|cumsum|scan|radixsort|sort|amax|norm_kernel|"
                            r"nll|criterion|cross_entropy|triton_red_|triton_per_|_sum_bitmatrix|bitmatrix"),
    (KernelClass.ELEMENTWISE, r"elementwise|triton_poi_|triton_|functor|_kernel_impl|"
                              r"act_and_mul|silu|gelu|relu|sigmoid|tanh|dropout|rotary|rope|"
                              r"pointwise|unary|binary|multi_tensor_apply|adam|sgd|clamp|"
                              r"quant|fused_add|where|pool|upsample|distribution|"
                              r"subtensorop|add_kernel|mul_kernel|scalepackedtensor|scal_kernel"),
]
_COMPILED = [(c, re.compile(p)) for c, p in _NAME_RULES]

# aten op (without namespace) -> class, for kernels whose name says little (e.g. Triton
# ``triton__0d1d2d``, ``Kernel2``) or to break ties.
_OP_CLASSES: dict[str, KernelClass] = {
    **{op: KernelClass.GEMM for op in ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear",
                                       "_scaled_mm", "addmv", "mv", "einsum", "_int_mm")},
    **{op: KernelClass.CONV for op in ("conv1d", "conv2d", "conv3d", "convolution", "_convolution",
                                       "cudnn_convolution", "miopen_convolution",
                                       "convolution_backward", "cudnn_convolution_backward",
                                       "conv_transpose2d", "cudnn_convolution_backward_input",
                                       "cudnn_convolution_backward_weight")},
    **{op: KernelClass.ATTENTION for op in ("scaled_dot_product_attention",
                                            "_scaled_dot_product_flash_attention",
                                            "_scaled_dot_product_efficient_attention",
                                            "_scaled_dot_product_cudnn_attention",
                                            "_flash_attention_forward", "_flash_attention_backward",
                                            "_efficient_attention_forward",
                                            "_scaled_dot_product_flash_attention_backward")},
    **{op: KernelClass.NORMALIZATION for op in ("layer_norm", "native_layer_norm", "rms_norm",
                                                "_fused_rms_norm", "group_norm", "batch_norm",
                                                "native_batch_norm", "cudnn_batch_norm",
                                                "softmax", "_softmax", "log_softmax",
                                                "_log_softmax", "native_layer_norm_backward",
                                                "cudnn_batch_norm_backward", "native_group_norm")},
    **{op: KernelClass.REDUCTION for op in ("sum", "mean", "max", "min", "amax", "argmax", "norm",
                                            "topk", "sort", "cumsum", "nll_loss",
                                            "cross_entropy_loss", "var", "std")},
    **{op: KernelClass.COPY for op in ("copy_", "_to_copy", "to", "contiguous", "clone", "cat",
                                       "index_select", "gather", "index", "embedding",
                                       "_copy_from")},
    **{op: KernelClass.MEMSET for op in ("zero_", "fill_", "zeros", "zeros_like", "ones")},
    **{op: KernelClass.COLLECTIVE for op in ("record_param_comms", "allreduce_", "all_reduce",
                                             "allgather_", "_allgather_base_", "reduce_scatter_",
                                             "_reduce_scatter_base_", "alltoall_base_",
                                             "broadcast_", "send", "recv_")},
}
_OP_CLASSES.update({op: KernelClass.ELEMENTWISE for op in (
    "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "relu", "relu_", "gelu", "silu",
    "silu_", "sigmoid", "tanh", "exp", "neg", "rsqrt", "pow", "threshold_backward", "dropout",
    "where", "clamp", "clamp_min", "clamp_min_", "masked_fill", "_foreach_add_", "_foreach_mul_",
    "_fused_adam_", "_fused_adamw_", "addcmul_", "addcdiv_", "lerp_", "sqrt", "abs")})

WEIGHT_ARG = {"linear": 1, "addmm": 2, "mm": 1, "matmul": 1, "conv1d": 1, "conv2d": 1, "conv3d": 1,
              "convolution": 1, "_convolution": 1, "cudnn_convolution": 1, "miopen_convolution": 1,
              "_int_mm": 1, "_scaled_mm": 1}
"""The argument of a GEMM/conv op that holds its weight (a 2-D ``mm``/``matmul`` operand: a linear
layer's), by op name without namespace."""
BIAS_ARG = {"linear": 2, "addmm": 0, "conv1d": 2, "conv2d": 2, "conv3d": 2, "convolution": 2, "_convolution": 2}
"""The argument that holds a GEMM/conv op's bias (a parameter too: autocast casts it every forward)."""


NORM_PARAM_ARGS = {"layer_norm": (2, 3), "native_layer_norm": (2, 3), "rms_norm": (2,), "_fused_rms_norm": (2,),
                   "group_norm": (2, 3), "native_group_norm": (1, 2), "batch_norm": (1, 2, 3, 4),
                   "native_batch_norm": (1, 2, 3, 4), "_native_batch_norm_legit": (1, 2, 3, 4),
                   "embedding": (0,)}
"""The arguments of a norm or embedding op that hold its parameters (and batch norm's running
statistics), by op name without namespace."""


def weight_arg(op_name: str, dims: Sequence | None) -> int | None:
    """The position of a recorded GEMM/conv op's weight (:data:`WEIGHT_ARG`), None when it has
    none: another op, a missing argument, or a ``matmul`` of two activations (not 2-D).

    >>> weight_arg("aten::linear", [[8, 4], [16, 4], [16]]), weight_arg("aten::matmul", [[2, 8, 4], [2, 4, 8]])
    (1, None)
    """
    key = op_key(op_name)
    w = WEIGHT_ARG.get(key)
    if w is None or not dims or w >= len(dims) or not isinstance(dims[w], (list, tuple)):
        return None
    return None if key == "matmul" and len(dims[w]) != 2 else w

def param_args(op_name: str, dims: Sequence | None) -> list[int]:
    """The positions of a recorded op's parameter arguments (a GEMM's or convolution's weight and
    bias, a norm's weight and bias, an embedding's table) that it was given as tensors.

    >>> param_args("aten::addmm", [[16], [8, 4], [4, 16], [], []])
    [2, 0]
    >>> param_args("aten::layer_norm", [[2, 8], [], [8], [8]])
    [2, 3]
    >>> param_args("aten::mul", [[2, 8], [2, 8]]), param_args("aten::linear", [[8, 4], [16, 4], []])
    ([], [1])
    """
    if not dims:
        return []
    key = op_key(op_name)
    w = weight_arg(op_name, dims)
    found = ([w] if w is not None else []) + ([BIAS_ARG[key]] if w is not None and key in BIAS_ARG else [])
    found += list(NORM_PARAM_ARGS.get(key, ()))
    return [i for i in found if i < len(dims) and isinstance(dims[i], (list, tuple)) and len(dims[i]) > 0]


_GENERIC = re.compile(r"^(triton__[0-9d]+|kernel2?|void cutlass::kernel2?)$")


def op_key(op_name: str) -> str:
    name = op_name.split("::")[-1].strip().lower()
    return name


_INDUCTOR = re.compile(r"^triton_(poi|red|per|tem)_fused_?(.*?)(_\d+)?$")
_COPY_OPS = {"", "to", "copy", "clone", "cat", "view", "unsafe", "transpose", "permute", "expand",
             "slice", "select", "stack", "unbind", "unsqueeze", "squeeze", "split", "empty", "like",
             "zeros", "constant", "pad", "nd", "reshape", "alias", "index", "as", "strided"}


def _inductor_class(low: str) -> KernelClass | None:
    """TorchInductor names kernels ``triton_{poi,red,per,tem}_fused_<ops>_<n>``."""
    m = _INDUCTOR.match(low)
    if m is None:
        return None
    kind, ops = m.group(1), set(m.group(2).replace("__", "_").split("_"))
    if kind == "tem":
        return KernelClass.GEMM
    if kind == "poi":
        return KernelClass.COPY if ops <= _COPY_OPS else KernelClass.ELEMENTWISE
    if {"layer", "norm"} <= ops or "rsqrt" in ops or "softmax" in ops:
        return KernelClass.NORMALIZATION
    return KernelClass.REDUCTION


def classify_kernel(name: str, op_name: str | None = None) -> KernelClass:
    """Kernel class from its name, falling back to (or, for generic names, using) the aten op.

    >>> classify_kernel("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>")
    <KernelClass.ELEMENTWISE: 'elementwise'>
    >>> classify_kernel("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT96x96x128_MI16x16x1")
    <KernelClass.GEMM: 'gemm'>
    >>> classify_kernel("triton__0d1d2d", "aten::layer_norm")
    <KernelClass.NORMALIZATION: 'normalization'>
    """
    low = (name or "").lower()
    inductor = _inductor_class(low)
    if inductor is not None:
        return inductor
    op_cls = _OP_CLASSES.get(op_key(op_name)) if op_name else None
    if _GENERIC.match(low.strip()) and op_cls is not None:
        return op_cls
    for cls, pattern in _COMPILED:
        if pattern.search(low):
            return cls
    return op_cls if op_cls is not None else KernelClass.OTHER


def is_collective(name: str) -> bool:
    """Whether a GPU kernel is a collective (NCCL/RCCL, vLLM/SGLang custom all-reduce, NVLS
    ``multimem`` kernels, MSCCL++): the one rule the graph builder, the cost models and the
    transforms share.

    >>> [is_collective(n) for n in ("ncclDevKernel_AllGather_RING_LL", "cross_device_reduce_1stage<bf16>",
    ...                             "multimem_all_reduce_kernel", "ampere_bf16_s16816gemm")]
    [True, True, True, False]
    """
    return classify_kernel(name) is KernelClass.COLLECTIVE


def is_attention(name: str, op_name: str | None = None) -> bool:
    """Whether a kernel, or a CPU op by its name, is attention.

    >>> is_attention("flash_fwd_kernel<Flash_fwd_kernel_traits>"), is_attention("aten::scaled_dot_product_attention")
    (True, True)
    """
    return classify_kernel(name, op_name) is KernelClass.ATTENTION


_PAGED_LL4MI = re.compile(r"paged_attention_ll4mi_qkv_mfma\d+_kernel<", re.IGNORECASE)
_TEMPLATE_INT = re.compile(r"\d+[ul]*")


def _template_args(name: str, start: int) -> list[str]:
    """The top-level template arguments of ``name`` from just after its ``<`` at ``start - 1``."""
    args: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in name[start:]:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            if depth == 0:
                args.append("".join(cur).strip())
                return args
            depth -= 1
        elif ch == "," and depth == 0:
            args.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    return []    # unclosed: a truncated name


def paged_attention_kernel_heads(name: str) -> tuple[int, int] | None:
    """(head size, query heads per KV head) from the template arguments of the ROCm paged-attention
    decode kernel ``paged_attention_ll4mi_QKV_mfma{4,16}_kernel`` (vLLM ``csrc/rocm/attention.cu``,
    AITER ``attention_v1``/``attention_ragged``, which SGLang and vLLM run on AMD GPUs), None for
    any other kernel or a name that does not parse. Its variants all follow the KV cache's
    ``Fp8KVCacheDataType`` with an optional output type, then ``BLOCK_SIZE, HEAD_SIZE,
    NUM_THREADS``, one or two flags (ALiBi, logits soft cap) and ``GQA_RATIO``.

    >>> paged_attention_kernel_heads("void paged_attention_ll4mi_QKV_mfma16_kernel<0, __hip_bfloat16, "
    ...     "__hip_bfloat16, (vllm::Fp8KVCacheDataType)0, 1, 128, 256, false, 4, 1, "
    ...     "ck_tile::ComposedAttention<0u, false> >(__hip_bfloat16 const*, float)")
    (128, 4)
    >>> paged_attention_kernel_heads("void paged_attention_ll4mi_QKV_mfma16_kernel<__hip_bfloat16, "
    ...     "__hip_bfloat16, (vllm::Fp8KVCacheDataType)0, __hip_bfloat16, 16, 64, 256, false, true, 8>()")
    (64, 8)
    >>> paged_attention_kernel_heads("paged_attention_ll4mi_reduce_kernel<__hip_bfloat16, 128, 128>()")
    """
    m = _PAGED_LL4MI.search(name)
    if m is None:
        return None
    args = _template_args(name, m.end())
    at = next((i for i, a in enumerate(args) if "fp8kvcachedatatype" in a.lower()), None)
    if at is None:
        return None
    rest = args[at + 1:]
    k = next((i for i, a in enumerate(rest) if _TEMPLATE_INT.fullmatch(a)), len(rest))   # past the output type
    sizes = rest[k:k + 3]
    flags = k + 3
    while flags < len(rest) and rest[flags] in ("true", "false"):
        flags += 1
    if len(sizes) < 3 or not all(_TEMPLATE_INT.fullmatch(a) for a in sizes) or flags == k + 3 \
            or flags >= len(rest) or not _TEMPLATE_INT.fullmatch(rest[flags]):
        return None
    head, ratio = int(sizes[1].rstrip("ul")), int(rest[flags].rstrip("ul"))
    return (head, ratio) if head > 0 and ratio > 0 else None


_TOKEN_NORM = re.compile(r"rms_?norm|layer_?norm")
_GRADIENT = re.compile(r"backward|grad|bwd")
_RESIDUAL_ADD = re.compile(r"add_kernel|addfunctor|add_functor|cudafunctoronself_add|\badd\b")


def is_token_norm(name: str, op_name: str | None = None) -> bool:
    """Whether a kernel normalizes each token's hidden vector on its own (RMSNorm, LayerNorm,
    vLLM's and SGLang's fused residual add + RMSNorm) in the forward pass: work that splits by
    tokens, unlike softmax, group or batch norm, or a norm's backward (which sums its weight's
    gradient over every token).

    >>> [is_token_norm(n) for n in ("vllm::fused_add_rms_norm_kernel<bf16, 8>", "FusedAddRMSNormKernel",
    ...                             "vectorized_layer_norm_kernel", "softmax_warp_forward", "batch_norm_collect",
    ...                             "layer_norm_grad_input_kernel")]
    [True, True, True, False, False, False]
    """
    if classify_kernel(name, op_name) is not KernelClass.NORMALIZATION:
        return False
    low, op = name.lower(), op_key(op_name) if op_name else ""
    if _GRADIENT.search(low) or _GRADIENT.search(op):
        return False
    return bool(_TOKEN_NORM.search(low)) or op in _TOKEN_NORM_OPS


def is_residual_add(name: str, op_name: str | None = None) -> bool:
    """Whether an elementwise kernel adds two tensors (a residual connection, where it follows a
    block's output).

    >>> is_residual_add("void at::native::vectorized_elementwise_kernel<4, add_kernel>", "aten::add")
    True
    >>> is_residual_add("void at::native::silu_and_mul_kernel<bf16>", "aten::silu")
    False
    """
    if classify_kernel(name, op_name) is not KernelClass.ELEMENTWISE:
        return False
    if op_name:
        return op_key(op_name) in ("add", "add_")
    return bool(_RESIDUAL_ADD.search(name.lower()))


class CollectiveKind(str, Enum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    SEND_RECV = "send_recv"
    BROADCAST = "broadcast"
    REDUCE = "reduce"


# first match wins, on PyTorch's ``Collective name`` when recorded, else on the kernel name
_COLLECTIVE_KINDS: tuple[tuple[CollectiveKind, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern)) for kind, pattern in (
        (CollectiveKind.REDUCE_SCATTER, r"reduce_?scatter"),
        (CollectiveKind.ALL_GATHER, r"all_?gather"),
        (CollectiveKind.ALL_REDUCE, r"all_?reduce|cross_device_reduce"),
        (CollectiveKind.ALL_TO_ALL, r"all_?to_?all|alltoall"),
        (CollectiveKind.BROADCAST, r"broadcast"),
        (CollectiveKind.SEND_RECV, r"send|recv"),
        (CollectiveKind.REDUCE, r"reduce"),
    ))


class P2pDirection(str, Enum):
    """Which end of a point-to-point transfer an op is: PyTorch's ``Collective name`` of
    ProcessGroupNCCL's ``send`` and ``recv``."""

    SEND = "send"
    RECV = "recv"


def p2p_direction(collective_name: str | None) -> P2pDirection | None:
    """The end of a point-to-point transfer a ``Collective name`` names; None for a collective
    (or no name: a ``SendRecv`` kernel alone does not say which end it is).

    >>> p2p_direction("send"), p2p_direction("recv"), p2p_direction("allreduce"), p2p_direction(None)
    (<P2pDirection.SEND: 'send'>, <P2pDirection.RECV: 'recv'>, None, None)
    """
    try:
        return P2pDirection(collective_name) if collective_name else None
    except ValueError:
        return None


def collective_kind(collective_name: str | None, kernel_name: str) -> CollectiveKind | None:
    """What a collective does, from PyTorch's ``Collective name`` when recorded, else from the
    kernel name; None when neither says.

    >>> collective_kind("_allgather_base", "ncclDevKernel_AllGather_RING_LL")
    <CollectiveKind.ALL_GATHER: 'all_gather'>
    >>> collective_kind(None, "ncclKernel_AllReduce_RING_LL_Sum_float")
    <CollectiveKind.ALL_REDUCE: 'all_reduce'>
    >>> collective_kind(None, "ncclDevKernel_Generic") is None
    True
    """
    for text in (collective_name, kernel_name):
        if not text:
            continue
        low = str(text).lower()
        for kind, pattern in _COLLECTIVE_KINDS:
            if pattern.search(low):
                return kind
    return None


def _numel(dims: Sequence[int]) -> int:
    return math.prod(int(d) for d in dims)


def duration_shares(op_index: np.ndarray, dur_ns: np.ndarray, workers: np.ndarray | None = None) -> np.ndarray:
    """Each activity's share of its launching op's work: its duration over the op's activities'
    total (each counted as at least 1 ns), so an op's FLOPs and bytes land on the kernels that did
    them. ``workers`` (per activity, optional): where an op launched any, only they share its work
    and its other activities get 0 — cuBLAS zeroes a split-K workspace with a memset before the
    GEMM kernel, and that memset does none of the GEMM's FLOPs.

    >>> duration_shares(np.array([0, 0, 1]), np.array([300.0, 100.0, 0.0])).tolist()
    [0.75, 0.25, 1.0]
    >>> duration_shares(np.array([0, 0, 1]), np.array([300.0, 10.0, 5.0]), np.array([True, False, False])).tolist()
    [1.0, 0.0, 1.0]
    """
    w = np.maximum(np.asarray(dur_ns, dtype=float), 1.0)
    if workers is not None:
        work = np.asarray(workers, dtype=bool)
        has = np.bincount(op_index, weights=work.astype(float)) > 0
        w = np.where(work | ~has[op_index], w, 0.0)
    return w / np.bincount(op_index, weights=w)[op_index]


def tensor_shape(dims: object) -> tuple[int, ...] | None:
    """One argument's recorded ``Input Dims`` as a shape: None for a scalar (``[]``), a tensor
    list or anything else.

    >>> tensor_shape([4, 256]), tensor_shape([]), tensor_shape([[2, 3], [2, 3]])
    ((4, 256), None, None)
    """
    if isinstance(dims, (list, tuple)) and dims and all(isinstance(d, int) for d in dims):
        return tuple(int(d) for d in dims)
    return None


def tensor_shapes(dims: object, members: bool = False) -> list[tuple[int, ...]]:
    """The shapes of an op's tensor arguments from its recorded ``Input Dims`` (scalars left
    out); ``members``: a tensor list's members too.

    >>> tensor_shapes([[4, 256], [], [[2, 3], [2, 3]]]), tensor_shapes([[4, 256], [[2, 3], [2, 3]]], members=True)
    ([(4, 256)], [(4, 256), (2, 3), (2, 3)])
    """
    out = []
    for d in dims if isinstance(dims, (list, tuple)) else ():
        shape = tensor_shape(d)
        if shape is not None:
            out.append(shape)
        elif members and isinstance(d, (list, tuple)):
            out.extend(x for x in map(tensor_shape, d) if x is not None)
    return out


def _tensors(dims: Sequence, types: Sequence | None) -> list[tuple[list[int], int] | None]:
    """(shape, bytes per element) of each argument that looks like a tensor, else None."""
    out: list[tuple[list[int], int] | None] = []
    for i, d in enumerate(dims):
        if not isinstance(d, (list, tuple)) or any(not isinstance(x, (int, float)) for x in d):
            out.append(None)
            continue
        t = types[i] if types and i < len(types) else None
        size = element_bytes(t)
        if len(d) == 0 and size is None:     # Scalar, ScalarList, None, optional args
            out.append(None)
            continue
        out.append(([int(x) for x in d], int(size) if size else DEFAULT_ELEMENT_BYTES))
    return out


def float_tensors(dims: Sequence, types: Sequence | None) -> list[tuple[int, int, DType]]:
    """(argument position, elements, dtype) of each floating-point tensor argument of a recorded op
    (0-d tensors left out).

    >>> float_tensors([[4, 8], [8], [], [3]], ["float", "c10::BFloat16", "Scalar", "long int"])
    [(0, 32, <DType.FP32: 'fp32'>), (1, 8, <DType.BF16: 'bf16'>)]
    """
    out = []
    for i, arg in enumerate(_tensors(dims, types)):
        dt = compute_dtype(types[i] if types and i < len(types) else None)
        if arg is not None and arg[0] and dt is not None:
            out.append((i, _numel(arg[0]), dt))
    return out


def _gemm(m: int, n: int, k: int, batch: int, esz: int, out_esz: int | None = None,
          bias: int = 0) -> tuple[int, int]:
    out_esz = out_esz or esz
    flops = 2 * batch * m * n * k + (batch * m * n if bias else 0)   # the bias: one add per output
    nbytes = batch * (m * k + k * n) * esz + batch * m * n * out_esz + bias
    return flops, nbytes


# FLOPs per output element: one per arithmetic operation, a transcendental (exp, tanh, rsqrt…)
# counting one, as TraceLens's elementwise perf models do; copies and fills do none.
_ELEMENTWISE_FLOPS: dict[str, int] = {
    "add": 1, "add_": 1, "sub": 1, "sub_": 1, "mul": 1, "mul_": 1, "div": 1, "div_": 1,
    "relu": 1, "relu_": 1, "threshold_backward": 1, "neg": 1, "clamp": 1, "clamp_min": 1,
    "clamp_min_": 1, "where": 1, "masked_fill": 1, "abs": 1, "_to_copy": 0,
    "gelu": 1, "silu": 1, "silu_": 1, "sigmoid": 1, "tanh": 1, "exp": 1, "rsqrt": 1, "pow": 1,
    "sqrt": 1, "dropout": 2, "addcmul_": 2, "addcdiv_": 2, "lerp_": 2, "fill_": 0, "zero_": 0,
}
_TOKEN_LAYER_NORMS = ("layer_norm", "native_layer_norm")
_LAYER_NORMS = (*_TOKEN_LAYER_NORMS, "group_norm", "native_group_norm")
_BATCH_NORMS = ("batch_norm", "native_batch_norm", "cudnn_batch_norm")
_RMS_NORMS = ("rms_norm", "_fused_rms_norm")
_TOKEN_NORM_OPS = (*_RMS_NORMS, *_TOKEN_LAYER_NORMS)   # group norm normalizes channel groups, not each token


def op_flops_bytes(op_name: str, input_dims: Sequence | None,
                   input_types: Sequence | None = None,
                   concrete_inputs: Sequence | None = None,
                   conv_output: Sequence[int] | None = None) -> tuple[int, int] | None:
    """(FLOPs, DRAM bytes) of one aten op call from recorded shapes, or None when unknown.

    Bytes count each input once and the output once (ideal reuse, as a roofline wants). Without
    ``input_types`` tensors are taken as fp32. ``concrete_inputs`` (the trace's ``Concrete
    Inputs``: the values of non-tensor arguments, as strings) gives attention its causal flag and
    varlen maximum lengths. Attention assumes a fused (flash) kernel: Q, K, V and O move once;
    FLOPs are 2·B·Hq·(D_qk + D_v)·P over the P unmasked (query, key) pairs: Sq·Sk, or the causal
    triangle. Convolution stride/padding come from the recorded int lists when present; 2021 traces
    record them empty, and then the output's spatial size is ``conv_output`` when given (read from
    the op that takes the output, :func:`conv_outputs_from_neighbours`), else stride 1 and padding
    0. Formulas and sources: docs/cost-models.md.

    >>> op_flops_bytes("aten::addmm", [[512], [64, 256], [256, 512], [], []],
    ...                ["float", "float", "float", "Scalar", "Scalar"])
    (16809984, 722944)
    >>> op_flops_bytes("aten::add", [[1024, 1024], [1024, 1024], []], ["float", "float", "Scalar"])
    (1048576, 12582912)
    >>> op_flops_bytes("aten::conv2d", [[32, 3, 224, 224], [64, 3, 7, 7], [], [2, 2], [3, 3], [], []], [])
    (7552892928, 122065664)
    >>> sdpa = [[1, 8, 128, 64]] * 3 + [[], [], [], [], []]
    >>> op_flops_bytes("aten::scaled_dot_product_attention", sdpa, ["c10::BFloat16"] * 3,
    ...                ["", "", "", "", "0.", "True", "", "False"])[0]   # causal: 128·129/2 pairs
    16908288
    """
    if not input_dims:
        return None
    op = op_key(op_name)
    try:
        args = _tensors(input_dims, input_types)
        attention = _ATTENTION_OPS.get(op)
        if attention is not None:
            return _attention(attention, args, input_dims, list(concrete_inputs or ()))
        if op in CONV_FORWARD_OPS:
            return _conv(args, input_dims, list(concrete_inputs or ()), conv_output)
        return _dispatch(op, args, input_dims, input_types, list(concrete_inputs or ()))
    except (ValueError, TypeError, IndexError, ZeroDivisionError):
        return None


FLASH_KERNEL_NAMES = {False: "flash_fwd_kernel<{dtype}> (whatif: fused attention)",
                      True: "flash_bwd_kernel<{dtype}> (whatif: fused attention backward)"}
"""The names of the forward and backward kernels a transform makes of unfused attention
(``flash_attention``): attention kernels to :func:`classify_kernel`, their dtype in the name."""


def fused_attention_flops_bytes(op_name: str, input_dims: Sequence | None, input_types: Sequence | None = None,
                                concrete_inputs: Sequence | None = None
                                ) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """(FLOPs, bytes) of one fused (flash) attention kernel for the forward attention op's call,
    forward and backward: the forward as :func:`op_flops_bytes` prices it, the backward as it prices
    the matching ``*_backward`` op (2.5× the FLOPs). None for a backward op, any other op, or
    shapes that do not say.

    >>> sdpa = [[1, 8, 128, 64]] * 3 + [[], [], [], [], []]
    >>> fused_attention_flops_bytes("aten::scaled_dot_product_attention", sdpa, ["c10::BFloat16"] * 3,
    ...                             ["", "", "", "", "0.", "True", "", "False"])
    ((16908288, 524288), (42270720, 917504))
    """
    spec = _ATTENTION_OPS.get(op_key(op_name))
    if spec is None or spec.backward or not input_dims:
        return None
    try:
        args = _tensors(input_dims, input_types)
        concrete = list(concrete_inputs or ())
        forward = _attention(spec, args, input_dims, concrete)
        backward = _attention(replace(spec, backward=True), args, input_dims, concrete)
    except (ValueError, TypeError, IndexError, ZeroDivisionError):
        return None
    return None if forward is None or backward is None else (forward, backward)


@dataclass(frozen=True)
class FlashBuffers:
    """What a FlashAttention-2 call allocates on the GPU (Dao-AILab/flash-attention
    ``csrc/flash_attn/flash_api.cpp``, ``mha_fwd`` / ``mha_bwd``, and PyTorch's copy of it under
    ``aten/src/ATen/native/transformers/cuda/flash_attn``): forward, the output (Q's shape with V's
    head dim, the inputs' dtype) and the softmax log-sum-exp it saves for the backward (fp32, one
    per query and head); it saves Q, K, V (``inputs_bytes``), the output and the log-sum-exp for the
    backward; backward, beside dQ/dK/dV (the gradients' own size), a workspace held for the call:
    ``softmax_d`` (fp32, queries rounded up to 128, per head), ``dq_accum`` (fp32, queries rounded
    to 128 × head dim rounded to 32, per head) and, when K/V have fewer heads than Q (GQA), dK and
    dV expanded to Q's heads before they are summed back. ``query_elements``: Q's."""

    output_bytes: int
    lse_bytes: int
    inputs_bytes: int
    backward_workspace_bytes: int
    query_elements: int


def flash_buffers(op_name: str, input_dims: Sequence | None, input_types: Sequence | None = None,
                  concrete_inputs: Sequence | None = None) -> FlashBuffers | None:
    """:class:`FlashBuffers` of the flash kernel that would run a forward attention op's call;
    None for any other op or shapes that do not say.

    >>> sdpa = [[2, 8, 1000, 64]] * 3 + [[], [], [], [], []]
    >>> b = flash_buffers("aten::scaled_dot_product_attention", sdpa, ["c10::BFloat16"] * 3)
    >>> b.output_bytes, b.lse_bytes, b.inputs_bytes, b.backward_workspace_bytes
    (2048000, 64000, 6144000, 4259840)
    """
    spec = _ATTENTION_OPS.get(op_key(op_name))
    if spec is None or spec.backward or not input_dims:
        return None
    try:
        qkv = _tensors(input_dims, input_types)[spec.q:spec.q + 3]
        if len(qkv) < 3 or any(a is None for a in qkv):
            return None
        (q, eq), (k, _), (v, _) = (a for a in qkv if a is not None)
        shape = _attention_shape(spec, q, k, v, input_dims, list(concrete_inputs or ()))
    except (ValueError, TypeError, IndexError, ZeroDivisionError):
        return None
    if shape is None:
        return None
    queries = sum(a for a, _ in shape.lengths) * shape.batch
    keys = sum(c for _, c in shape.lengths) * shape.batch
    rounded = sum(_round_up(a, 128) for a, _ in shape.lengths) * shape.batch
    expanded = keys * shape.batch_heads // shape.batch * (shape.d + shape.dv) * eq
    gqa = expanded if expanded > shape.kv_elems * eq else 0
    heads = shape.batch_heads // shape.batch
    return FlashBuffers(output_bytes=queries * heads * shape.dv * eq, lse_bytes=queries * heads * 4,
                        inputs_bytes=(queries * heads * shape.d + shape.kv_elems) * eq,
                        backward_workspace_bytes=rounded * heads * 4 * (1 + _round_up(shape.d, 32)) + gqa,
                        query_elements=queries * heads * shape.d)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


GEMM_TILE = 128
"""Output tile edge (rows = columns) a GEMM kernel's thread block computes, for wave counts: the
usual cuBLAS/CUTLASS tile on A100/H100 (NVIDIA, *Matrix Multiplication Background User's Guide*,
"Tile quantization" and "Wave quantization"); taken from that source, not fitted: on Vidur's A100
GEMMs ``bench/wave_split.py --tile 64`` prices splits slightly better (4.8 vs 5.3 % median for
halves), ``--tile 256`` much worse."""

GEMM_OPS = frozenset({"mm", "_int_mm", "_scaled_mm", "addmm", "bmm", "baddbmm", "linear", "matmul"})
"""The recorded ops (by name without namespace) that run one GEMM or a batch of them."""


@dataclass(frozen=True)
class GemmShape:
    """One (batched) GEMM: ``batch`` products of (m×k)·(k×n), ``element_bytes`` per input element,
    ``bias_bytes`` of an added bias."""

    m: int
    n: int
    k: int
    batch: int
    element_bytes: int
    bias_bytes: int = 0

    def flops_bytes(self) -> tuple[int, int]:
        return _gemm(self.m, self.n, self.k, self.batch, self.element_bytes, bias=self.bias_bytes)

    @property
    def output_tiles(self) -> int:
        """Thread blocks of ``GEMM_TILE``² outputs: ``batch·⌈m/T⌉·⌈n/T⌉``."""
        return self.batch * -(-self.m // GEMM_TILE) * -(-self.n // GEMM_TILE)


def gemm_shape(op_name: str, input_dims: Sequence | None,
               input_types: Sequence | None = None) -> GemmShape | None:
    """The GEMM an aten matrix op (mm, addmm, bmm, baddbmm, linear, matmul) does, from its recorded
    shapes; None for other ops or shapes that do not multiply.

    >>> g = gemm_shape("aten::linear", [[4, 256, 8192], [1280, 8192], []], ["c10::BFloat16"] * 2)
    >>> (g.m, g.n, g.k, g.output_tiles)
    (1024, 1280, 8192, 80)
    """
    op = op_key(op_name)
    if not input_dims or op not in GEMM_OPS:
        return None
    try:
        return _gemm_shape(op, _tensors(input_dims, input_types))
    except (ValueError, TypeError, IndexError):
        return None


def _gemm_shape(op: str, args) -> GemmShape | None:
    if op in ("mm", "_int_mm", "_scaled_mm"):
        (a, ea), (b, _eb) = args[0], args[1]
        if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
            return None
        return GemmShape(a[0], b[1], a[1], 1, ea)
    if op == "addmm":
        (c, ec), (a, ea), (b, _eb) = args[0], args[1], args[2]
        if len(a) != 2 or len(b) != 2 or a[1] != b[0]:
            return None
        return GemmShape(a[0], b[1], a[1], 1, ea, bias_bytes=_numel(c) * ec)
    if op in ("bmm", "baddbmm"):
        off = 1 if op == "baddbmm" else 0
        (a, ea), (b, _eb) = args[off], args[off + 1]
        if len(a) != 3 or len(b) != 3 or a[2] != b[1] or a[0] != b[0]:
            return None
        return GemmShape(a[1], b[2], a[2], a[0], ea)
    if op == "linear":
        (x, ex), (w, _ew) = args[0], args[1]
        if len(w) != 2 or x[-1] != w[1] or len(args) > 3:
            return None
        bias = args[2][0] if len(args) > 2 and args[2] is not None else None
        return GemmShape(_numel(x[:-1]), w[0], w[1], 1, ex, bias_bytes=_numel(bias) * ex if bias else 0)
    # matmul
    if len(args) != 2 or args[0] is None or args[1] is None:
        return None
    (a, ea), (b, _eb) = args
    if len(b) == 1:
        return GemmShape(_numel(a[:-1]), 1, a[-1], 1, ea) if a[-1] == b[0] else None
    if len(a) == 1:
        return GemmShape(1, b[-1], a[0], _numel(b[:-2]), ea)
    if a[-1] != b[-2]:
        return None
    if len(b) == 2:
        return GemmShape(_numel(a[:-1]), b[1], a[-1], 1, ea)
    return GemmShape(a[-2], b[-1], a[-1], max(_numel(a[:-2]), _numel(b[:-2])), ea)


def _reachable(size: int, kernel: int, out: int, most_stride: int = 4) -> bool:
    """Whether some stride (1 to ``most_stride``) and padding (0 to the kernel) take an input of
    ``size`` to an output of ``out`` (dilation 1)."""
    return any((size + 2 * p - kernel) // st + 1 == out for st in range(1, most_stride + 1) for p in range(kernel + 1))


def conv_outputs_from_neighbours(names: Sequence[str] | np.ndarray, dims: Sequence | np.ndarray,
                                 concrete: Sequence | np.ndarray, thread: np.ndarray, start_ns: np.ndarray,
                                 end_ns: np.ndarray) -> dict[int, tuple[int, ...]]:
    """The output spatial size of each forward convolution op whose stride and padding are not
    recorded (2021 traces record them as empty lists), read from the op that takes its output:
    the first op that starts after it ends on its thread (within :data:`CONV_OUTPUT_LOOKAHEAD`)
    whose first input has its batch, its output channels and a spatial size some stride and
    padding reach (a batch norm, an activation, a residual add). Arguments: CPU ops in time order
    per thread (``thread`` a key per op); returns {position: spatial size}.

    >>> names = ["aten::conv2d", "aten::cudnn_convolution", "aten::batch_norm"]
    >>> dims = [[[32, 256, 56, 56], [512, 256, 1, 1], [], [], [], [], []]] * 2 + [[[32, 512, 28, 28], [512]]]
    >>> conv_outputs_from_neighbours(names, dims, [()] * 3, np.zeros(3), np.array([0, 1, 9]), np.array([8, 7, 12]))
    {0: (28, 28), 1: (28, 28)}
    """
    out: dict[int, tuple[int, ...]] = {}
    for i, name in enumerate(names):
        if op_key(name) not in CONV_FORWARD_OPS or not isinstance(dims[i], list) or len(dims[i]) < 2:
            continue
        x, w = dims[i][0], dims[i][1]
        if not (isinstance(x, list) and isinstance(w, list) and len(x) == len(w) >= 3):
            continue
        nd = len(x) - 2
        stride, padding, _ = _conv_geometry(dims[i], list(concrete[i] or ()), nd)
        if stride is not None or padding is not None:
            continue
        for j in range(i + 1, min(i + 1 + CONV_OUTPUT_LOOKAHEAD, len(names))):
            if thread[j] != thread[i]:
                break
            first = dims[j][0] if isinstance(dims[j], list) and dims[j] else None
            if start_ns[j] < end_ns[i] or not (isinstance(first, list) and len(first) == len(x)):
                continue
            if first[0] == x[0] and first[1] == w[0] and all(
                    _reachable(int(s), int(k), int(o)) for s, k, o in zip(x[2:], w[2:], first[2:])):
                out[i] = tuple(int(o) for o in first[2:])
                break
    return out


def _dispatch(op: str, args, dims, types, concrete: list) -> tuple[int, int] | None:
    if op in GEMM_OPS:
        shape = _gemm_shape(op, args)
        return shape.flops_bytes() if shape is not None else None
    if op in ("_grouped_mm", "_scaled_grouped_mm"):
        return _grouped_gemm(args)
    if op in ("embedding", "index_select"):
        return _gather(op, args)
    if op in ("cat", "stack"):     # each input read once, the result written once
        esz = element_bytes(types[0] if types else None)   # a TensorList's dtype is not recorded
        return None if esz is None else (0, int(2 * sum(_numel(d) for d in dims[0]) * esz))
    if op in _LAYER_NORMS or op in _BATCH_NORMS or op in _RMS_NORMS:
        return _norm(op, args, concrete)
    if op in ("softmax", "_softmax", "log_softmax", "_log_softmax"):
        (x, ex) = args[0]
        n = _numel(x)
        return 5 * n, 2 * n * ex
    if op in ("sum", "mean", "amax", "max", "min", "norm", "var", "std"):
        (x, ex) = args[0]
        n = _numel(x)
        return n, n * ex + ex
    if op == "copy_":   # copy_(self, src): src read, self written; one conversion per element (TraceLens)
        (dst, ed), es = args[0], args[1][1]
        n = _numel(dst)
        return n, n * (ed + es)
    if op in _ELEMENTWISE_FLOPS:
        tensors = [a for a in args if a is not None]
        if not tensors:
            return None
        out = max(_numel(t[0]) for t in tensors)
        out_size = tensors[0][1]
        if op in ("fill_", "zero_"):
            return 0, out * out_size
        reads = sum(_numel(t[0]) * t[1] for t in tensors)
        return _ELEMENTWISE_FLOPS[op] * out, reads + out * out_size
    return None


def _norm(op: str, args, concrete: list) -> tuple[int, int]:
    """TraceLens's normalization perf models, over N elements of C channels (the normalized
    shape for layer/RMS norm, dim 1 for batch/group norm). Batch norm (and layer/group norm,
    always computing their statistics): 3N for the statistics when training, 6C for the
    per-channel scale and shift, 2N to apply them; bytes: the activations in and out, and 2
    (running mean, variance) + γ + β (+ 2 written when training) per-channel vectors. RMS norm:
    (2C + 2) per row for the root mean square, N (+ N with γ) to apply it."""
    (x, ex) = args[0]
    n = _numel(x)
    if op in _RMS_NORMS:
        weight = args[2] if len(args) > 2 else None
        c = _numel(weight[0]) if weight is not None and weight[0] else x[-1]
        return (n // c) * (2 * c + 2) + n * (2 if weight is not None else 1), \
            2 * n * ex + (c * ex if weight is not None else 0)
    if op in _BATCH_NORMS:
        c = x[1]
        training = _concrete(concrete, 5) != "False"
    elif op in ("group_norm", "native_group_norm"):
        c, training = x[1], True
    else:
        weight = args[2] if len(args) > 2 else None
        c, training = (_numel(weight[0]) if weight is not None and weight[0] else x[-1]), True
    flops = 6 * c + 2 * n + (3 * n if training else 0)
    return flops, 2 * n * ex + (6 if training else 4) * c * ex


def _int_list(value: object, nd: int) -> list[int] | None:
    """An int-list argument from ``Input Dims`` (2021-2023 traces) or ``Concrete Inputs`` (the
    string ``'[16, 16]'``), broadcast from one value to ``nd``; None when absent."""
    if isinstance(value, str):
        text = value.strip().strip("[]()")
        value = [int(t) for t in text.split(",") if t.strip()] if text else None
    if isinstance(value, (list, tuple)) and len(value) == nd:
        return [int(t) for t in value]
    if isinstance(value, (list, tuple)) and len(value) == 1:
        return [int(value[0])] * nd
    return None


CONV_FORWARD_OPS = frozenset({"conv1d", "conv2d", "conv3d", "convolution", "_convolution", "cudnn_convolution",
                              "miopen_convolution"})
"""Forward convolution ops (:func:`op_key`): input, weight, bias, stride, padding, dilation, ..."""
CONV_OUTPUT_LOOKAHEAD = 64
"""How many ops after a convolution on its thread :func:`conv_outputs_from_neighbours` reads."""


def _conv_geometry(dims: Sequence, concrete: list, nd: int) -> tuple[list[int] | None, list[int] | None, list[int]]:
    """A convolution's recorded stride and padding (None when not recorded) and its dilation (1)."""
    def param(i: int) -> list[int] | None:
        return _int_list(dims[i] if i < len(dims) else None, nd) or _int_list(_concrete(concrete, i), nd)
    return param(3), param(4), param(5) or [1] * nd


def _conv(args, dims, concrete: list, output: Sequence[int] | None = None) -> tuple[int, int] | None:
    (x, ex), (w, _ew) = args[0], args[1]
    nd = len(x) - 2
    if nd < 1 or len(w) != len(x):
        return None
    batch, spatial = x[0], x[2:]
    cout, cin_g, kernel = w[0], w[1], w[2:]
    stride, padding, dilation = _conv_geometry(dims, concrete, nd)
    if stride is None and padding is None and output is not None and len(output) == nd:
        out_sp = [int(o) for o in output]
    else:
        out_sp = [(s + 2 * p - d * (k - 1) - 1) // st + 1
                  for s, p, d, k, st in zip(spatial, padding or [0] * nd, dilation, kernel, stride or [1] * nd)]
    if any(o <= 0 for o in out_sp):
        return None
    out_numel = batch * cout * _numel(out_sp)
    flops = 2 * out_numel * cin_g * _numel(kernel)
    bias = args[2] if len(args) > 2 else None
    nbytes = (_numel(x) + _numel(w) + out_numel) * ex + (_numel(bias[0]) * ex if bias else 0)
    return flops, nbytes


def _grouped_gemm(args) -> tuple[int, int] | None:
    """MoE grouped GEMM (``_grouped_mm(a, b, offs)``): 2-D ``a`` (tokens of all groups, K) times
    3-D ``b`` (groups, K, N), each token through its group's weights; or 3-D × 3-D, a bmm."""
    (a, ea), (b, _eb) = args[0], args[1]
    if len(b) != 3 or a[-1] != b[1]:
        return None
    groups, k, n = b
    if len(a) == 2:
        tokens = a[0]
        return 2 * tokens * k * n, (tokens * k + groups * k * n + tokens * n) * ea
    if len(a) == 3 and a[0] == groups:
        return _gemm(a[1], n, k, groups, ea)
    return None


def _gather(op: str, args) -> tuple[int, int] | None:
    """``embedding(weight, indices)`` / ``index_select(x, dim, index)``: no FLOPs; each selected
    row is read once and written once, plus the indices."""
    if op == "embedding":
        (w, ew), (idx, ei) = args[0], args[1]
        if len(w) != 2:
            return None
        rows = _numel(idx)
        return 0, 2 * rows * w[1] * ew + rows * ei
    (x, ex), (idx, ei) = args[0], args[2]
    rows = _numel(idx)
    return 0, 2 * rows * (_numel(x) // max(x[0], 1)) * ex + rows * ei


def embedding_table(op_name: str, input_dims: Sequence | None, input_types: Sequence | None = None,
                    concrete_inputs: Sequence | None = None) -> tuple[int, int, int] | None:
    """(rows, row width, bytes per element) of the table a lookup reads: ``embedding``'s weight, or
    the 2-D input of ``index_select`` along dim 0 (what ``nn.Embedding`` runs as); None for another
    op, another dim, or no shapes. A model's weights include the tables it looks tokens up in.

    >>> embedding_table("aten::embedding", [[151936, 1024], [1, 512], [], [], []], ["c10::BFloat16", "long int"])
    (151936, 1024, 2)
    >>> embedding_table("aten::index_select", [[151936, 1024], [], [512]], ["c10::BFloat16", "Scalar", "long int"],
    ...                 ["", "0", ""])
    (151936, 1024, 2)
    >>> embedding_table("aten::index_select", [[4, 8], [], [2]], ["float", "Scalar", "long int"], ["", "1", ""])
    """
    op = op_key(op_name)
    if op not in ("embedding", "index_select") or not input_dims:
        return None
    try:
        args = _tensors(input_dims, input_types)
        if op == "index_select":
            dim = str([*(concrete_inputs or ()), "", ""][1]).strip()
            if dim not in ("0", ""):
                return None
        table = args[0]
        if table is None or len(table[0]) != 2 or min(table[0]) <= 0:
            return None
        return table[0][0], table[0][1], table[1]
    except (ValueError, TypeError, IndexError):
        return None


class Layout(str, Enum):
    """Axis order of an attention op's Q/K/V tensors."""

    BHSD = "bhsd"      # (batch, heads, seq, head dim): torch SDPA
    BSHD = "bshd"      # (batch, seq, heads, head dim): flash/efficient kernels; varlen when 3-D (tokens, heads, dim)
    PAGED = "paged"    # vLLM paged_attention: query (seqs, heads, dim), K/V in a block cache


@dataclass(frozen=True)
class AttentionOp:
    """Where an attention op keeps its operands (argument positions in ``Input Dims`` and
    ``Concrete Inputs``). ``causal`` is the position of its causal flag (an int ``custom_mask_type``
    for the efficient kernels: 0 none, 1 top-left, 2 bottom-right); ``bottom_right``: a causal
    mask aligned to the last key (FlashAttention >= 2.1, vLLM) rather than the first (torch's
    ``is_causal``); ``backward``: the op computes dQ, dK, dV. Varlen ops give the cumulative
    sequence lengths at ``cu_seqlens`` and the longest sequence at ``max_seqlen``."""

    layout: Layout
    causal: int | None
    q: int = 0
    bottom_right: bool = False
    backward: bool = False
    cu_seqlens: int | None = None
    max_seqlen: int | None = None
    mask_type: bool = False


_ATTENTION_OPS: dict[str, AttentionOp] = {
    "scaled_dot_product_attention": AttentionOp(Layout.BHSD, causal=5),
    "_scaled_dot_product_flash_attention": AttentionOp(Layout.BHSD, causal=4),
    "_scaled_dot_product_efficient_attention": AttentionOp(Layout.BHSD, causal=6),
    "_scaled_dot_product_cudnn_attention": AttentionOp(Layout.BHSD, causal=6),
    "_scaled_dot_product_flash_attention_backward": AttentionOp(Layout.BHSD, causal=11, q=1, backward=True),
    "_scaled_dot_product_efficient_attention_backward": AttentionOp(Layout.BHSD, causal=11, q=1, backward=True),
    "_scaled_dot_product_cudnn_attention_backward": AttentionOp(Layout.BHSD, causal=14, q=1, backward=True),
    "_flash_attention_forward": AttentionOp(Layout.BSHD, causal=8, cu_seqlens=3, max_seqlen=5),
    "_flash_attention_backward": AttentionOp(Layout.BSHD, causal=11, q=1, backward=True, cu_seqlens=6,
                                             max_seqlen=8),
    "_efficient_attention_forward": AttentionOp(Layout.BSHD, causal=9, cu_seqlens=4, max_seqlen=6,
                                                mask_type=True),
    "_flash_attn_forward": AttentionOp(Layout.BSHD, causal=5, bottom_right=True),
    "_flash_attn_varlen_forward": AttentionOp(Layout.BSHD, causal=9, bottom_right=True, cu_seqlens=3,
                                              max_seqlen=5),
    "_flash_attn_backward": AttentionOp(Layout.BSHD, causal=11, q=1, backward=True, bottom_right=True),
    "paged_attention_v1": AttentionOp(Layout.PAGED, causal=None, q=1, max_seqlen=9),
    "paged_attention_v2": AttentionOp(Layout.PAGED, causal=None, q=4, max_seqlen=12),
}


def _concrete(values: list, i: int | None) -> str:
    return str(values[i]).strip() if i is not None and i < len(values) and values[i] is not None else ""


def causal_pairs(sq: int, sk: int, bottom_right: bool = False) -> int:
    """Unmasked (query, key) pairs of one head under a causal mask: query i sees keys
    ``j <= i`` (top-left, torch's ``is_causal``) or ``j <= i + sk - sq`` (bottom-right,
    FlashAttention >= 2.1 and vLLM: the queries are the last ``sq`` positions).

    >>> causal_pairs(4, 4), causal_pairs(1, 100, bottom_right=True), causal_pairs(1, 100)
    (10, 100, 1)
    """
    first = 1 + (sk - sq if bottom_right else 0)       # keys query 0 would see, before clipping
    lo = max(0, min(sq, 1 - first))                     # queries before lo see no key
    hi = max(lo, min(sq, sk - first))                   # queries from hi on see every key
    return (hi - lo) * first + (lo + hi - 1) * (hi - lo) // 2 + (sq - hi) * sk


def _varlen_lengths(total: int, seqs: int, longest: int) -> list[int]:
    """Sequence lengths of a varlen batch whose shapes give only the total, the count and the
    longest: the longest one plus equal shares of the rest (TraceLens's rule)."""
    if seqs <= 1 or longest <= 0 or longest > total:
        return [total]
    return [longest] + [(total - longest) // (seqs - 1)] * (seqs - 1)


@dataclass(frozen=True)
class _Attention:
    """What an attention call computes: ``batch_heads`` query heads (× batch), each over the
    (queries, keys) of ``lengths`` (one pair per sequence), head dims ``d`` (QK) and ``dv`` (V),
    and the K + V elements it reads (with the KV heads of their own shape: GQA); ``batch``: how many
    sequences each ``lengths`` entry stands for (a padded batch: all of one length)."""

    batch_heads: int
    lengths: list[tuple[int, int]]
    d: int
    dv: int
    kv_elems: int
    batch: int = 1


def _attention_shape(spec: AttentionOp, q: list[int], k: list[int], v: list[int], dims,
                     concrete: list) -> _Attention | None:
    if spec.layout is Layout.PAGED:             # query (seqs, Hq, D); K/V cache blocks (blocks, Hkv, ...)
        seqs, hq, d = q
        longest = int(float(_concrete(concrete, spec.max_seqlen)))
        return _Attention(hq, [(1, longest)] * seqs, d, d, seqs * longest * k[1] * 2 * d)
    if len(q) == 4 and len(k) == 4:
        if spec.layout is Layout.BHSD:
            b, hq, sq, d = q
            hkv, sk = k[1], k[2]
        else:                                   # (B, S, H, D)
            b, sq, hq, d = q
            sk, hkv = k[1], k[2]
        return _Attention(b * hq, [(sq, sk)], d, v[3], b * hkv * sk * (d + v[3]), batch=b)
    if len(q) == 3 and spec.layout is Layout.BSHD and spec.cu_seqlens is not None and spec.max_seqlen is not None:
        (tq, hq, d), (tk, hkv), dv = q, k[:2], v[2]   # varlen: (tokens, H, D), cu_seqlens (B + 1,)
        seqs = _numel(dims[spec.cu_seqlens]) - 1
        longest_q, longest_k = (int(float(_concrete(concrete, spec.max_seqlen + i) or 0)) for i in (0, 1))
        lengths = list(zip(_varlen_lengths(tq, seqs, longest_q), _varlen_lengths(tk, seqs, longest_k)))
        return _Attention(hq, lengths, d, dv, tk * hkv * (d + dv))
    return None


def is_attention_backward(op_name: str) -> bool:
    """Whether a CPU op computes an attention's gradients (a training step's backward pass).

    >>> is_attention_backward("aten::_scaled_dot_product_flash_attention_backward"), \\
    ...     is_attention_backward("aten::scaled_dot_product_attention")
    (True, False)
    """
    spec = _ATTENTION_OPS.get(op_key(op_name))
    return spec is not None and spec.backward


def attention_sequences(op_name: str, input_dims: Sequence | None,
                        concrete_inputs: Sequence | None = None) -> list[tuple[int, int]] | None:
    """Per sequence of a forward attention op's batch, its (queries, keys), read from the op's
    recorded shapes; None for any other op, a backward one, or shapes that do not say. A padded
    batch gives every sequence the padded lengths; a varlen one without its lengths, the longest
    plus equal shares of the rest (as :func:`op_flops_bytes` prices it).

    >>> attention_sequences("aten::scaled_dot_product_attention", [[2, 8, 1, 64], [2, 8, 37, 64], [2, 8, 37, 64]])
    [(1, 37), (1, 37)]
    >>> attention_sequences("aten::mm", [[4, 8], [8, 4]]) is None
    True
    """
    spec = _ATTENTION_OPS.get(op_key(op_name))
    if spec is None or spec.backward or not input_dims:
        return None
    operands = [a[0] for a in _tensors(input_dims, None)[spec.q:spec.q + 3] if a is not None]
    if len(operands) < 3:
        return None
    try:
        q, k, v = operands
        shape = _attention_shape(spec, q, k, v, input_dims, list(concrete_inputs or ()))
    except (ValueError, TypeError, IndexError):
        return None
    return None if shape is None else shape.lengths * shape.batch


def _attention(spec: AttentionOp, args, dims, concrete: list) -> tuple[int, int] | None:
    """FLOPs and bytes of an attention op (forward: QKᵀ and PV; backward: the recomputed QKᵀ
    plus dV, dP, dQ, dK, i.e. 2.5× the forward FLOPs; softmax ignored: O(1/D) of the rest)."""
    (q, eq), (k, _ek), (v, _ev) = args[spec.q], args[spec.q + 1], args[spec.q + 2]
    shape = _attention_shape(spec, q, k, v, dims, concrete)
    if shape is None:
        return None
    flag = _concrete(concrete, spec.causal)
    causal = flag in ("1", "2") if spec.mask_type else flag == "True"
    bottom_right = spec.bottom_right or (spec.mask_type and flag == "2")
    unmasked = sum(causal_pairs(a, c, bottom_right) if causal else a * c for a, c in shape.lengths)
    flops = 2 * shape.batch_heads * unmasked * (shape.d + shape.dv)
    q_elems = _numel(q)
    o_elems = q_elems // shape.d * shape.dv
    if spec.backward:   # read Q, K, V, dO; write dQ, dK, dV
        return flops * 5 // 2, (2 * q_elems + o_elems + 2 * shape.kv_elems) * eq
    return flops, (q_elems + shape.kv_elems + o_elems) * eq
