"""Measured collectives of a trace: (kind, message bytes, ranks, duration) of its NCCL/RCCL kernels.

PyTorch (>= 2.1) records on each collective kernel, or on the ``record_param_comms`` op that
launched it, ``Collective name``, ``In msg nelems``, ``Out msg nelems``, ``Group size`` and
``dtype``. The *message* is the full buffer in the convention of
:func:`whatif.hardware.collectives.collective_time_ns`: the output for all-gather (``Out msg
nelems``), the input for every other kind. A single rank's kernel duration includes the time it
waited for its peers, so these points overestimate transfer time; callers that can should use
the linked multi-rank transfer times (``COMM`` tasks after :mod:`whatif.depgraph.rules.collectives`).

"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from whatif.core.dtypes import element_bytes
from whatif.core.kernels import collective_kind, is_collective
from whatif.tracer.args import Arg, arg_column
from whatif.tracer.kinds import EventKind
from whatif.tracer.trace import Trace, per_name


@dataclass(frozen=True)
class CollectivePoint:
    """One measured collective kernel (``dur_ns`` includes waiting for peers on one rank)."""

    kind: str
    message_bytes: float
    ranks: int
    dur_ns: int
    rank: int
    event: int          # row in ``trace.events`` of the kernel


def _message_bytes(kind: str, dtype: str, in_nelems: float | None, out_nelems: float | None) -> float | None:
    esize = element_bytes(dtype)
    nelems = out_nelems if kind == "all_gather" and out_nelems is not None else in_nelems
    if esize is None or nelems is None:
        return None
    return float(nelems) * esize


def collective_points(trace: Trace) -> list[CollectivePoint]:
    """Every collective kernel of ``trace`` whose size, group size and dtype are recorded (on the
    kernel or on the CPU op with the same external id)."""
    ev = trace.events
    kernels = np.flatnonzero(ev["kind"].to_numpy() == int(EventKind.KERNEL))
    if len(kernels) == 0:
        return []
    coll = kernels[per_name(ev["name"], is_collective)[kernels]]
    if not len(coll):
        return []
    names = ev["name"].astype(str).to_numpy()
    ext = ev["external_id"].to_numpy()
    ranks = ev["rank"].to_numpy()
    # the CPU op that launched a kernel records the arguments when the kernel does not
    launched = set(zip(ranks[coll].tolist(), ext[coll].tolist()))
    ops = np.flatnonzero((ev["kind"].to_numpy() == int(EventKind.CPU_OP)) & (ext >= 0))
    ops = np.asarray([r for r, key in zip(ops.tolist(), zip(ranks[ops].tolist(), ext[ops].tolist()))
                      if key in launched], dtype=np.int64)
    rows = np.concatenate([coll, ops])  # arguments are read for these rows only (a job has millions)
    values = {arg: dict(zip(rows.tolist(), arg_column(ev, arg, rows).tolist()))
              for arg in (Arg.GROUP_SIZE, Arg.COLLECTIVE_NAME, Arg.DTYPE, Arg.IN_MSG_NELEMS, Arg.OUT_MSG_NELEMS)}
    group_size, coll_name, dtype = values[Arg.GROUP_SIZE], values[Arg.COLLECTIVE_NAME], values[Arg.DTYPE]
    in_nelems, out_nelems = values[Arg.IN_MSG_NELEMS], values[Arg.OUT_MSG_NELEMS]
    op_row = {(int(ranks[r]), int(ext[r])): r for r in ops.tolist() if group_size[r] is not None}
    out: list[CollectivePoint] = []
    dur = ev["dur_ns"].to_numpy()
    for k in coll.tolist():
        row = k if group_size[k] is not None else op_row.get((int(ranks[k]), int(ext[k])))
        if row is None:
            continue
        ck = collective_kind(coll_name[row] or None, names[k])
        kind = ck.value if ck is not None else None
        group = group_size[row]
        if kind is None or group < 1:
            continue
        nbytes = _message_bytes(kind, dtype[row], in_nelems[row], out_nelems[row])
        if nbytes is None or dur[k] <= 0:
            continue
        out.append(CollectivePoint(kind, nbytes, int(group), int(dur[k]), int(ranks[k]), int(k)))
    return out


def points_frame(points: list[CollectivePoint]) -> pd.DataFrame:
    """The points as a table (kind, message_bytes, ranks, dur_ns, rank, event)."""
    cols = ["kind", "message_bytes", "ranks", "dur_ns", "rank", "event"]
    return pd.DataFrame([[getattr(p, c) for c in cols] for p in points], columns=cols)


def fastest_per_size(points: list[CollectivePoint]) -> list[tuple[str, float, int, int]]:
    """``(kind, bytes, ranks, dur_ns)`` with the shortest duration per (kind, bytes, ranks): the
    occurrence that waited least for its peers (calibration input)."""
    best: dict[tuple[str, float, int], int] = {}
    for p in points:
        key = (p.kind, p.message_bytes, p.ranks)
        best[key] = min(best.get(key, p.dur_ns), p.dur_ns)
    return [(k, b, r, d) for (k, b, r), d in sorted(best.items())]
