"""``flash_attention``: attention that runs unfused — PyTorch SDPA's math backend, an explicit
QKᵀ, scale, mask, softmax and PV in eager kernels — run as one FlashAttention kernel forward and
one backward (``torch.backends.cuda.sdp_kernel`` / ``sdpa_kernel(FLASH_ATTENTION)``).

**Which attention.** Every ``aten::_scaled_dot_product_attention_math`` call of the trace, with
the ``aten::scaled_dot_product_attention`` op around it (its shapes, dtypes and ``is_causal``).
Its forward is every CPU task inside that op on its thread and the GPU work they launch (the
upcasts to fp32, the mask, both batched GEMMs, the softmax, the downcast). Its backward is the
autograd nodes those ops created: a node carries the sequence number of the forward op that made
it, and the forward op's own number is the one the next node gets, so the attention's nodes are
those numbered from the SDPA op's number up to (not including) the number of the next op after
it on the thread (and the same forward thread where the forward op records it: PyTorch 2.x
records 0 there, so a program with several forward threads is not told apart). Inference traces
(no sequence numbers, or no nodes) have a forward only.

**The rewrite** (each step logged): per call, the forward's GPU tasks fuse into one kernel and
the backward's into another (``edit.fuse``; the other members' launch calls go), the other CPU
tasks of the call are removed with the CPU gaps between them, and the one left (the fused
kernel's launch) lasts what the flash op costs the CPU. Work outside the call is untouched.

**Kernel time** (the fused kernel on the GPU it runs on)::

    T = t0 + A(F, B) / e

* ``F``, ``B``: the FLOPs and bytes of the fused kernel from the call's shapes
  (:func:`~whatif.core.kernels.fused_attention_flops_bytes`: 4·D FLOPs per head and unmasked
  (query, key) pair forward, the causal triangle when ``is_causal``; Q, K, V, O once; backward
  2.5× the FLOPs), in the inputs' 16-bit dtype.
* ``A``: the time on the device's achievable roofline
  (:func:`~whatif.hardware.roofline.achievable_time_ns`: the achievable GEMM rate at that size);
  ``t0`` the device's fixed kernel latency (:func:`~whatif.hardware.roofline.fixed_latency_ns`).
* ``e``: the share of that roofline a flash kernel reaches. Calibrated on the trace's own fused
  attention kernels where it has any (each op's kernels: ``A / (T − t0)``, the median, forward
  and backward apart, the other direction's where one is missing); else ``efficiency`` (default
  ``DEFAULT_EFFICIENCY`` = 0.35: FlashAttention-2 reaches 35 % of the H100's bf16 peak (Shah et
  al., *FlashAttention-3*, 2024, §1), and on the shared H100 traces' FA2 forward kernels 21–29 %
  of the achievable roofline at their sizes (Qwen1.5-0.5B, Falconsai ViT; ``whatif ops``). On an
  A100, where FA2 reaches 50–73 % of peak forward (Dao, *FlashAttention-2*, 2023), the default is
  pessimistic; pass ``efficiency`` or a trace with flash kernels.

**CPU time of the flash op**: ``r · n``, with ``r`` the CPU time per recorded event (ops and
runtime calls) of the unfused calls being replaced (each call's span over its event count, the
median over the calls, forward and backward apart: the host's speed at dispatching an op, measured
where it is replaced) and ``n`` the events PyTorch's flash
path records (``FLASH_FORWARD_EVENTS`` = 20: the SDPA op, ``_scaled_dot_product_flash_attention``,
``_flash_attention_forward``, transposes, output/LSE allocations, ``cudaFuncSetAttribute`` and the
launch; ``FLASH_BACKWARD_EVENTS`` = 33 for the backward node; counted in PyTorch 2.11's flash
path as `whatif record` traced it, ``sample_traces/gpu/pairs/p4_sdpa-after-r1``).

**Memory** (``whatif memory -s``): :meth:`FlashAttention.memory_edit` edits the allocator records
as FlashAttention-2 allocates (:func:`flash_memory_edit`; docs/memory.md).

Left out: the efficient (xFormers) and cuDNN backends, FlashAttention-3, attention written by hand
outside SDPA (its kernels are not one op), dropout's RNG in the flash kernel.

>>> FlashAttention(efficiency=0.5).setting()
'flash_attention(efficiency=0.5)'
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from whatif.core.dtypes import DType, op_dtype
from whatif.core.kernels import (
    FLASH_KERNEL_NAMES,
    KernelClass,
    flash_buffers,
    fused_attention_flops_bytes,
    is_attention_backward,
    op_key,
)
from whatif.depgraph.graph import GPU_WORK_KINDS, EdgeKind, TaskGraph, TaskKind, kind_codes
from whatif.depgraph.hierarchy import autograd_nodes, thread_keys
from whatif.depgraph.schema import DEVICE_COLUMN
from whatif.hardware.devices import Device, find_device
from whatif.hardware.roofline import achievable_time_ns, fixed_latency_ns
from whatif.tracer.args import Arg, int_values
from whatif.tracer.kinds import EventKind
from whatif.tracer.memory import RecordEdit, RecordEditor
from whatif.tracer.op_facts import op_facts
from whatif.tracer.trace import Trace, per_name

from ..base import Transform, TransformContext, TransformError
from ..edit import durations_ns, fuse, remove, rename, set_duration, set_edge_latency, set_state
from ..needs import Need
from ..parallel.layers import linked_op_rows
from ..registry import register
from ..select import kernel_classes

MATH_OP = "_scaled_dot_product_attention_math"
SDPA_OP = "aten::scaled_dot_product_attention"
FLASH_FORWARD_EVENTS = 20
FLASH_BACKWARD_EVENTS = 33
DEFAULT_EFFICIENCY = 0.35
FLASH_OPS = {False: "aten::_scaled_dot_product_flash_attention",
             True: "aten::_scaled_dot_product_flash_attention_backward"}
_CPU_EVENTS = (int(EventKind.CPU_OP), int(EventKind.RUNTIME), int(EventKind.DRIVER))
_CPU_TASKS = (int(TaskKind.CPU_CALL), int(TaskKind.CPU_WORK))


@dataclass(frozen=True)
class Pass:
    """One direction of one unfused attention call: its CPU tasks (program order), the GPU tasks
    they launch, its measured span on its thread and how many CPU events it recorded."""

    cpu: np.ndarray
    gpu: np.ndarray
    start_ns: int
    end_ns: int
    events: int

    @property
    def ns_per_event(self) -> float:
        return (self.end_ns - self.start_ns) / max(self.events, 1)


@dataclass(frozen=True)
class UnfusedAttention:
    """One SDPA math call: the op row (shapes), the fused kernel's work forward and backward, its
    dtype, and its passes (``backward`` None in inference)."""

    op_row: int
    forward: Pass
    backward: Pass | None
    flops: tuple[float, float]
    bytes: tuple[float, float]
    dtype: DType


@dataclass(frozen=True)
class Rewrite:
    """What one pass becomes: a flash kernel of ``kernel_ns`` named ``name``, dispatched by one
    op of ``cpu_ns``."""

    unfused: Pass
    kernel_ns: float
    cpu_ns: int
    backward: bool
    name: str


class _Threads:
    """Rows of a table (the trace's events, or its allocator records) per CPU thread, sorted by
    time (ties in row order), to find what started inside a span."""

    def __init__(self, key: np.ndarray, ts: np.ndarray, rows: np.ndarray) -> None:
        self.key = key
        order = np.lexsort((rows, ts[rows], key[rows]))
        self.rows = rows[order]
        self.keys = key[self.rows]
        self.ts = ts[self.rows]

    @classmethod
    def events(cls, trace: Trace) -> _Threads:
        """The trace's CPU events (ops, runtime and driver calls)."""
        ev = trace.events
        cpu = np.flatnonzero(np.isin(ev["kind"].to_numpy(), _CPU_EVENTS))
        return cls(_thread_keys(ev), ev["ts_ns"].to_numpy(), cpu)

    @classmethod
    def records(cls, trace: Trace) -> _Threads:
        """The trace's allocator records (``Trace.memory``)."""
        mem = trace.memory
        return cls(_thread_keys(mem), mem["ts_ns"].to_numpy(), np.arange(len(mem)))

    def within(self, key: int, start_ns: int, end_ns: int) -> np.ndarray:
        """Rows of thread ``key`` that start within [start_ns, end_ns], in order."""
        a, b = _span(self.keys, self.ts, key, start_ns, end_ns)
        return self.rows[a:b]

    def inside(self, row: int, start_ns: int, end_ns: int) -> np.ndarray:
        """Rows on ``row``'s thread that start within [start_ns, end_ns], in order."""
        return self.within(int(self.key[row]), start_ns, end_ns)

    def after(self, row: int, end_ns: int) -> np.ndarray:
        """Rows on ``row``'s thread that start after ``end_ns``, in order."""
        return self.within(int(self.key[row]), end_ns + 1, np.iinfo(np.int64).max)


def _thread_keys(table: pd.DataFrame) -> np.ndarray:
    return thread_keys(table["rank"].to_numpy(), table["pid"].to_numpy(), table["tid"].to_numpy())


def _span(keys: np.ndarray, starts: np.ndarray, key: int, start_ns: int, end_ns: int) -> tuple[int, int]:
    """The positions [a, b) of the entries of ``key`` starting within [start_ns, end_ns] in arrays
    sorted by (key, start)."""
    lo, hi = np.searchsorted(keys, key, "left"), np.searchsorted(keys, key, "right")
    return (int(lo + np.searchsorted(starts[lo:hi], start_ns, "left")),
            int(lo + np.searchsorted(starts[lo:hi], end_ns, "right")))


class _Nodes:
    """The trace's autograd nodes (``evaluate_function`` ops): rows, rank, sequence number and
    forward thread id, read once."""

    def __init__(self, trace: Trace) -> None:
        ev = trace.events
        self.rows = autograd_nodes(ev)
        self.rank = ev["rank"].to_numpy()[self.rows]
        self.number = int_values(trace.arg(Arg.SEQUENCE_NUMBER), self.rows)
        self.fwd_tid = int_values(trace.arg(Arg.FWD_THREAD_ID), self.rows)

    def of_call(self, trace: Trace, threads: _Threads, op_row: int, end_ns: int, inside: np.ndarray) -> np.ndarray:
        """Rows of the nodes the forward ops of one call created (module docstring)."""
        seq = trace.arg(Arg.SEQUENCE_NUMBER)
        first = seq[op_row]
        if first is None:
            return np.empty(0, dtype=np.int64)
        later = threads.after(op_row, end_ns)
        numbered = later[int_values(seq, later) >= 0][:1]
        stop = int(seq[numbered[0]]) if len(numbered) else int(int_values(seq, inside).max()) + 1
        hit = (self.rank == trace.events["rank"].to_numpy()[op_row]) & (self.number >= int(first)) \
            & (self.number < stop)
        fwd_tid = trace.arg(Arg.FWD_THREAD_ID)[op_row]
        if fwd_tid is not None and int(fwd_tid) > 0:   # forward ops record 0 (unset) in torch 2.x
            hit &= self.fwd_tid == int(fwd_tid)
        return self.rows[hit]


class _CpuTasks:
    """The graph's trace-backed CPU tasks per thread, sorted by measured start."""

    def __init__(self, graph: TaskGraph, trace: Trace) -> None:
        t = graph.tasks
        ids = np.flatnonzero(np.isin(t["kind"].to_numpy(), _CPU_TASKS) & (t["event"].to_numpy() >= 0))
        start = t["measured_start_ns"].to_numpy()[ids]
        key = _thread_keys(trace.events)[t["event"].to_numpy()[ids]]
        order = np.lexsort((start, key))
        self.ids, self.key, self.start = ids[order], key[order], start[order]
        self.end = t["measured_end_ns"].to_numpy()[self.ids]

    def inside(self, key: int, start_ns: int, end_ns: int) -> np.ndarray:
        """Ids of the CPU tasks of thread ``key`` that start and end within [start_ns, end_ns]."""
        a, b = _span(self.key, self.start, key, start_ns, end_ns)
        return self.ids[a:b][self.end[a:b] <= end_ns]


def _launched(graph: TaskGraph, calls: np.ndarray) -> np.ndarray:
    e = graph.edges
    hit = (e["kind"].to_numpy() == int(EdgeKind.LAUNCH)) & np.isin(e["src"].to_numpy(), calls)
    gpu = np.unique(e["dst"].to_numpy()[hit])
    return gpu[np.isin(graph.tasks["kind"].to_numpy()[gpu], kind_codes(GPU_WORK_KINDS))]


def _pass(graph: TaskGraph, cpu_tasks: _CpuTasks, threads: _Threads, rows: np.ndarray, ev: pd.DataFrame) -> Pass:
    ts, dur = ev["ts_ns"].to_numpy(), ev["dur_ns"].to_numpy()
    cpu, events = [], 0
    for r in rows:
        cpu.append(cpu_tasks.inside(int(threads.key[r]), int(ts[r]), int(ts[r] + dur[r])))
        events += len(threads.inside(int(r), int(ts[r]), int(ts[r] + dur[r])))
    ids = np.concatenate(cpu) if cpu else np.empty(0, dtype=np.int64)
    return Pass(cpu=ids, gpu=_launched(graph, ids), start_ns=int(ts[rows].min()),
                end_ns=int((ts[rows] + dur[rows]).max()), events=events)


def find_unfused(graph: TaskGraph, sixteen_bit: bool = True) -> list[UnfusedAttention]:
    """Every SDPA math call of ``graph``'s trace with its forward and backward tasks (module
    docstring); calls whose shapes do not say what a flash kernel would do, that launched no GPU
    work, or (``sixteen_bit``) whose inputs are not fp16/bf16 (no flash kernel takes them) are
    left out. Found once per graph structure (read-only)."""
    return graph.memo(f"flash_attention_unfused@{sixteen_bit}", lambda: _find_unfused(graph, sixteen_bit))


@dataclass(frozen=True)
class MathCall:
    """One SDPA math call as the trace recorded it: the SDPA op's row (shapes), the rows of the
    autograd nodes of its backward (empty in inference), the fused kernel's (FLOPs, bytes) forward
    and backward (None where the shapes do not say) and the inputs' dtype ('' when unknown)."""

    op_row: int
    nodes: np.ndarray
    work: tuple[tuple[int, int], tuple[int, int]] | None
    dtype: str

    def flash_ready(self, sixteen_bit: bool) -> bool:
        """Whether a flash kernel could run it: its work is known and (``sixteen_bit``) its inputs
        are fp16/bf16."""
        return self.work is not None and bool(self.dtype) and \
            (not sixteen_bit or self.dtype in (DType.BF16.value, DType.FP16.value))


def _math_calls(trace: Trace, threads: _Threads) -> list[MathCall]:
    ev = trace.events
    is_op = ev["kind"].to_numpy() == int(EventKind.CPU_OP)
    math_rows = np.flatnonzero(per_name(ev["name"], lambda n: op_key(n) == MATH_OP) & is_op)
    if not len(math_rows):
        return []
    autograd = _Nodes(trace)
    ts, end = ev["ts_ns"].to_numpy(), ev["ts_ns"].to_numpy() + ev["dur_ns"].to_numpy()
    is_sdpa = per_name(ev["name"], lambda n: n == SDPA_OP)
    dims, types, concrete = trace.arg(Arg.INPUT_DIMS), trace.arg(Arg.INPUT_TYPES), trace.arg(Arg.CONCRETE_INPUTS)
    out = []
    for m in math_rows.tolist():
        around = threads.inside(m, int(ts[m]) - 10**12, int(ts[m]))
        around = around[(end[around] >= end[m]) & is_sdpa[around]]
        op = int(around[0]) if len(around) else m
        inside = threads.inside(op, int(ts[op]), int(end[op]))
        out.append(MathCall(op, autograd.of_call(trace, threads, op, int(end[op]), inside),
                            fused_attention_flops_bytes(SDPA_OP, dims[op], types[op], concrete[op]),
                            op_dtype(types[op]) or ""))
    return out


def _find_unfused(graph: TaskGraph, sixteen_bit: bool) -> list[UnfusedAttention]:
    trace = graph.trace
    if trace is None:
        return []
    threads = _Threads.events(trace)
    calls = [c for c in _math_calls(trace, threads) if c.flash_ready(sixteen_bit)]
    if not calls:
        return []
    ev = trace.events
    cpu_tasks = _CpuTasks(graph, trace)
    found: list[UnfusedAttention] = []
    for c in calls:
        assert c.work is not None
        forward = _pass(graph, cpu_tasks, threads, np.array([c.op_row]), ev)
        if not len(forward.gpu):
            continue
        backward = _pass(graph, cpu_tasks, threads, c.nodes, ev) if len(c.nodes) else None
        if backward is not None and not len(backward.gpu):
            backward = None
        (ff, fb), (bf, bb) = c.work
        found.append(UnfusedAttention(c.op_row, forward, backward, (float(ff), float(bf)), (float(fb), float(bb)),
                                      DType(c.dtype)))
    return found


def flash_memory_edit(trace: Trace) -> RecordEdit:
    """What the allocator records become when each SDPA math call (16-bit inputs, known shapes) runs
    as FlashAttention (:class:`~whatif.core.kernels.FlashBuffers`):

    * forward: of the blocks allocated inside the SDPA op, the output (the last one still held
      after the call with the output's size) stays; every other one goes with its free (the S×S
      scores, the softmax the math backend saves for the backward, its fp32 copies of Q, K, V);
      the log-sum-exp is allocated where the call began and freed where the last saved block was
      (the backward's release of it), or at the call's end without one (inference). Where the
      math backend saved fp32 copies of its 16-bit inputs (a held block of Q's elements × 4
      bytes: the math backend upcasts them), nothing kept Q, K, V themselves; flash saves them,
      so their bytes are held from the call's end to that release (one block: the trace does not
      say which block holds them, nor when they would have been freed; counted from the call's
      end, it is counted twice until then);
    * backward: the blocks its autograd nodes allocate and free before the last node ends go (the
      S×S gradients); those still held after it (the gradients for Q, K, V) stay; the flash
      backward's workspace is held from its first record to its last.

    A call whose output block is not found among its records is left as recorded (counted in the
    edit's line).

    Raises
    ------
    TransformError : the trace has no SDPA math call with 16-bit inputs and known shapes.
    """
    threads = _Threads.events(trace)
    calls = [c for c in _math_calls(trace, threads) if c.flash_ready(sixteen_bit=True)]
    if not calls:
        raise TransformError("flash_attention: the trace runs no attention through SDPA's math backend "
                             "(with recorded shapes and 16-bit inputs)")
    mem = trace.memory
    editor = RecordEditor(mem)
    records = _Threads.records(trace)
    ev = trace.events
    ts, end = ev["ts_ns"].to_numpy(), ev["ts_ns"].to_numpy() + ev["dur_ns"].to_numpy()
    dims, types, concrete = trace.arg(Arg.INPUT_DIMS), trace.arg(Arg.INPUT_TYPES), trace.arg(Arg.CONCRETE_INPUTS)
    sizes, mem_ts = mem["bytes"].to_numpy(), mem["ts_ns"].to_numpy()
    device = mem["device_type"].to_numpy().astype(np.int64) * 0x10000 + mem["device_id"].to_numpy()
    edited = 0
    for c in calls:
        buffers = flash_buffers(SDPA_OP, dims[c.op_row], types[c.op_row], concrete[c.op_row])
        fwd = records.within(int(threads.key[c.op_row]), int(ts[c.op_row]), int(end[c.op_row]))
        allocs = fwd[sizes[fwd] > 0]
        frees = {int(a): editor.free_of(int(a)) for a in allocs}
        within = set(fwd.tolist())
        held = [a for a, f in frees.items() if f is None or f not in within]
        outputs = [a for a in held if buffers is not None and sizes[a] == buffers.output_bytes]
        if buffers is None or not outputs:
            continue
        out = outputs[-1]
        on = fwd[device[fwd] == device[out]]
        for a in frees:
            if a != out:
                editor.drop_block(a)
        saved = [f for a, f in frees.items() if a in held and a != out and f is not None and device[a] == device[out]]
        released = (max(saved), True) if saved else (int(on[-1]), True)
        editor.add_block(buffers.lse_bytes, (int(on[0]), False), released, FLASH_OPS[False])
        if saved and any(sizes[a] == 4 * buffers.query_elements for a in held):
            editor.add_block(buffers.inputs_bytes, (int(on[-1]), True), released, FLASH_OPS[False])
        if len(c.nodes):
            bwd = np.unique(np.concatenate([records.within(int(threads.key[n]), int(ts[n]), int(end[n]))
                                            for n in c.nodes.tolist()]))
            stop = int(end[c.nodes].max())
            for a in bwd[sizes[bwd] > 0].tolist():
                f = editor.free_of(a)
                if f is not None and mem_ts[f] <= stop:
                    editor.drop_block(a)
            mine = bwd[device[bwd] == device[out]]
            if len(mine):
                editor.add_block(buffers.backward_workspace_bytes, (int(mine[0]), False), (int(mine[-1]), True),
                                 FLASH_OPS[True])
        edited += 1
    edit = editor.edit("")
    gone = int(sizes[edit.dropped][sizes[edit.dropped] > 0].sum())
    left = f"; {len(calls) - edited:,} without their output block among their records left as recorded" \
        if edited < len(calls) else ""
    return RecordEdit(f"flash_attention: {edited:,} of {len(calls):,} SDPA math calls allocate as FlashAttention "
                      f"({gone / 2**20:,.1f} MiB of the math backend's blocks go, {edit.added_bytes / 2**20:,.1f} "
                      f"MiB of log-sum-exp, saved Q, K, V and backward workspace come){left}", edit.dropped, edit.added)


def math_attention_kernels(graph: TaskGraph) -> np.ndarray:
    """Ids of the GPU tasks of every SDPA math call, forward and backward, whatever its inputs'
    dtype (:func:`find_unfused`)."""
    ids = [p.gpu for a in find_unfused(graph, sixteen_bit=False) for p in (a.forward, a.backward) if p is not None]
    return np.unique(np.concatenate(ids)) if ids else np.empty(0, dtype=np.int64)


def calibrated_efficiency(graph: TaskGraph, device: Device) -> tuple[float | None, float | None, int, int]:
    """The share of the achievable roofline the trace's own fused attention kernels reach,
    forward and backward (module docstring): (forward, backward, ops measured each); None where
    the trace has none."""
    trace = graph.trace
    kernels = np.flatnonzero(kernel_classes(graph) == KernelClass.ATTENTION.value)
    if trace is None or not len(kernels):
        return None, None, 0, 0
    op_row = linked_op_rows(graph, kernels)
    ok = ~np.isnan(op_row)
    per_op = pd.Series(graph.tasks["dur_ns"].to_numpy()[kernels[ok]].astype(float),
                       index=op_row[ok].astype(np.int64)).groupby(level=0).agg(["sum", "size"])
    fixed = fixed_latency_ns(device)
    share: dict[bool, list[float]] = {False: [], True: []}
    facts = op_facts(trace, per_op.index.to_numpy())
    for op, (total, count) in zip(facts, per_op.to_numpy().tolist()):
        if "paged" in op.name or op_key(op.name) == op_key(SDPA_OP):
            continue
        busy = total - fixed * count
        if not op.flops > 0 or busy <= 0 or op.dtype not in (DType.BF16.value, DType.FP16.value):
            continue
        ideal = achievable_time_ns(op.flops, op.nbytes, device, op.dtype, KernelClass.ATTENTION)
        share[is_attention_backward(op.name)].append(ideal / busy)
    fwd = float(np.median(share[False])) if share[False] else None
    bwd = float(np.median(share[True])) if share[True] else None
    return fwd, bwd, len(share[False]), len(share[True])


def dispatch_ns_per_event(calls: list[UnfusedAttention]) -> dict[bool, float]:
    """The host's CPU time per recorded event of the calls being replaced, forward (False) and
    backward (True): the median over the calls (one call can hold a one-off stall, such as the
    first step's library initialization), the forward's where no call has a backward."""
    fwd = float(np.median([a.forward.ns_per_event for a in calls]))
    bwd = [a.backward.ns_per_event for a in calls if a.backward is not None]
    return {False: fwd, True: float(np.median(bwd)) if bwd else fwd}


@register
@dataclass
class FlashAttention(Transform):
    name = "flash_attention"
    description = "Run unfused attention (SDPA's math backend) as one FlashAttention kernel forward and one backward"
    requires = (Need.GPU_KERNELS, Need.KNOWN_GPU)

    efficiency: float | None = field(default=None, metadata={"minimum": 0.01, "maximum": 1.0, "help":
        "share of the achievable roofline the flash kernels reach (default: the trace's own fused "
        f"attention kernels, else {DEFAULT_EFFICIENCY})"})

    @classmethod
    def candidates(cls, graph: TaskGraph, ctx: TransformContext) -> list[Transform]:
        if not find_unfused(graph):
            raise TransformError("flash_attention: the trace runs no attention through SDPA's math backend "
                                 "(with recorded shapes and 16-bit inputs)")
        return [cls()]

    def match(self, graph: TaskGraph, ctx: TransformContext) -> np.ndarray:
        ids = [np.concatenate([p.cpu, p.gpu]) for a in find_unfused(graph)
               for p in (a.forward, a.backward) if p is not None]
        return np.unique(np.concatenate(ids)) if ids else np.empty(0, dtype=np.int64)

    def efficiencies(self, graph: TaskGraph, device: Device) -> tuple[float, float, str]:
        """(forward, backward) share of the achievable roofline, and where it comes from."""
        if self.efficiency is not None:
            return self.efficiency, self.efficiency, f"efficiency {self.efficiency:g} (given)"
        fwd, bwd, n_fwd, n_bwd = calibrated_efficiency(graph, device)
        if fwd is None and bwd is None:
            return DEFAULT_EFFICIENCY, DEFAULT_EFFICIENCY, f"efficiency {DEFAULT_EFFICIENCY:g} (default: the trace " \
                                                           f"has no fused attention kernel)"
        f, b = fwd if fwd is not None else bwd, bwd if bwd is not None else fwd
        assert f is not None and b is not None
        return f, b, f"efficiency {f:.2f} / {b:.2f} (the trace's {n_fwd} forward / {n_bwd} backward fused " \
                     f"attention ops)"

    def memory_edit(self, graph: TaskGraph) -> RecordEdit | None:
        """The allocator records as FlashAttention makes them (:func:`flash_memory_edit`)."""
        return flash_memory_edit(self.recorded_trace(graph))

    def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
        device = find_device(ctx.device)
        if device is None:
            raise TransformError(f"flash_attention: the recorded GPU ({ctx.device}) is not in the catalog")
        calls = find_unfused(graph)
        if not calls:
            raise TransformError("flash_attention: the trace runs no attention through SDPA's math backend "
                                 "(with recorded shapes and 16-bit inputs, launching GPU work)")
        e_fwd, e_bwd, source = self.efficiencies(graph, device)
        now = graph.tasks[DEVICE_COLUMN].to_numpy(dtype=object) if DEVICE_COLUMN in graph.tasks else None
        per_event = dispatch_ns_per_event(calls)
        passes: list[Rewrite] = []
        for a in calls:
            for backward, p in ((False, a.forward), (True, a.backward)):
                if p is None:
                    continue
                i = int(backward)
                moved = now[p.gpu[0]] if now is not None and pd.notna(now[p.gpu[0]]) else None
                on = find_device(str(moved)) if moved is not None else device
                assert on is not None, moved   # a gpu move is to a catalog GPU
                ideal = achievable_time_ns(a.flops[i], a.bytes[i], on, a.dtype, KernelClass.ATTENTION)
                cpu = per_event[backward] * (FLASH_BACKWARD_EVENTS if backward else FLASH_FORWARD_EVENTS)
                name = FLASH_KERNEL_NAMES[backward].format(dtype=a.dtype.value)
                passes.append(Rewrite(p, fixed_latency_ns(on) + ideal / (e_bwd if backward else e_fwd),
                                      int(round(cpu)), backward, name))
        n_bwd = sum(1 for r in passes if r.backward)
        why = (f"{len(calls):,} SDPA math calls as FlashAttention ({len(calls):,} forward, {n_bwd:,} backward "
               f"kernels; {source})")
        gpu_events = [graph.tasks["event"].to_numpy()[r.unfused.gpu] for r in passes]
        out = _cpu_to_one_op(graph, passes, why)
        return _fuse_kernels(out, passes, gpu_events, why)


def _cpu_to_one_op(graph: TaskGraph, passes: list[Rewrite], why: str) -> TaskGraph:
    """Each pass's CPU tasks become its first launch call, lasting the flash op's CPU time: the
    gaps inside the pass go, the ones before and after it keep only their part outside it."""
    e = graph.edges
    t = graph.tasks
    src, dst, kind, lat = (e[c].to_numpy() for c in ("src", "dst", "kind", "lat_ns"))
    thread = kind == int(EdgeKind.THREAD)
    member = np.zeros(len(t), dtype=bool)
    new_lat = lat.copy()
    heads, head_ns, drop = [], [], []
    start, finish = t["measured_start_ns"].to_numpy(), t["measured_end_ns"].to_numpy()
    for r in passes:
        p = r.unfused
        member[:] = False
        member[p.cpu] = True
        inner = thread & member[src] & member[dst]
        new_lat[inner] = 0
        first, last = p.cpu[np.argmin(start[p.cpu])], p.cpu[np.argmax(finish[p.cpu])]
        into = np.flatnonzero(thread & (dst == first) & ~member[src])
        new_lat[into] = np.maximum(0, lat[into] - (start[first] - p.start_ns))
        out_of = np.flatnonzero(thread & (src == last) & ~member[dst])
        new_lat[out_of] = np.maximum(0, lat[out_of] - (p.end_ns - finish[last]))
        launchers = p.cpu[t["kind"].to_numpy()[p.cpu] == int(TaskKind.CPU_CALL)]
        launching = launchers[np.isin(launchers, src[(kind == int(EdgeKind.LAUNCH)) & np.isin(dst, p.gpu)])]
        head = int(launching[np.argmin(start[launching])])
        heads.append(head)
        head_ns.append(r.cpu_ns)
        drop.append(p.cpu[(p.cpu != head) & ~np.isin(p.cpu, launching)])
    order = np.argsort(heads)
    heads_sorted, head_ns_sorted = np.asarray(heads)[order], np.asarray(head_ns, dtype=float)[order]
    changed = np.flatnonzero(new_lat != lat)
    out = set_edge_latency(graph, changed, new_lat[changed],
                           reason=f"{why}: the CPU gaps inside each call go (one op dispatches the flash kernel)")
    out = set_duration(out, heads_sorted, durations_ns(head_ns_sorted),
                       reason=f"{why}: each call's CPU time is the flash op's (this host's time per recorded event "
                              f"x the events of PyTorch's flash path)")
    out = set_state(out, heads_sorted, "op", [FLASH_OPS[passes[i].backward] for i in order],
                    reason=f"{why}: the op that dispatches the flash kernel")
    gone = np.concatenate(drop) if drop else np.empty(0, dtype=np.int64)
    return remove(out, gone, reason=f"{why}: the unfused ops' own CPU work") if len(gone) else out


def _fuse_kernels(graph: TaskGraph, passes: list[Rewrite], gpu_events: list[np.ndarray], why: str) -> TaskGraph:
    """Each pass's GPU tasks (found again by their trace rows: the CPU edit renumbered the tasks)
    become one flash kernel, a task of its own (no trace row: its work is the flash kernel's, not
    its first member's); its other members' launch calls go."""
    t = graph.tasks
    event = t["event"].to_numpy()
    gpu = np.isin(t["kind"].to_numpy(), kind_codes(GPU_WORK_KINDS)) & (event >= 0)
    by_event = pd.Series(np.flatnonzero(gpu), index=event[gpu])
    groups = [np.sort(by_event.reindex(rows).to_numpy().astype(np.int64)) for rows in gpu_events]
    order = np.argsort([g[0] for g in groups])
    groups = [groups[i] for i in order]
    heads = np.array([g[0] for g in groups], dtype=np.int64)
    durs = durations_ns(np.array([passes[i].kernel_ns for i in order]))
    backward = np.array([passes[i].backward for i in order])
    names = np.array([passes[i].name for i in order], dtype=object)
    out = set_state(graph, heads, "event", -1, reason=f"{why}: each fused kernel is a task of its own")
    out = set_state(out, heads, "op", [FLASH_OPS[b] for b in backward.tolist()],
                    reason=f"{why}: the ops that launch the flash kernels")
    single = np.array([len(g) == 1 for g in groups])
    if single.any():
        out = set_duration(out, heads[single], durs[single], reason=f"{why}: one-kernel calls")
        out = rename(out, heads[single], names[single].tolist(), reason=f"{why}: one-kernel calls")
    many = np.flatnonzero(~single)
    if not len(many):
        return out
    return fuse(out, np.concatenate([groups[i] for i in many]), durs[many], name=names[many].tolist(),
                groups=np.concatenate([np.full(len(groups[i]), k) for k, i in enumerate(many)]), drop_launches=True,
                reason=f"{why}: T = t0 + A(F, B) / e on the achievable roofline")
