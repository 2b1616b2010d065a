"""Event kinds of the normalized event table and the mapping from Kineto categories.

Kineto renamed its categories over the years (2021: ``Operator``/``Runtime``/``Kernel``;
2022+: ``cpu_op``/``cuda_runtime``/``kernel``); both map to one :class:`EventKind`.
"""
from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum


class EventKind(IntEnum):
    CPU_OP = 0          # aten / framework operator on a CPU thread
    ANNOTATION = 1      # user annotation (record_function, ProfilerStep#N)
    PYTHON = 2          # python_function (with_stack)
    RUNTIME = 3         # CUDA/HIP runtime API call
    DRIVER = 4          # CUDA driver API call (cuLaunchKernel for Triton/CUTLASS)
    KERNEL = 5          # GPU kernel
    MEMCPY = 6          # GPU copy
    MEMSET = 7          # GPU memset
    GPU_ANNOTATION = 8  # user annotation mirrored on a GPU stream
    GPU_SYNC = 9        # cuda_sync record (stream/event/context sync, stream wait event)
    OTHER = 10          # profiler overhead, range profiler, anything else with a duration

    @property
    def on_gpu(self) -> bool:
        return self in GPU_KINDS

    @property
    def is_gpu_activity(self) -> bool:
        """Work that occupies a GPU stream (kernels, copies, memsets)."""
        return self in GPU_ACTIVITY_KINDS


GPU_ACTIVITY_KINDS = frozenset({EventKind.KERNEL, EventKind.MEMCPY, EventKind.MEMSET})
"""Events that occupy a GPU stream: what becomes a GPU task of the graph."""
GPU_MEMORY_KINDS = frozenset({EventKind.MEMCPY, EventKind.MEMSET})
"""Activities that move or set memory rather than compute (HTA's "memory" kernel type)."""
GPU_KINDS = GPU_ACTIVITY_KINDS | {EventKind.GPU_ANNOTATION, EventKind.GPU_SYNC}
"""Every event recorded on a GPU track (the activities, plus annotations and sync records)."""


def codes(kinds: Iterable[IntEnum]) -> list[int]:
    """The integer codes of a set of kinds (event or task kinds), sorted, for ``np.isin`` on a
    ``kind`` column."""
    return sorted(int(k) for k in kinds)

CATEGORY_KINDS: dict[str, EventKind] = {
    "cpu_op": EventKind.CPU_OP,
    "operator": EventKind.CPU_OP,
    "user_annotation": EventKind.ANNOTATION,
    "python_function": EventKind.PYTHON,
    "cuda_runtime": EventKind.RUNTIME,
    "runtime": EventKind.RUNTIME,
    "cuda_driver": EventKind.DRIVER,
    "kernel": EventKind.KERNEL,
    "gpu_memcpy": EventKind.MEMCPY,
    "memcpy": EventKind.MEMCPY,
    "gpu_memset": EventKind.MEMSET,
    "memset": EventKind.MEMSET,
    "gpu_user_annotation": EventKind.GPU_ANNOTATION,
    "cuda_sync": EventKind.GPU_SYNC,
}

KINETO_CATEGORY: dict[EventKind, str] = {
    EventKind.CPU_OP: "cpu_op", EventKind.ANNOTATION: "user_annotation", EventKind.PYTHON: "python_function",
    EventKind.RUNTIME: "cuda_runtime", EventKind.DRIVER: "cuda_driver", EventKind.KERNEL: "kernel",
    EventKind.MEMCPY: "gpu_memcpy", EventKind.MEMSET: "gpu_memset", EventKind.GPU_ANNOTATION: "gpu_user_annotation",
    EventKind.GPU_SYNC: "cuda_sync", EventKind.OTHER: "other",
}
"""Each kind's category as current Kineto spells it (what a written trace uses; read back as the same kind)."""

# Complete events of these categories carry no information for the graph.
IGNORED_CATEGORIES = frozenset({"trace", "critical_path"})


def kind_of(category: str | None) -> EventKind:
    """Map a Kineto category to an :class:`EventKind`.

    >>> kind_of("Kernel"), kind_of("cuda_runtime"), kind_of("overhead")
    (<EventKind.KERNEL: 5>, <EventKind.RUNTIME: 3>, <EventKind.OTHER: 10>)
    """
    if not category:
        return EventKind.OTHER
    return CATEGORY_KINDS.get(category.lower(), EventKind.OTHER)
