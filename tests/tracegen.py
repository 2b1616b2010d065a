"""Write small hand-made Kineto traces for tests (times in microseconds, as in Kineto)."""
from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import orjson

CPU_PID, MAIN_TID = 100, 1


class KinetoTrace:
    """Accumulates Kineto events; ``write`` produces a ``.json.gz`` our reader and HTA accept."""

    def __init__(self, rank: int | None = None, world_size: int | None = None, base_us: int = 1_000_000,
                 gpu_name: str = "NVIDIA A100-SXM4-80GB") -> None:
        self.events: list[dict[str, Any]] = []
        self.gpu_name = gpu_name
        self.rank = rank
        self.world_size = world_size
        self.base = base_us

    def _x(self, cat: str, name: str, ts: float, dur: float, pid: int, tid: int, **args: Any) -> dict[str, Any]:
        ev = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": self.base + ts, "dur": dur,
              "args": args}
        self.events.append(ev)
        return ev

    def step(self, n: int, ts: float, dur: float, tid: int = MAIN_TID) -> None:
        self._x("user_annotation", f"ProfilerStep#{n}", ts, dur, CPU_PID, tid)

    def synced_step(self, n: int, ts: float, sync_ts: float, gpu_end: float, corr: int) -> float:
        """Step ``n`` from ``ts``, ended by a ``cudaDeviceSynchronize`` from ``sync_ts`` that returns
        1 us after the GPU is done at ``gpu_end``; returns where the next step may start."""
        self.runtime("cudaDeviceSynchronize", sync_ts, gpu_end + 1 - sync_ts, corr=corr)
        self.step(n, ts, gpu_end + 2 - ts)
        return gpu_end + 4

    def annotation(self, name: str, ts: float, dur: float, tid: int = MAIN_TID) -> None:
        self._x("user_annotation", name, ts, dur, CPU_PID, tid)

    def op(self, name: str, ts: float, dur: float, tid: int = MAIN_TID, args: dict[str, Any] | None = None) -> None:
        """A cpu_op; ``args`` as record_shapes writes them (``External id``, ``Input Dims``, ``Input type``)."""
        self._x("cpu_op", name, ts, dur, CPU_PID, tid, **(args or {}))

    def python(self, name: str, ts: float, dur: float, tid: int = MAIN_TID) -> None:
        """A python_function event (``with_stack``: ``file.py(line): function``, ``nn.Module: Name_0``)."""
        self._x("python_function", name, ts, dur, CPU_PID, tid)

    def runtime(self, name: str, ts: float, dur: float, corr: int, tid: int = MAIN_TID) -> None:
        self._x("cuda_runtime", name, ts, dur, CPU_PID, tid, correlation=corr)

    def gpu(self, name: str, ts: float, dur: float, corr: int, stream: int = 7, device: int = 0,
            cat: str = "kernel", **args: Any) -> None:
        self._x(cat, name, ts, dur, device, stream, correlation=corr, device=device, stream=stream, **args)

    def cuda_sync(self, kind: str, ts: float, dur: float, corr: int, stream: int = -1, device: int = 0,
                  **args: Any) -> None:
        self._x("cuda_sync", kind, ts, dur, device, stream, correlation=corr, cuda_sync_kind=kind, device=device,
                stream=stream, **args)

    def memory(self, ts: float, nbytes: int, addr: int | None, total_allocated: int | None = None,
               total_reserved: int | None = None, device: int = 0, device_type: int = 1, tid: int = MAIN_TID) -> None:
        """An allocator record (``profile_memory``): ``nbytes`` < 0 is a free; a total left None is
        not written (as in 2021 traces)."""
        args: dict[str, Any] = {"Device Type": device_type, "Device Id": device, "Bytes": nbytes}
        for key, value in (("Addr", addr), ("Total Allocated", total_allocated), ("Total Reserved", total_reserved)):
            if value is not None:
                args[key] = value
        self.events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": CPU_PID,
                            "tid": tid, "ts": self.base + ts, "args": args})

    def flow(self, cat: str, fid: int, ph: str, ts: float, tid: int) -> None:
        self.events.append({"ph": ph, "cat": cat, "name": cat, "id": fid, "pid": CPU_PID, "tid": tid,
                            "ts": self.base + ts, **({"bp": "e"} if ph == "f" else {})})

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": self.gpu_name}],
                               "traceEvents": self.events}
        if self.rank is not None:
            doc["distributedInfo"] = {"backend": "nccl", "rank": self.rank, "world_size": self.world_size or 1}
        return doc

    def write(self, path: Path) -> Path:
        data = orjson.dumps(self.document())
        path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
        return path
