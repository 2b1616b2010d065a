"""``autocast``: an fp32 program run under ``torch.autocast(dtype=bf16|fp16)`` — mixed precision
as PyTorch does it, not a program converted to bf16 (that is ``precision``).

Three changes, each from what autocast does (:mod:`whatif.core.autocast`):

1. **GEMM, convolution and attention kernels** (autocast's lower-precision list), forward and
   backward, are priced in the autocast dtype by ``precision``'s law (each keeps its share of the
   achievable roofline). Every other kernel keeps its recorded dtype: norms, softmax and losses
   run in fp32 under autocast, and an op fed by an fp32 tensor (the residual stream) stays fp32.
2. **Casts before each forward op**: a lower-precision op casts its fp32 weight and bias on every
   forward (the master weights stay fp32) and its fp32 activation unless that activation is the
   output of a lower-precision op (directly, or through one-tensor ops such as GELU: read from
   the kernel before it on its stream); an fp32-list op fed by a lower-precision output casts it
   up. Each cast is a CPU op (``aten::to`` → ``_to_copy``) and its copy kernel, inserted before
   the op's first launch and kernel.
3. **Casts in backward**: each forward cast's ``ToCopyBackward0`` casts the gradient back, one CPU
   op and copy kernel each, on the backward thread and stream; placed after the backward GEMM at
   the mirrored position of the pass (backward runs the layers in reverse).

A cast kernel lasts ``L + bytes/BW`` (``bytes`` = elements × (4 + 2): read in one dtype, written in
the other; ``BW`` the trace's own achieved bandwidth of memory-bound kernels, ``L`` the device's
fixed latency). A cast's CPU op lasts what an op launching one elementwise kernel lasts in this
trace (the median, forward and backward apart: a backward node adds the autograd engine's
overhead). Measured against an H200 fp32 → bf16 autocast pair in ``bench/gpu_pairs.py`` (p1).

**Memory** (``whatif memory -s``): :meth:`Autocast.memory_edit` edits the allocator records as
the program allocates under autocast (:mod:`.autocast_memory`: blocks in the dtype their op
outputs, the casts' copies, each held as long as autograd keeps it; docs/memory.md).

Left out: autocast's dispatch overhead on ops it does not cast; the cast cache when one weight is
used twice in a forward (tied embeddings: cast once); a product of two lower-precision outputs
(SwiGLU's ``gate·up``) is taken as fp32, so one activation cast too many per such MLP.

>>> Autocast(dtype="fp16").setting()
'autocast(dtype=fp16)'
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from whatif.core.autocast import AUTOCAST_DTYPES, LOWERED_CLASSES, autocast_casts, is_fp32_op
from whatif.core.dtypes import ELEMENT_BYTES
from whatif.core.kernels import KernelClass, float_tensors
from whatif.depgraph.graph import EdgeKind, TaskGraph, TaskKind
from whatif.depgraph.hierarchy import build_hierarchy
from whatif.depgraph.schema import DEVICE_COLUMN
from whatif.hardware.devices import find_device, sixteen_bit
from whatif.hardware.roofline import fixed_latency_ns
from whatif.tracer.args import Arg
from whatif.tracer.kinds import EventKind
from whatif.tracer.memory import RecordEdit

from ..base import Transform, TransformContext, TransformError
from ..edit import add_edges, scale, set_duration, set_state, splice_tasks
from ..needs import Need
from ..parallel.layers import backward_mask, linked_op_rows
from ..registry import register
from ..select import Selector, kernel_classes
from .autocast_memory import autocast_memory_edit
from .flash_attention import math_attention_kernels
from .precision import record_spec

_LOOK_BACK = 4   # ops walked back through to find what an activation came from


@dataclass(frozen=True)
class CastSite:
    """Casts to insert after ``anchor_kernel`` on its stream, launched by CPU ops inserted after
    ``anchor_call`` on its thread (launch latency ``launch_lat_ns``); ``bytes`` per cast."""

    anchor_kernel: int
    anchor_call: int
    launch_lat_ns: int
    bytes: tuple[float, ...]
    backward: bool


def _neighbours(graph: TaskGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per task: its predecessor on its ordered resource (-1 when first), the call that launched it
    (-1 when none) and that launch's latency (ns), from the STREAM/THREAD and LAUNCH edges."""
    e = graph.edges
    n = len(graph.tasks)
    kind = e["kind"].to_numpy()
    src, dst, lat = e["src"].to_numpy(), e["dst"].to_numpy(), e["lat_ns"].to_numpy()
    pred = np.full(n, -1, dtype=np.int64)
    order = np.isin(kind, [int(EdgeKind.STREAM), int(EdgeKind.THREAD)])
    pred[dst[order]] = src[order]
    launcher = np.full(n, -1, dtype=np.int64)
    launch_lat = np.zeros(n, dtype=np.int64)
    launch = kind == int(EdgeKind.LAUNCH)
    launcher[dst[launch]] = src[launch]
    launch_lat[dst[launch]] = lat[launch]
    return pred, launcher, launch_lat


