"""Event names as Kineto writes them: demangled kernel names and runtime calls without CUPTI's
version suffix.

Kineto demangles every kernel name with ``abi::__cxa_demangle`` and names runtime calls from its
own table (``cudaLaunchKernel``). Traces written from raw CUPTI records (whatif's ``--backend
cupti`` before its converter did this, other CUPTI-based tools) carry the mangled symbol
(``_ZN2at6native...``) and CUPTI's callback name (``cudaLaunchKernel_v7000``: the suffix is the
CUDA version that introduced the callback). That suffix is what tells such a file apart: the
reader respells the names of a file whose calls carry it (:func:`kineto_spelling`), so its
kernels are named as in a Kineto trace of the same program and the rules that match whole call
names (``QUERY_CALL`` in ``depgraph/rules/sync_lookup.py``) see ``cudaEventQuery``. A trace that
Kineto wrote keeps its names as written, mangled ones included (seven shared traces hold kernels
Kineto left mangled): whatif then names them as HTA and TraceLens do on the same file. The CUPTI
converter writes names through :func:`kineto_name`.
"""
from __future__ import annotations

import ctypes
import functools
import re
from collections.abc import Callable, Sequence

import numpy as np

# The CUPTI callback suffix: ``_v`` and the CUDA version (3020, 7000, 11060...). API functions
# whose own name has a short version (``cudaGetDeviceProperties_v2``, ``cuMemcpyDtoH_v2``) keep it.
_CALLBACK_VERSION = re.compile(r"^(cu\w*?)_v\d{4,}$")
_MANGLED_PREFIX = "_Z"


@functools.cache
def _cxa_demangle() -> tuple[Callable[..., int | None], Callable[[int], None]] | None:
    """libstdc++'s ``__cxa_demangle`` and libc's ``free``, or ``None`` where they cannot be loaded."""
    try:
        demangle = ctypes.CDLL("libstdc++.so.6").__cxa_demangle
        free = ctypes.CDLL(None).free
    except (OSError, AttributeError):
        return None
    demangle.restype = ctypes.c_void_p
    demangle.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t),
                         ctypes.POINTER(ctypes.c_int)]
    free.restype = None
    free.argtypes = [ctypes.c_void_p]
    return demangle, free


@functools.lru_cache(maxsize=65536)
def demangle(name: str) -> str:
    """The demangled form of an Itanium-mangled C++ symbol, as Kineto writes kernel names; the
    name itself when it is not mangled, does not demangle, or libstdc++ is not available.

    >>> demangle("_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEEEEviT0_")[:68]
    'void at::native::vectorized_elementwise_kernel<4, at::native::FillFu'
    >>> demangle("ampere_sgemm_128x64_nn"), demangle("_Znot a symbol")
    ('ampere_sgemm_128x64_nn', '_Znot a symbol')
    """
    if not name.startswith(_MANGLED_PREFIX):
        return name
    lib = _cxa_demangle()
    if lib is None:
        return name
    cxa_demangle, free = lib
    status = ctypes.c_int(-1)
    try:
        raw = name.encode()
    except UnicodeEncodeError:
        return name
    out = cxa_demangle(raw, None, None, ctypes.byref(status))
    if not out:
        return name
    try:
        text = ctypes.string_at(out).decode(errors="replace") if status.value == 0 else name
    finally:
        free(out)
    return text


def api_call_name(name: str) -> str:
    """A runtime or driver call's name without CUPTI's callback version suffix.

    >>> api_call_name("cudaLaunchKernel_v7000"), api_call_name("cudaLaunchKernelExC_v11060")
    ('cudaLaunchKernel', 'cudaLaunchKernelExC')
    >>> api_call_name("cudaGetDeviceProperties_v2"), api_call_name("cuMemcpyDtoH_v2")
    ('cudaGetDeviceProperties_v2', 'cuMemcpyDtoH_v2')
    """
    match = _CALLBACK_VERSION.match(name)
    return match.group(1) if match else name


def kineto_name(name: str) -> str:
    """An event name spelled as Kineto writes it (:func:`demangle`, then :func:`api_call_name`).

    >>> kineto_name("_ZN7cutlass6KernelI4GemmEEvNT_6ParamsE"), kineto_name("cudaStreamSynchronize_v3020")
    ('void cutlass::Kernel<Gemm>(Gemm::Params)', 'cudaStreamSynchronize')
    >>> kineto_name("aten::mm")
    'aten::mm'
    """
    return api_call_name(demangle(name))


def kineto_spelling(names: Sequence[str]) -> tuple[list[str], np.ndarray] | None:
    """For the distinct event names of a file written from raw CUPTI records (some call carries
    CUPTI's callback suffix): the distinct names as Kineto spells them and, per old name index,
    its new index (two raw names may become one). ``None`` for any other file.

    >>> names, remap = kineto_spelling(["cudaLaunchKernel_v7000", "_ZN2at6native6kernelEv", "at::native::kernel()"])
    >>> names, remap.tolist()
    (['cudaLaunchKernel', 'at::native::kernel()'], [0, 1, 1])
    >>> kineto_spelling(["cudaLaunchKernel", "_ZN2at6native6kernelEv"]) is None
    True
    """
    if not any(_CALLBACK_VERSION.match(n) for n in names):
        return None
    spelled: list[str] = []
    index: dict[str, int] = {}
    remap = np.empty(len(names), dtype=np.int32)
    for i, name in enumerate(names):
        new = kineto_name(name)
        remap[i] = index.setdefault(new, len(spelled))
        if remap[i] == len(spelled):
            spelled.append(new)
    return spelled, remap
