"""Nesting of CPU events on each thread, and what every CPU event belongs to.

Daydream's task->layer mapping: layer boundaries are marked on the CPU; an event inside a
layer's window belongs to it. For each CPU event we find its parent by interval nesting on its
thread and inherit, from the innermost enclosing event of each sort:

* ``step``  -- the N of ``ProfilerStep#N``
* ``phase`` -- an annotation ``phase:<name>`` (written by :func:`whatif.phase`) or one named
  exactly ``prefill``/``decode``/``denoise``...
* ``layer`` -- an ``nn.Module: X`` python frame or a user annotation (not a step or phase)
* ``op``    -- an aten/framework operator (``cpu_op``)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from whatif.tracer.kinds import EventKind
from whatif.tracer.kineto import step_number
from whatif.tracer.markers import PHASE_PREFIX

KNOWN_PHASES = frozenset({"prefill", "decode", "denoise", "denoising", "forward", "backward", "optimizer"})
CPU_KINDS = (EventKind.CPU_OP, EventKind.ANNOTATION, EventKind.PYTHON, EventKind.RUNTIME, EventKind.DRIVER)


def phase_name(name: str) -> str | None:
    """The phase an annotation names, or None.

    >>> phase_name("phase:prefill"), phase_name("Decode"), phase_name("aten::mm")
    ('prefill', 'decode', None)
    """
    if name.startswith(PHASE_PREFIX):
        return name[len(PHASE_PREFIX):]
    low = name.lower()
    return low if low in KNOWN_PHASES else None


@dataclass
class CpuHierarchy:
    """Per CPU event (arrays aligned with ``rows``, the event-table rows of CPU events)."""

    rows: np.ndarray          # event rows, grouped by thread, in (ts, -dur) order
    parent: np.ndarray        # position in ``rows`` of the parent, -1 at top level
    step: np.ndarray          # step number, -1 outside steps
    phase: np.ndarray         # object: phase name or None
    layer: np.ndarray         # object: layer name or None
    op: np.ndarray            # object: aten op name or None
    has_call: np.ndarray      # a runtime/driver call is this event or below it
    has_structure: np.ndarray  # a step or phase annotation is this event or below it
    is_structure: np.ndarray  # this event is a step or phase annotation


def build_hierarchy(events: pd.DataFrame) -> CpuHierarchy:
    """Nest the CPU events of every (rank, pid, tid) and propagate step/phase/layer/op."""
    kinds = events["kind"].to_numpy()
    cpu_mask = np.isin(kinds, [int(k) for k in CPU_KINDS])
    rows = np.flatnonzero(cpu_mask)
    sub = events.iloc[rows]
    # Stable sort by thread keeps the table's (ts, -dur) order within a thread.
    order = np.lexsort((np.arange(len(rows)), sub["tid"].to_numpy(), sub["pid"].to_numpy(), sub["rank"].to_numpy()))
    rows = rows[order]
    sub = events.iloc[rows]
    n = len(rows)
    ts = sub["ts_ns"].to_numpy().tolist()
    end = (sub["ts_ns"].to_numpy() + sub["dur_ns"].to_numpy()).tolist()
    thread = (sub["rank"].to_numpy().astype(np.int64) * 0x1000003 + sub["pid"].to_numpy() * 0x10001
              + sub["tid"].to_numpy()).tolist()

    parent = [-1] * n
    stack: list[int] = []
    prev_thread = None
    for i in range(n):
        if thread[i] != prev_thread:
            stack.clear()
            prev_thread = thread[i]
        t = ts[i]
        while stack and end[stack[-1]] <= t:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    parent_arr = np.asarray(parent, dtype=np.int64)

    # What each event itself defines (per distinct name: names are categorical).
    kind_arr = sub["kind"].to_numpy()
    codes = sub["name"].cat.codes.to_numpy()
    cats = [str(c) for c in sub["name"].cat.categories]
    step_of_name = np.asarray([step_number(c) if step_number(c) is not None else -1 for c in cats], dtype=np.int64)
    phase_of_name = np.asarray([phase_name(c) for c in cats], dtype=object)
    module_of_name = np.asarray([c[len("nn.Module: "):] if c.startswith("nn.Module: ") else None for c in cats],
                                dtype=object)
    is_ann = kind_arr == int(EventKind.ANNOTATION)
    own_step = np.where(is_ann, step_of_name[codes], -1)
    own_phase = is_ann & (own_step < 0) & (phase_of_name[codes] != None)  # noqa: E711
    own_layer = (is_ann & (own_step < 0) & ~own_phase) | ((kind_arr == int(EventKind.PYTHON))
                                                          & (module_of_name[codes] != None))  # noqa: E711
    own_op = kind_arr == int(EventKind.CPU_OP)
    idx = np.arange(n, dtype=np.int64)
    step_src = _inherit(np.where(own_step >= 0, idx, -1), parent_arr)
    phase_src = _inherit(np.where(own_phase, idx, -1), parent_arr)
    layer_src = _inherit(np.where(own_layer, idx, -1), parent_arr)
    op_src = _inherit(np.where(own_op, idx, -1), parent_arr)
    names_arr = np.asarray(cats, dtype=object)[codes]
    layer_name = np.where(kind_arr == int(EventKind.PYTHON), module_of_name[codes], names_arr)
    step = np.where(step_src >= 0, own_step[np.maximum(step_src, 0)], -1)
    none = np.array(None)  # the fill as an array: numpy's stubs do not take a bare None
    phase = np.where(phase_src >= 0, phase_of_name[codes][np.maximum(phase_src, 0)], none)
    layer = np.where(layer_src >= 0, layer_name[np.maximum(layer_src, 0)], none)
    op = np.where(op_src >= 0, names_arr[np.maximum(op_src, 0)], none)
    is_structure = (own_step >= 0) | own_phase

    has_call = np.isin(kind_arr, [int(EventKind.RUNTIME), int(EventKind.DRIVER)])
    # Children come after parents in this order, so one reverse sweep propagates flags upward.
    hc = has_call.tolist()
    hs = is_structure.tolist()
    for i in range(n - 1, -1, -1):
        p = parent[i]
        if p >= 0:
            if hc[i]:
                hc[p] = True
            if hs[i]:
                hs[p] = True
    return CpuHierarchy(rows=rows, parent=parent_arr, step=step.astype(np.int64), phase=phase, layer=layer, op=op,
                        has_call=np.asarray(hc, dtype=bool), has_structure=np.asarray(hs, dtype=bool),
                        is_structure=is_structure)


def _inherit(source: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """For every event, the nearest event at or above it (itself first) whose ``source`` is set
    (>= 0), by pointer jumping: O(log depth) vectorized passes.

    >>> _inherit(np.array([0, -1, -1, 3]), np.array([-1, 0, 1, 1])).tolist()
    [0, 0, 0, 3]
    """
    val = source.copy()
    up = parent.copy()
    while True:
        need = (val < 0) & (up >= 0)
        if not need.any():
            return val
        val[need] = val[up[need]]
        up[need] = up[up[need]]
