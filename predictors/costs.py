"""The cost model transforms use by default (``trace``), calibrated on the trace itself (implements
:class:`whatif.transforms.base.CostModel`; :mod:`whatif.predictors.datasheet` is the same model
without the calibrations). Everything is vectorized over tasks; per-task facts
of a graph are computed once per structure of it (``graph.memo``: graphs whose tasks were added,
removed, renamed or reclassified recompute them).

**Kernel facts.** Class from the kernel and op names (:mod:`whatif.core.kernels`). FLOPs
and bytes from the launching aten op's recorded shapes (``record_shapes``), shared among that
op's kernels in proportion to their recorded durations. Weight bytes of a GEMM/conv: the weight
operand (``linear``: arg 1, ``addmm``: arg 2, ``mm``/2-D ``matmul``: arg 1, conv: arg 1; ``bmm``
has none). Without shapes they are *estimated* from the recorded duration ``d`` minus the fixed
latency ``F`` (``estimated`` says which): memory-bound kernels move ``(d−F)·BW`` bytes at the
trace's calibrated bandwidth BW (fp32 intensity 1/4 FLOP/byte); matrix kernels do
``(d−F)·P·ASSUMED_MATRIX_EFFICIENCY`` FLOPs at the device peak P of their dtype and sit at the
ridge point (bytes = FLOPs/R), all bytes counted as weights. dtype: the op's first recognized
``Input type``; else from the kernel name (bf16/half/fp8/int8/tf32 spellings, ``h884``-style
Volta/Turing fp16 tensor-core names); else fp32 (Daydream-era traces). An fp32 op whose kernel
name says tf32 (cuDNN on Ampere) is tf32.

**Bandwidth.** The median achieved DRAM bandwidth of the trace's memory-bound kernels with
known bytes (>= ``MIN_PEERS`` kernels of >= 5 us), else the device's achievable streaming bandwidth
(``ASSUMED_BW_EFFICIENCY`` of the peak for a device without achievable figures).

**Precision** (``precision_factor``; the ``precision`` transform). A spec is a dtype (tf32, bf16,
fp16, fp8, int8 = W8A8) or ``<dtype>_weight`` (weight-only: int4/int8/fp8 weights, 16-bit
activations and math). Applying a spec to a kernel of recorded dtype ``r`` gives its new
activation dtype ``a`` and weight dtype ``w``:

* matrix classes (GEMM, conv, attention) compute in the spec's dtype; attention has no int8
  or tf32 path (it stays/goes 16-bit under int8, unchanged under tf32);
* other (vector-unit) kernels store data in the spec's dtype but never below 16 bits: vector
  units have no fp8/int8 arithmetic and W8A8/fp8 recipes keep norms, activations and residuals
  in 16-bit (tf32 changes only matrix math);
* weight-only specs set ``w`` (GEMM/conv only) and move fp32 activations to 16-bit;
* a kernel already at or below the target (16-bit for bf16/fp16, 8-bit for fp8/int8) is unchanged.

The time above the device's fixed per-kernel latency ``F`` (:func:`~whatif.hardware.roofline.fixed_latency_ns`:
launch, ramp, drain; never scales) then keeps the kernel's share of the achievable roofline, as
every plan and the GPU move do (:func:`anchored_time_ns`): ``T' = F' + (T − F')·A'/A`` with
``F' = min(T, F)`` (per launch for a task that stands for several), ``A = max(s·FLOPs/P(r),
bytes/BW_a)`` at the recorded dtype and ``A'`` the same at the new ones
(:func:`~whatif.hardware.roofline.achievable_time_ns`): ``bytes' = act·b(a)/b(r) + weights·b(w)/b(r)``,
``P`` the device's achievable GEMM rate for the dtype read at the recorded kernel's size for
matrix classes (fp32 for vector kernels: they compute in fp32 whatever they store), ``BW_a``
its achievable streaming bandwidth, ``s`` the wave term of a kernel whose rows a plan split. A
memory-bound kernel scales by the byte ratio, a compute-bound GEMM by the rate ratio (and not at
all under weight-only quantization), a decode GEMV by its byte ratio; one that crosses the ridge
by the part of each it keeps. Until 2026-11-28 the ratio was Habitat's blend ``m^γ·c^(1−γ)``
(Yu et al. ATC'21), which does not telescope: precision then a GPU move and the move then
precision differed by up to 2.2 % (``bench/parallel_order.py``).
Daydream's AMP model (Zhu et al. ATC'20) uses ×1/3 compute-bound, ×1/2 memory-bound on
V100 fp32→fp16; ``bench/whatif_precision.py`` compares the two on a V100 ResNet-50 trace.

**Another GPU** (``move_to_device``; the ``gpu`` transform). Kernels and memsets keep their
share of the achievable roofline (:func:`whatif.hardware.retarget.retarget_ns`), with residual
curves per op family fitted on ``fit_from`` pairs of traces (:func:`retarget_fit`). Memcpys:
H2D/D2H by the (achievable) PCIe ratio, D2D by the streaming-bandwidth ratio, P2P by the
peer-link ratio. Collectives: by the peer-link ratio (PCIe for a GPU without peer links). A
device without a native rate for the dtype falls back bf16→fp16→fp32, fp8/int8→fp16 (what
frameworks do).

**State carried by transformed graphs** (optional ``tasks`` columns the transforms write, read
here): ``cost_precision`` — the specs applied to the task, ``+``-joined; ``cost_device`` — the
catalog name of the GPU the task now runs on; ``cost_work`` — the task's
:class:`~whatif.core.work.WorkShare` of its recorded work (``tensor_parallel``'s shards), which
multiplies the recorded FLOPs, activation bytes and weight bytes. They survive every primitive (tasks a transform
inserts get None: recorded state).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from whatif.core.dtypes import (
    ELEMENT_BYTES,
    PRECISION_RANK,
    DType,
    dtype_in_kernel_name,
    element_bytes,
    op_dtype,
)
from whatif.core.kernels import KernelClass, duration_shares, gemm_shape, op_flops_bytes, weight_arg
from whatif.core.work import WORK_COLUMN, launch_shares, output_shares, shares_of
from whatif.depgraph.graph import GPU_WORK_KINDS, TaskGraph, TaskKind, kind_codes
from whatif.depgraph.schema import DEVICE_COLUMN, PRECISION_COLUMN
from whatif.hardware.devices import DEVICES, Device, find_device, get_device, sixteen_bit
from whatif.hardware.retarget import PairedKernels, RetargetFit, fit_retarget, moved_ns, retarget_ns
from whatif.hardware.roofline import (
    DEFAULT_FIXED_NS,
    achievable_time_ns,
    achievable_times_ns,
    fixed_latency_ns,
    wave_tail_ratio,
)
from whatif.tracer.args import Arg
from whatif.tracer.trace import Trace
from whatif.transforms.base import TransformError
from whatif.transforms.parallel.layers import backward_mask
from whatif.transforms.select import kernel_classes

from .cost_models import CostModelBase, CostModelName, register_cost_model
from .pairs import paired_ops

if TYPE_CHECKING:
    from whatif.hardware.collectives import CollectiveCalibration
    from whatif.hardware.topology import Topology

MIN_PEERS = 5
ASSUMED_BW_EFFICIENCY = 0.7      # of peak DRAM bandwidth, when the trace cannot calibrate it
ASSUMED_MATRIX_EFFICIENCY = 0.5  # of peak FLOP/s, to estimate FLOPs of a matrix kernel without shapes
DEFAULT_BW_BYTES_PER_S = 1.0e12  # when neither the trace nor the device tells
MAX_WAIT_RATIO = 4.0             # a collective kernel longer than this x the model mostly waited for peers

PRECISIONS = ("tf32", "bf16", "fp16", "fp8", "int8")
WEIGHT_ONLY = ("int4", "int8", "fp8")
MATRIX = {KernelClass.GEMM.value, KernelClass.CONV.value, KernelClass.ATTENTION.value}
WEIGHTED = {KernelClass.GEMM.value, KernelClass.CONV.value}
MEMORY_BOUND = {KernelClass.ELEMENTWISE.value, KernelClass.REDUCTION.value, KernelClass.NORMALIZATION.value,
                KernelClass.COPY.value, KernelClass.MEMSET.value}
_FACTS_KEY = "trace_cost_facts"


@dataclass(frozen=True)
class _OpFacts:
    """What one recorded aten op does: FLOPs, DRAM bytes, its weight operand's bytes, its dtype, and
    a GEMM's output tiles (:attr:`~whatif.core.kernels.GemmShape.output_tiles`; NaN for other ops)."""

    flops: float
    dram_bytes: float
    weight_bytes: float
    dtype: str
    output_tiles: float


