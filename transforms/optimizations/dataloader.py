"""``dataloader``: PyTorch DataLoader worker processes (``num_workers=N``).

Model (sources: the PyTorch ``torch.utils.data`` docs, "Single- and Multi-process Data Loading"
and the ``DataLoader`` parameters ``num_workers`` and ``prefetch_factor``; the method is
Daydream's (Zhu et al., USENIX ATC 2020): data loading is CPU work on the training thread, and
the optimization is a graph edit (Insert on new threads, Schedule edges) that the replay prices):

* In a ``num_workers=0`` trace each batch is loaded inside the training thread, inside one
  ``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__`` range per step (its dataset
  ``__getitem__`` calls, transforms, collation and ``pin_memory`` are nested in it). Where that
  range holds no recorded op (PyTorch 1.8-era traces) it is one ``CPU_WORK`` task of duration
  ``L_b``, ns. Where it holds ops (``aten::tensor``, ``aten::stack``, ``aten::pin_memory``...
  with the dataset's Python time as gaps between them, as PyTorch 2.x records it) those tasks
  are first fused into one task spanning the first to the last of them
  (:func:`fold_loader_ranges`), so the load is again one task; the GPU harvest's pair 5
  (``sample_traces/gpu/pairs/p5_dataloader-*``) is such a trace.
* With ``workers=N``, batch ``b`` is loaded by worker ``b mod N`` (PyTorch's round-robin
  ``_worker_queue_idx_cycle``) on its own ordered CPU resource, one batch after another, taking
  ``L_b · load_scale`` (``load_scale`` > 1 models workers contending for cores or memory
  bandwidth; default 1: each worker as fast as the in-thread loader was).
* Prefetch window: PyTorch keeps at most ``prefetch_factor · N`` batches requested ahead of the
  consumer, so the load of batch ``b`` may start only once batch ``b − N·prefetch_factor`` was
  consumed (a FLOW edge from that batch's fetch).
* The training thread's ``__next__`` becomes a fetch: it waits (FLOW edge) for batch ``b``'s load
  to end, then takes ``fetch_us``: a queue get, unpickling, and rebuilding each tensor from the
  shared-memory handle the worker sent (torch.multiprocessing moves tensors put on a queue to
  shared memory and sends only a handle; with the Linux ``file_descriptor`` strategy each
  storage's descriptor is passed over a Unix socket, then mapped). :data:`DEFAULT_FETCH_US`
  = 1 ms is our order-of-magnitude estimate of that hand-over for a batch of two tensors on an
  idle host (two descriptor passes and mmaps, a pipe read, unpickling); it is not read from any
  trace. It is host-dependent: ``python bench/whatif_dataloader.py --measure-fetch`` times it with
  torch on the local machine (4.7–17 ms on our loaded 2-core VM). On the ResNet50 pair it does not
  matter: the training thread waits for the GPU at the batch's H2D copy right after ``__next__``,
  so even 5 ms only moves the first step.
* ``warm=True`` (default): the trace window is mid-epoch (a profiler schedule skips the first
  steps), so the worker queues are full at the window's start: the first ``N·prefetch_factor``
  batches of the window were loaded before it and get no load task. ``warm=False`` models an
  iterator created just before the window's first ``__next__`` (epoch start): every worker starts
  then and the first fetch waits a whole load.

The replay, not this module, then yields the steady state: step ≈ max(training-thread critical
path, L / N) (data-bound when the workers cannot keep up). Loading tasks are grouped per
(rank, thread), each group with its own N workers (one DataLoader per rank).

``workers=0`` is refused: it is in-thread loading, which is what a ``num_workers=0`` trace
already shows. A trace whose loader already uses workers (``_MultiProcessingDataLoaderIter``)
is refused too: its ``__next__`` holds only the fetch, the load time is not in the trace.

>>> DataLoaderWorkers(workers=4).label()
'dataloader(workers=4, prefetch_factor=2, load_scale=1.0, warm=True)'
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from whatif.core import limits
from whatif.depgraph.graph import EdgeKind, ResourceKind, TaskGraph, TaskKind
from whatif.tracer.trace import name_texts, per_name

from ..base import Transform, TransformContext, TransformError
from ..edit import (
    add_edges,
    add_resource,
    duplicate,
    fuse,
    move,
    reclassify,
    remove_edges,
    rename,
    scale,
    set_duration,
)
from ..registry import register
from ..select import Selector

DEFAULT_FETCH_US = 1000.0
"""Training-thread cost of taking one ready batch from a worker (µs); see the module docstring."""
DEFAULT_SELECT = Selector(kind="cpu_work", name="DataLoader")
MULTIPROCESS_MARK = "_MultiProcessingDataLoaderIter"


def fold_loader_ranges(graph: TaskGraph, *, reason: str) -> TaskGraph:
    """Fuse the tasks recorded inside each single-process ``__next__`` range into one task.

    PyTorch 2.x records the dataset's ops (``aten::tensor``, ``aten::stack``,
    ``aten::pin_memory``...) inside ``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__``,
    so the range is no task of its own: its time is those tasks plus the Python time between them
    (the thread-order gaps). For each such range (a CPU event of the trace whose name holds
    ``DataLoader``), the tasks of its thread that start and end inside it become one ``CPU_WORK``
    task named like the range, spanning the first task's start to the last task's end; the gap
    before the first and after the last stay edge latencies. Launch and other edges of the members
    stay on the fused task. Ranges holding fewer than two tasks are left as they are; a graph
    without its trace is returned unchanged.
    """
    trace = graph.trace
    if trace is None or not len(graph.tasks):
        return graph
    ev = trace.events
    names = name_texts(ev["name"])
    cpu_ranges = np.flatnonzero(per_name(ev["name"], lambda n: "DataLoader" in n)
                                & (ev["device"].to_numpy() < 0) & (ev["dur_ns"].to_numpy() > 0))
    if not len(cpu_ranges):
        return graph
    t = graph.tasks
    event = t["event"].to_numpy()
    real = event >= 0
    kind = t["kind"].to_numpy()
    cpu = real & np.isin(kind, (int(TaskKind.CPU_CALL), int(TaskKind.CPU_WORK)))
    pid = np.full(len(t), -1, np.int64)
    tid = np.full(len(t), -1, np.int64)
    pid[cpu] = ev["pid"].to_numpy()[event[cpu]]
    tid[cpu] = ev["tid"].to_numpy()[event[cpu]]
    rank = t["rank"].to_numpy()
    start, end = t["measured_start_ns"].to_numpy(), t["measured_end_ns"].to_numpy()
    ids: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    spans: list[int] = []
    range_names: list[str] = []
    taken = np.zeros(len(t), dtype=bool)
    threads: dict[tuple[int, int, int], np.ndarray] = {}  # (rank, pid, tid) -> CPU tasks by start
    cpu_ids = np.flatnonzero(cpu)
    for key, group in pd.DataFrame({"rank": rank[cpu_ids], "pid": pid[cpu_ids], "tid": tid[cpu_ids],
                                    "id": cpu_ids}).groupby(["rank", "pid", "tid"]):
        members = group["id"].to_numpy()
        threads[(int(key[0]), int(key[1]), int(key[2]))] = members[np.argsort(start[members], kind="stable")]
    ev_rank, ev_pid, ev_tid = ev["rank"].to_numpy(), ev["pid"].to_numpy(), ev["tid"].to_numpy()
    ev_ts, ev_dur = ev["ts_ns"].to_numpy(), ev["dur_ns"].to_numpy()
    for r in cpu_ranges.tolist():
        on_thread = threads.get((int(ev_rank[r]), int(ev_pid[r]), int(ev_tid[r])))
        if on_thread is None:
            continue
        lo, hi = np.searchsorted(start[on_thread], [ev_ts[r], ev_ts[r] + ev_dur[r]], side="left")
        inside = on_thread[lo:hi]
        inside = inside[(end[inside] <= ev_ts[r] + ev_dur[r]) & ~taken[inside]]
        if len(inside) < 2:
            continue
        taken[inside] = True
        ids.append(np.sort(inside))
        labels.append(np.full(len(inside), len(spans)))
        spans.append(int(end[inside].max() - start[inside].min()))
        range_names.append(str(names[r]))
    if not ids:
        return graph
    members, groups = np.concatenate(ids), np.concatenate(labels)
    heads = np.asarray([g.min() for g in ids], dtype=np.int64)
    gone = np.sort(np.setdiff1d(members, heads))
    out = fuse(graph, members, np.asarray(spans, dtype=np.int64), name=range_names, drop_launches=False,
               groups=groups, reason=reason, transform=DataLoaderWorkers.name)
    new_heads = heads - np.searchsorted(gone, heads)  # fuse removes the other members and renumbers
    return reclassify(out, new_heads, TaskKind.CPU_WORK, reason=reason, transform=DataLoaderWorkers.name)


@register
@dataclass
class DataLoaderWorkers(Transform):
    name = "dataloader"
    description = "DataLoader worker processes: batch loading leaves the training thread (workers=N)"

    @classmethod
    def candidates(cls, graph: TaskGraph, ctx: TransformContext) -> list[Transform]:
        """2, 4 and 8 workers (PyTorch's common settings); a trace with no loading refuses them."""
        return [cls(workers=n) for n in (2, 4, 8)]

    workers: int = field(metadata={
        "minimum": 1, "maximum": limits.MAX_PARTS,
        "help": "number of worker processes (PyTorch num_workers; 0 is loading in the training thread, which is "
                "what a num_workers=0 trace shows)"})
    prefetch_factor: int = field(default=2, metadata={
        "minimum": 1, "help": "batches each worker loads ahead (PyTorch default 2)",
        "maximum": limits.MAX_PARTS})
    fetch_us: float | None = field(default=None, metadata={"minimum": 0,
        "help": f"training-thread time to take a ready batch from a worker, µs (default {DEFAULT_FETCH_US:g})"})
    load_scale: float = field(default=1.0, metadata={"exclusive_minimum": 0,
        "help": "multiplier on each batch's load time on a worker (> 1: workers contend for CPU)"})
    warm: bool = field(default=True, metadata={
        "help": "the window is mid-epoch: its first workers*prefetch_factor batches were loaded before it"})
    select: Selector | None = field(default=None, metadata={
        "help": "the loading tasks, one per batch (default: CPU work named like DataLoader)"})

    def match(self, graph: TaskGraph, ctx: TransformContext) -> np.ndarray:
        """The per-batch loading tasks (sorted ids); raises :class:`TransformError` when none."""
        sel = self.select or DEFAULT_SELECT
        ids = sel(graph)
        names = name_texts(graph.tasks["name"], ids)
        multi = per_name(graph.tasks["name"], lambda n: MULTIPROCESS_MARK in n)[ids]
        if multi.any():
            raise TransformError(f"dataloader: {int(multi.sum())} selected tasks are {names[multi][0]!r}: this "
                                 "trace's DataLoader already uses worker processes, so its load time is not in "
                                 "the trace (only the fetch); record with num_workers=0")
        if len(ids) == 0:
            what = repr(sel) if self.select else (f"{sel!r}, i.e. CPU work named like "
                                                  "'enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__'")
            raise TransformError(f"dataloader: no data-loading task in this trace (looked for {what}); pass select= "
                                 "to name the loading op")
        return ids

    def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
        if self.select is None:
            graph = fold_loader_ranges(graph, reason=f"{self.label()}: one load task per batch")
        loads = self.match(graph, ctx)
        t = graph.tasks
        n_workers, window = self.workers, self.workers * self.prefetch_factor
        fetch_ns = round((DEFAULT_FETCH_US if self.fetch_us is None else self.fetch_us) * 1000)
        why = self.label()
        start = t["measured_start_ns"].to_numpy()
        res = t["resource"].to_numpy()
        rank = t["rank"].to_numpy()

        # Batches per loading thread, in measured order; which batches get a worker load task.
        groups: list[np.ndarray] = []
        for r in np.unique(res[loads]).tolist():
            g = loads[res[loads] == r]
            groups.append(g[np.argsort(start[g], kind="stable")])
        first_loaded = window if self.warm else 0
        out = graph.copy()
        plan: list[tuple[np.ndarray, np.ndarray, int]] = []  # (batches with a load, their worker, group)
        for gi, g in enumerate(groups):
            b = np.arange(first_loaded, len(g))
            plan.append((g[b], b % n_workers, gi))
        used = sorted({(gi, int(w)) for _, ws, gi in plan for w in np.unique(ws).tolist()})
        res_of: dict[tuple[int, int], int] = {}
        for gi, w in used:
            thread = int(res[groups[gi][0]])
            out, res_of[(gi, w)] = add_resource(
                out, rank=int(rank[groups[gi][0]]), kind=ResourceKind.THREAD,
                name=f"DataLoader worker {w} of {out.resources['name'].iat[thread]} (modeled)",
                reason=f"{why}: a worker process")

        to_load = np.concatenate([p[0] for p in plan]) if plan else np.empty(0, np.int64)
        if len(to_load):
            # Worker copies of the loads: same duration and step (the consumer's), no inherited edges.
            out, copies = duplicate(out, to_load, measured=False, reason=f"{why}: a worker loads each batch")
            copy_of = dict(zip(np.sort(to_load).tolist(), copies.tolist()))
            out = remove_edges(out, np.isin(out.edges["dst"].to_numpy(), copies),
                               reason=f"{why}: worker loads depend only on the prefetch window")
            for (gi, w), r in res_of.items():
                batch_ids, ws, _ = plan[gi]
                mine = np.asarray([copy_of[int(x)] for x in batch_ids[ws == w]], dtype=np.int64)
                out = move(out, mine, r, reason=f"{why}: batches b with b mod {n_workers} = {w}")
            if self.load_scale != 1.0:
                out = scale(out, copies, self.load_scale, reason=f"{why}: worker contention")
            src, dst = [], []
            for g in groups:
                pos = {int(x): i for i, x in enumerate(g.tolist())}
                for x in g[first_loaded:].tolist():
                    load, batch = copy_of[x], pos[x]
                    src.append(load)  # fetch of batch waits for its load
                    dst.append(x)
                    if batch >= window:  # its load starts once batch - N*prefetch_factor was consumed
                        src.append(int(g[batch - window]))
                        dst.append(load)
            out = add_edges(out, src, dst, 0, EdgeKind.FLOW, reason=f"{why}: fetch waits for its load; prefetch "
                            f"window of {window} batches")
            if not self.warm:
                out = self._cold_start(out, groups, copy_of, window, why)
            pos_in = {int(x): i for g in groups for i, x in enumerate(g.tolist())}
            inv = {c: o for o, c in copy_of.items()}
            out = rename(out, copies, [f"load batch {pos_in[inv[int(c)]]} (modeled DataLoader worker)"
                                       for c in copies.tolist()], reason=f"{why}: worker loads")

        out = rename(out, loads, f"enumerate(DataLoader){MULTIPROCESS_MARK}.__next__ (modeled fetch)",
                     reason=f"{why}: fetches")
        prefetched = sum(min(window, len(g)) for g in groups) if self.warm else 0
        return set_duration(out, loads, fetch_ns,
                            reason=f"{why}: move batch loading to {n_workers} worker processes per loader "
                                   f"({len(to_load)} loads on workers, {prefetched} prefetched before the window); "
                                   f"__next__ only takes a ready batch from a worker")

    def _cold_start(self, out: TaskGraph, groups: list[np.ndarray], copy_of: dict[int, int], window: int,
                    why: str) -> TaskGraph:
        """The iterator is created just before the first ``__next__``: the first prefetch window's loads
        start then (after that task's thread predecessor, or at its measured offset from the rank's origin)."""
        e = out.edges
        order = e[(e["kind"] == int(EdgeKind.THREAD)).to_numpy()]
        pred = dict(zip(order["dst"].tolist(), order["src"].tolist()))
        kinds = out.tasks["kind"].to_numpy()
        ranks = out.tasks["rank"].to_numpy()
        m_start = out.tasks["measured_start_ns"].to_numpy()
        flow: tuple[list[int], list[int]] = ([], [])
        anchor: tuple[list[int], list[int], list[int]] = ([], [], [])
        for g in groups:
            first = int(g[0])
            heads = [copy_of[int(x)] for x in g[:window].tolist()]
            if first in pred:
                flow[0].extend([pred[first]] * len(heads))
                flow[1].extend(heads)
            else:
                origin = int(np.flatnonzero((kinds == int(TaskKind.ORIGIN)) & (ranks == ranks[first]))[0])
                anchor[0].extend([origin] * len(heads))
                anchor[1].extend(heads)
                anchor[2].extend([int(m_start[first] - m_start[origin])] * len(heads))
        if flow[0]:
            out = add_edges(out, flow[0], flow[1], 0, EdgeKind.FLOW, reason=f"{why}: iterator created before the "
                            "first __next__; every worker starts loading")
        if anchor[0]:
            out = add_edges(out, anchor[0], anchor[1], anchor[2], EdgeKind.ANCHOR, reason=f"{why}: iterator created "
                            "at the first __next__")
        return out
