"""Transformer blocks in a kernel sequence: which GEMM is QKV, attention output, MLP up/down.

The heuristic (per rank and step, kernels in measured start order; documented in docs/multi-gpu.md):

1. **Attention cores**: kernels of class ``attention`` (FlashAttention, SDPA, paged attention…),
   or an unfused ``bmm → softmax → bmm`` (a batched GEMM within 3 kernels of a softmax on either
   side). Consecutive attention kernels with no other GEMM between them form one core.
2. **Norms**: kernels of class ``normalization`` other than softmax, or any kernel whose module
   (``layer`` column, from ``nn.Module`` frames when recorded with stack) is named ``*norm*``;
   a run of them is one norm. With fewer normalization kernels than attention cores (eager
   RMSNorm: pow, mean, rsqrt, mul), reduction kernels count as norms too.
3. Block ``i`` (core ``A_i``): its **attention output** GEMM (row-parallel) is the first GEMM
   after ``A_i``; its **QKV** GEMMs (column-parallel) are the GEMMs after the last norm that
   precedes a GEMM before ``A_i`` (a QK-norm after the projection does not count) and after the
   previous block's output GEMM; without a norm there, as many GEMMs as the previous block had
   QKV GEMMs (1 for the first); its **MLP** GEMMs are those
   between the first and second norm after the output GEMM (pre-norm: post-attention norm → next
   block's or the final norm; post-norm: add+LN → add+LN), the last of them the **MLP down**
   (row-parallel), the others **up/gate** (column-parallel). Without two norms there: the GEMMs
   before the next block's QKV, capped at the previous block's MLP GEMM count.
4. Elementwise kernels between the first QKV GEMM and the output GEMM (RoPE, reshapes) and
   between the first MLP GEMM and MLP down (the activation) work on sharded activations; the rest
   of the block — from the output GEMM to the first MLP GEMM, and from MLP down to the next
   block's QKV when no GEMM lies between — (norms, residual adds) on the full hidden size.

Anything outside blocks (embedding, LM head, sampling, DiT's timestep MLP) is left replicated.
"""
from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pandas as pd

from whatif.core.dtypes import element_bytes
from whatif.core.kernels import KernelClass
from whatif.core.work import output_shares
from whatif.depgraph.graph import TaskGraph, TaskKind
from whatif.tracer.args import Arg

from ..edit import set_state
from ..select import kernel_classes
from .sharding import Role

_BMM_OPS = re.compile(r"(^|::)(bmm|baddbmm|matmul|einsum)$")
_NORM_LAYER = re.compile(r"norm", re.IGNORECASE)

COLUMNS = ("task", "rank", "block", "part", "role")


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """(first, last) index of every run of True."""
    idx = np.flatnonzero(mask)
    if not len(idx):
        return []
    breaks = np.flatnonzero(np.diff(idx) > 1)
    starts = np.r_[idx[0], idx[breaks + 1]]
    ends = np.r_[idx[breaks], idx[-1]]
    return list(zip(starts.tolist(), ends.tolist()))


