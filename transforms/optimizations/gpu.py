"""``gpu``: run the selected GPU work on another GPU of the catalog, each kernel keeping its efficiency.

* Kernels and memsets keep the share they reached of the recorded GPU's *achievable* roofline
  (:func:`whatif.hardware.retarget.retarget_ns`): ``T' = F·L_d/L_s + (T − F)·A_d/A_s``,
  ``F = min(T, L_s)``, ``A`` the achievable roofline time of the kernel's FLOPs and bytes (the
  achievable GEMM rate of its dtype at its size for GEMM/conv/attention, the fp32 peak
  otherwise, and the streaming bandwidth), ``L`` each GPU's fixed kernel latency. ``fit_from``
  adds residual curves per op family fitted on pairs of traces of one program recorded on both
  GPUs (``'ON_SOURCE=ON_DEST'``; :mod:`whatif.predictors.pairs`).
* Memcpys: host↔device by the PCIe bandwidth ratio, device↔device by the DRAM ratio, peer
  copies by the peer-link ratio; collectives by the peer-link ratio (NVLink / Infinity Fabric
  per direction; PCIe for a GPU without peer links). Topology changes are not modeled.
* CPU tasks are unchanged (the host, driver and launch path are not part of the GPU) unless
  ``host_speed`` is given: then CPU calls, CPU work and the CPU gaps between them (thread-order
  edge latencies) take ``1/host_speed`` of their time. ``host_from`` instead measures that
  factor: a trace of the same program on the destination's host, whose CPU ops of the same name
  and shapes ran at some ratio of this trace's (:func:`whatif.tracer.host.host_time_ratio`).
  Launch latencies and GPU idle stay.

Capacity: when the trace holds allocator records (``whatif record --memory``), a destination
with less memory than a device's recorded allocated peak is refused in one line (the work does
not fit; ``whatif memory`` says what held the peak). Without records nothing is checked.

Not modeled: a different vendor's kernel library picks other kernels (cuBLAS vs hipBLASLt tile
shapes, more or fewer helper kernels), and per-kernel fixed costs differ by platform.

>>> Gpu(device="H100_SXM").label()
"gpu(device=H100_SXM, host_speed=1.0, select=Selector(kind='gpu'))"
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from whatif.core.errors import WhatifError
from whatif.depgraph.graph import (
    GPU_WORK_KINDS,
    LOCAL_GPU_WORK_KINDS,
    EdgeKind,
    TaskGraph,
    TaskKind,
    kind_codes,
)
from whatif.depgraph.schema import DEVICE_COLUMN
from whatif.hardware.devices import GIB, Device, find_device, get_device
from whatif.tracer.host import host_time_ratio
from whatif.tracer.memory import device_label, gpu_peaks
from whatif.tracer.trace import Trace, load_trace

from ..base import Transform, TransformContext, TransformError
from ..edit import scale_edge_latency, set_duration, set_state
from ..placement import Placement
from ..registry import register
from ..select import Selector, select

COLUMN = DEVICE_COLUMN   # read by whatif.predictors.costs
_CPU_KINDS = (int(TaskKind.CPU_CALL), int(TaskKind.CPU_WORK))


@register
@dataclass
class Gpu(Transform):
    name = "gpu"
    description = ("Run on another GPU of the catalog (each kernel keeps its share of the achievable roofline; "
                   "CPU unchanged unless host_speed or host_from)")

    device: str = field(default="", metadata={"help": "catalog name (H100_SXM, MI300X…) or a trace-style GPU name"})
    host_speed: float = field(default=1.0, metadata={
        "exclusive_minimum": 0, "help": "CPU speed relative to the recorded host (2 = CPU "
        "tasks and gaps take half the time)"})
    select: Selector = field(default_factory=lambda: Selector(kind="gpu"),
                             metadata={"help": "which GPU work moves (default: all)"})
    host_from: str | None = field(default=None, metadata={
        "help": "a trace of the same program recorded on the destination's host: CPU tasks and gaps take "
                "its measured speed (instead of host_speed)"})
    fit_from: list[str] | None = field(default=None, metadata={
        "help": "pairs 'ON_SOURCE=ON_DEST' of traces of one program recorded on the traced GPU and on the "
                "destination: the move is fitted on the op calls they share"})

    def _check(self) -> None:
        if not str(self.device).strip():
            raise TransformError("gpu: name the destination, e.g. device = \"H100_SXM\" ('whatif devices' lists them)")
        if self.host_from and self.host_speed != 1.0:
            raise TransformError("gpu: give host_speed or host_from, not both")

    @property
    def _moves_host(self) -> bool:
        return self.host_speed != 1.0 or bool(self.host_from)

    def _gpu_ids(self, graph: TaskGraph) -> np.ndarray:
        ids = self.select(graph)
        on_gpu = np.isin(graph.tasks["kind"].to_numpy()[ids], kind_codes(GPU_WORK_KINDS))
        return ids[on_gpu]

    def match(self, graph: TaskGraph, ctx: TransformContext) -> np.ndarray:
        self._check()
        ids = self._gpu_ids(graph)
        if self._moves_host:
            ids = np.union1d(ids, select(graph, where=lambda t: t["kind"].isin(_CPU_KINDS).to_numpy()))
        return ids

    def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
        self._check()
        cost = ctx.require_cost(self.name)
        ids = self._gpu_ids(graph)
        if not len(ids) and not self._moves_host:
            raise TransformError(f"gpu: the selection matches no GPU task ({self.select})")
        self._check_capacity(graph)
        new = np.rint(cost.move_to_device(graph, ids, self.device, self._fit_traces())).astype(np.int64)
        dest = _catalog_name(self.device)
        out = set_state(graph, ids, COLUMN, dest, reason=f"kernels now priced as on {dest}")
        out = set_duration(out, ids, new,
                           reason=f"to {dest}: each kernel keeps its share of the achievable roofline, copies "
                                  f"by PCIe/DRAM/link ratios, collectives by link ratio")
        if self._moves_host:
            out = _scale_host(out, self._host_time_factor(graph), self.label())
        return out

    def placement(self, placement: Placement, graph: TaskGraph, ctx: TransformContext) -> Placement:
        """The replica on the destination GPU (its memory holds the weights and the KV cache) when
        every GPU task moves; a selection that moves some keeps the recorded GPU's memory."""
        self._check()
        return placement.on(_catalog_name(self.device)) if self.select == Selector(kind="gpu") else placement

    def _host_time_factor(self, graph: TaskGraph) -> float:
        """CPU time on the destination host per CPU time on the recorded one."""
        if not self.host_from:
            return 1.0 / self.host_speed
        if graph.trace is None:
            raise TransformError("gpu: host_from needs the graph's trace (its CPU ops are matched by name and shapes)")
        try:
            return host_time_ratio(graph.trace, load_trace(str(self.host_from))).time_ratio
        except WhatifError as exc:
            raise TransformError(f"gpu: host_from: {exc}") from None


    def _fit_traces(self) -> list[tuple[Trace, Trace]]:
        """The ``fit_from`` pairs, loaded (a malformed pair or an unreadable trace: TransformError)."""
        out = []
        for pair in self.fit_from or []:
            parts = str(pair).split("=")
            if len(parts) != 2 or not all(p.strip() for p in parts):
                raise TransformError(f"gpu: fit_from item {pair!r} is not 'TRACE_ON_SOURCE=TRACE_ON_DESTINATION'")
            try:
                out.append((load_trace(parts[0].strip()), load_trace(parts[1].strip())))
            except WhatifError as exc:
                raise TransformError(f"gpu: fit_from: {exc}") from None
        return out

    def _check_capacity(self, graph: TaskGraph) -> None:
        """Refuse a destination with less memory than the recording's allocated peak."""
        try:
            dest = get_device(self.device)
        except (KeyError, ValueError):  # an unknown name: the cost model refuses it, naming the catalog
            return
        if graph.trace is None:
            return
        for peak in gpu_peaks(graph.trace.memory):
            if peak.recorded and peak.allocated_bytes > dest.mem_bytes:
                raise TransformError(
                    f"gpu: rank {peak.rank} {device_label(peak.device_type, peak.device_id)} held "
                    f"{peak.allocated_bytes / GIB:.1f} GiB allocated at its peak, more than the {dest.name}'s "
                    f"{dest.mem_bytes / GIB:.0f} GiB: the work does not fit ('whatif memory' shows what held it)")


