"""What ``pipeline_parallel`` does to memory: stage ``s`` of ``p`` holds its layers' parameters,
gradients and optimizer state, and the activations of the micro-batches its schedule keeps in
flight (Narayanan et al. 2021, §2.2: with 1F1B stage ``s`` holds at most ``p − s`` micro-batches'
activations, GPipe all ``m``; Korthikanti et al. 2022, §4.2.3, for the first stage's ``p``).

Each allocation of the trace's allocator records (``Trace.memory``; a recording without pipeline
parallelism) keeps its :class:`~whatif.transforms.optimizations.batch_memory.BlockRole` and gets a
**share**, its bytes on the stage over its recorded bytes. The forward's work ops
(:mod:`.forward_ops`) each belong to the stage of their transformer block — stage ``s`` holds
blocks ``[s·n/p, (s+1)·n/p)`` of a step's ``n`` (:func:`stage_of`, as ``pipeline_parallel``
splits the kernels); the ops before the first block (embeddings) to stage 0, those after the last
(final norm, LM head, loss) to the last stage:

* **Activations made in the forward** belong to the stage of the op that makes them and to the
  stage of the work op that takes them (a stage boundary's activation is received into a buffer
  of its size); each is one micro-batch's, ``1/m`` of the recorded batch, and the stage holds
  ``f`` micro-batches of them at once: ``min(p − s, m)`` with ``1f1b``, ``m`` with ``gpipe``, 1
  when ``serving`` (no backward keeps them). Share ``f/m`` on the stages that hold them, 0 elsewhere;
  one held past its step's end (a KV cache: every micro-batch's sequences keep theirs) ``1``.
* **Activations made in the backward** are input gradients (matched to their forward op by
  ``Sequence number``): they belong to that op's stage and to the stage of the work op that made
  its input (which receives the gradient), one micro-batch at a time: ``1/m``.
* **Other activations** (outside the forward's work ops and the autograd nodes of their ops: the
  batch as loaded, the loss's scalars) are taken whole.
* **Parameters, their gradients, optimizer state and everything else made to last**: a block whose
  bytes are those of a parameter (:func:`~.forward_ops.lasting_shares`) takes the share of the
  parameters with those bytes that the stage's ops use (1 for each on the stage, 0 for each not;
  their mean); what was allocated before the recording takes the stage's share of the parameters'
  elements.

Left out: a stage boundary's residual stream when the block heuristic puts the next layer's norm
on the previous stage (the norm's output is counted, the residual it reads is not), the send
buffers of a transport that copies (NCCL and gloo send from the tensor), weights tied across the
first and last stage (each holds a copy; counted once, half on each), activations that do not
scale with the batch (taken to), and Megatron-LM's freeing of a stage's output once sent (its
data; the autograd graph stays): the output is counted on the stage that made it until its
backward, as a plain PyTorch pipeline (examples/train.py) holds it.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np
import pandas as pd

from whatif.depgraph.hierarchy import OUTSIDE_STEPS, enclosing, record_steps
from whatif.tracer.memory import BlockScaling, RecordEdit, on_gpu
from whatif.tracer.trace import Trace

from ..base import TransformError
from ..optimizations.batch_memory import BlockRole, BlockRoles, block_roles
from .forward_ops import ForwardOps, forward_ops, lasting_shares, parameter_uses, shares_edit


class Schedule(str, Enum):
    """How a pipeline runs its micro-batches: 1F1B / PipeDream-Flush and GPipe for training,
    request pipelining for serving (module docstring of :mod:`.pipeline`)."""

    ONE_F_ONE_B = "1f1b"
    GPIPE = "gpipe"
    SERVING = "serving"


SCHEDULES = tuple(s.value for s in Schedule)
TRAINING_MICRO_BATCHES = 4
"""Micro-batches per training step when a plan does not say (serving: one per stage)."""


def schedule_of(name: str, who: str = "pipeline_parallel") -> Schedule:
    """The :class:`Schedule` called ``name``.

    Raises
    ------
    TransformError : ``name`` is not one (``who`` names the transform that asks).
    """
    try:
        return Schedule(name)
    except ValueError:
        raise TransformError(f"{who}: schedule must be one of {', '.join(SCHEDULES)} (got {name!r})") from None


def default_micro_batches(schedule: Schedule, stages: int) -> int:
    """Micro-batches per step when none are given: one per stage when serving (the fewest that
    keep every stage busy), :data:`TRAINING_MICRO_BATCHES` when training.

    >>> default_micro_batches(Schedule.SERVING, 8), default_micro_batches(Schedule.GPIPE, 8)
    (8, 4)
    """
    return stages if schedule is Schedule.SERVING else TRAINING_MICRO_BATCHES


def stage_of(layer: np.ndarray, blocks: np.ndarray, stages: int) -> np.ndarray:
    """Per layer (its block's index among the ``blocks`` of its step, -1 before the first): the
    pipeline stage that holds it, ``s`` for blocks ``[s·n/p, (s+1)·n/p)``.

    >>> stage_of(np.array([-1, 0, 1, 2, 3, 4, 5]), np.array([6] * 7), 4).tolist()
    [0, 0, 1, 1, 2, 3, 3]
    """
    stage = np.zeros(len(layer), dtype=np.int64)
    for s in range(1, stages):
        stage[layer >= (blocks * s) // stages] = s
    return stage


def in_flight(schedule: Schedule, stages: int, stage: int, micro_batches: int) -> int:
    """Micro-batches whose forward activations stage ``stage`` of ``stages`` holds at once.

    >>> one_f_one_b = Schedule.ONE_F_ONE_B
    >>> [in_flight(one_f_one_b, 4, s, 8) for s in range(4)], in_flight(one_f_one_b, 4, 0, 2)
    ([4, 3, 2, 1], 2)
    >>> in_flight(Schedule.GPIPE, 4, 0, 8), in_flight(Schedule.SERVING, 4, 0, 8)
    (8, 1)
    """
    if schedule is Schedule.GPIPE:
        return micro_batches
    if schedule is Schedule.SERVING:
        return 1
    return min(stages - stage, micro_batches)


@dataclass(frozen=True)
class PipelineShares:
    """Each allocation's bytes on pipeline stage ``stage`` over its recorded bytes (``scale``,
    aligned with ``roles.rows``) and the share of what was allocated before the recording
    (``before``); ``in_flight``: the micro-batches whose activations the stage holds at once;
    ``moved``: the gradients allocated earlier, each right before its ``to`` row (a step's first
    forward allocation)."""

    degree: int
    stage: int
    micro_batches: int
    schedule: Schedule
    in_flight: int
    roles: BlockRoles
    scale: np.ndarray
    before: float
    moved: np.ndarray
    to: np.ndarray

    def scaling(self) -> BlockScaling:
        """The shares and moves as a :class:`~whatif.tracer.memory.BlockScaling` (what
        ``scaled_edit`` and ``batch_peaks`` take)."""
        return BlockScaling(self.roles.rows, self.scale, self.before, self.moved, self.to)


def _owned(stages: np.ndarray, *at: np.ndarray, stage: int) -> np.ndarray:
    """Whether ``stage`` is among the stages of positions ``at`` (-1: none there)."""
    out = np.zeros(len(at[0]), dtype=bool)
    for pos in at:
        out |= (pos >= 0) & (stages[np.maximum(pos, 0)] == stage)
    return out


def pipeline_shares(trace: Trace, degree: int, stage: int, micro_batches: int, schedule: str = Schedule.ONE_F_ONE_B,
                    roles: BlockRoles | None = None, ops: ForwardOps | None = None) -> PipelineShares:
    """Each allocation's share on stage ``stage`` of ``degree`` with ``micro_batches`` micro-batches
    under ``schedule`` (module docstring).

    Raises
    ------
    TransformError : as :func:`~whatif.transforms.optimizations.batch_memory.block_roles`; an unknown
        schedule or stage; the trace's forward has no transformer block, or fewer in a step than stages.
    """
    schedule = schedule_of(schedule)
    if not 0 <= stage < degree or micro_batches < 1:
        raise TransformError(f"pipeline_parallel: stage {stage} of {degree} with {micro_batches} micro-batches")
    roles = block_roles(trace, "pipeline_parallel") if roles is None else roles
    ops = forward_ops(trace) if ops is None else ops
    if not (ops.role >= 0).any():
        raise TransformError(f"pipeline_parallel: found no transformer block (attention followed by a GEMM) in the "
                             f"forward ops of {trace.source}; its memory cannot be split into stages")
    fewest = int(ops.blocks[ops.blocks > 0].min())
    if degree > fewest:
        raise TransformError(f"pipeline_parallel: {degree} stages for {fewest} blocks per step in the forward ops of "
                             f"{trace.source} would leave a stage empty")
    stages = np.where(ops.work >= 0, stage_of(ops.block, ops.blocks, degree), -1)
    f = in_flight(schedule, degree, stage, micro_batches)
    mem = trace.memory
    allocs = roles.rows
    pos = enclosing(ops.hierarchy, trace.events, mem.iloc[allocs])
    at = np.maximum(pos, 0)
    made_by = np.where(pos >= 0, ops.made_by[at], -1)
    in_forward = (pos >= 0) & (ops.work[at] >= 0) & (made_by < 0)
    by = np.maximum(made_by, 0)
    backward = (made_by >= 0) & (ops.work[by] >= 0)
    forward_owned = _owned(stages, np.where(in_forward, at, -1), np.where(in_forward, ops.consumer(at), -1),
                           stage=stage)
    backward_owned = _owned(stages, np.where(backward, by, -1), np.where(backward, ops.producer(by), -1), stage=stage)
    steps = record_steps(trace.events, mem)
    past_step = (roles.frees < 0) | (steps[np.maximum(roles.frees, 0)] != steps[allocs])
    held = np.where(past_step, 1.0, f / micro_batches)
    activation_scale = np.where(in_forward, np.where(forward_owned, held, 0.0),
                                np.where(backward, np.where(backward_owned, 1 / micro_batches, 0.0), 1.0))
    activation = roles.mask(BlockRole.ACTIVATION)
    uses = parameter_uses(trace, ops)
    lasting = lasting_shares(uses, (stages[uses.pos] == stage).astype(float))
    scale = np.where(activation, activation_scale, lasting.of(mem["bytes"].to_numpy()[allocs], on_gpu(mem)[allocs]))
    moved = np.zeros(0, dtype=np.int64)
    to = np.zeros(0, dtype=np.int64)
    if schedule is Schedule.ONE_F_ONE_B and micro_batches > f:
        moved, to = _gradients_earlier(trace, roles, steps[allocs], (pos >= 0) & ops.forward[at], scale > 0)
    return PipelineShares(degree, stage, micro_batches, schedule, f, roles, scale, lasting.before, moved, to)


def _gradients_earlier(trace: Trace, roles: BlockRoles, steps: np.ndarray, in_forward: np.ndarray,
                       kept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The gradients (``BlockRole.GRADIENT`` allocations of ``kept``) and, for each, the step's
    first allocation made in a forward op on its device (``steps``, ``in_forward``: per allocation
    of ``roles.rows``, its step and whether a forward op made it): with 1F1B a stage's first
    backward makes them while later micro-batches' forwards are still to come."""
    mem = trace.memory
    allocs = roles.rows
    frame = pd.DataFrame({"row": allocs, "ts": mem["ts_ns"].to_numpy()[allocs], "step": steps,
                          "rank": mem["rank"].to_numpy()[allocs], "type": mem["device_type"].to_numpy()[allocs],
                          "device": mem["device_id"].to_numpy()[allocs]})
    keys = ["rank", "type", "device", "step"]
    first = frame[in_forward & (steps != OUTSIDE_STEPS)].sort_values(["ts", "row"]).drop_duplicates(keys)
    grads = frame[roles.mask(BlockRole.GRADIENT) & kept]
    anchored = grads.merge(first[[*keys, "row"]], on=keys, suffixes=("", "_to"))
    anchored = anchored[anchored["row_to"] < anchored["row"]]
    return anchored["row"].to_numpy(np.int64), anchored["row_to"].to_numpy(np.int64)


def pipeline_memory_edit(trace: Trace, degree: int, stage: int, micro_batches: int,
                         schedule: str = Schedule.ONE_F_ONE_B) -> RecordEdit:
    """The allocator records of pipeline stage ``stage`` of ``degree``: each allocation at its share
    of its bytes (:func:`pipeline_shares`), at its place, freed at its free; on each device, what
    was allocated before the recording at the stage's share of the parameters, from the first
    record on (:func:`~whatif.tracer.memory.scaled_edit`).

    Raises
    ------
    TransformError : as :func:`pipeline_shares`.
    """
    shares = pipeline_shares(trace, degree, stage, micro_batches, schedule)
    return shares_edit(trace, shares.roles, shares.scaling(),
                       f"pipeline_parallel(degree={degree}, stage={stage}, micro_batches={micro_batches}, "
                       f"schedule={shares.schedule.value}): {shares.in_flight} of {micro_batches} micro-batches' "
                       f"activations held at once; ", " (the other stages' layers)")
