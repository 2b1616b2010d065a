"""Event names as Kineto writes them: demangled kernel names and runtime calls without CUPTI's
version suffix.

Kineto demangles every kernel name with ``abi::__cxa_demangle`` and names runtime calls from its
own table (``cudaLaunchKernel``). Raw CUPTI records (whatif's ``--backend cupti`` before the
converter did this, other CUPTI-based tools, some AMD/third-party traces) carry the mangled
symbol (``_ZN2at6native...``) and CUPTI's callback name (``cudaLaunchKernel_v7000``: the suffix
is the CUDA version that introduced the callback). The reader normalizes every event name with
:func:`kineto_name`, and the CUPTI converter writes names through it, so both spell a kernel
and a call the way a Kineto trace does: a kernel's name is the same in both backends' traces,
and the rules that match whole call names (``QUERY_CALL`` in ``depgraph/rules/sync_lookup.py``)
see ``cudaEventQuery``, not ``cudaEventQuery_v3020``.
"""
from __future__ import annotations

import ctypes
import functools
import re
from collections.abc import Callable

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
