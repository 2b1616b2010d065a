"""Large multi-rank jobs made from one real rank's trace, for tests and benches (issue 15 item 6).

:func:`generate_job` writes N Kineto files, named as ``whatif record`` names a rank's trace, that a folder loader
reads as one job: every rank runs the source rank's events, with

* **jitter**: before each collective, each rank arrives late by an exponential delay of mean
  ``jitter_ns`` (its CPU work and kernels since the previous collective are shifted by it);
* **stragglers**: ranks that arrive a fixed ``stragglers[rank]`` ns later still, at every collective;
* **consistent collectives**: the k-th collective kernel starts at each rank's arrival and ends on
  every rank at the same true instant, the last arrival + the source kernel's duration, and
  everything after it on a rank moves with that end (as NCCL would hold it);
* **independent clocks**: each rank's timestamps are offset by a uniform draw in
  ``±clock_skew_ns`` (rank 0 keeps its clock), as separate hosts' profilers record them.

The collective arguments are rewritten for the whole job (``Group size`` N, ``Process Group
Ranks`` 0..N-1) and ``distributedInfo`` says the rank and world size. The same seed gives the same
bytes, written as ``whatif record`` writes a trace (``distributedInfo`` first, spelled so that
HolisticTraceAnalysis finds each file's rank). The :class:`JobPlan` returned says what was
injected, so a test can check that an analysis recovers it (the straggler, the skew of every call,
the clock offsets).

>>> plan = generate_job("../shared/traces/hta/nccl_data_a100_rank0of2.json.gz", "job/", ranks=8,
...                     stragglers={5: 200_000})      # doctest: +SKIP
>>> plan.arrival_delay_ns.shape                         # doctest: +SKIP
(8, 21)
"""
from __future__ import annotations

import copy
import gzip
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from whatif.core.bounds import check_fields
from whatif.core.errors import TraceError
from whatif.core.kernels import is_collective
from whatif.core.limits import MAX_RANK
from whatif.core.output import write_output
from whatif.tracer.kinds import EventKind, kind_of
from whatif.tracer.kineto import kineto_json, read_bytes
from whatif.tracer.record.trace_file import trace_file_name

__all__ = ["JobOptions", "JobPlan", "generate_job"]

_GROUP_ARGS = ("Group size", "Process Group Ranks")


@dataclass(frozen=True)
class JobOptions:
    ranks: int = field(default=8, metadata={"minimum": 2, "maximum": MAX_RANK, "help": "ranks in the job"})
    jitter_ns: int = field(default=20_000, metadata={
        "minimum": 0, "help": "mean of each rank's exponential arrival delay before every collective"})
    clock_skew_ns: int = field(default=5_000_000, metadata={
        "minimum": 0, "help": "each rank's clock is offset by a uniform draw within +- this (rank 0: none)"})
    seed: int = field(default=0, metadata={"minimum": 0, "maximum": 2**32 - 1, "help": "random seed"})

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class JobPlan:
    """What :func:`generate_job` injected: per rank and collective (in the source's time order) the
    arrival delay (jitter + straggler), per rank its clock offset, and the files written."""

    files: list[Path]
    arrival_delay_ns: np.ndarray   # (ranks, collectives) int64
    clock_offset_ns: np.ndarray    # (ranks,) int64
    collective_names: list[str]

    def skew_ns(self, k: int) -> int:
        """The skew of the k-th collective: latest arrival delay - earliest."""
        column = self.arrival_delay_ns[:, k]
        return int(column.max() - column.min())


def _collectives(events: list[dict[str, Any]]) -> list[int]:
    """Indices of the collective kernels, in start order."""
    found = [i for i, e in enumerate(events)
             if isinstance(e, dict) and e.get("ph") == "X" and kind_of(str(e.get("cat", ""))) is EventKind.KERNEL
             and is_collective(str(e.get("name", ""))) and isinstance(e.get("ts"), (int, float))]
    return sorted(found, key=lambda i: (float(events[i]["ts"]), i))


def _ns(us: float) -> int:
    return int(round(float(us) * 1000))


def _us(ns: int) -> float:
    return ns / 1000


