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

**Which kernels** (:func:`absorbed_kernels`): the collective's consumer when it is a token norm
(:func:`~whatif.core.kernels.is_token_norm`), or a residual add
(:func:`~whatif.core.kernels.is_residual_add`) followed on its stream by a token norm, both in the
collective's step and followed by another kernel of that step (which then waits for the collective).

Left out: the bytes the fusion saves (the add's output is not written and read again; the sum
here is an upper bound); the absorbed kernels' CPU launches (kept: vLLM and TokenWeave launch
through CUDA graphs, where they cost nothing apart); multimem's in-switch reduction.
"""
from __future__ import annotations

import numpy as np

from whatif.core.kernels import is_residual_add, is_token_norm
from whatif.depgraph.graph import TaskGraph, TaskKind
from whatif.hardware.devices import find_device
from whatif.hardware.roofline import fixed_latency_ns

from ..base import TransformContext, TransformError
from ..edit import remove
from .comm import next_on_resource
from .nanoflow import NANOFLOW_GEMV


def absorbed_kernels(graph: TaskGraph, consumers: np.ndarray) -> list[np.ndarray]:
    """Per collective consumer: the kernel ids a fused AllReduce–RMSNorm takes over (empty when
    the consumer is neither a token norm nor a residual add before one)."""
    t = graph.tasks
    kinds, steps = t["kind"].to_numpy(), t["step"].to_numpy()
    names, ops = t["name"].astype(str).to_numpy(), t["op"].astype(object).to_numpy()

    def kernel_in(task: int, step: int) -> bool:
        return task >= 0 and kinds[task] == int(TaskKind.KERNEL) and steps[task] == step

    def op(task: int) -> str | None:
        return str(ops[task]) if isinstance(ops[task], str) and ops[task] else None

    out = []
    for c in np.asarray(consumers, dtype=np.int64).tolist():
        step = int(steps[c])
        group: list[int] = []
        if is_token_norm(names[c], op(c)):
            group = [c]
        elif is_residual_add(names[c], op(c)):
            nxt = int(next_on_resource(graph, np.array([c]))[0])
            if kernel_in(nxt, step) and is_token_norm(names[nxt], op(nxt)):
                group = [c, nxt]
        if group and not kernel_in(int(next_on_resource(graph, np.array([group[-1]]))[0]), step):
            group = []
        out.append(np.asarray(group, dtype=np.int64))
    return out


def absorbed_part_ns(graph: TaskGraph, ctx: TransformContext, kernels: np.ndarray, ranks: int, parts: int,
                     comm_sms: int) -> int:
    """ns that each of a collective's ``parts`` parts gains by doing ``kernels``' work for its
    rank's 1/``ranks`` of the tokens on ``comm_sms`` SMs (see the module docstring)."""
    dev = find_device(ctx.device) if ctx.device else None
    if dev is None or not dev.sm_count:
        raise TransformError(f"fuse_norm prices the norm on the collective's SMs and needs the GPU's SM count; the "
                             f"trace's GPU ({ctx.device or 'unnamed'}) is not in the hardware catalog")
    share = min(comm_sms / dev.sm_count, 1.0)
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
