"""What ``torch.autocast`` does to one recorded op: which of its fp32 inputs it casts, and to what.

PyTorch's CUDA autocast (``aten/src/ATen/autocast_mode.cpp``; the op lists of the *Automatic Mixed
Precision* docs) runs the ops of its lower-precision list (GEMMs, convolutions, attention) in
bf16/fp16, casting every fp32 floating-point tensor argument first (a ``_to_copy`` op and one copy
kernel each); the ops of its fp32 list (norms, softmax, losses, exp/log/pow, reductions) cast
lower-precision inputs up to fp32; every other op runs in the widest dtype of its inputs, so an
op fed by a lower-precision output stays lower precision and a residual ``add`` of an fp32 stream
and a bf16 branch gives fp32. Parameters stay fp32 (the master weights): each forward casts them
again (once per autocast region: the cast cache). In backward, each cast's ``ToCopyBackward0``
casts the incoming gradient back to its input's dtype (one copy kernel each).

>>> [(c.role.value, c.numel, c.to_fp32) for c in autocast_casts("aten::addmm", [[3072], [4096, 1024], [1024, 3072]],
...                                                        ["float", "float", "float"], fed_by_low=False)]
[('bias', 3072, False), ('activation', 4194304, False), ('weight', 3145728, False)]
>>> [c.role.value for c in autocast_casts("aten::addmm", [[3072], [4096, 1024], [1024, 3072]],
...                                 ["float", "float", "float"], fed_by_low=True)]
['bias', 'weight']
>>> [(c.role.value, c.to_fp32) for c in autocast_casts("aten::_log_softmax", [[4096, 8192], [], []],
...                                              ["float", "Scalar", "Scalar"], fed_by_low=True)]
[('activation', True)]
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from .dtypes import DType
from .kernels import BIAS_ARG, KernelClass, float_tensors, op_key, weight_arg

FP32_OPS = frozenset({
    "layer_norm", "native_layer_norm", "group_norm", "native_group_norm", "rms_norm", "_fused_rms_norm",
    "softmax", "_softmax", "log_softmax", "_log_softmax", "cross_entropy_loss", "nll_loss", "nll_loss_forward",
    "nll_loss2d", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div",
    "binary_cross_entropy_with_logits", "exp", "expm1", "log", "log1p", "log2", "log10", "pow", "rsqrt",
    "reciprocal", "softplus", "sum", "prod", "cumsum", "cumprod", "norm", "linalg_vector_norm", "logsumexp",
    "cosine_similarity", "cdist", "renorm", "erfinv"})
"""Autocast's fp32 list (CUDA), by op name without namespace: these cast lower-precision inputs up."""


AUTOCAST_DTYPES = ("bf16", "fp16")
"""The 16-bit dtypes autocast (and a converted model, ``precision``) computes in."""
LOWERED_CLASSES = frozenset({KernelClass.GEMM.value, KernelClass.CONV.value, KernelClass.ATTENTION.value})
"""Kernel classes of autocast's lower-precision list (GEMMs, convolutions, attention)."""


class CastRole(str, Enum):
    """What a cast tensor is to its op."""

    WEIGHT = "weight"
    BIAS = "bias"
    ACTIVATION = "activation"


@dataclass(frozen=True)
class Cast:
    """One cast autocast inserts before an op: ``numel`` elements, fp32 → the autocast dtype, or
    the autocast dtype → fp32 when ``to_fp32`` (an fp32-list op fed by a lower-precision output)."""

    role: CastRole
    numel: int
    to_fp32: bool = False

    def bytes(self, low_bytes: float) -> float:
        """DRAM bytes the copy kernel moves: each element read in one dtype, written in the other."""
        return self.numel * (4.0 + low_bytes)


def is_fp32_op(op_name: str) -> bool:
    """On autocast's fp32 list."""
    return op_key(op_name) in FP32_OPS


def autocast_casts(op_name: str, dims: Sequence | None, types: Sequence[str] | None, *,
                   fed_by_low: bool) -> list[Cast]:
    """The casts autocast runs before a recorded fp32 op (empty when it casts nothing).

    A lower-precision op (GEMM, convolution, attention: the caller says which kernels are) casts its
    fp32 parameters (:func:`~whatif.core.kernels.weight_arg`, ``BIAS_ARG``) always and its other fp32 tensors unless
    ``fed_by_low``: its activation is the output of a lower-precision op (directly, or through ops
    that take one tensor). An fp32-list op (:data:`FP32_OPS`) casts its first tensor up when
    ``fed_by_low``. Other ops cast nothing.
    """
    if not dims:
        return []
    tensors = float_tensors(dims, types or ())
    key = op_key(op_name)
    if key in FP32_OPS:
        return [Cast(CastRole.ACTIVATION, tensors[0][1], to_fp32=True)] if fed_by_low and tensors else []
    params = {weight_arg(op_name, dims): CastRole.WEIGHT, BIAS_ARG.get(key): CastRole.BIAS}
    out = []
    for i, n, dt in tensors:
        if dt not in (DType.FP32, DType.TF32):
            continue
        role = params.get(i, CastRole.ACTIVATION)
        if role is CastRole.ACTIVATION and fed_by_low:
            continue
        out.append(Cast(role, n))
    return out