def _lookup(values: np.ndarray, table: dict[str, Any]) -> np.ndarray:
    """``table[v]`` for every value, one dict lookup per distinct value.

    >>> _lookup(np.array(["bf16", "fp32", "bf16"], dtype=object), ELEMENT_BYTES).tolist()
    [2.0, 4.0, 2.0]
    """
    codes, uniques = pd.factorize(np.asarray(values, dtype=object))
    if not len(uniques):
        return np.empty(len(values))
    return np.asarray([table[u] for u in uniques])[codes]


def resolve_device(name: str) -> Device:
    """A catalog entry from a catalog name (``H100_SXM``) or a trace-style name (``NVIDIA H100
    80GB HBM3``); TransformError naming the catalog otherwise."""
    try:
        return get_device(name)
    except (KeyError, ValueError):
        raise TransformError(f"unknown GPU {name!r}; use a catalog name ({', '.join(DEVICES)}) "
                             f"or a name as traces write it ('NVIDIA H100 80GB HBM3'); 'whatif devices' lists "
                             f"the catalog, and --device-spec FILE adds your own (docs/device-specs.md)") from None


@dataclass(frozen=True)
class _State:
    """Per task: activation/compute dtype and weight dtype after the applied precision specs."""

    act: np.ndarray     # object: dtype names
    weight: np.ndarray  # object


