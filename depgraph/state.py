"""The builder's state: the tasks being built, the edges each rule returned, and what the rules
look up (launches, blocking copies, origins). In a module of its own so that the rules import it,
not the builder (:mod:`.build` runs :data:`.rules.RULES` over one :class:`BuildState`)."""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from whatif.tracer.trace import Trace

from .graph import EdgeKind, ResourceKind

_T = TypeVar("_T")


@dataclass
class TaskColumns:
    """Tasks being assembled, as lists of arrays appended group by group."""

    parts: dict[str, list[np.ndarray | list]] = field(default_factory=lambda: {k: [] for k in (
        "event", "kind", "resource", "rank", "dur_ns", "measured_start_ns", "measured_end_ns",
        "step", "phase", "layer", "op", "name", "tie")})
    size: int = 0

    def add(self, **cols: np.ndarray | list) -> np.ndarray:
        n = len(cols["event"])
        for key, part in self.parts.items():
            part.append(cols[key])
        ids = np.arange(self.size, self.size + n, dtype=np.int64)
        self.size += n
        return ids

    def frame(self) -> pd.DataFrame:
        """The tasks as one table; the text columns categorical (each text once, a small code per
        task: never one string per task). Consumes the parts: each column's are released once
        the column is made, so that the table is never held twice.

        >>> cols = TaskColumns()
        >>> _ = cols.add(**{k: [1] for k in cols.parts} | {"name": ["b"], "op": [None]})
        >>> _ = cols.add(**{k: [2] for k in cols.parts} | {"name": ["a"], "op": ["x"]})
        >>> t = cols.frame()
        >>> t["name"].tolist(), list(t["name"].cat.categories), t["op"].tolist(), t["event"].tolist()
        (['b', 'a'], ['a', 'b'], [nan, 'x'], [1, 2])
        """
        out: dict[str, np.ndarray | pd.Categorical] = {}
        for key in list(self.parts):
            part = self.parts.pop(key)
            if key in ("phase", "layer", "op", "name"):
                out[key] = _categorical(part)
            else:
                out[key] = np.concatenate([np.asarray(p) for p in part]) if part else np.empty(0)
            del part
        return pd.DataFrame(out, copy=False)


def _categorical(parts: list[np.ndarray | list]) -> pd.Categorical:
    """The texts (or None) of ``parts`` one after the other, as what ``pd.Categorical`` makes of
    them joined (categories sorted, their dtype inferred as pandas infers it), factorized part by
    part: no object array of the whole column."""
    index: dict[str, int] = {}
    coded = []
    for p in parts:
        codes, values = pd.factorize(np.asarray(p, dtype=object))
        lut = np.asarray([index.setdefault(v, len(index)) for v in values], dtype=np.int32)
        coded.append(np.where(codes >= 0, lut[np.maximum(codes, 0)] if len(lut) else -1, -1).astype(np.int32))
    texts = list(index)
    order = sorted(range(len(texts)), key=lambda i: texts[i])
    rank = np.empty(len(texts), dtype=np.int32)
    rank[order] = np.arange(len(texts), dtype=np.int32)
    codes = np.concatenate(coded) if coded else np.empty(0, dtype=np.int32)
    del coded
    codes = np.where(codes >= 0, rank[np.maximum(codes, 0)] if len(rank) else -1, -1)
    return pd.Categorical.from_codes(codes, categories=pd.Index([texts[i] for i in order]))


class Resources:
    """Resource ids by (rank, kind, device, key), created on first use in sorted order."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, int, int, str, bool]] = []
        self.ids: dict[tuple[int, int, int, int], int] = {}

    def get(self, rank: int, kind: ResourceKind, device: int, key: int, name: str, ordered: bool = True) -> int:
        k = (rank, int(kind), device, key)
        if k not in self.ids:
            self.ids[k] = len(self.rows)
            self.rows.append((rank, int(kind), device, key, name, ordered))
        return self.ids[k]

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=["rank", "kind", "device", "key", "name", "ordered"])


@dataclass(frozen=True)
class EdgeSet:
    """The edges one rule returns: all of one kind, ``lat_ns`` per edge."""

    kind: EdgeKind
    src: np.ndarray
    dst: np.ndarray
    lat_ns: np.ndarray

    @classmethod
    def of(cls, kind: EdgeKind, src: np.ndarray | list[int], dst: np.ndarray | list[int],
           lat_ns: np.ndarray | list[int]) -> EdgeSet:
        return cls(kind, np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64),
                   np.asarray(lat_ns, dtype=np.int64))

    @classmethod
    def empty(cls, kind: EdgeKind) -> EdgeSet:
        return cls.of(kind, [], [], [])

    def __len__(self) -> int:
        return len(self.src)


@dataclass(frozen=True)
class BlockingCopies:
    """Copy calls held by their copy (:func:`~.tasks.held_copies`): the call's own part ends at
    ``issue_end_ns``, and a WAIT task holds the rest of it, until ``waits_on`` is done."""

    copy: np.ndarray          # copy task ids
    wait: np.ndarray          # their WAIT task ids
    call: np.ndarray          # their call task ids
    issue_end_ns: np.ndarray  # when each call's own part ends (BlockingCallIssue moves it)
    waits_on: np.ndarray      # what each WAIT waits for: the copy, or the copy's predecessor on its stream


@dataclass(frozen=True)
class Arrivals:
    """Matched collectives split by :class:`~whatif.depgraph.rules.collectives.CollectiveSplit`:
    per member its ARRIVE task and its group's BARRIER task."""

    member: np.ndarray   # COMM task ids, group by group
    arrive: np.ndarray   # ARRIVE task per member
    barrier: np.ndarray  # BARRIER task per member (of its group)

    @classmethod
    def none(cls) -> Arrivals:
        empty = np.empty(0, dtype=np.int64)
        return cls(empty, empty, empty)