def cast_cpu_ns(graph: TaskGraph) -> tuple[float, float]:
    """What one cast op costs the CPU, forward and backward (ns): the median duration of the
    trace's outermost ops that launch exactly one elementwise kernel and nothing else (forward:
    ``aten::add``, ``aten::gelu``…; backward: the autograd node, ``evaluate_function: GeluBackward0``).
    The backward figure is the forward one where backward has no such op. TransformError when the
    trace has no such op at all."""
    def compute() -> tuple[float, float]:
        trace = graph.trace
        assert trace is not None
        t = graph.tasks
        ev = trace.events
        kernels = np.flatnonzero(t["kind"].to_numpy() == int(TaskKind.KERNEL))
        op_row = linked_op_rows(graph, kernels)
        linked = ~np.isnan(op_row)
        kernels, op_row = kernels[linked], op_row[linked].astype(np.int64)
        hier = build_hierarchy(ev)
        pos_of = pd.Series(np.arange(len(hier.rows)), index=hier.rows)
        is_op = ev["kind"].to_numpy()[hier.rows] == int(EventKind.CPU_OP)
        top = np.arange(len(hier.rows))
        for _ in range(64):   # walk each op up to its outermost enclosing op
            parent = hier.parent[top]
            up = (parent >= 0) & is_op[np.maximum(parent, 0)]
            if not up.any():
                break
            top = np.where(up, parent, top)
        outer = hier.rows[top[pos_of.reindex(op_row).to_numpy()]]
        cls = kernel_classes(graph)[kernels]
        back = backward_mask(graph)[kernels]
        frame = pd.DataFrame({"outer": outer, "elementwise": cls == KernelClass.ELEMENTWISE.value, "back": back})
        per = frame.groupby("outer").agg(n=("elementwise", "size"), ew=("elementwise", "all"), back=("back", "all"))
        single = per[(per["n"] == 1) & per["ew"]]
        dur = ev["dur_ns"].to_numpy()[single.index.to_numpy()].astype(float)
        fwd, bwd = dur[~single["back"].to_numpy()], dur[single["back"].to_numpy()]
        if not len(fwd) and not len(bwd):
            raise TransformError("autocast: the trace has no op that launches one elementwise kernel, so what "
                                 "a cast costs its CPU is unknown")
        f = float(np.median(fwd)) if len(fwd) else float(np.median(bwd))
        return f, float(np.median(bwd)) if len(bwd) else f
    return graph.memo("autocast_cast_cpu_ns", compute)


def _fed_by_low(first: int, pred: np.ndarray, cls: np.ndarray, passes: np.ndarray) -> bool:
    """Whether the activation of the op whose first kernel is ``first`` is a lower-precision output:
    the kernel before it on its stream is a GEMM/conv/attention, possibly through ops that keep
    their input's dtype (``passes``)."""
    k = pred[first]
    for _ in range(_LOOK_BACK):
        if k < 0:
            return False
        if cls[k] in LOWERED_CLASSES:
            return True
        if not passes[k]:
            return False
        k = pred[k]
    return False


def _keeps_input_dtype(op_name: str, dims: list | None, types: list | None, kernel_class: str) -> bool:
    """An op that runs in its input's dtype under autocast: not on the fp32 list, and not an
    elementwise op of two or more tensors (``add``, ``mul``: those run in the widest, taken as the
    fp32 residual stream's)."""
    if is_fp32_op(op_name):
        return False
    return kernel_class != KernelClass.ELEMENTWISE.value or len(float_tensors(dims or [], types or [])) <= 1


