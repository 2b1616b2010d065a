"""A kernel's share of its recorded work after a transform split it, defined once.

``tensor_parallel`` leaves each rank 1/t of a sharded GEMM's FLOPs and weights and part of its
activations. Transforms applied after it (``pim_offload``, ``overlap``, ``search_nanoflow``, a
pipeline's micro-batches) read a kernel's work through ``CostModel.kernel_facts``; the facts come
from the launching op's *recorded* shapes, so without this state they would see the unsplit
kernel. The splitting transform records a :class:`WorkShare` per task in the ``cost_work`` column
(through :func:`whatif.transforms.edit.set_state`); the cost model multiplies the recorded facts by
it. Tasks without one (None) keep their recorded work.

``rows`` is the factor on the rows (tokens, batch) of each of a kernel's launches that a transform
priced with the wave term (``batch``, ``sequence_parallel``'s token split, ``overlap``'s and a
serving pipeline's micro-batches), ``launches`` how many launches the task stands for now (a
pipeline's m micro-batches run each kernel m times; the other fields are then the work of each
launch, and the task's time that of all of them): a GPU move re-prices the wave term and the
launch latency on the destination, so that growing the batch and then moving prices as moving and
then growing it.

>>> s = WorkShare(flops=0.5, activation_bytes=0.75, weight_bytes=0.5)
>>> s.then(WorkShare(flops=0.5, activation_bytes=1.0, weight_bytes=0.5))
WorkShare(flops=0.25, activation_bytes=0.75, weight_bytes=0.25, output_bytes=1.0, heads=1.0, rows=1.0, launches=1.0)
>>> shares_of([s, None])[0].tolist(), shares_of([s, None])[1].tolist()
([0.5, 1.0], [0.75, 1.0])
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

WORK_COLUMN = "cost_work"


@dataclass(frozen=True)
class WorkShare:
    """Fractions of the recorded FLOPs, non-weight (activation: input + output) DRAM bytes, weight
    bytes and output bytes one kernel (each of its launches) does now, of the attention heads it computes (1/t after a
    tensor-parallel head split: what a later head split must divide), of the rows of each launch
    as priced by the wave term, and the launches it stands for (module docstring)."""

    flops: float = 1.0
    activation_bytes: float = 1.0
    weight_bytes: float = 1.0
    output_bytes: float = 1.0
    heads: float = 1.0
    rows: float = 1.0
    launches: float = 1.0

    def then(self, other: WorkShare) -> WorkShare:
        """This share split again by ``other`` (a second transform on the same kernel)."""
        return WorkShare(self.flops * other.flops, self.activation_bytes * other.activation_bytes,
                         self.weight_bytes * other.weight_bytes, self.output_bytes * other.output_bytes,
                         self.heads * other.heads, self.rows * other.rows, self.launches * other.launches)


def split_further(current: Sequence[WorkShare | None] | np.ndarray,
                  new: Sequence[WorkShare]) -> list[WorkShare]:
    """Each task's share after a further split ``new`` of its ``current`` work (None: recorded)."""
    return [c.then(s) if isinstance(c, WorkShare) else s for c, s in zip(current, new)]


def current_shares(tasks_frame: pd.DataFrame, tasks: np.ndarray) -> list[WorkShare | None]:
    """The ``cost_work`` column of ``tasks`` (a graph's ``tasks`` frame; None where never split)."""
    if WORK_COLUMN not in tasks_frame:
        return [None] * len(tasks)
    return list(tasks_frame[WORK_COLUMN].to_numpy()[tasks])


def shares_of(values: Sequence[WorkShare | None] | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(FLOP, activation-byte, weight-byte) share arrays of a ``cost_work`` column slice (1 where None)."""
    n = len(values)
    f, a, w = np.ones(n), np.ones(n), np.ones(n)
    for i, v in enumerate(values):
        if isinstance(v, WorkShare):
            f[i], a[i], w[i] = v.flops, v.activation_bytes, v.weight_bytes
    return f, a, w


def output_shares(tasks_frame: pd.DataFrame, tasks: np.ndarray) -> np.ndarray:
    """Per task: the share of its recorded output bytes it writes now (1 where never split)."""
    return np.array([v.output_bytes if isinstance(v, WorkShare) else 1.0
                     for v in current_shares(tasks_frame, tasks)], dtype=float)


def launch_shares(tasks_frame: pd.DataFrame, tasks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per task: (the factor on each launch's rows that the wave term priced, the launches it
    stands for); 1 where never split."""
    got = [(v.rows, v.launches) if isinstance(v, WorkShare) else (1.0, 1.0)
           for v in current_shares(tasks_frame, tasks)]
    arr = np.asarray(got, dtype=float).reshape(-1, 2)
    return arr[:, 0], arr[:, 1]
