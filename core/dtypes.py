"""Data types, defined once: every spelling a trace, an NCCL argument or a precision spec uses,
its element size in bytes, and the compute dtype (the one a device has a peak rate for).

Spellings are compared after :func:`normalize` (lower case, no ``c10::`` prefix), so
``c10::BFloat16`` (an aten ``Input type``), ``bfloat16`` (NCCL's ``dtype`` argument) and ``bf16``
(a precision spec) are the same type.

>>> element_bytes("c10::BFloat16"), element_bytes("float"), element_bytes("int4"), element_bytes("Scalar")
(2.0, 4.0, 0.5, None)
>>> compute_dtype("c10::Half"), compute_dtype("long")
(<DType.FP16: 'fp16'>, None)
>>> dtype_in_kernel_name("volta_h884gemm_64x64_ldg8_nn")
<DType.FP16: 'fp16'>
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from enum import Enum


class DType(str, Enum):
    """Compute data types with their own peak rate."""

    FP32 = "fp32"
    TF32 = "tf32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"

    @property
    def bytes(self) -> int:
        """Bytes per element as stored (tf32 is stored as fp32)."""
        return int(ELEMENT_BYTES[self.value])


# normalized spelling -> (bytes per element, compute dtype or None for types no matrix engine runs)
_SPELLINGS: dict[str, tuple[float, DType | None]] = {
    "fp32": (4, DType.FP32), "float": (4, DType.FP32), "float32": (4, DType.FP32),
    "double": (8, DType.FP32), "float64": (8, DType.FP32),
    "tf32": (4, DType.TF32),
    "bf16": (2, DType.BF16), "bfloat16": (2, DType.BF16),
    "fp16": (2, DType.FP16), "half": (2, DType.FP16), "float16": (2, DType.FP16),
    "fp8": (1, DType.FP8), "float8_e4m3fn": (1, DType.FP8), "float8_e5m2": (1, DType.FP8),
    "float8_e4m3fnuz": (1, DType.FP8), "float8_e5m2fnuz": (1, DType.FP8),
    "int8": (1, DType.INT8), "signed char": (1, DType.INT8),
    "int4": (0.5, None),
    "long": (8, None), "long int": (8, None), "int64": (8, None), "int": (4, None), "int32": (4, None),
    "short": (2, None), "int16": (2, None), "unsigned char": (1, None), "uint8": (1, None),
    "byte": (1, None), "char": (1, None), "bool": (1, None),
    "complex<float>": (8, None), "complex<double>": (16, None),
}

ELEMENT_BYTES: dict[str, float] = {name: float(size) for name, (size, _) in _SPELLINGS.items()}
"""Bytes per element by normalized spelling."""

DEFAULT_ELEMENT_BYTES = 4
"""Traces without ``Input type`` (Jan-2021 ones) are of fp32 models."""

PRECISION_RANK: dict[str, int] = {"fp32": 0, "tf32": 1, "bf16": 2, "fp16": 2, "fp8": 3, "int8": 3, "int4": 4}
"""How far a storage/compute type is from fp32: a precision change applies only when it moves a
kernel further."""

# (compute dtype, substrings of a lower-cased kernel name that say it), first match wins
_KERNEL_NAME_SPELLINGS: tuple[tuple[DType, tuple[str, ...]], ...] = (
    (DType.BF16, ("bf16", "bfloat16")),
    (DType.FP8, ("fp8", "e4m3", "e5m2")),
    (DType.TF32, ("tf32",)),
    (DType.FP16, ("half", "fp16", "f16", "h884", "h1688", "h16816", "hgemm", "hmma")),
    (DType.INT8, ("int8", "imma", "i8i8")),
    (DType.FP32, ("sgemm", "s884", "s1688", "float")),
)


# AMD Tensile (rocBLAS/hipBLASLt) GEMM names: Cijk_<A layout>_<B layout>_<types>_..., the types token
# giving the A/B type, then the output and compute types (BBS: bf16 in and out, fp32 accumulate)
_TENSILE = re.compile(r"Cijk_[A-Za-z]+_[A-Za-z]+_([A-Z0-9]+)_")
_TENSILE_TYPES: dict[str, DType] = {
    "S": DType.FP32, "SB": DType.FP32, "BBS": DType.BF16, "BSS": DType.BF16, "BB": DType.BF16, "B": DType.BF16,
    "HHS": DType.FP16, "HSS": DType.FP16, "HH": DType.FP16, "H": DType.FP16, "I8I32": DType.INT8,
    "F8F8S": DType.FP8, "F8BS": DType.FP8, "F8HS": DType.FP8, "F8SS": DType.FP8,
}


def normalize(type_name: str) -> str:
    """The spelling tables are keyed by: lower case, stripped, without ``c10::``.

    >>> normalize(" c10::Float8_e4m3fn ")
    'float8_e4m3fn'
    """
    low = type_name.strip().lower()
    return low[5:] if low.startswith("c10::") else low


def element_bytes(type_name: str | None) -> float | None:
    """Bytes per element of a type spelling; None for what is not a tensor type (``Scalar``, '')."""
    if not type_name:
        return None
    return ELEMENT_BYTES.get(normalize(str(type_name)))


def compute_dtype(type_name: str | None) -> DType | None:
    """The compute dtype of a type spelling; None for integer/bool types and non-tensors."""
    if not type_name:
        return None
    entry = _SPELLINGS.get(normalize(str(type_name)))
    return entry[1] if entry else None


SCALAR_TYPES: dict[int, str] = {0: "uint8", 1: "int8", 2: "short", 3: "int", 4: "long", 5: "fp16", 6: "fp32",
                                 7: "double", 11: "bool", 15: "bf16"}
"""c10::ScalarType codes, as a recorded op's ``Concrete Inputs`` spell a dtype argument (``aten::to``)."""