@dataclass(frozen=True)
class LocalCollectives:
    """What one build state applies of a :class:`~.rules.collectives.CollectivePlan` (all of it for a one-state
    build): per group it takes part in, its member task ids, the group's id in the plan, last
    arrival and barrier rank; the clock shifts of every rank."""

    members: list[np.ndarray]
    group: np.ndarray
    last_arrival_ns: np.ndarray
    barrier_rank: np.ndarray
    offsets_ns: dict[int, int]


@dataclass
class BuildState:
    """Everything the build steps read and write. Tasks are rows of ``tasks`` (the graph's task
    columns); edges are kept per rule, in the order the rules ran."""

    trace: Trace
    tasks: pd.DataFrame
    thread_tie: np.ndarray  # per task built from events: order among tasks starting together on a thread
    resources: Resources
    report: Counter[str]
    call_ids: np.ndarray            # CPU_CALL tasks (contiguous ids)
    gpu_ids: np.ndarray             # GPU work tasks
    cpu_ids: np.ndarray             # tasks on CPU threads (markers, calls, work, waits)
    begin_ids: np.ndarray           # step-begin markers
    end_ids: np.ndarray             # step-end markers, aligned with ``begin_ids``
    launch_of: np.ndarray           # per task: its launching call task, -1
    call_task_of_event: np.ndarray  # per event row: the call task it belongs to, -1
    blocking: BlockingCopies
    origin_of_rank: dict[int, int]
    edges: dict[type, EdgeSet] = field(default_factory=dict)  # by the class of the rule that returned them
    collective_plan: LocalCollectives | None = None  # given: this state's part of a job's plan (whatif.scale)
    collectives: LocalCollectives | None = None      # matched collectives (ClockAlignment)
    arrivals: Arrivals = field(default_factory=Arrivals.none)          # their split (CollectiveSplit)
    version: int = 0  # bumped by every column write, table or latency replacement: what :meth:`memo` keys by
    _memo: dict[str, tuple[int, Any]] = field(default_factory=dict, repr=False)

    def column(self, name: str) -> np.ndarray:
        return self.tasks[name].to_numpy()

    @property
    def start_ns(self) -> np.ndarray:
        return self.memo("start_ns", lambda: self.tasks["measured_start_ns"].to_numpy())

    @property
    def end_ns(self) -> np.ndarray:
        return self.memo("end_ns", lambda: self.tasks["measured_end_ns"].to_numpy())

    def set_column(self, name: str, ids: np.ndarray, values: np.ndarray | int) -> None:
        """``tasks[name][ids] = values``, on a copy of the column."""
        col = self.tasks[name].to_numpy().copy()
        col[ids] = values
        self.tasks[name] = col
        self._changed()

    def copy_rows(self, name: str, ids: np.ndarray, from_ids: np.ndarray) -> None:
        """``tasks[name][ids] = tasks[name][from_ids]``, on a copy of the column; a categorical
        column stays categorical (its codes copied: no object array of the column)."""
        col = self.tasks[name]
        if isinstance(col.dtype, pd.CategoricalDtype):
            codes = col.cat.codes.to_numpy().copy()
            codes[ids] = codes[from_ids]
            self.tasks[name] = pd.Categorical.from_codes(codes, dtype=col.dtype)
        else:
            values = col.to_numpy().copy()
            values[ids] = values[from_ids]
            self.tasks[name] = values
        self._changed()

    def _changed(self) -> None:
        """A column, the table or latencies changed: every memoized fact is stale, and dropped
        (a stale entry would hold the replaced columns alive until recomputed)."""
        self.version += 1
        self._memo.clear()

    def memo(self, key: str, compute: Callable[[], _T]) -> _T:
        """``compute()``, computed once while the task table is the same (no column written, no
        table replaced since): several rules read the same derived facts (launch timing, lookups)."""
        hit = self._memo.get(key)
        if hit is None or hit[0] != self.version:
            hit = self._memo[key] = (self.version, compute())
        return hit[1]

    def replace_tasks(self, tasks: pd.DataFrame) -> None:
        """A new task table (a rule that adds tasks)."""
        self.tasks = tasks
        self._changed()

    def set_latency(self, rule: type, lat_ns: np.ndarray) -> None:
        """Replace the latencies of the edges ``rule`` returned."""
        self.edges[rule] = replace(self.edges[rule], lat_ns=np.asarray(lat_ns, dtype=np.int64))
        self._changed()

    def all_edges(self) -> pd.DataFrame:
        """Every rule's edges, in the order the rules ran."""
        sets = list(self.edges.values()) or [EdgeSet.empty(EdgeKind.ANCHOR)]
        return pd.DataFrame({
            "src": np.concatenate([s.src for s in sets]),
            "dst": np.concatenate([s.dst for s in sets]),
            "lat_ns": np.concatenate([s.lat_ns for s in sets]),
            "kind": np.concatenate([np.full(len(s), int(s.kind), dtype=np.int8) for s in sets]),
        })