def plan_casts(graph: TaskGraph, kernels: np.ndarray, lowered: np.ndarray, low_bytes: float) -> list[CastSite]:
    """The casts autocast adds around the selected ``kernels`` (``lowered``: those of them that run
    in the autocast dtype now), forward and backward, grouped by where they go."""
    trace = graph.trace
    if trace is None:
        raise TransformError("autocast: the graph has no trace to read the ops' shapes from")
    t = graph.tasks
    ev = trace.events
    cls = kernel_classes(graph)
    pred, launcher, launch_lat = _neighbours(graph)
    back = backward_mask(graph)
    gpu = np.flatnonzero(t["kind"].to_numpy() == int(TaskKind.KERNEL))
    op_of = np.full(len(t), -1, dtype=np.int64)
    found = linked_op_rows(graph, gpu)
    op_of[gpu[~np.isnan(found)]] = found[~np.isnan(found)].astype(np.int64)
    dims, types = trace.arg(Arg.INPUT_DIMS), trace.arg(Arg.INPUT_TYPES)
    names = ev["name"].astype(str).to_numpy()
    lowered_ops = np.unique(op_of[kernels[lowered]])
    if not any(dims[r] for r in lowered_ops[lowered_ops >= 0]):
        raise TransformError("autocast: the trace records no input shapes of its GEMM/conv/attention ops, so the "
                             "casts autocast adds cannot be sized; record with --record-shapes (precision prices "
                             "a model converted to the dtype, without casts)")

    passes = np.zeros(len(t), dtype=bool)
    linked = gpu[op_of[gpu] >= 0]
    pairs = pd.MultiIndex.from_arrays([op_of[linked], cls[linked]])
    codes, uniq = pairs.factorize()
    keeps = np.array([_keeps_input_dtype(names[r], dims[r], types[r], c) for r, c in uniq], dtype=bool)
    passes[linked] = keeps[codes] if len(uniq) else False

    chosen = np.zeros(len(t), dtype=bool)
    chosen[kernels] = True
    low = np.zeros(len(t), dtype=bool)
    low[kernels[lowered]] = True
    fwd = kernels[~back[kernels] & (op_of[kernels] >= 0)]
    start = t["measured_start_ns"].to_numpy()
    rank, step = t["rank"].to_numpy(), t["step"].to_numpy()
    first_of: dict[int, int] = {}
    for k in fwd[np.argsort(start[fwd], kind="stable")]:
        first_of.setdefault(int(op_of[k]), int(k))
    sites: list[CastSite] = []
    forward_sites: list[tuple[int, int, int, CastSite]] = []   # (rank, step, start, site)
    for r, k0 in first_of.items():
        lowered_op = low[k0]
        if not lowered_op and not is_fp32_op(names[r]):
            continue
        casts = autocast_casts(names[r], dims[r], types[r] or (), fed_by_low=_fed_by_low(k0, pred, cls, passes))
        if not lowered_op:
            casts = [c for c in casts if c.to_fp32]
        q, c0 = int(pred[k0]), int(launcher[k0])
        if not casts or q < 0 or c0 < 0 or pred[c0] < 0:
            continue
        site = CastSite(q, int(pred[c0]), int(launch_lat[k0]), tuple(c.bytes(low_bytes) for c in casts), False)
        sites.append(site)
        forward_sites.append((int(rank[k0]), int(step[k0]), int(start[k0]), site))
    matrix = chosen & back & np.isin(cls, list(LOWERED_CLASSES))
    sites += _backward_sites(graph, forward_sites, matrix, launcher, launch_lat)
    return sites