def conversion_target(input_types: Sequence[str] | None, concrete: Sequence[str] | None) -> str | None:
    """The dtype a recorded conversion (``aten::to``, ``aten::_to_copy``) converts to: what its
    first integer ``Scalar`` argument after the tensor names as a :data:`SCALAR_TYPES` code (None
    when there is none, or it names another type).

    >>> conversion_target(["float", "Scalar", "Scalar", "Scalar", ""], ["", "15", "False", "False", ""])
    'bf16'
    >>> conversion_target(["float", "", "Scalar", "Scalar"], ["", "", "6", "False"])
    'fp32'
    """
    for kind, value in list(zip(input_types or [], concrete or []))[1:]:
        if kind == "Scalar" and str(value).isdigit():
            return SCALAR_TYPES.get(int(value))
    return None


FACTORY_DTYPE_ARGS: dict[str, int] = {
    "empty": 1, "empty_strided": 2, "empty_like": 1, "zeros": 1, "zeros_like": 1, "ones": 1, "ones_like": 1,
    "full": 2, "full_like": 2, "scalar_tensor": 1, "rand": 1, "randn": 1}
"""The argument that names the dtype of what a factory op makes (aten's signatures)."""


def factory_dtype(op_name: str, concrete: Sequence[str] | None) -> str | None:
    """The dtype a recorded factory op (``aten::empty``…, :data:`FACTORY_DTYPE_ARGS`) is asked
    to make, from its ``Concrete Inputs``; None for another op or when it does not say.

    >>> factory_dtype("aten::empty", ["[4, 256]", "4", "0", "", "", "0"]), factory_dtype("aten::ones", ["[2]", ""])
    ('long', None)
    """
    at = FACTORY_DTYPE_ARGS.get(op_name.rsplit("::", 1)[-1])
    value = str(concrete[at]) if at is not None and concrete is not None and at < len(concrete) else ""
    return SCALAR_TYPES.get(int(value)) if value.isdigit() else None


def op_dtype(input_types: Sequence[str] | None) -> str:
    """The dtype an op computes in: its first argument whose ``Input type`` is a compute dtype
    ("" when none is).

    >>> op_dtype(["", "c10::BFloat16", "float"]), op_dtype(["Scalar"])
    ('bf16', '')
    """
    return next((d.value for d in map(compute_dtype, input_types or []) if d is not None), "")


def dtype_in_kernel_name(name: str) -> DType | None:
    """The compute dtype a kernel name spells (cuBLAS/CUTLASS/cuDNN conventions, Volta ``h884``
    tensor-core names, templates such as ``<c10::Half>``), None when it says none.

    >>> [dtype_in_kernel_name(n) for n in ("sm80_xmma_gemm_bf16bf16_bf16f32", "volta_sgemm_128x64",
    ...                                    "sm80_xmma_fprop_implicit_gemm_tf32f32", "relu",
    ...                                    "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT96x96x128_MI16x16x1")]
    [<DType.BF16: 'bf16'>, <DType.FP32: 'fp32'>, <DType.TF32: 'tf32'>, None, <DType.BF16: 'bf16'>]
    """
    tensile = _TENSILE.match(name)
    if tensile:
        return _TENSILE_TYPES.get(tensile.group(1))
    low = name.lower()
    for dtype, spellings in _KERNEL_NAME_SPELLINGS:
        if any(s in low for s in spellings):
            return dtype
    return None
