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

from whatif.tracer.kineto import step_number
from whatif.tracer.kinds import EventKind
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
    phase: list[str | None]
    layer: list[str | None]
    op: list[str | None]
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
    kind_list = sub["kind"].to_numpy().tolist()
    names = sub["name"].astype(str).tolist()

    parent = [-1] * n
    step = [-1] * n
    phase: list[str | None] = [None] * n
    layer: list[str | None] = [None] * n
    op: list[str | None] = [None] * n
    is_structure = [False] * n
    stack: list[int] = []
    prev_thread = None
    k_op, k_ann, k_py = int(EventKind.CPU_OP), int(EventKind.ANNOTATION), int(EventKind.PYTHON)
    for i in range(n):
        if thread[i] != prev_thread:
            stack.clear()
            prev_thread = thread[i]
        t = ts[i]
        while stack and end[stack[-1]] <= t:
            stack.pop()
        if stack:
            p = stack[-1]
            parent[i] = p
            step[i], phase[i], layer[i], op[i] = step[p], phase[p], layer[p], op[p]
        k = kind_list[i]
        name = names[i]
        if k == k_ann:
            num = step_number(name)
            ph = phase_name(name) if num is None else None
            if num is not None:
                step[i] = num
                is_structure[i] = True
            elif ph is not None:
                phase[i] = ph
                is_structure[i] = True
            else:
                layer[i] = name
        elif k == k_op:
            op[i] = name
        elif k == k_py and name.startswith("nn.Module: "):
            layer[i] = name[len("nn.Module: "):]
        stack.append(i)

    has_call = np.isin(np.asarray(kind_list, dtype=np.int8), [int(EventKind.RUNTIME), int(EventKind.DRIVER)])
    has_structure = np.asarray(is_structure, dtype=bool).copy()
    parent_arr = np.asarray(parent, dtype=np.int64)
    # Children come after parents in this order, so one reverse sweep propagates flags upward.
    hc = has_call.tolist()
    hs = has_structure.tolist()
    for i in range(n - 1, -1, -1):
        p = parent[i]
        if p >= 0:
            if hc[i]:
                hc[p] = True
            if hs[i]:
                hs[p] = True
    return CpuHierarchy(rows=rows, parent=parent_arr, step=np.asarray(step, dtype=np.int64), phase=phase,
                        layer=layer, op=op, has_call=np.asarray(hc, dtype=bool),
                        has_structure=np.asarray(hs, dtype=bool), is_structure=np.asarray(is_structure, dtype=bool))
