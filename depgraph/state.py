"""The builder's state, shared by its rules (``build.py``, ``syncs.py``, ``collectives.py``):
tasks being assembled, resource ids, and what the synchronization rules need. In a module of
its own so that the rules import it, not the builder."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from whatif.tracer.trace import Trace

from .graph import ResourceKind


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
        out: dict[str, np.ndarray | list[object]] = {}
        for key, part in self.parts.items():
            if key in ("phase", "layer", "op", "name"):
                out[key] = np.concatenate([np.asarray(p, dtype=object) for p in part]) if part else []
            else:
                out[key] = np.concatenate([np.asarray(p) for p in part]) if part else np.empty(0)
        return pd.DataFrame(out)


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


@dataclass
class SyncContext:
    """What the synchronization rules need from the builder."""

    trace: Trace
    tasks: pd.DataFrame
    call_ids: np.ndarray
    gpu_ids: np.ndarray
    launch_of: np.ndarray          # per task: its launching call task, -1
    prev_of: np.ndarray            # per GPU task: previous task on its stream, -1
    call_task_of_event: np.ndarray  # per event row: the call task it belongs to, -1
    start_m: np.ndarray
    end_m: np.ndarray
    dur: np.ndarray                # replay durations; sync rules shorten waiting calls
    blocking: list[tuple[int, int]]  # (copy task, WAIT task) of blocking copies
    report: Counter