def current_device(graph: TaskGraph, recorded: Device | None) -> Device | None:
    """The GPU the graph's kernels run on now: the destination a ``gpu`` transform wrote on most of
    them (the ``cost_device`` column), else ``recorded``. Collectives are left out: those a
    parallel transform inserts name the GPU of the preset that priced them."""
    if DEVICE_COLUMN not in graph.tasks:
        return recorded
    t = graph.tasks
    gpu = np.isin(t["kind"].to_numpy(), [int(k) for k in LOCAL_GPU_WORK_KINDS])
    moved = t.loc[gpu, DEVICE_COLUMN].dropna().astype(str)
    if not len(moved) or len(moved) * 2 < int(gpu.sum()):
        return recorded
    return find_device(str(moved.value_counts().sort_index().idxmax())) or recorded


def _catalog_name(device: str) -> str:
    """The catalog name of a GPU given as traces write it; the name itself when not in the catalog."""
    found = find_device(device)
    return found.name if found is not None else device


def _scale_host(graph: TaskGraph, factor: float, reason: str) -> TaskGraph:
    """CPU calls, CPU work and thread-order gaps x ``factor``."""
    cpu = np.flatnonzero(np.isin(graph.tasks["kind"].to_numpy(), _CPU_KINDS))
    dur = graph.tasks["dur_ns"].to_numpy()
    out = set_duration(graph, cpu, np.rint(dur[cpu] * factor).astype(np.int64),
                       reason=f"host x{factor:.3g} time: {reason}")
    thread = out.edges["kind"].to_numpy() == int(EdgeKind.THREAD)
    return scale_edge_latency(out, thread, factor, reason=f"CPU gaps (thread-order edges), host x{factor:.3g} time")