@register_cost_model
class TraceCostModel(CostModelBase):
    """The cost model calibrated on the trace itself (see the module docstring); ``trace`` in
    :data:`~whatif.predictors.cost_models.COST_MODELS`."""

    key = CostModelName.TRACE

    def __init__(self, trace: Trace, device: Device | None = None) -> None:
        self.trace = trace
        gpu = trace.gpu_name
        self.device = device or find_device(gpu)
        self.gpu_name = gpu
        self._bw: float | None = None
        self._collective_calibrations: dict[tuple[str, int, int], CollectiveCalibration | None] = {}
        self._measured_collectives: list[tuple] = []
        self._op_memo: dict[tuple[str, str, str, str, tuple[int, ...] | None], _OpFacts] = {}
        self._retarget_fits: dict[tuple[str, str, tuple[tuple[str, str], ...]], RetargetFit] = {}

    # -- recorded facts, all tasks of a graph, cached ------------------------------------------
    def _base(self, graph: TaskGraph) -> dict[str, np.ndarray]:
        """Facts of every task as recorded (before any transform's precision/device change)."""
        return graph.memo(f"{_FACTS_KEY}@{self.key.value}@{id(self.trace)}", lambda: self._compute_base(graph))

    def _op_facts(self, op_name: str, dims: list | None, types: Sequence[str],
                  concrete: Sequence[str], conv_output: tuple[int, ...] | None = None) -> _OpFacts:
        """The :class:`_OpFacts` of one recorded op (``conv_output``: a convolution's output size when
        its stride is not recorded, :meth:`~whatif.tracer.trace.Trace.conv_outputs`); NaN/'' when
        unknown. Memoized by shape."""
        key = (op_name, repr(dims), repr(types), repr(concrete), conv_output)
        got = self._op_memo.get(key)
        if got is not None:
            return got
        flops = nbytes = wbytes = tiles = np.nan
        fb = op_flops_bytes(op_name, dims, types, concrete, conv_output) if dims is not None else None
        if fb is not None:
            flops, nbytes = float(fb[0]), float(fb[1])
            wbytes = 0.0
            w = weight_arg(op_name, dims)
            if w is not None and dims is not None:
                esz = element_bytes(types[w] if types and w < len(types) else None) or 4
                wbytes = float(np.prod([int(x) for x in dims[w]] or [0])) * esz
                wbytes = min(wbytes, nbytes)
            shape = gemm_shape(op_name, dims, types)
            tiles = float(shape.output_tiles) if shape is not None else np.nan
        got = _OpFacts(flops, nbytes, wbytes, op_dtype(types), tiles)
        self._op_memo[key] = got
        return got

    def _compute_base(self, graph: TaskGraph) -> dict[str, np.ndarray]:
        t = graph.tasks
        n = len(t)
        ev = self.trace.events
        cls = kernel_classes(graph)
        kinds = t["kind"].to_numpy()
        gpu = np.isin(kinds, kind_codes(GPU_WORK_KINDS))
        rows = t["event"].to_numpy().astype(np.int64)
        valid = gpu & (rows >= 0) & (rows < len(ev))
        # dtype from kernel names, once per distinct name
        codes, uniques = pd.factorize(t["name"].astype(object).to_numpy())
        name_dtype = np.asarray([(d.value if (d := dtype_in_kernel_name(str(u))) else "") for u in uniques],
                                dtype=object)
        dtype = np.where(codes >= 0, name_dtype[np.maximum(codes, 0)], "") if n else np.empty(0, dtype=object)
        dtype = dtype.astype(object)
        # recorded duration (stable across transforms) for sharing an op's work among its kernels
        rec_dur = t["dur_ns"].to_numpy().astype(float)
        rec_dur[valid] = ev["dur_ns"].to_numpy()[rows[valid]]
        flops = np.full(n, np.nan)
        nbytes = np.full(n, np.nan)
        wbytes = np.full(n, np.nan)
        tiles = np.full(n, np.nan)
        vi = np.flatnonzero(valid)
        if len(vi):
            op_row = self.trace.launching_op_rows(rows[vi])
            linked = ~np.isnan(op_row)
            li = vi[linked]
            op_rows = op_row[linked].astype(np.int64)
            uniq_rows, inv = np.unique(op_rows, return_inverse=True)
            dims, types = self.trace.arg(Arg.INPUT_DIMS), self.trace.arg(Arg.INPUT_TYPES)
            concrete = self.trace.arg(Arg.CONCRETE_INPUTS)
            op_names = ev["name"].astype(str).to_numpy()
            conv_outputs = self.trace.conv_outputs()
            per_op = [self._op_facts(op_names[r], dims[r], types[r], concrete[r], conv_outputs.get(int(r)))
                      for r in uniq_rows]
            if per_op:
                of = np.array([o.flops for o in per_op])[inv]
                ob = np.array([o.dram_bytes for o in per_op])[inv]
                ow = np.array([o.weight_bytes for o in per_op])[inv]
                odt = np.array([o.dtype for o in per_op], dtype=object)[inv]
                share = duration_shares(inv, rec_dur[li], kinds[li] == int(TaskKind.KERNEL))
                flops[li], nbytes[li], wbytes[li] = of * share, ob * share, ow * share
                # an op's memset or copy beside its kernels did none of their work: its own is estimated
                idle = li[share == 0]
                flops[idle] = nbytes[idle] = wbytes[idle] = np.nan
                # blocks are no work to share out: each GEMM kernel of the op runs all its tiles
                tiles[li] = np.array([o.output_tiles for o in per_op])[inv]
                has = odt != ""
                # an fp32 op whose kernel runs tf32 tensor cores (cuDNN/cuBLAS with allow_tf32)
                odt = np.where((odt == "fp32") & (dtype[li] == "tf32"), "tf32", odt)
                dtype[li[has]] = odt[has]
        dtype[dtype == ""] = "fp32"
        # estimates where shapes are missing
        estimated = gpu & (np.isnan(flops) | np.isnan(nbytes))
        if self._bw is None:
            self._calibrate(graph, {"kernel_class": cls, "bytes": nbytes})
        if estimated.any():
            bw = self._bw
            busy = np.maximum(rec_dur - fixed_latency_ns(self.device), 0.0)
            matrix = np.isin(cls, list(MATRIX)) & (self.device is not None)
            mem = estimated & ~matrix
            nbytes[mem] = busy[mem] * 1e-9 * bw
            flops[mem] = nbytes[mem] / 4
            wbytes[mem] = 0.0
            mat = np.flatnonzero(estimated & matrix)
            if len(mat):
                dev = self.device
                assert dev is not None
                for d in np.unique(dtype[mat]):
                    sel = mat[dtype[mat] == d]
                    flops[sel] = busy[sel] * 1e-9 * dev.peak_flops(d) * ASSUMED_MATRIX_EFFICIENCY
                    nbytes[sel] = flops[sel] / max(dev.ridge_point(d), 1.0)
                wbytes[mat] = np.where(np.isin(cls[mat], list(WEIGHTED)), nbytes[mat], 0.0)
        wbytes = np.where(np.isin(cls, list(WEIGHTED)), np.nan_to_num(wbytes), 0.0)
        tiles[cls != KernelClass.GEMM.value] = np.nan
        return {"kernel_class": cls, "flops": flops, "bytes": nbytes, "weight_bytes": wbytes, "dtype": dtype,
                "estimated": estimated, "tiles": tiles}

    # -- current facts (after the transforms' precision and device changes) ---------------------
    def _devices(self, graph: TaskGraph, tasks: np.ndarray) -> np.ndarray:
        """Per task: the catalog name of the GPU it runs on now (None when unknown)."""
        rec = self.device.name if self.device is not None else None
        out = np.full(len(tasks), rec, dtype=object)
        if DEVICE_COLUMN in graph.tasks:
            cur = graph.tasks[DEVICE_COLUMN].to_numpy()[tasks]
            set_ = pd.notna(cur)
            out[set_] = cur[set_]
        return out

    def _specs(self, graph: TaskGraph, tasks: np.ndarray) -> np.ndarray:
        if PRECISION_COLUMN not in graph.tasks:
            return np.full(len(tasks), None, dtype=object)
        return graph.tasks[PRECISION_COLUMN].to_numpy()[tasks]

    @staticmethod
    def _apply_spec(act: np.ndarray, weight: np.ndarray, cls: np.ndarray, spec: str, half: np.ndarray) -> None:
        """Apply one precision spec in place (``half``: each task's device 16-bit dtype)."""
        if not len(act):
            return

        def rank(x: np.ndarray) -> np.ndarray:
            return _lookup(x, PRECISION_RANK)
        if spec.endswith("_weight"):
            w = spec[: -len("_weight")]
            low = rank(act) < 2
            act[low] = half[low]
            weighted = np.isin(cls, list(WEIGHTED)) & (rank(weight) < PRECISION_RANK[w])
            weight[weighted] = w
            return
        matrix = np.isin(cls, list(MATRIX))
        new = np.full(len(act), spec, dtype=object)
        if spec in ("fp8", "int8"):
            vec_or_int8_attn = ~matrix | ((cls == KernelClass.ATTENTION.value) & (spec == "int8"))
            new[vec_or_int8_attn] = half[vec_or_int8_attn]
        if spec == "tf32":
            new[~np.isin(cls, list(WEIGHTED))] = "fp32"
        better = rank(new) > rank(act)
        act[better] = new[better]
        wbetter = rank(new) > rank(weight)
        weight[wbetter] = new[wbetter]

    def _state(self, graph: TaskGraph, tasks: np.ndarray, base: dict[str, np.ndarray], devices: np.ndarray,
               extra: str | None = None) -> _State:
        act = base["dtype"][tasks].copy()
        weight = act.copy()
        cls = base["kernel_class"][tasks]
        half = _lookup(np.asarray([d or "" for d in devices], dtype=object),
                       {d: sixteen_bit(dev).value for d, dev in DEVICES.items()} | {"": "bf16"}).astype(object)
        specs = self._specs(graph, tasks)
        for joined in pd.unique(specs[pd.notna(specs)]):
            sel = np.flatnonzero(specs == joined)
            for spec in str(joined).split("+"):
                a, w = act[sel], weight[sel]
                self._apply_spec(a, w, cls[sel], spec, half[sel])
                act[sel], weight[sel] = a, w
        if extra is not None:
            self._apply_spec(act, weight, cls, extra, half)
        return _State(act=act, weight=weight)

    @staticmethod
    def _work(graph: TaskGraph, base: dict[str, np.ndarray], tasks: np.ndarray,
              state: _State) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(FLOPs, DRAM bytes, weight bytes) of ``tasks`` now: the recorded work in ``state``'s
        dtypes, times each task's :class:`~whatif.core.work.WorkShare` (``cost_work``)."""
        rb = _lookup(base["dtype"][tasks], ELEMENT_BYTES)
        total, w = base["bytes"][tasks], base["weight_bytes"][tasks]
        act = (total - w) * _lookup(state.act, ELEMENT_BYTES) / rb
        wb = w * _lookup(state.weight, ELEMENT_BYTES) / rb
        flops = base["flops"][tasks].copy()
        if WORK_COLUMN in graph.tasks:
            fs, acts, ws = shares_of(graph.tasks[WORK_COLUMN].to_numpy()[tasks])
            flops, act, wb = flops * fs, act * acts, wb * ws
        return flops, act + wb, wb

    def kernel_facts(self, graph: TaskGraph, tasks: np.ndarray) -> dict[str, np.ndarray]:
        """Per task: ``kernel_class``, ``flops``, ``bytes`` and ``weight_bytes`` (DRAM bytes now),
        ``dtype`` (compute/storage dtype now), ``weight_dtype``, ``device`` (catalog name now),
        ``estimated`` (no recorded shapes: FLOPs/bytes estimated from the duration), ``waves``
        (a GEMM's output tiles now over its GPU's SMs, :attr:`~whatif.core.kernels.GemmShape.output_tiles`;
        NaN for other kernels and where shapes or the GPU are unknown), ``recorded_flops`` (FLOPs
        of the kernel as measured, before any transform: the size its achievable GEMM rate is read
        at, whatever its work is now)."""
        tasks = np.asarray(tasks, dtype=np.int64)
        base = self._base(graph)
        devices = self._devices(graph, tasks)
        state = self._state(graph, tasks, base, devices)
        flops, nbytes, wb = self._work(graph, base, tasks, state)
        return {"kernel_class": base["kernel_class"][tasks], "flops": flops, "bytes": nbytes,
                "weight_bytes": wb, "dtype": state.act, "weight_dtype": state.weight, "device": devices,
                "estimated": base["estimated"][tasks], "waves": _waves(graph, base, tasks, devices),
                "recorded_flops": base["flops"][tasks]}

    def memory_bandwidth_bytes_per_s(self, graph: TaskGraph) -> float:
        """Median achieved DRAM bandwidth (bytes/s) of the trace's memory-bound kernels of >= 5 us
        with recorded shapes, when >= ``MIN_PEERS``; else ``ASSUMED_BW_EFFICIENCY`` of the peak."""
        if self._bw is None:
            self._base(graph)   # computing the facts calibrates the bandwidth
        if self._bw is None:    # facts came from the graph's cache
            self._calibrate(graph, self._base(graph))
        assert self._bw is not None
        return self._bw

    def _calibrate(self, graph: TaskGraph, facts: dict[str, np.ndarray]) -> None:
        measured = self._measured_bandwidth_bytes_per_s(graph, facts)
        self._bw = measured if measured is not None else self._datasheet_bandwidth_bytes_per_s()

    def _datasheet_bandwidth_bytes_per_s(self) -> float:
        if self.device is not None and self.device.achievable is not None:
            return self.device.stream_bw_bytes_per_s
        if self.device is not None:
            return self.device.mem_bw_bytes_per_s * ASSUMED_BW_EFFICIENCY
        return DEFAULT_BW_BYTES_PER_S

    def _measured_bandwidth_bytes_per_s(self, graph: TaskGraph, facts: dict[str, np.ndarray]) -> float | None:
        """Median achieved bandwidth of the trace's memory-bound kernels (None when too few)."""
        ev = self.trace.events
        rows = graph.tasks["event"].to_numpy()
        ok = (rows >= 0) & np.isin(facts["kernel_class"], list(MEMORY_BOUND)) & ~np.isnan(facts["bytes"])
        if "estimated" in facts:
            ok &= ~facts["estimated"]
        ok &= graph.tasks["kind"].to_numpy() == int(TaskKind.KERNEL)
        dur = np.zeros(len(rows))
        dur[ok] = ev["dur_ns"].to_numpy()[rows[ok]]
        ok &= dur >= 5_000
        if ok.sum() >= MIN_PEERS:
            return float(np.median(facts["bytes"][ok] / (dur[ok] * 1e-9)))
        return None

    # -- what-ifs -------------------------------------------------------------------------------
    def check_precision(self, graph: TaskGraph, tasks: np.ndarray, spec: str) -> None:
        """TransformError when a task's GPU is unknown or has no native rate for ``spec``."""
        dtype, weight_only = (spec[: -len("_weight")], True) if spec.endswith("_weight") else (spec, False)
        if weight_only and dtype not in WEIGHT_ONLY:
            raise TransformError(f"precision: weight-only {dtype!r} is not supported (choose one of "
                                 f"{', '.join(w + '_weight' for w in WEIGHT_ONLY)})")
        if not weight_only and dtype not in PRECISIONS:
            hint = " (int4 is weight-only: use dtype='int4_weight')" if dtype == "int4" else ""
            raise TransformError(f"precision: unknown dtype {dtype!r}{hint}; choose one of "
                                 f"{', '.join(PRECISIONS)}, int4_weight, or weight_only=true with int8/fp8")
        for name in pd.unique(self._devices(graph, np.asarray(tasks, dtype=np.int64))):
            if name is None:
                raise TransformError(f"precision: the recorded GPU ({self.gpu_name or 'not named in the trace'}) "
                                     f"is not in the device catalog, so its tensor-core rates are unknown; "
                                     f"apply gpu(device=...) first or add it to whatif.hardware.devices")
            dev = get_device(name)
            need = sixteen_bit(dev) if weight_only else DType(dtype)
            if not dev.peak.get(need):
                alt = {DType.BF16: " (use dtype='fp16')", DType.FP8: " (use int8, or fp8_weight / int4_weight)",
                       DType.TF32: ""}.get(need, "")
                raise TransformError(f"precision: {dev.name} has no native {need.value} rate{alt}; "
                                     f"its native dtypes: {', '.join(d.value for d in dev.peak)}")

    def precision_factor(self, graph: TaskGraph, tasks: np.ndarray, to_dtype: str) -> np.ndarray:
        """Per task: time multiplier when the spec ``to_dtype`` (``bf16``, ``fp8``,
        ``int4_weight``… see the module docstring) is applied on top of the task's current state:
        the achievable-roofline time at the new dtypes and bytes over the time at the old ones, on the
        task's GPU, GEMM rates read at the recorded kernel's size (the law of every plan and of the
        move, so precision and a GPU move commute)."""
        tasks = np.asarray(tasks, dtype=np.int64)
        if to_dtype == "int4":
            to_dtype = "int4_weight"
        self.check_precision(graph, tasks, to_dtype)
        base = self._base(graph)
        devices = self._devices(graph, tasks)
        old = self._state(graph, tasks, base, devices)
        new = self._state(graph, tasks, base, devices, extra=to_dtype)
        flops, b_old, _ = self._work(graph, base, tasks, old)
        _, b_new, _ = self._work(graph, base, tasks, new)
        flops, b_old, b_new = np.nan_to_num(flops), np.nan_to_num(b_old), np.nan_to_num(b_new)
        size = np.nan_to_num(base["flops"][tasks])
        cls = base["kernel_class"][tasks]
        rows, launches = launch_shares(graph.tasks, tasks)
        stretch = _row_tail(np.where(backward_mask(graph)[tasks], np.nan, _waves(graph, base, tasks, devices)), rows)
        ratio = np.ones(len(tasks))
        fixed_ns = np.full(len(tasks), DEFAULT_FIXED_NS)
        changed = (new.act != old.act) | (new.weight != old.weight)
        on = pd.Series(devices, dtype=object).astype(str)
        for d, idx in on.groupby(on).indices.items():
            dev = get_device(d)
            fixed_ns[idx] = fixed_latency_ns(dev)
            i = idx[changed[idx]]
            before = achievable_times_ns(dev, cls[i], old.act[i], flops[i], b_old[i], size[i], stretch[i])
            after = achievable_times_ns(dev, cls[i], new.act[i], flops[i], b_new[i], size[i], stretch[i])
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio[i] = np.where(before > 0, after / before, 1.0)
        ratio = np.where(np.isfinite(ratio), ratio, 1.0)
        dur = graph.tasks["dur_ns"].to_numpy()[tasks].astype(float)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(dur > 0, moved_ns(dur, ratio, fixed_ns, fixed_ns, launches) / dur, 1.0)

    def move_to_device(self, graph: TaskGraph, tasks: np.ndarray, device: str,
                       fit_from: Sequence[tuple[Trace, Trace]] = ()) -> np.ndarray:
        """Per task: its duration (ns) on GPU ``device`` instead of the one it runs on now.

        Kernels and memsets keep their efficiency (:func:`whatif.hardware.retarget.retarget_ns`),
        with residual curves fitted on ``fit_from``: pairs of traces of one program, recorded on
        this trace's GPU and on ``device`` (:func:`whatif.predictors.pairs.paired_ops`)."""
        tasks = np.asarray(tasks, dtype=np.int64)
        dst = resolve_device(device)
        facts = self.kernel_facts(graph, tasks)
        if len(tasks) and any(d is None for d in facts["device"]):
            raise TransformError(f"gpu: the recorded GPU ({self.gpu_name or 'not named in the trace'}) is not in "
                                 f"the device catalog ('whatif devices' lists it), so there is nothing to scale from")
        t = graph.tasks
        dur = t["dur_ns"].to_numpy()[tasks].astype(float)
        kinds = t["kind"].to_numpy()[tasks]
        names = t["name"].astype(str).to_numpy()[tasks]
        ops = t["op"].astype(object).to_numpy()[tasks] if "op" in t else np.full(len(tasks), None, dtype=object)
        out = dur.copy()
        waves = np.where(backward_mask(graph)[tasks], np.nan, facts["waves"])
        rows, launches = launch_shares(t, tasks)
        keys = pd.DataFrame({"d": facts["device"], "k": kinds, "c": facts["kernel_class"]}).astype({"d": str, "c": str})
        for (d, k, c), idx in keys.groupby(["d", "k", "c"]).indices.items():
            src = get_device(d)
            if src.name == dst.name:
                continue
            if k == int(TaskKind.MEMCPY) or k == int(TaskKind.COMM) or c == KernelClass.COLLECTIVE.value:
                ratio = _copy_ratio(names[idx], src, dst) if k == int(TaskKind.MEMCPY) \
                    else src.peer_copy_bw_bytes_per_s / dst.peer_copy_bw_bytes_per_s
                out[idx] = moved_ns(dur[idx], ratio, fixed_latency_ns(src), fixed_latency_ns(dst))
            else:
                fit = self.retarget_fit(src, dst, fit_from) if fit_from else None
                family = np.where(pd.notna(ops[idx]), ops[idx], facts["kernel_class"][idx])
                out[idx] = retarget_ns(dur[idx], facts["kernel_class"][idx], facts["dtype"][idx],
                                       facts["flops"][idx], facts["bytes"][idx], src, dst, fit, family,
                                       size_flops=facts["recorded_flops"][idx],
                                       compute_scale=(_row_tail(waves[idx], rows[idx]),
                                                      _row_tail(waves[idx] * src.sm_count / dst.sm_count,
                                                                rows[idx])),
                                       launches=launches[idx])
        return out

    def retarget_fit(self, src: Device, dst: Device, fit_from: Sequence[tuple[Trace, Trace]]) -> RetargetFit:
        """The residual curves of moving ``src`` kernels to ``dst``, fitted on the op calls the
        pairs of traces share (memoized per pair of GPUs and traces).

        Raises
        ------
        TransformError
            When a pair was not recorded on ``src`` and ``dst`` or shares no op.
        """
        key = (src.name, dst.name, tuple((a.source, b.source) for a, b in fit_from))
        got = self._retarget_fits.get(key)
        if got is not None:
            return got
        pairs: PairedKernels | None = None
        for a, b in fit_from:
            for trace, want in ((a, src), (b, dst)):
                found = find_device(trace.gpu_name)
                if found is None or found.name != want.name:
                    raise TransformError(f"gpu: {trace.source} was recorded on "
                                         f"{found.name if found else 'an unknown GPU'}, not {want.name}: a fit "
                                         f"pair is (a trace on {src.name}, the same program on {dst.name})")
            try:
                got_pairs = paired_ops(a, b)
            except ValueError as exc:
                raise TransformError(f"gpu: {exc}") from None
            pairs = got_pairs if pairs is None else pairs.concat(got_pairs)
        assert pairs is not None
        try:
            fit = fit_retarget(pairs, src, dst)
        except ValueError as exc:
            raise TransformError(f"gpu: {exc}") from None
        self._retarget_fits[key] = fit
        return fit

    # -- multi-GPU (whatif.transforms.parallel, docs/multi-gpu.md) -------------------------------
    def collective_time_ns(self, kind: str, message_bytes: float, ranks: int, topology_name: str,
                           ranks_per_machine: int | None = None) -> float:
        """ns of one collective over ``ranks`` GPUs of the preset ``topology_name``, packed onto as
        many machines as needed (:func:`whatif.hardware.collectives.collective_time_ns`). When the
        trace's GPU is of the preset's family, calibrated on the trace's collective kernels of that
        kind (fastest occurrence per size: the one that waited least for its peers); a kernel more
        than ``MAX_WAIT_RATIO`` times the uncalibrated model's time is taken as dominated by waiting
        for peers and not used (bench/collectives_traces.py: single-rank kernels of 2.4 ms for a
        40 us all-reduce)."""
        from whatif.hardware.collectives import collective_time_ns
        from whatif.hardware.topology import TopologyName, preset
        try:
            base = preset(topology_name)
        except ValueError:
            raise TransformError(f"unknown topology {topology_name!r} (presets: "
                                 f"{', '.join(t.value for t in TopologyName)})") from None
        per = min(ranks_per_machine or ranks, base.gpus_per_machine)
        topo = base.with_machines(max(1, -(-ranks // per)))
        key = (base.name, topo.machines, per)  # the fit depends on the topology it was made on
        if key not in self._collective_calibrations:
            try:
                self._collective_calibrations[key] = self._collective_calibration(base, topo)
            except ValueError as exc:  # the trace's collectives do not fit on this topology
                raise TransformError(f"collectives on {topology_name}: {exc}") from None
        return float(collective_time_ns(kind, message_bytes, ranks, topo, ranks_per_machine=per,
                                        calibration=self._collective_calibrations[key]))

    def measure_collectives(self, points: Iterable[tuple]) -> None:
        """Calibrate collectives on measured ``(kind, message_bytes, ranks, dur_ns[,
        ranks_per_machine])`` points as well, e.g. an nccl-tests run of the cluster
        (:func:`whatif.tracer.measured_collectives.read_nccl_tests`, ``.points()``): they describe
        the machine the job runs on, so they fit whatever preset prices it, unfiltered (an
        nccl-tests time is a transfer, not a wait for peers)."""
        self._measured_collectives.extend(points)
        self._collective_calibrations.clear()

    def _collective_calibration(self, base: Topology, topo: Topology) -> CollectiveCalibration | None:
        """The fit of the trace's collective kernels when its GPU is of the preset ``base``'s family,
        with the measured points of :meth:`measure_collectives`."""
        from whatif.hardware.collectives import calibrate, collective_time_ns
        from whatif.tracer.measured_collectives import (
            collective_points,
            fastest_per_size,
        )
        same = self.device is not None and base.device is not None \
            and self.device.name.split("_")[0] == base.device.split("_")[0]
        pts = fastest_per_size(collective_points(self.trace)) if same else []
        pts = [p for p in pts if p[3] <= MAX_WAIT_RATIO * collective_time_ns(
            p[0], p[1], p[2], base.with_machines(max(1, -(-p[2] // base.gpus_per_machine))))]
        pts += self._measured_collectives
        if not pts:
            return None
        # a measured point may span more machines than this call: the fit does not depend on it
        machines = max(-(-int(p[2]) // int(p[4] if len(p) > 4 and p[4] else base.gpus_per_machine))
                       for p in pts)
        return calibrate(pts, topo.with_machines(max(topo.machines, machines)), residual=False)

    def kernel_time_ns(self, graph: TaskGraph, tasks: np.ndarray, flops: np.ndarray,
                       nbytes: np.ndarray, max_slowdown: float | None = None,
                       rows: float | np.ndarray | None = None) -> np.ndarray:
        """Per task: its time at new work, :func:`anchored_time_ns` on the GPU it runs on now.
        ``rows``: the new work is the kernel's rows (tokens, batch) times ``rows`` — a micro- or
        nano-batch (1/n) or a larger batch (k) — so a forward GEMM's waves move with them
        (:func:`~whatif.hardware.roofline.wave_tail_ratio`); a backward GEMM's are left (a weight
        gradient's tokens are its reduction dimension: its output tiles do not move). None prices by
        FLOPs and bytes alone."""
        tasks = np.asarray(tasks, dtype=np.int64)
        facts = self.kernel_facts(graph, tasks)
        waves = new_waves = None
        if rows is not None:
            forward = ~backward_mask(graph)[tasks]
            waves = np.where(forward, facts["waves"], np.nan)
            new_waves = waves * np.broadcast_to(np.asarray(rows, dtype=float), waves.shape)
        dur = graph.tasks["dur_ns"].to_numpy()[tasks].astype(float)
        out = dur.copy()
        keys = pd.DataFrame({"d": facts["device"], "t": facts["dtype"]}).astype(str)
        for (d, dt), idx in keys.groupby(["d", "t"]).indices.items():
            dev = get_device(d) if d != "None" else None
            out[idx] = anchored_time_ns(dev, dur[idx], facts["kernel_class"][idx], facts["flops"][idx],
                                        facts["bytes"][idx], np.asarray(flops, dtype=float)[idx],
                                        np.asarray(nbytes, dtype=float)[idx], dt, max_slowdown=max_slowdown,
                                        waves=None if waves is None else waves[idx],
                                        new_waves=None if new_waves is None else new_waves[idx],
                                        size_flops=facts["recorded_flops"][idx])
        return out


def anchored_time_ns(device: Device | None, dur_ns: np.ndarray, classes: np.ndarray, flops: np.ndarray,
                     nbytes: np.ndarray, new_flops: np.ndarray, new_bytes: np.ndarray, dtype: str = "bf16",
                     fixed_ns: float | None = None, calibration: Any = None,
                     max_slowdown: float | None = None, waves: np.ndarray | None = None,
                     new_waves: np.ndarray | None = None, size_flops: np.ndarray | None = None) -> np.ndarray:
    """Measured ``dur_ns`` moved to new work (FLOPs, DRAM bytes):
    ``T' = F' + (T − F')·A(f', b')/A(f, b)``, ``F' = min(T, F)``: the time above the device's fixed
    latency F (:func:`~whatif.hardware.roofline.fixed_latency_ns`; ``fixed_ns`` overrides it)
    scales like the achievable roofline time A (:func:`~whatif.hardware.roofline.achievable_time_ns`,
    the kernel keeps its efficiency; Williams et al. 2009), its GEMM rate read at the measured
    kernel's size for both (a shard runs at the efficiency its whole did: reading it at the shard's
    size took the Vidur TP bench from 4.9 % to 6.9 % median). ``size_flops``: that size when the
    kernel was measured at other work than ``flops`` (the recorded kernel's FLOPs, so that two
    changes in a row price as the two at once). ``calibration`` (a
    :class:`~whatif.hardware.roofline.CalibratedRoofline`) prices the ratio on its curves instead;
    without a device, the FLOP ratio for matrix classes and the byte ratio otherwise. Used by
    ``tensor_parallel`` and the other parallel transforms; ``bench/parallel_tp.py`` measures it
    (and the calibrated variant) on Vidur's TP profiles.

    ``max_slowdown`` S: only ``W = min(T − F', S·A(f, b))`` of the time is work, the rest latency
    that no change of the work moves: ``T' = T + W·(A(f', b')/A(f, b) − 1)``. A kernel of a few
    microseconds that moves kilobytes is hundreds of times its roofline time; without S, four times
    its bytes would price it four times longer (``batch``, measured in ``bench/batch_scaling.py``).

    ``waves``/``new_waves`` (a GEMM's thread blocks over SMs before and after; NaN where unknown):
    the compute term of the new time is stretched by
    :func:`~whatif.hardware.roofline.wave_tail_ratio` — each half of a GEMM of a few waves pays a
    partly empty last wave (wave quantization; TokenWeave's reason for wave-aware token splits).
    On the device's roofline only: the ``calibration`` ratio has no wave term. ``bench/wave_split.py``
    measures it on Vidur's operators split and grown by rows.

    >>> from whatif.hardware.devices import get_device
    >>> h100 = get_device("H100_SXM")
    >>> t = anchored_time_ns(h100, np.array([3200.0]), np.array(["elementwise"]), np.array([0.0]),
    ...                      np.array([45056.0]), np.array([0.0]), np.array([4 * 45056.0]))
    >>> t_capped = anchored_time_ns(h100, np.array([3200.0]), np.array(["elementwise"]), np.array([0.0]),
    ...                             np.array([45056.0]), np.array([0.0]), np.array([4 * 45056.0]), max_slowdown=4)
    >>> bool(t[0] > 2 * 3200), bool(t_capped[0] < 1.1 * 3200)
    (True, True)
    """
    classes = np.asarray(classes, dtype=object)
    with np.errstate(divide="ignore", invalid="ignore"):
        if calibration is not None:
            old = np.array([calibration.kernel_time_ns(c, f, b) for c, f, b in zip(classes, flops, nbytes)])
            new = np.array([calibration.kernel_time_ns(c, f, b) for c, f, b in zip(classes, new_flops, new_bytes)])
            ratio = new / old
        elif device is not None:
            anchor = np.asarray(flops if size_flops is None else size_flops, dtype=float)
            old = np.array([achievable_time_ns(f, b, device, dtype, c, size_flops=f0)
                            for c, f, b, f0 in zip(classes, flops, nbytes, anchor)])
            tail = np.ones(len(classes)) if waves is None or new_waves is None else wave_tail_ratio(waves, new_waves)
            new = np.array([achievable_time_ns(f, b, device, dtype, c, size_flops=f0, compute_scale=s)
                            for c, f, b, f0, s in zip(classes, new_flops, new_bytes, anchor, tail)])
            ratio = new / old
        else:
            ratio = np.where(np.isin(classes, list(MATRIX)), new_flops / flops, new_bytes / nbytes)
    ratio = np.where(np.isfinite(ratio) & (ratio >= 0), ratio, 1.0)
    dur = np.asarray(dur_ns, dtype=float)
    latency = fixed_latency_ns(device) if fixed_ns is None else fixed_ns
    fixed = np.minimum(dur, latency) if calibration is None else np.zeros_like(dur)
    if max_slowdown is None or device is None or calibration is not None:
        return fixed + (dur - fixed) * ratio
    work = np.minimum(dur - fixed, max_slowdown * old)
    return dur + work * (ratio - 1)


def _waves(graph: TaskGraph, base: dict[str, np.ndarray], tasks: np.ndarray, devices: np.ndarray) -> np.ndarray:
    """Per task: a GEMM's output tiles now over its GPU's SMs (NaN for other kernels and where the
    shapes or the GPU are unknown)."""
    sms = np.array([DEVICES[d].sm_count if d in DEVICES else np.nan for d in devices], dtype=float)
    return base["tiles"][tasks] * output_shares(graph.tasks, tasks) / sms


def _row_tail(waves: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per kernel: the wave term a transform that scaled its rows by ``rows`` priced, at its
    ``waves`` now on some GPU (1 where the rows were not changed or the waves are unknown)."""
    return np.where(rows != 1, wave_tail_ratio(waves / rows, waves), 1.0)


def _copy_ratio(names: Sequence[str], src: Device, dst: Device) -> np.ndarray:
    """T'/T of memcpys by direction: host copies by PCIe, device copies by DRAM, peer copies by link."""
    out = np.empty(len(names))
    for i, n in enumerate(names):
        low = n.lower()
        if "dtod" in low or "d2d" in low:
            out[i] = src.stream_bw_bytes_per_s / dst.stream_bw_bytes_per_s
        elif "ptop" in low or "p2p" in low or "peer" in low:
            out[i] = src.peer_copy_bw_bytes_per_s / dst.peer_copy_bw_bytes_per_s
        else:
            out[i] = src.host_copy_bw_bytes_per_s / dst.host_copy_bw_bytes_per_s
    return out