def generate_job(source: str | Path, out_dir: str | Path, options: JobOptions = JobOptions(),
                 stragglers: dict[int, int] | None = None) -> JobPlan:
    """Write ``options.ranks`` rank files made from the trace ``source`` into ``out_dir``.

    Parameters
    ----------
    source : one rank's Kineto trace (``.json`` or ``.json.gz``) with collective kernels.
    out_dir : the job's folder (made if needed).
    options : ranks, jitter, clock skew, seed (:class:`JobOptions`).
    stragglers : rank -> ns it arrives late at every collective, on top of the jitter.

    Raises
    ------
    TraceError : the source is not a trace or has no collective kernel.
    """
    source, out = Path(source), Path(out_dir)
    doc = orjson.loads(read_bytes(source))
    events = doc.get("traceEvents") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise TraceError(source, "not a Kineto trace (no traceEvents list)")
    colls = _collectives(events)
    if not colls:
        raise TraceError(source, "no collective kernel (NCCL/RCCL) to build a job around")
    n, k = options.ranks, len(colls)
    rng = np.random.default_rng(options.seed)
    delay = np.rint(rng.exponential(options.jitter_ns, size=(n, k))).astype(np.int64) if options.jitter_ns else \
        np.zeros((n, k), dtype=np.int64)
    for rank, extra in (stragglers or {}).items():
        if not 0 <= rank < n:
            raise ValueError(f"straggler rank {rank} is not in 0..{n - 1}")
        delay[rank] += int(extra)
    clock = np.rint(rng.uniform(-options.clock_skew_ns, options.clock_skew_ns, size=n)).astype(np.int64)
    clock[0] = 0
    start = np.asarray([_ns(events[i]["ts"]) for i in colls], dtype=np.int64)
    end = start + np.asarray([_ns(events[i].get("dur", 0)) for i in colls], dtype=np.int64)
    # Per rank, the shift before collective j (S_{j-1} + delay_j) and the common end of each collective.
    shift_before = np.zeros((n, k), dtype=np.int64)
    shift_after = np.zeros(n, dtype=np.int64)
    common_end = np.zeros(k, dtype=np.int64)
    for j in range(k):
        shift_before[:, j] = shift_after + delay[:, j]
        common_end[j] = int((start[j] + shift_before[:, j]).max()) + int(end[j] - start[j])
        shift_after = np.full(n, common_end[j] - end[j], dtype=np.int64)
    files = [_write_rank(doc, events, colls, r, n, shift_before[r], common_end, end, int(clock[r]), out)
             for r in range(n)]
    return JobPlan(files=files, arrival_delay_ns=delay, clock_offset_ns=clock,
                   collective_names=[str(events[i].get("name", "")) for i in colls])


def _write_rank(doc: dict[str, Any], events: list[Any], colls: list[int], rank: int, ranks: int,
                shift_before: np.ndarray, common_end: np.ndarray, coll_end: np.ndarray, clock_ns: int,
                out: Path) -> Path:
    """One rank's file: every timed event shifted by the shift of the segment it starts in (the
    collective it precedes), collective kernels stretched to the common end, the clock offset added."""
    final = int(common_end[-1] - coll_end[-1])
    coll_set = {i: j for j, i in enumerate(colls)}
    ranks_text = "[" + ", ".join(str(r) for r in range(ranks)) + "]"
    new_events = []
    for i, e in enumerate(events):
        if not isinstance(e, dict) or not isinstance(e.get("ts"), (int, float)):
            new_events.append(e)
            continue
        e = dict(e)
        t = _ns(e["ts"])
        j = coll_set.get(i)
        if j is not None:
            begin = t + int(shift_before[j])
            e["ts"] = _us(begin + clock_ns)
            e["dur"] = _us(int(common_end[j]) - begin)
        else:
            seg = int(np.searchsorted(coll_end, t, side="left"))
            e["ts"] = _us(t + (int(shift_before[seg]) if seg < len(colls) else final) + clock_ns)
        args = e.get("args")
        if isinstance(args, dict) and any(a in args for a in _GROUP_ARGS):
            args = dict(args)
            args["Group size"] = ranks
            args["Process Group Ranks"] = ranks_text
            e["args"] = args
        new_events.append(e)
    rank_doc = {key: value for key, value in doc.items() if key != "traceEvents"}
    source_info = rank_doc.get("distributedInfo")
    info: dict[str, Any] = copy.deepcopy(source_info) if isinstance(source_info, dict) else {}
    info.update({"rank": rank, "world_size": ranks})
    info.pop("pg_config", None)  # the source's process groups no longer describe the job
    rank_doc["distributedInfo"] = info
    rank_doc["traceEvents"] = new_events
    path = out / trace_file_name(rank)
    return write_output(path, gzip.compress(kineto_json(rank_doc), compresslevel=1, mtime=0))
