"""The cost models transforms use, calibrated on the trace itself (implements
:class:`whatif.transforms.base.CostModel`).

* Kernel facts: class from the kernel and op names (:mod:`whatif.depgraph.kernels`); FLOPs and
  bytes from the launching aten op's recorded shapes (``record_shapes``), shared among that op's
  kernels by duration. Without shapes they are *estimated* from the duration: memory-bound
  kernels at the trace's calibrated bandwidth, matrix kernels at ``ASSUMED_MATRIX_EFFICIENCY``
  of the device's peak (the ``estimated`` fact says which).
* Bandwidth: the median achieved DRAM bandwidth of the trace's memory-bound kernels with known
  bytes (>= ``MIN_PEERS`` kernels of >= 5 us), else ``ASSUMED_BW_EFFICIENCY`` of the device peak.
* Precision: matrix kernels scale by the ratio of the device's peak FLOP/s in the two dtypes,
  memory-bound kernels by the ratio of element sizes (Daydream's AMP model: x1/3 and x1/2 on a
  V100 fp32 -> fp16); a fixed ``FIXED_NS`` per kernel does not scale.
* Another GPU: Habitat's wave scaling per kernel (:func:`whatif.predictors.habitat.move_kernel_time_ns`).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from whatif.depgraph.graph import TaskGraph
from whatif.depgraph.kernels import KernelClass, classify_kernel, dtype_bytes, op_flops_bytes
from whatif.tracer.kinds import EventKind
from whatif.tracer.trace import Trace
from whatif.transforms.base import TransformError

from .devices import Device, DType, find_device, get_device
from .habitat import DEFAULT_FIXED_NS, move_kernel_time_ns

MIN_PEERS = 5
ASSUMED_BW_EFFICIENCY = 0.7      # of peak DRAM bandwidth, when the trace cannot calibrate it
ASSUMED_MATRIX_EFFICIENCY = 0.5  # of peak FLOP/s, to estimate FLOPs of a matrix kernel without shapes
FIXED_NS = DEFAULT_FIXED_NS      # per-kernel latency that no precision or bandwidth change removes
DEFAULT_BW_BYTES_PER_S = 1.0e12  # when neither the trace nor the device tells
_TYPE_DTYPE = {"c10::bfloat16": "bf16", "bfloat16": "bf16", "c10::half": "fp16", "half": "fp16", "float": "fp32",
               "double": "fp32", "c10::float8_e4m3fn": "fp8", "c10::float8_e5m2": "fp8", "signed char": "int8",
               "int8": "int8"}
MEMORY_BOUND = {KernelClass.ELEMENTWISE.value, KernelClass.REDUCTION.value, KernelClass.NORMALIZATION.value,
                KernelClass.COPY.value, KernelClass.MEMSET.value}


def _name_dtype(name: str) -> str:
    low = name.lower()
    if "bf16" in low or "bfloat16" in low:
        return "bf16"
    if "half" in low or "f16" in low or "fp16" in low:
        return "fp16"
    if "fp8" in low or "e4m3" in low:
        return "fp8"
    return "fp32"


class TraceCostModel:
    """Cost models for the graphs of one trace (see the module docstring)."""

    def __init__(self, trace: Trace, device: Device | None = None) -> None:
        self.trace = trace
        gpu = next((r.gpu_name for r in trace.ranks if r.gpu_name), None)
        self.device = device or find_device(gpu)
        self.gpu_name = gpu
        ev = trace.events
        ops = ev[ev["kind"].to_numpy() == int(EventKind.CPU_OP)]
        ops = ops[ops["external_id"].to_numpy() >= 0]
        self._op_by_ext = pd.Series(ops.index.to_numpy(),
                                    index=pd.MultiIndex.from_arrays([ops["rank"].to_numpy(),
                                                                     ops["external_id"].to_numpy()]))
        self._op_by_ext = self._op_by_ext[~self._op_by_ext.index.duplicated(keep="last")]
        self._bw: float | None = None

    # -- facts --------------------------------------------------------------------------------
    def kernel_facts(self, graph: TaskGraph, tasks: np.ndarray) -> dict[str, np.ndarray]:
        tasks = np.asarray(tasks, dtype=np.int64)
        facts = self._recorded_facts(graph, tasks)
        cls, flops, nbytes, dtype = facts["kernel_class"], facts["flops"], facts["bytes"], facts["dtype"]
        dur = graph.tasks["dur_ns"].to_numpy()[tasks].astype(float)
        estimated = np.isnan(flops) | np.isnan(nbytes)
        if estimated.any():
            bw = self.memory_bandwidth_bytes_per_s(graph)
            mem = np.isin(cls, list(MEMORY_BOUND)) | (cls == KernelClass.OTHER.value)
            for i in np.flatnonzero(estimated):
                busy = max(dur[i] - FIXED_NS, 0.0)
                if mem[i] or self.device is None:
                    nbytes[i], flops[i] = busy * 1e-9 * bw, busy * 1e-9 * bw / 4
                else:
                    flops[i] = busy * 1e-9 * self.device.peak_flops(dtype[i]) * ASSUMED_MATRIX_EFFICIENCY
                    nbytes[i] = flops[i] / max(self.device.ridge_point(dtype[i]), 1.0)
        facts["estimated"] = estimated
        return facts

    def _recorded_facts(self, graph: TaskGraph, tasks: np.ndarray) -> dict[str, np.ndarray]:
        """Class and dtype of every task; FLOPs and bytes where the op's shapes were recorded, else NaN."""
        t = graph.tasks
        ev = self.trace.events
        rows = t["event"].to_numpy()[tasks]
        names = t["name"].astype(str).to_numpy()[tasks]
        ops = t["op"].astype(object).to_numpy()[tasks]
        dur = t["dur_ns"].to_numpy()[tasks].astype(float)
        n = len(tasks)
        cls = np.asarray([classify_kernel(nm, op if isinstance(op, str) else None).value
                          for nm, op in zip(names, ops)], dtype=object)
        flops = np.full(n, np.nan)
        nbytes = np.full(n, np.nan)
        dtype = np.asarray([_name_dtype(nm) for nm in names], dtype=object)
        valid = rows >= 0
        ext = np.full(n, -1, dtype=np.int64)
        ext[valid] = ev["external_id"].to_numpy()[rows[valid]]
        rank = np.full(n, -1, dtype=np.int64)
        rank[valid] = ev["rank"].to_numpy()[rows[valid]]
        op_row = self._op_by_ext.reindex(pd.MultiIndex.from_arrays([rank, ext])).to_numpy()
        linked = np.flatnonzero(~np.isnan(op_row))
        args = ev["args"].to_numpy()
        op_names = ev["name"].astype(str).to_numpy()
        share: dict[int, float] = {}
        for i in linked:
            share[int(op_row[i])] = share.get(int(op_row[i]), 0.0) + max(dur[i], 1.0)
        for i in linked:
            r = int(op_row[i])
            a = args[r] or {}
            dims = a.get("Input Dims", a.get("Input dims"))
            types = a.get("Input type")
            fb = op_flops_bytes(op_names[r], dims, types) if dims is not None else None
            if fb is not None:
                frac = max(dur[i], 1.0) / share[r]
                flops[i], nbytes[i] = fb[0] * frac, fb[1] * frac
            if types:
                first = next((_TYPE_DTYPE[str(x).lower()] for x in types if str(x).lower() in _TYPE_DTYPE), None)
                if first:
                    dtype[i] = first
        return {"kernel_class": cls, "flops": flops, "bytes": nbytes, "dtype": dtype}

    def memory_bandwidth_bytes_per_s(self, graph: TaskGraph) -> float:
        if self._bw is not None:
            return self._bw
        t = graph.tasks
        gpu = np.flatnonzero(t["kind"].isin([4, 5, 6]).to_numpy() & (t["dur_ns"].to_numpy() >= 5_000)
                             & (t["event"].to_numpy() >= 0))
        measured: list[float] = []
        if len(gpu):
            facts = self._recorded_facts(graph, gpu)
            mem = np.isin(facts["kernel_class"], list(MEMORY_BOUND)) & ~np.isnan(facts["bytes"])
            dur = t["dur_ns"].to_numpy()[gpu][mem].astype(float)
            measured = list(facts["bytes"][mem] / (dur * 1e-9))
        if len(measured) >= MIN_PEERS:
            self._bw = float(np.median(measured))
        elif self.device is not None:
            self._bw = self.device.mem_bw_bytes_per_s * ASSUMED_BW_EFFICIENCY
        else:
            self._bw = DEFAULT_BW_BYTES_PER_S
        return self._bw

    # -- what-ifs -------------------------------------------------------------------------------
    def precision_factor(self, graph: TaskGraph, tasks: np.ndarray, to_dtype: str) -> np.ndarray:
        to = DType(to_dtype if to_dtype != "int4" else "int8")
        facts = self.kernel_facts(graph, tasks)
        dur = graph.tasks["dur_ns"].to_numpy()[tasks].astype(float)
        factor = np.ones(len(tasks))
        to_bytes = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}[to.value]
        if to_dtype == "int4":
            to_bytes = 0.5
        for i, (c, src) in enumerate(zip(facts["kernel_class"], facts["dtype"])):
            src_bytes = dtype_bytes({"bf16": "c10::BFloat16", "fp16": "c10::Half", "fp32": "float",
                                     "fp8": "c10::Float8_e4m3fn", "int8": "signed char"}.get(src, "float")) or 4
            if c in (KernelClass.GEMM.value, KernelClass.CONV.value, KernelClass.ATTENTION.value):
                if self.device is None:
                    raise TransformError("precision: the recorded GPU is unknown, so its tensor-core rates are too")
                ratio = self.device.peak_flops(src) / self.device.peak_flops(to)
            else:
                ratio = to_bytes / src_bytes
            busy = max(dur[i] - FIXED_NS, 0.0)
            factor[i] = (min(dur[i], FIXED_NS) + busy * ratio) / dur[i] if dur[i] > 0 else 1.0
        return factor

    def move_to_device(self, graph: TaskGraph, tasks: np.ndarray, device: str) -> np.ndarray:
        if self.device is None:
            raise TransformError(f"gpu: the recorded GPU ({self.gpu_name or 'not in the trace'}) is not in the "
                                 f"device catalog (whatif devices)")
        try:
            dst = get_device(device)
        except (KeyError, ValueError):
            dst = find_device(device)
        if dst is None:
            raise TransformError(f"gpu: unknown device {device!r} (whatif devices lists them)")
        facts = self.kernel_facts(graph, tasks)
        dur = graph.tasks["dur_ns"].to_numpy()[tasks].astype(float)
        return np.asarray([move_kernel_time_ns(d, f, b, self.device, dst, dt, c)
                           for d, f, b, dt, c in zip(dur, facts["flops"], facts["bytes"], facts["dtype"],
                                                     facts["kernel_class"])])