def _rank_blocks(cls: np.ndarray, names: np.ndarray, ops: np.ndarray, layers: np.ndarray) -> list[dict]:
    """Blocks of one rank's kernel sequence (indices into it)."""
    n = len(cls)
    gemm = cls == KernelClass.GEMM.value
    low = np.asarray([str(x).lower() for x in names], dtype=object)
    oplow = np.asarray([str(x).lower() if isinstance(x, str) else "" for x in ops], dtype=object)
    softmax = np.asarray(["softmax" in a or "softmax" in b for a, b in zip(low, oplow)], dtype=bool)
    attn = cls == KernelClass.ATTENTION.value
    bmm = gemm & np.asarray([bool(_BMM_OPS.search(o)) for o in oplow], dtype=bool)
    for s in np.flatnonzero(softmax).tolist():
        lo = [j for j in range(max(0, s - 3), s) if bmm[j]]
        hi = [j for j in range(s + 1, min(n, s + 4)) if bmm[j]]
        if lo and hi:
            attn[lo[-1]:hi[0] + 1] = True
    layer_norm = np.asarray([isinstance(x, str) and bool(_NORM_LAYER.search(x)) for x in layers], dtype=bool)
    norm = (cls == KernelClass.NORMALIZATION.value) & ~softmax
    if len(_runs(norm)) < len(_runs(attn)):   # eager RMSNorm (pow, mean, rsqrt, mul): the mean marks it
        norm |= cls == KernelClass.REDUCTION.value
    norm |= layer_norm & ~gemm & ~attn
    norm_starts = np.asarray([a for a, _ in _runs(norm)], dtype=np.int64)
    gemm_idx = np.flatnonzero(gemm & ~attn)
    # attention cores: attention kernels merged unless a non-attention GEMM separates them
    cores: list[tuple[int, int]] = []
    for a, b in _runs(attn):
        if cores and not ((gemm_idx > cores[-1][1]) & (gemm_idx < a)).any():
            cores[-1] = (cores[-1][0], b)
        else:
            cores.append((a, b))
    blocks: list[dict] = []
    prev_out, q_prev, m_prev = -1, 1, None
    for i, (s, e) in enumerate(cores):
        nxt = cores[i + 1][0] if i + 1 < len(cores) else n
        after = gemm_idx[(gemm_idx > e) & (gemm_idx < nxt)]
        if not len(after):
            continue
        out = int(after[0])
        win = gemm_idx[(gemm_idx > prev_out) & (gemm_idx < s)]
        norms_before = norm_starts[(norm_starts > prev_out) & (norm_starts < (win[-1] if len(win) else s))]
        qkv = win[win > norms_before[-1]] if len(norms_before) else win[-q_prev:]
        norms_after = norm_starts[(norm_starts > out) & (norm_starts < nxt)]
        rest = after[1:]
        if len(norms_after) >= 2:
            mlp = rest[(rest > norms_after[0]) & (rest < norms_after[1])]
        else:
            mlp = rest[rest > norms_after[0]] if len(norms_after) else rest
            if m_prev is not None:
                mlp = mlp[:m_prev]
            elif i + 1 < len(cores):
                mlp = mlp[:-1] if len(mlp) > 1 else mlp   # leave the next block's QKV
        blocks.append({"core": (s, e), "qkv": qkv.tolist(), "out": out, "mlp": mlp.tolist()})
        prev_out = int(mlp[-1]) if len(mlp) else out
        q_prev, m_prev = max(1, len(qkv)), (len(mlp) or m_prev)
    return blocks


def find_blocks(graph: TaskGraph) -> pd.DataFrame:
    """One row per kernel that belongs to a detected block: ``task``, ``rank``, ``block`` (0-based
    per rank, in time order), ``part`` (``qkv``, ``attention``, ``attn_out``, ``mlp_in``,
    ``mlp_down``, ``attn_elementwise``, ``mlp_elementwise``, ``block_other``) and its
    tensor-parallel ``role`` (:class:`~whatif.transforms.parallel.sharding.Role` value).

    Blocks are found in each step's forward kernels separately (kernels outside steps form one
    more sequence; the backward is mapped by :func:`backward_blocks`), so no block reaches into
    the next step: the kernels of step k+1 before its first block (embedding, norm) are never the
    residual tail of step k's last block."""
    t = graph.tasks
    kinds = t["kind"].to_numpy()
    start = t["measured_start_ns"].to_numpy()
    steps = t["step"].to_numpy()
    ranks = t["rank"].to_numpy()
    cls_all = kernel_classes(graph)
    names, ops, layers = (t[c].astype(object).to_numpy() for c in ("name", "op", "layer"))
    rows: list[tuple[int, int, int, str, str]] = []
    forward = ~backward_mask(graph)
    for rank in np.unique(ranks).tolist():
        mine = (kinds == int(TaskKind.KERNEL)) & (ranks == rank) & (start >= 0) & forward
        first_block = 0
        for step in np.unique(steps[mine]).tolist():
            k = np.flatnonzero(mine & (steps == step))
            k = k[np.argsort(start[k], kind="stable")]
            first_block += sequence_rows(rows, k, int(rank), first_block, cls_all, names, ops, layers)
    return pd.DataFrame(rows, columns=list(COLUMNS)).sort_values("task", ignore_index=True)


