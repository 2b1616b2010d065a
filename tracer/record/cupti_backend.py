"""The ``cupti`` backend: NVIDIA's cupti-python Activity API instead of torch.profiler.

It records CUDA runtime and driver calls, concurrent kernels, memcpy, memset and
synchronization, and links them to the program's ``record_function`` ranges (``phase:*``) and
to ``ProfilerStep#N`` steps through CUPTI external correlation ids. CPU operators are not
recorded (that is Kineto's job). CUPTI admits one activity subscriber per process, so
torch.profiler must not run at the same time: a program that starts its own torch.profiler
under this backend gets an error.

cupti-python is imported only here, only when this backend is chosen.
"""
from __future__ import annotations

import ctypes
import itertools
import os
import threading
from typing import Any

import torch

from whatif.tracer.names import api_call_name

from .cupti_records import (
    KIND_CONCURRENT_KERNEL,
    KIND_DRIVER,
    KIND_EXTERNAL_CORRELATION,
    KIND_MEMCPY,
    KIND_MEMSET,
    KIND_RUNTIME,
    KIND_SYNCHRONIZATION,
    CpuRange,
    cupti_to_kineto,
    is_noise_call,
    snapshot,
)
from .errors import BackendUnavailableError, OptionError
from .options import RecordOptions, Schedule

BUFFER_BYTES = 8 * 1024 * 1024
ENABLED_KINDS = (KIND_RUNTIME, KIND_DRIVER, KIND_CONCURRENT_KERNEL, KIND_MEMCPY, KIND_MEMSET,
                 KIND_SYNCHRONIZATION, KIND_EXTERNAL_CORRELATION)
CUDA_DRIVER_LIBRARY = "libcuda.so.1"


def check_cupti_available() -> Any:
    """Return the ``cupti.cupti`` module, or raise :class:`BackendUnavailableError` (one line)."""
    try:
        ctypes.CDLL(CUDA_DRIVER_LIBRARY)
    except OSError:
        raise BackendUnavailableError(f"--backend cupti: no CUDA driver on this machine ({CUDA_DRIVER_LIBRARY} "
                                      "cannot be loaded); use --backend torch") from None
    try:
        from cupti import cupti  # type: ignore[import-not-found]
    except ImportError:
        raise BackendUnavailableError("--backend cupti needs cupti-python: pip install 'whatif[cupti]'") from None
    return cupti


