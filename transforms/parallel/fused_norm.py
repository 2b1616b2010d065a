"""TokenWeave's fused AllReduce + residual add + RMSNorm (MLSys 2026), ``overlap``'s ``fuse_norm``.

After a tensor-parallel all-reduce a transformer adds the residual and normalizes every token
(vLLM's ``fused_add_rms_norm``; PyTorch's ``add`` then ``rms_norm``). Every rank does that work
for all tokens. TokenWeave's kernel does it inside the collective instead: reduce-scatter, then
residual add + RMSNorm on the rank's 1/t of the tokens, then all-gather, on the few SMs
(``comm_sms``) the collective holds. The compute stream loses those kernels; the collective gains
their work for 1/t of the tokens, on c of the GPU's S SMs.

**Price** of the absorbed kernels (:func:`absorbed_part_ns`), per collective part of n:
``Σ (T − F) / (t·n) / P(c/S)`` — their time above the device's fixed latency F
(:func:`~whatif.hardware.roofline.fixed_latency_ns`: inside the collective no launch or ramp-up
is paid again), on the rank's 1/t of one nano-batch's tokens, at the speed memory-bound work keeps
on a share c/S of the GPU beside compute: NanoFlow's measured curve
(:data:`~.nanoflow.NANOFLOW_GEMV`; 8 of an H100's 132 SMs keep 15 % of the speed).

**Which kernels** (:func:`fusable`, :func:`absorbed_kernels`): after a forward all-reduce whose
message is known, its consumer when it is a token norm (:func:`~whatif.core.kernels.is_token_norm`),
or a residual add (:func:`~whatif.core.kernels.is_residual_add`) followed on its stream by a token
norm, both in the collective's step, followed by another kernel of that step (which then waits for
the collective), and neither feeding a collective itself (sequence-parallel TP, where the norm after
a reduce-scatter produces the next all-gather).

Left out: the bytes the fusion saves (the add's output is not written and read again; the sum
here is an upper bound); the absorbed kernels' CPU launches (kept: vLLM and TokenWeave launch
through CUDA graphs, where they cost nothing apart); multimem's in-switch reduction.
"""
from __future__ import annotations

import numpy as np

from whatif.core.kernels import CollectiveKind, is_residual_add, is_token_norm
from whatif.depgraph.graph import EdgeKind, TaskGraph, TaskKind
from whatif.hardware.devices import find_device
from whatif.hardware.roofline import fixed_latency_ns

from ..base import TransformContext, TransformError
from ..edit import remove
from .comm import collective_messages, comm_sm_share, next_on_resource
from .layers import backward_mask
from .nanoflow import NANOFLOW_GEMV


def absorbed_kernels(graph: TaskGraph, consumers: np.ndarray) -> list[np.ndarray]:
    """Per collective consumer: the kernel ids a fused AllReduce–RMSNorm takes over (empty when
    the consumer is neither a token norm nor a residual add before one, is in the backward pass,
    or when one of them feeds a collective itself: under sequence parallelism the norm produces the
    next all-gather, which is no longer TokenWeave's pattern)."""
    t = graph.tasks
    kinds, steps = t["kind"].to_numpy(), t["step"].to_numpy()
    names, ops = t["name"].astype(str).to_numpy(), t["op"].astype(object).to_numpy()
    succ = next_on_resource(graph, np.arange(len(t)))
    backward = backward_mask(graph)
    e = graph.edges
    flow = e[e["kind"] == int(EdgeKind.FLOW)]
    feeds_collective = np.zeros(len(t), dtype=bool)
    feeds_collective[flow["src"].to_numpy()[kinds[flow["dst"].to_numpy()] == int(TaskKind.COMM)]] = True

    def kernel_in(task: int, step: int) -> bool:
        return task >= 0 and kinds[task] == int(TaskKind.KERNEL) and steps[task] == step and not backward[task]

    def op(task: int) -> str | None:
        return str(ops[task]) if isinstance(ops[task], str) and ops[task] else None

    def group_of(c: int) -> list[int]:
        step, nxt = int(steps[c]), int(succ[c])
        if not kernel_in(c, step):
            return []
        if is_token_norm(names[c], op(c)):
            group = [c]
        elif is_residual_add(names[c], op(c)) and kernel_in(nxt, step) and is_token_norm(names[nxt], op(nxt)):
            group = [c, nxt]
        else:
            return []
        return group if kernel_in(int(succ[group[-1]]), step) and not feeds_collective[group].any() else []

    return [np.asarray(group_of(c), dtype=np.int64) for c in np.asarray(consumers, dtype=np.int64).tolist()]


def fusable(graph: TaskGraph, comms: np.ndarray, consumers: np.ndarray) -> list[tuple[np.ndarray, int]]:
    """Per region (its collective and consumer): the kernels a fused AllReduce–RMSNorm takes over
    (:func:`absorbed_kernels`) and the ranks that share the tokens, where the collective is an
    all-reduce whose message is known; no kernels elsewhere."""
    out = []
    for kernels, message in zip(absorbed_kernels(graph, consumers), collective_messages(graph, comms)):
        ok = message is not None and message[0] == CollectiveKind.ALL_REDUCE.value
        out.append((kernels if ok else kernels[:0], message[2] if ok and message is not None else 0))
    return out


def absorbed_part_ns(graph: TaskGraph, ctx: TransformContext, kernels: np.ndarray, ranks: int, parts: int,
                     comm_sms: int) -> int:
    """ns that each of a collective's ``parts`` parts gains by doing ``kernels``' work for its
    rank's 1/``ranks`` of the tokens on ``comm_sms`` SMs (see the module docstring)."""
    share = comm_sm_share(ctx, comm_sms)
    if share == 0:
        raise TransformError(f"fuse_norm prices the norm on the collective's SMs and needs the GPU's SM count; the "
                             f"trace's GPU ({ctx.device or 'unnamed'}) is not in the hardware catalog")
    dev = find_device(ctx.device)
    dur = graph.tasks["dur_ns"].to_numpy()[np.asarray(kernels, dtype=np.int64)].astype(float)
    work = np.maximum(dur - fixed_latency_ns(dev), 0.0).sum()
    return int(round(work / (ranks * parts) / NANOFLOW_GEMV.performance(share)))


def remove_absorbed(graph: TaskGraph, comms: np.ndarray, absorbed: list[np.ndarray], *,
                    reason: str) -> tuple[TaskGraph, np.ndarray]:
    """``graph`` without the absorbed kernels (their consumers' waits move to the next kernel,
    :func:`~whatif.transforms.edit.remove`) and the collectives' ids in it."""
    gone = np.unique(np.concatenate([np.empty(0, np.int64), *absorbed]))
    if not len(gone):
        return graph, np.asarray(comms, dtype=np.int64)
    comms = np.asarray(comms, dtype=np.int64)
    return remove(graph, gone, reason=reason), comms - np.searchsorted(gone, comms)