def sequence_rows(rows: list[tuple[int, int, int, str, str]], k: np.ndarray, rank: int, first_block: int,
                   cls_all: np.ndarray, names: np.ndarray, ops: np.ndarray, layers: np.ndarray) -> int:
    """Append the block rows of one kernel sequence ``k`` (task ids in start order; or any items
    the class, name, op and layer arrays are indexed by, such as CPU ops) to ``rows``, numbering its
    blocks from ``first_block``; returns how many blocks it had."""
    blocks = _rank_blocks(cls_all[k], names[k], ops[k], layers[k])
    gemm = (cls_all[k] == KernelClass.GEMM.value)
    for b, blk in enumerate(blocks):
        nxt_qkv = blocks[b + 1]["qkv"][0] if b + 1 < len(blocks) and blocks[b + 1]["qkv"] else -1
        s, e = blk["core"]
        part = {}
        first_qkv = blk["qkv"][0] if blk["qkv"] else s
        for j in range(first_qkv, blk["out"]):
            part[j] = "attn_elementwise"
        for j in range(s, e + 1):
            part[j] = "attention"
        for j in blk["qkv"]:
            part[j] = "qkv"
        part[blk["out"]] = "attn_out"
        if blk["mlp"]:
            for j in range(blk["out"] + 1, blk["mlp"][0]):
                part[j] = "block_other"
            for j in range(blk["mlp"][0], blk["mlp"][-1]):
                part[j] = "mlp_elementwise"
            for j in blk["mlp"][:-1]:
                part[j] = "mlp_in"
            part[blk["mlp"][-1]] = "mlp_down"
            if nxt_qkv > 0 and not gemm[blk["mlp"][-1] + 1:nxt_qkv].any():
                for j in range(blk["mlp"][-1] + 1, nxt_qkv):
                    part[j] = "block_other"      # residual add and the next block's norm
        for j, p in part.items():
            if p.endswith("elementwise") and gemm[j]:
                p = "block_other"     # an extra GEMM inside a region (e.g. DiT adaLN): replicated
            rows.append((int(k[j]), rank, first_block + b, p, ROLE_OF_PART[p].value))
    return len(blocks)


BACKWARD_COLUMN = "phase_backward"   # set by keep_backward_mask; read by backward_mask


def backward_mask(graph: TaskGraph) -> np.ndarray:
    """Per task: a GPU kernel of the backward pass — per (rank, step), every kernel from the first to
    the last one launched by an op whose name contains ``backward`` (so the ``aten::mm`` under
    ``MmBackward0`` counts too); on a graph that a transform marked (:func:`keep_backward_mask`),
    the mark. Computed once per graph structure (read-only)."""
    return graph.memo("backward_mask", lambda: _backward_mask(graph))


def keep_backward_mask(graph: TaskGraph, *, reason: str) -> TaskGraph:
    """``graph`` with its backward kernels marked, so that :func:`backward_mask` keeps them after
    a transform removes kernels: on what remains of a stage, the first and last kernels launched by
    an op named ``backward`` no longer bound the pass (a stage's gradient GEMMs run under
    ``aten::mm``)."""
    if BACKWARD_COLUMN in graph.tasks:
        return graph
    return set_state(graph, np.arange(len(graph.tasks)), BACKWARD_COLUMN, backward_mask(graph).tolist(),
                     reason=reason)