class CuptiSession:
    """One recording with the CUPTI Activity API; :attr:`cycles` holds the converted document."""

    name = "cupti"

    def __init__(self, options: RecordOptions) -> None:
        if options.schedule != Schedule():
            raise OptionError("--wait/--warmup/--active/--repeat need --backend torch "
                              "(the cupti backend records the whole run)")
        if options.record_shapes or options.with_stack or options.profile_memory:
            raise OptionError("--record-shapes/--with-stack/--memory need --backend torch "
                              "(CUPTI does not see CPU operators)")
        self._cupti = check_cupti_available()
        self.gpu = True
        self.cycles: list[dict[str, Any]] = []
        self.program_profiler_used = False
        self._records: list[dict[str, Any]] = []
        self._ranges: list[CpuRange] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._running = False
        self._step_num = 0
        self._step_start_ns = 0
        self._step_id = 0
        self._patched: list[tuple[Any, str, Any]] = []
        self._thread_ids: dict[int, int] = {}
        self._noise_ids: dict[tuple[int, int], bool] = {}
        self._api_names: dict[tuple[int, int], str] = {}

    # -- CUPTI buffers ------------------------------------------------------------------------
    def _buffer_requested(self) -> tuple[int, int]:
        return BUFFER_BYTES, 0

    def _buffer_completed(self, activities: list[Any]) -> None:
        kept = [s for s in (snapshot(a) for a in activities if not self._noise(a)) if s is not None]
        with self._lock:
            self._records.extend(kept)

    def _noise(self, record: Any) -> bool:
        """Whether a record is a call the trace leaves out (:func:`is_noise_call`), decided once per
        callback id: copying each record runs in the program's process while it waits, and the
        calls Kineto leaves out (``cudaGetDevice``...) were 92-94 % of the calls in the H200
        recordings (``bench/gpu_backends.py``)."""
        kind = int(record.kind)
        if kind not in (KIND_RUNTIME, KIND_DRIVER):
            return False
        key = (kind, int(record.cbid))
        noise = self._noise_ids.get(key)
        if noise is None:
            noise = self._noise_ids[key] = is_noise_call(kind, api_call_name(self._api_name(*key)))
        return noise

    def _api_name(self, kind: int, cbid: int) -> str:
        """CUPTI's name of a runtime/driver callback, asked once per callback id."""
        name = self._api_names.get((kind, cbid))
        if name is None:
            domains = self._cupti.CallbackDomain
            domain = domains.RUNTIME_API if kind == KIND_RUNTIME else domains.DRIVER_API
            name = self._api_names[kind, cbid] = str(self._cupti.get_callback_name(domain, cbid))
        return name

    def _now_ns(self) -> int:
        return int(self._cupti.get_timestamp())

    # -- annotations --------------------------------------------------------------------------
    def _push(self) -> int:
        ext = next(self._ids)
        self._cupti.activity_push_external_correlation_id(self._cupti.ExternalCorrelationKind.CUSTOM0, ext)
        return ext

    def _pop(self) -> None:
        self._cupti.activity_pop_external_correlation_id(self._cupti.ExternalCorrelationKind.CUSTOM0)

    def _patch_record_function(self) -> None:
        rf = torch.autograd.profiler.record_function
        session = self
        enter, exit_ = rf.__enter__, rf.__exit__

        def traced_enter(self_rf: Any) -> Any:
            result = enter(self_rf)
            self_rf._whatif = (session._push(), session._now_ns())
            return result

        def traced_exit(self_rf: Any, *exc: Any) -> Any:
            ext, start_ns = self_rf.__dict__.pop("_whatif", (0, 0))
            if ext:
                session._pop()
                session._add_range(self_rf.name, start_ns, ext)
            return exit_(self_rf, *exc)

        self._patched.append((rf, "__enter__", enter))
        self._patched.append((rf, "__exit__", exit_))
        rf.__enter__, rf.__exit__ = traced_enter, traced_exit  # type: ignore[method-assign]  # patched, restored on stop

        original_profile = torch.profiler.profile

        class RefusedProfile(original_profile):  # type: ignore[misc, valid-type]
            def start(self) -> None:
                raise RuntimeError("whatif record --backend cupti: the program's own torch.profiler would be a "
                                   "second CUPTI subscriber; record it with --backend torch")

        for module in (torch.profiler, torch.profiler.profiler):
            self._patched.append((module, "profile", original_profile))
            module.profile = RefusedProfile  # type: ignore[attr-defined]

    def _add_range(self, name: str, start_ns: int, ext: int) -> None:
        with self._lock:
            self._thread_ids[cupti_thread_id(threading.get_ident())] = threading.get_native_id()
            self._ranges.append(CpuRange(name=name, start_ns=start_ns, end_ns=self._now_ns(), pid=os.getpid(),
                                         tid=threading.get_native_id(), external_id=ext))

    # -- session ------------------------------------------------------------------------------
    def start(self, on_yield: Any) -> None:
        cupti = self._cupti
        cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)
        for kind in ENABLED_KINDS:
            cupti.activity_enable(kind)
        self._patch_record_function()
        self._running = True
        self._open_step()

    def _open_step(self) -> None:
        self._step_id = self._push()
        self._step_start_ns = self._now_ns()

    def _close_step(self) -> None:
        self._pop()
        self._add_range(f"ProfilerStep#{self._step_num}", self._step_start_ns, self._step_id)

    def step(self) -> None:
        if self._running:
            self._close_step()
            self._step_num += 1
            self._open_step()

    def _unpatch(self) -> None:
        for owner, name, original in reversed(self._patched):
            setattr(owner, name, original)
        self._patched.clear()

    def disown(self) -> None:
        """In a forked child: forget the parent's CUPTI subscription and give back what was patched."""
        self._running = False
        self._unpatch()

    def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        self._close_step()
        self._unpatch()
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
        cupti = self._cupti
        cupti.activity_flush_all(1)
        for kind in ENABLED_KINDS:
            cupti.activity_disable(kind)
        devices = [kineto_device_properties(torch.cuda.get_device_properties(i))
                   for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
        with self._lock:
            for thread in threading.enumerate():
                if thread.ident is not None and thread.native_id is not None:
                    self._thread_ids[cupti_thread_id(thread.ident)] = thread.native_id
            self.cycles = [cupti_to_kineto(self._records, annotations=self._ranges, api_name=self._api_name,
                                           pid=os.getpid(), device_properties=devices,
                                           thread_ids=self._thread_ids)]


def cupti_thread_id(ident: int) -> int:
    """The thread id CUPTI gives a thread's calls: the low 32 bits of ``pthread_self()``, which is
    ``threading.get_ident()`` on Linux (the recordings of ``sample_traces/gpu`` show the main
    thread's calls under ``0x45ba5740``, the low half of a glibc ``pthread_t``).

    >>> hex(cupti_thread_id(0x7F2A45BA5740))
    '0x45ba5740'
    """
    return ident & 0xFFFFFFFF


def kineto_device_properties(props: Any) -> dict[str, Any]:
    """A device's ``deviceProperties`` entry under Kineto's keys, from the fields of
    ``torch.cuda.get_device_properties`` that torch has had since 1.x (Kineto also writes
    register and shared-memory sizes; whatif reads only the name).

    >>> from types import SimpleNamespace
    >>> kineto_device_properties(SimpleNamespace(name="NVIDIA H200", total_memory=150109880320, major=9, minor=0,
    ...     max_threads_per_multi_processor=2048, multi_processor_count=132))["numSms"]
    132
    """
    return {"name": props.name, "totalGlobalMem": props.total_memory, "computeMajor": props.major,
            "computeMinor": props.minor, "maxThreadsPerMultiprocessor": props.max_threads_per_multi_processor,
            "numSms": props.multi_processor_count}
