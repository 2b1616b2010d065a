"""Communication as graph tasks: collectives inserted as ``COMM`` tasks on a communication stream.

A collective becomes one task on an ordered STREAM resource of its rank (NCCL runs each
communicator on its own stream), chained in program order with the other collectives of that
stream, with FLOW edges from the work that produces its input and to the work that consumes its
output. Its duration comes from the cost model in the transform context
(:meth:`whatif.transforms.base.CostModel.collective_time_ns`, i.e. NCCL's tuning model in
:mod:`whatif.hardware.collectives`, calibrated on the trace's own collective kernels when it
has some). Transforms here run on one device's trace and model **one representative rank**:
with symmetric parallelism every rank runs the same schedule, so the rank's step time is the
job's (the wait for the slowest peer is not modeled; a multi-rank trace keeps its measured skew
in the collectives it already has).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from whatif.depgraph.graph import EdgeKind, ResourceKind, TaskGraph, TaskKind
from whatif.depgraph.schema import DEVICE_COLUMN
from whatif.hardware.devices import find_device
from whatif.hardware.topology import preset
from whatif.tracer.measured_collectives import collective_points

from ..base import TransformContext, TransformError
from ..edit import NewEdges, add_resource, insert_many, new_task, set_duration, set_state
from ..optimizations.gpu import current_device


class OnTopology:
    """Mixin of the transforms whose collectives are priced on a topology preset, their
    ``topology`` parameter (a dataclass field each declares, so its place among the parameters
    stays the transform's own)."""

    topology: str

    def collective_topology(self) -> str | None:
        return self.topology

    def topology_gpu(self) -> str | None:
        """The catalog name of the preset's GPUs, whose links price the collectives inserted on
        it (None for a name that is not a preset: pricing refuses it with the presets' list)."""
        try:
            return preset(self.topology).device
        except ValueError:
            return None


KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast", "reduce")
_MESSAGE = re.compile(r"(" + "|".join(KINDS) + r") \(([\d.]+) MiB x(\d+)\)")   # how collectives are named


@dataclass(frozen=True)
class Collective:
    """One collective: ``kind``, ``message_bytes`` (the full buffer: the all-reduced tensor, the
    gathered output, the scattered input, everything a rank sends in an all-to-all), the number of
    ``ranks`` in the group, the ``topology`` preset (``whatif.hardware.topology``) and how many
    of the group's ranks share a machine (None: packed)."""

    kind: str
    message_bytes: float
    ranks: int
    topology: str
    ranks_per_machine: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise TransformError(f"unknown collective {self.kind!r} (known: {', '.join(KINDS)})")
        if self.ranks < 1 or self.message_bytes < 0:
            raise TransformError(f"a collective needs ranks >= 1 and bytes >= 0 (got {self.ranks}, "
                                 f"{self.message_bytes})")

    def time_ns(self, ctx: TransformContext, transform: str) -> int:
        """Predicted duration (ns) from the context's cost model."""
        if self.ranks == 1:
            return 0
        cost = ctx.require_cost(transform)
        return int(round(cost.collective_time_ns(self.kind, float(self.message_bytes), int(self.ranks),
                                                 self.topology, self.ranks_per_machine)))

    def label(self) -> str:
        return f"{self.kind} {self.message_bytes / 2**20:.2f} MiB x{self.ranks}"


def collective_messages(graph: TaskGraph, tasks: np.ndarray) -> list[tuple[str, float, int] | None]:
    """Per collective task: ``(kind, message bytes, ranks)`` — from its name where a transform wrote
    ``<kind> (<MiB> MiB x<ranks>)`` (the parallel transforms, ``detach_collectives``), else from the
    trace's record of its kernel (:func:`~whatif.tracer.measured_collectives.collective_points`);
    None where neither says."""
    t = graph.tasks
    names, events = t["name"].astype(str).to_numpy(), t["event"].to_numpy()
    points = None
    out: list[tuple[str, float, int] | None] = []
    for task in np.asarray(tasks, dtype=np.int64).tolist():
        m = _MESSAGE.search(str(names[task]))
        if m:
            out.append((m.group(1), float(m.group(2)) * 2**20, int(m.group(3))))
            continue
        if points is None:
            points = {p.event: p for p in collective_points(graph.trace)} if graph.trace is not None else {}
        point = points.get(int(events[task])) if events[task] >= 0 else None
        out.append((point.kind, point.message_bytes, point.ranks) if point is not None else None)
    return out


def collective_part_ns(ctx: TransformContext, transform: str, dur_ns: int,
                       message: tuple[str, float, int] | None, parts: int, topology: str) -> int:
    """ns of one of ``parts`` equal parts of a collective task of ``dur_ns`` carrying ``message``
    (:func:`collective_messages`): its duration × price(bytes/parts)/price(bytes) on ``topology``
    (each part pays the latency again); ``dur_ns / parts`` without a message."""
    if message is None:
        return dur_ns // parts
    kind, nbytes, ranks = message
    full = Collective(kind, nbytes, ranks, topology).time_ns(ctx, transform)
    part = Collective(kind, nbytes / parts, ranks, topology).time_ns(ctx, transform)
    return int(round(dur_ns * part / full)) if full > 0 else dur_ns // parts


def comm_sm_share(ctx: TransformContext, ctas: int) -> float:
    """Share of the recorded GPU's SMs a communication kernel of ``ctas`` thread blocks (one SM
    each) holds while it runs; 0 when the GPU is not in the catalog."""
    dev = find_device(ctx.device) if ctx.device else None
    return min(ctas / dev.sm_count, 1.0) if dev is not None and dev.sm_count else 0.0


def overlapped_compute_slowdown(share: float) -> float:
    """Factor on the time of compute that runs beside a communication kernel holding ``share`` of
    the SMs: ``1 / (1 − share)`` (the compute keeps the other SMs)."""
    if not 0 <= share < 1:
        raise TransformError(f"a communication kernel cannot hold {share:.0%} of the SMs and leave compute any")
    return 1.0 / (1.0 - share)


def comm_stream(graph: TaskGraph, rank: int, label: str) -> tuple[TaskGraph, int]:
    """The id of rank ``rank``'s stream named ``label`` (a new ordered STREAM resource when the
    graph has none), and the graph (a new one when a resource was added)."""
    res = graph.resources
    name = f"{label} (rank {rank})"
    hit = np.flatnonzero((res["name"].astype(str).to_numpy() == name) & (res["rank"].to_numpy() == rank)) \
        if len(res) else np.empty(0, np.int64)
    if len(hit):
        return graph, int(hit[0])
    device = res.loc[(res["rank"] == rank) & (res["kind"] == int(ResourceKind.STREAM)), "device"]
    return add_resource(graph, rank=rank, kind=ResourceKind.STREAM, name=name,
                        device=int(device.to_numpy()[0]) if len(device) else -1, reason=f"a stream for {label}")


def insert_tasks(graph: TaskGraph, *, resource: int, after: Sequence[int], before: Sequence[int],
                 dur_ns: Sequence[int], names: Sequence[str], reason: str,
                 kind: TaskKind = TaskKind.COMM, extra_after: Sequence[Sequence[int]] | None = None,
                 after_lat_ns: Sequence[int] | None = None, before_lat_ns: Sequence[int] | None = None,
                 priced_on: str | Sequence[str | None] | None = None,
                 ctx: TransformContext | None = None) -> tuple[TaskGraph, np.ndarray]:
    """Insert tasks in bulk on ``resource`` (an ordered stream), chained in the order given.

    Task ``i`` depends on ``after[i]`` (and on ``extra_after[i]``) and ``before[i]`` depends on it
    (FLOW edges; -1 for none), those two edges carrying ``after_lat_ns[i]`` and ``before_lat_ns[i]``
    (default 0); it inherits step, phase, layer, op and the GPU it is priced on from ``after[i]``.
    ``priced_on`` (one catalog name, or one per task) instead names the GPU whose links priced the
    new tasks. Collectives priced on a topology preset are priced on the preset's GPUs; with
    ``ctx``, when the graph's GPU is another (recorded so, or moved by ``gpu``), they are moved to
    it by the cost model's own ``move_to_device`` (the rule ``gpu`` applies to every collective:
    link ratio beyond the fixed latency), so the preset sets the machine (fabric, NICs, machines)
    and the GPU its links, and ``gpu`` before or after a parallel transform gives the same step.
    Returns the new graph and the new task ids (aligned with the inputs).
    """
    n_new = len(dur_ns)
    if n_new == 0:
        return graph, np.empty(0, dtype=np.int64)
    if not (len(after) == len(before) == len(names) == n_new):
        raise TransformError("after, before, dur_ns and names must have one entry per task")
    if (np.asarray(dur_ns) < 0).any():
        raise TransformError("inserted durations must be >= 0 ns")
    mine = new_task(np.arange(n_new, dtype=np.int64))
    a = np.asarray(after, dtype=np.int64)
    b = np.asarray(before, dtype=np.int64)
    a_lat = np.zeros(n_new, dtype=np.int64) if after_lat_ns is None else np.asarray(after_lat_ns, dtype=np.int64)
    b_lat = np.zeros(n_new, dtype=np.int64) if before_lat_ns is None else np.asarray(before_lat_ns, dtype=np.int64)
    src, dst = [a[a >= 0], mine[b >= 0]], [mine[a >= 0], b[b >= 0]]
    lat = [a_lat[a >= 0], b_lat[b >= 0]]
    if extra_after is not None:
        for i, deps in enumerate(extra_after):
            d = np.asarray([x for x in deps if x >= 0], dtype=np.int64)
            src.append(d)
            dst.append(np.full(len(d), mine[i]))
            lat.append(np.zeros(len(d), dtype=np.int64))
    # chain on the stream: after whatever the stream already holds, then in the given order
    on_res = np.flatnonzero(graph.tasks["resource"].to_numpy() == resource)
    chain = np.concatenate([on_res[-1:], mine])
    n_flow = sum(len(x) for x in src)
    edges = NewEdges(src=np.concatenate([*src, chain[:-1]]), dst=np.concatenate([*dst, chain[1:]]),
                     lat_ns=np.concatenate([*lat, np.zeros(len(chain) - 1, dtype=np.int64)]),
                     kind=np.r_[np.full(n_flow, int(EdgeKind.FLOW)), np.full(len(chain) - 1, int(EdgeKind.STREAM))])
    out, ids = insert_many(graph, kind=kind, resource=resource, dur_ns=dur_ns, names=names, attribute_from=a,
                           edges=edges, reason=reason)
    if priced_on is None:
        return out, ids
    shown = priced_on if isinstance(priced_on, str) else "their collectives' GPUs"
    out = set_state(out, ids, DEVICE_COLUMN, priced_on if isinstance(priced_on, str) else list(priced_on),
                    reason=f"priced on {shown}")
    if not isinstance(priced_on, str) or ctx is None:
        return out, ids
    here = current_device(out, find_device(ctx.device) if ctx.device else None)
    if here is None or here.name == priced_on:
        return out, ids
    moved = ctx.require_cost("collective pricing").move_to_device(out, ids, here.name)
    out = set_duration(out, ids, np.rint(moved).astype(np.int64),
                       reason=f"priced on {priced_on} links, the graph runs on {here.name}: by link ratio")
    return set_state(out, ids, DEVICE_COLUMN, here.name, reason=f"now on {here.name}"), ids


def next_on_resource(graph: TaskGraph, tasks: np.ndarray) -> np.ndarray:
    """Per task: the task after it on its ordered resource (its STREAM/THREAD successor), -1 when last."""
    e = graph.edges
    order = e[e["kind"].isin([int(EdgeKind.STREAM), int(EdgeKind.THREAD)])]
    succ = np.full(len(graph.tasks), -1, dtype=np.int64)
    succ[order["src"].to_numpy()] = order["dst"].to_numpy()
    return succ[np.asarray(tasks, dtype=np.int64)]