def _backward_mask(graph: TaskGraph) -> np.ndarray:
    t = graph.tasks
    if BACKWARD_COLUMN in t:
        marked = t[BACKWARD_COLUMN].to_numpy(dtype=object) == True  # noqa: E712 (None where not marked)
        marked.flags.writeable = False
        return marked
    named = t["op"].astype(str).str.contains("backward", case=False, regex=False).to_numpy()
    kern = t["kind"].to_numpy() == int(TaskKind.KERNEL)
    out = np.zeros(len(t), dtype=bool)
    if not (named & kern).any():
        return out
    start = t["measured_start_ns"].to_numpy()
    key = t["rank"].to_numpy().astype(np.int64) * (1 << 32) + t["step"].to_numpy().astype(np.int64)
    for k in np.unique(key[named & kern]).tolist():
        sel = kern & (key == k)
        s = start[sel & named]
        out |= sel & (start >= s.min()) & (start <= s.max())
    out.flags.writeable = False
    return out


PAIR_FLOPS_TOLERANCE = 0.10   # a gradient GEMM does its forward GEMM's FLOPs


def backward_blocks(graph: TaskGraph, blocks: pd.DataFrame,
                    flops: Callable[[np.ndarray], np.ndarray] | None = None) -> pd.DataFrame | None:
    """The backward's kernels mapped to the forward's blocks (same columns as :func:`find_blocks`,
    ``part`` prefixed ``bwd_``), or None when a step has a backward that cannot be mapped.

    Per (rank, step) with a backward (:func:`backward_mask`): the backward mirrors the forward, so
    its **last** ``2·n`` GEMMs (n: the step's forward block GEMMs) are their gradient pairs — input
    gradient and weight gradient of each, in reverse layer order (the LM head's pair comes before
    them, the embedding has no GEMM) — and each pair takes its forward GEMM's block, part and role.
    With ``flops`` (FLOPs per task id, NaN when unknown) each gradient GEMM must do its forward
    GEMM's FLOPs within 10 %, so a shifted pairing (a frozen embedding, recomputation, extra
    GEMMs) is caught instead of mislabelled. The backward's attention kernels form runs like the
    forward's cores (no GEMM between them: FlashAttention-2's backward is three kernels), one run
    per block in reverse order, heads split. A step whose backward has fewer than ``2·n`` GEMMs,
    another count of attention runs than blocks, or a pair off its forward FLOPs is not mapped."""
    t = graph.tasks
    bw = backward_mask(graph)
    if not bw.any():
        return blocks.iloc[:0].copy()
    cls = kernel_classes(graph)
    start = t["measured_start_ns"].to_numpy()
    steps, ranks = t["step"].to_numpy(), t["rank"].to_numpy()
    fwd_steps = steps[blocks["task"].to_numpy()]
    rows: list[tuple[int, int, int, str, str]] = []
    for rank, step in sorted({(int(r), int(s)) for r, s in zip(ranks[bw], steps[bw])}):
        mine = blocks[(blocks["rank"].to_numpy() == rank) & (fwd_steps == step)]
        mine = mine.assign(start=start[mine["task"].to_numpy()]).sort_values(["start", "task"], kind="stable")
        gemms = mine[mine["part"].isin(["qkv", "attn_out", "mlp_in", "mlp_down"])]
        cores = mine[mine["part"] == "attention"].drop_duplicates("block")
        k = np.flatnonzero(bw & (ranks == rank) & (steps == step))
        k = k[np.argsort(start[k], kind="stable")]
        is_gemm = cls[k] == KernelClass.GEMM.value
        runs = _runs(cls[k] == KernelClass.ATTENTION.value)
        merged: list[tuple[int, int]] = []
        for a, b in runs:   # attention kernels with no GEMM between them are one core's backward
            if merged and not is_gemm[merged[-1][1]:a].any():
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        bg = k[is_gemm]
        n = len(gemms)
        if n == 0 or len(bg) < 2 * n or len(merged) != len(cores):
            return None
        pairs = bg[len(bg) - 2 * n:].reshape(n, 2)
        fwd_gemms = gemms.iloc[::-1]
        if flops is not None:
            want = np.repeat(flops(fwd_gemms["task"].to_numpy(np.int64)), 2)
            got = flops(pairs.reshape(-1))
            known = np.isfinite(want) & np.isfinite(got) & (want > 0)
            if (np.abs(got[known] / want[known] - 1) > PAIR_FLOPS_TOLERANCE).any():
                return None
        for fwd, pair in zip(fwd_gemms.itertuples(), pairs):
            for task in pair:
                rows.append((int(task), rank, int(fwd.block), f"bwd_{fwd.part}", str(fwd.role)))
        for core, (a, b) in zip(cores.iloc[::-1].itertuples(), merged):
            for task in k[a:b + 1]:
                if cls[task] == KernelClass.ATTENTION.value:
                    rows.append((int(task), rank, int(core.block), "bwd_attention", str(core.role)))
    return pd.DataFrame(rows, columns=list(COLUMNS)).sort_values("task", ignore_index=True)


