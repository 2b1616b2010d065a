"""Handing freed memory back to the system between the phases of an analysis.

A big trace's load and graph build free hundreds of megabytes of temporaries (numpy arrays,
Python objects, Arrow buffers). glibc's allocator keeps freed heap pages resident for reuse, and
Arrow's default pool (mimalloc) keeps its freed segments; what a later phase allocates does not
always fit in them, so the process's resident peak grows by what was kept (measured on a
64-rank job: ~100-200 MiB at every later phase, ``docs/scale.md``). :func:`release_freed_memory`
returns both: ``malloc_trim(0)`` (glibc only; a few milliseconds at a gigabyte of heap) and
Arrow's ``release_unused``. Nothing live is touched.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

import pyarrow as pa


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to call
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


RELEASE_MIN_ROWS = 100_000
"""Below this many table rows (events, tasks) the work just done freed a few megabytes at most:
not worth a trim, which walks the whole heap (~1 ms a call; after every build step of a 24k-task
trace that was a quarter of its build time)."""


def release_freed_memory(rows: int | None = None) -> bool:
    """Return freed heap pages and Arrow's unused buffers to the system; whether the C heap was
    trimmed (glibc). ``rows``: the table rows the work just done went over; fewer than
    :data:`RELEASE_MIN_ROWS` and nothing is done (None: always release).

    >>> release_freed_memory(rows=10)
    False
    >>> isinstance(release_freed_memory(), bool)
    True
    """
    if rows is not None and rows < RELEASE_MIN_ROWS:
        return False
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