def _backward_sites(graph: TaskGraph, forward: Sequence[tuple[int, int, int, CastSite]], backward_gemms: np.ndarray,
                    launcher: np.ndarray, launch_lat: np.ndarray) -> list[CastSite]:
    """The ``ToCopyBackward0`` twin of each forward cast, after the backward GEMM at the mirrored
    position of its (rank, step)'s backward pass; none where the step has no backward."""
    t = graph.tasks
    start = t["measured_start_ns"].to_numpy()
    by_step: dict[tuple[int, int], list[tuple[int, CastSite]]] = defaultdict(list)
    for rank, step, s, site in forward:
        by_step[(rank, step)].append((s, site))
    bg = np.flatnonzero(backward_gemms & (launcher >= 0))
    out: list[CastSite] = []
    for (rank, step), items in sorted(by_step.items()):
        mine = bg[(t["rank"].to_numpy()[bg] == rank) & (t["step"].to_numpy()[bg] == step)]
        if not len(mine):
            continue
        mine = mine[np.argsort(start[mine], kind="stable")]
        items.sort(key=lambda x: x[0])
        n = len(items)
        for i, (_, site) in enumerate(items):
            j = min(len(mine) - 1, int((1.0 - (i + 1.0) / n) * len(mine)))
            k = int(mine[j])
            out.append(CastSite(k, int(launcher[k]), int(launch_lat[k]), site.bytes, True))
    return out


