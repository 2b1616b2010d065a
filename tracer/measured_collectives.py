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

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from whatif.core.dtypes import element_bytes
from whatif.core.errors import TraceError
from whatif.core.kernels import CollectiveKind, collective_kind, is_collective
from whatif.tracer.args import Arg, arg_columns
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
    categories, codes = ev["name"].cat.categories, ev["name"].cat.codes.to_numpy()
    ext = ev["external_id"].to_numpy()
    ranks = ev["rank"].to_numpy()
    # the CPU op that launched a kernel records the arguments when the kernel does not
    launched = set(zip(ranks[coll].tolist(), ext[coll].tolist()))
    ops = np.flatnonzero((ev["kind"].to_numpy() == int(EventKind.CPU_OP)) & np.isin(ext, ext[coll]) & (ext >= 0))
    ops = np.asarray([r for r, key in zip(ops.tolist(), zip(ranks[ops].tolist(), ext[ops].tolist()))
                      if key in launched], dtype=np.int64)
    rows = np.concatenate([coll, ops])  # arguments are read for these rows only (a job has millions)
    wanted = (Arg.GROUP_SIZE, Arg.COLLECTIVE_NAME, Arg.DTYPE, Arg.IN_MSG_NELEMS, Arg.OUT_MSG_NELEMS)
    values = {arg: dict(zip(rows.tolist(), column.tolist()))
              for arg, column in arg_columns(trace.args, wanted, rows).items()}
    group_size, coll_name, dtype = values[Arg.GROUP_SIZE], values[Arg.COLLECTIVE_NAME], values[Arg.DTYPE]
    in_nelems, out_nelems = values[Arg.IN_MSG_NELEMS], values[Arg.OUT_MSG_NELEMS]
    op_row = {(int(ranks[r]), int(ext[r])): r for r in ops.tolist() if group_size[r] is not None}
    out: list[CollectivePoint] = []
    dur = ev["dur_ns"].to_numpy()
    for k in coll.tolist():
        row = k if group_size[k] is not None else op_row.get((int(ranks[k]), int(ext[k])))
        if row is None:
            continue
        ck = collective_kind(coll_name[row] or None, str(categories[codes[k]]))
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


# nccl-tests program names (``<name>_perf``) -> the collective they time
_NCCL_TESTS_KINDS = {
    "all_reduce": CollectiveKind.ALL_REDUCE, "all_gather": CollectiveKind.ALL_GATHER,
    "reduce_scatter": CollectiveKind.REDUCE_SCATTER, "alltoall": CollectiveKind.ALL_TO_ALL,
    "sendrecv": CollectiveKind.SEND_RECV, "broadcast": CollectiveKind.BROADCAST,
    "reduce": CollectiveKind.REDUCE,
}
_PROGRAM = re.compile(r"\b(" + "|".join(sorted(_NCCL_TESTS_KINDS, key=len, reverse=True)) + r")_perf\b")
_RANK_LINE = re.compile(r"^#\s+Rank\s+(\d+)\b.*?\bon\s+(\S+)")


@dataclass(frozen=True)
class NcclTestsRun:
    """One nccl-tests run: what it timed and its (message bytes, out-of-place time) rows."""

    kind: CollectiveKind
    ranks: int
    ranks_per_node: int
    sizes_bytes: tuple[float, ...]
    times_ns: tuple[float, ...]

    def points(self) -> list[tuple[str, float, int, float, int]]:
        """``(kind, message_bytes, ranks, dur_ns, ranks_per_node)`` for
        :func:`whatif.hardware.collectives.calibrate`."""
        return [(self.kind.value, b, self.ranks, t, self.ranks_per_node)
                for b, t in zip(self.sizes_bytes, self.times_ns)]


def read_nccl_tests(path: str | Path, kind: CollectiveKind | str | None = None,
                    ranks: int | None = None) -> NcclTestsRun:
    """The rows of an nccl-tests output (``all_reduce_perf`` and friends, NVIDIA/nccl-tests).

    ``size`` is the full buffer in bytes (the gathered output for all-gather, as the cost model
    takes it); the time is the out-of-place column, µs. The collective comes from the program name
    in the output or the file name, else ``kind``; the ranks and nodes from its ``#  Rank`` lines
    (distinct hosts), else ``ranks`` on one node.

    Raises:
        TraceError: the file cannot be read, names no collective, lists no ranks, or holds no row.

    >>> import tempfile, os
    >>> text = ("# Collective test starting: all_reduce_perf\\n"
    ...         "#  Rank  0 Group  0 Pid 1 on node-a device  0 [0x07] NVIDIA A100-SXM4-80GB\\n"
    ...         "#  Rank  1 Group  0 Pid 2 on node-a device  1 [0x0b] NVIDIA A100-SXM4-80GB\\n"
    ...         "     1048576   262144  float  sum  -1   30.10  34.84  34.84  0   29.90  35.07  35.07  0\\n")
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = os.path.join(d, "out.txt"); _ = open(p, "w").write(text)
    ...     run = read_nccl_tests(p)
    >>> run.kind.value, run.ranks, run.ranks_per_node, run.points()[0][1], run.points()[0][3]
    ('all_reduce', 2, 2, 1048576.0, 30100.0)
    """
    path = Path(path)
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise TraceError(path, f"cannot read: {exc.strerror}") from None
    program = _PROGRAM.search(text) or _PROGRAM.search(path.name)
    if kind is not None:
        coll = CollectiveKind(kind)
    elif program is not None:
        coll = _NCCL_TESTS_KINDS[program.group(1)]
    else:
        raise TraceError(path, "names no nccl-tests program (all_reduce_perf, ...); pass the kind")
    hosts: dict[int, str] = {}
    sizes, times = [], []
    for line in text.splitlines():
        rank = _RANK_LINE.match(line)
        if rank:
            hosts[int(rank.group(1))] = rank.group(2)
            continue
        tok = line.split()
        if line.startswith("#") or len(tok) < 11 or not (tok[0].isdigit() and tok[1].isdigit()):
            continue
        try:
            time_us = float(tok[-8])
        except ValueError:
            continue
        if time_us > 0:
            sizes.append(float(tok[0]))
            times.append(time_us * 1e3)
    n = len(hosts) or ranks
    if not n:
        raise TraceError(path, "lists no ranks (no '#  Rank' lines); pass the number of ranks")
    if not sizes:
        raise TraceError(path, "holds no nccl-tests result row")
    nodes = len(set(hosts.values())) or 1
    return NcclTestsRun(coll, n, n // nodes, tuple(sizes), tuple(times))