ROLE_OF_PART = {"qkv": Role.COLUMN, "mlp_in": Role.COLUMN, "attn_out": Role.ROW, "mlp_down": Role.ROW,
                "attention": Role.HEADS, "attn_elementwise": Role.SHARDED, "mlp_elementwise": Role.SHARDED,
                "block_other": Role.SEQUENCE}


def gemm_io_bytes(graph: TaskGraph, tasks: np.ndarray, nbytes: np.ndarray,
                  weight_bytes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per task: (input, weight, output) activation bytes. From the launching op's recorded shapes
    (``mm``, ``addmm``, ``linear``, ``matmul``, ``bmm``: output ``M x N``, times the task's
    :class:`~whatif.core.work.WorkShare` of its output after a split) when there are some;
    else the non-weight bytes split evenly between input and output."""
    tasks = np.asarray(tasks, dtype=np.int64)
    act = np.maximum(np.nan_to_num(nbytes) - np.nan_to_num(weight_bytes), 0.0)
    inp, out = act / 2, act / 2
    w = np.nan_to_num(weight_bytes).astype(float)
    shapes = _output_elems(graph, tasks)
    ok = ~np.isnan(shapes[:, 0])
    out_b = shapes[:, 0] * shapes[:, 1] * output_shares(graph.tasks, tasks)
    ok &= out_b <= act
    out[ok] = out_b[ok]
    inp[ok] = act[ok] - out_b[ok]
    return inp, w, out


def linked_op_rows(graph: TaskGraph, tasks: np.ndarray) -> np.ndarray:
    """Per task: the trace row of the CPU op that launched it (same rank and ``External id``), NaN
    when there is none (no trace, synthetic task, or no op recorded)."""
    tasks = np.asarray(tasks, dtype=np.int64)
    tr = graph.trace
    if tr is None or not len(tasks):
        return np.full(len(tasks), np.nan)
    return tr.launching_op_rows(graph.tasks["event"].to_numpy()[tasks])


def _output_elems(graph: TaskGraph, tasks: np.ndarray) -> np.ndarray:
    """Per task: (output elements, bytes per element) of its GEMM op, NaN when unknown."""
    res = np.full((len(tasks), 2), np.nan)
    tr = graph.trace
    if tr is None or not len(tasks):
        return res
    ev = tr.events
    op_rows = linked_op_rows(graph, tasks)
    names = ev["name"].astype(str).to_numpy()
    all_dims, all_types = tr.arg(Arg.INPUT_DIMS), tr.arg(Arg.INPUT_TYPES)
    for i, r in enumerate(op_rows):
        if np.isnan(r):
            continue
        dims, types = all_dims[int(r)], all_types[int(r)]
        op = names[int(r)].split("::")[-1]
        shape = _gemm_out(op, dims)
        if shape is not None:
            ti = 1 if op == "addmm" else 0
            res[i] = (float(np.prod(shape)), element_bytes(types[ti] if ti < len(types) else None) or 2.0)
    return res


def _gemm_out(op: str, dims: object) -> list[int] | None:
    if not isinstance(dims, list) or len(dims) < 2:
        return None
    try:
        if op in ("mm", "matmul", "bmm"):
            a, b = dims[0], dims[1]
            return [*a[:-1], b[-1]]
        if op == "addmm":
            return [dims[1][0], dims[2][1]]
        if op == "linear":
            return [*dims[0][:-1], dims[1][0]]
    except (IndexError, TypeError):
        return None
    return None