@register
@dataclass
class Autocast(Transform):
    name = "autocast"
    description = ("torch.autocast on an fp32 program: GEMM/conv/attention in bf16/fp16, plus the casts autocast "
                   "adds (weights every forward, fp32 activations, their backward)")
    requires = (Need.GPU_KERNELS, Need.KNOWN_GPU)

    dtype: str = field(default="bf16", metadata={"help": "bf16 or fp16"})
    select: Selector = field(default_factory=lambda: Selector(kind="kernel"),
                             metadata={"help": "which kernels (default: all GPU kernels)"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if str(self.dtype).lower() not in AUTOCAST_DTYPES:
            raise TransformError(f"autocast: dtype {self.dtype!r} is not an autocast dtype; choose bf16 or fp16")

    @classmethod
    def candidates(cls, graph: TaskGraph, ctx: TransformContext) -> list[Transform]:
        """Autocast to the GPU's native 16-bit dtype (fp16 on a V100), for an fp32 program: one
        whose GEMM/conv/attention kernels spend most of their time in fp32 (a bf16 program's few
        fp32 GEMMs are not what autocast is for)."""
        device = find_device(ctx.device)
        tr = cls(dtype=sixteen_bit(device).value if device is not None else "bf16")
        ids, lowered, matrix = tr._lowered(graph, ctx)
        dur = graph.tasks["dur_ns"].to_numpy()[ids]
        share = dur[lowered].sum() / max(dur[matrix].sum(), 1)
        if share <= 0.5:
            raise TransformError(f"autocast: not an fp32 program ({share:.0%} of the GEMM/conv/attention time is "
                                 f"fp32); try it with whatif predict -s")
        return [tr]

    def _lowered(self, graph: TaskGraph, ctx: TransformContext) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The selected kernels, and per kernel: whether it is a GEMM/conv/attention kernel, and
        whether it is one autocast runs in the autocast dtype (recorded in fp32 or tf32 now; not
        the GEMMs of SDPA's math backend, which upcasts 16-bit inputs to fp32 itself)."""
        ids = self.select(graph)
        if not len(ids):
            return ids, np.zeros(0, dtype=bool), np.zeros(0, dtype=bool)
        facts = ctx.require_cost(self.name).kernel_facts(graph, ids)
        matrix = np.isin(facts["kernel_class"], list(LOWERED_CLASSES))
        inside_math = np.isin(ids, math_attention_kernels(graph))
        return ids, matrix & np.isin(facts["dtype"], ["fp32", "tf32"]) & ~inside_math, matrix

    def match(self, graph: TaskGraph, ctx: TransformContext) -> np.ndarray:
        ids, lowered, _ = self._lowered(graph, ctx)
        return ids[lowered]

    def memory_edit(self, graph: TaskGraph) -> RecordEdit | None:
        """The allocator records as the program makes them under autocast
        (:func:`~.autocast_memory.autocast_memory_edit`)."""
        return autocast_memory_edit(self.recorded_trace(graph), str(self.dtype).lower())

    def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
        spec = str(self.dtype).lower()
        cost = ctx.require_cost(self.name)
        ids, lowered, _ = self._lowered(graph, ctx)
        if not len(ids):
            raise TransformError(f"autocast: {self.select.why_empty(graph)}")
        if not lowered.any():
            raise TransformError("autocast: no selected GEMM, convolution or attention kernel runs in fp32 "
                                 "(the program already runs them in lower precision)")
        sites = plan_casts(graph, ids, lowered, ELEMENT_BYTES[spec])
        mat = ids[lowered]
        try:
            factor = cost.precision_factor(graph, mat, spec)
        except TransformError as exc:
            raise TransformError(f"autocast: {str(exc).removeprefix('precision: ')}") from None
        out = scale(record_spec(graph, mat, spec), mat, factor,
                    reason=f"{spec} autocast: {len(mat):,} GEMM/conv/attention kernels in {spec} "
                           f"(each keeps its share of the achievable roofline); the rest keep their dtype")
        return self._insert_casts(out, ctx, sites, spec)

    def _insert_casts(self, graph: TaskGraph, ctx: TransformContext, sites: list[CastSite], spec: str) -> TaskGraph:
        if not sites:
            return graph
        cost = ctx.require_cost(self.name)
        recorded = find_device(ctx.device)
        fixed = fixed_latency_ns(recorded)
        bw = cost.memory_bandwidth_bytes_per_s(graph)
        fwd_cpu, bwd_cpu = cast_cpu_ns(graph)
        kernel_durs = [[int(round(fixed + b / bw * 1e9)) for b in s.bytes] for s in sites]
        cpu_durs = [[int(round(bwd_cpu if s.backward else fwd_cpu))] * len(s.bytes) for s in sites]
        n_fwd = sum(len(s.bytes) for s in sites if not s.backward)
        n_bwd = sum(len(s.bytes) for s in sites if s.backward)
        why = (f"{spec} autocast: {n_fwd:,} casts before forward ops, {n_bwd:,} in backward "
               f"(kernel: {fixed / 1e3:.1f} us + bytes at {bw / 1e9:,.0f} GB/s measured; CPU op "
               f"{fwd_cpu / 1e3:.1f} / {bwd_cpu / 1e3:.1f} us, this trace's one-kernel elementwise ops)")
        out, calls = splice_tasks(graph, anchors=[s.anchor_call for s in sites], durs=cpu_durs,
                                  name=f"aten::to (autocast {spec} cast)", deps=[[-1] * len(d) for d in cpu_durs],
                                  reason=why, kind=TaskKind.CPU_CALL)
        out, kernels = splice_tasks(out, anchors=[s.anchor_kernel for s in sites], durs=kernel_durs,
                                    name=f"autocast {spec} cast copy_kernel", deps=[[-1] * len(d) for d in kernel_durs],
                                    reason=why, kind=TaskKind.KERNEL)
        src = np.concatenate(calls) if calls else np.empty(0, np.int64)
        dst = np.concatenate(kernels) if kernels else np.empty(0, np.int64)
        lat = [s.launch_lat_ns for c, s in zip(calls, sites) for _ in c]
        out = add_edges(out, src, dst, lat, EdgeKind.LAUNCH, reason="each cast op launches its copy kernel")
        out = set_state(out, np.sort(np.concatenate([src, dst])), "op", "aten::_to_copy",
                        reason="the casts are aten::_to_copy ops")
        return self._on_current_device(out, ctx, np.sort(dst), recorded)

    @staticmethod
    def _on_current_device(graph: TaskGraph, ctx: TransformContext, kernels: np.ndarray,
                           recorded: object) -> TaskGraph:
        """Casts priced on the recorded GPU, moved to the one their op runs on now (``gpu`` before
        ``autocast`` and after it give the same casts)."""
        if DEVICE_COLUMN not in graph.tasks or recorded is None:
            return graph
        now = graph.tasks[DEVICE_COLUMN].to_numpy(dtype=object)[kernels]
        out = set_state(graph, kernels, DEVICE_COLUMN, None, reason="casts priced on the recorded GPU")
        cost = ctx.require_cost("autocast")
        for dev in pd.unique(now[pd.notna(now)]):
            sel = kernels[now == dev]
            moved = cost.move_to_device(out, sel, str(dev))
            out = set_duration(out, sel, np.rint(moved).astype(np.int64), reason=f"casts on {dev}")
            out = set_state(out, sel, DEVICE_COLUMN, dev, reason=f"now on {dev}")
        return out
