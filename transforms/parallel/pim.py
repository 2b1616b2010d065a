"""``pim_offload``: move memory-bound kernels (decode GEMV, decode attention) to HBM-PIM units.

Model (DCC, arXiv 2511.15503; AttAcc, ASPLOS 2024; device numbers in
:mod:`whatif.hardware.pim`, from the leaf hardware package):

* **Candidates**: kernels of class ``gemm``/``attention`` with recorded shapes whose arithmetic
  intensity ``I = FLOPs / DRAM bytes`` (``CostModel.kernel_facts``) is at most ``max_intensity``
  (decode GEMV at batch b has I ≈ b; prefill GEMMs have hundreds). Each kernel's *resident*
  operand R (the weight of a GEMM, the KV cache of attention) stays in PIM memory; its input
  activation X and output Y move.
* **Partitioning** of a kernel over the U units of a level L (bank / bank group / buffer die):
  ``row`` — output rows bank-local (what PIM wants): no cross-unit reduction, but the operand must
  be rearranged out of the host's interleaved layout, ``(1 − 1/U)·R`` bytes each time the host
  rewrites it (weights: once at load, amortized over ``weight_reuse`` steps or reported as setup;
  KV cache: the new tokens, ``R / kv_tokens`` per step); the GPU's input must be broadcast to the
  row units (X rearranged) and the output gathered back (Y rearranged). ``col`` — the reduction
  dimension split across units exactly as the host interleaves it (no operand rearrangement), but
  every unit leaves partial sums of the whole output: ``U·Y`` in fp32 reduced on the buffer die.
* **Time**: PIM compute ``max(F/(0.85·P_L), R/(0.81·BW_L))`` + a command overhead; GPU↔PIM link
  transfers ``X/B_link`` and ``Y/B_link`` (+1 µs; ``B_link`` per direction, each direction its own
  resource) when the neighbouring kernel runs on the other side; rearrangement
  ``2·bytes/(0.81·BW_ext)`` (read + write through the buffer die).
* **Interdependence** (DCC's point): the previous kernel on the stream is taken as the producer of
  a kernel's input. A row-partitioned kernel followed by a col-partitioned one on PIM needs no
  movement at all (one's row split *is* the other's reduction split); any other hand-over between
  PIM kernels rearranges Y; a hand-over between GPU and PIM crosses the link. So whether to
  offload a kernel and how to partition it depend on its neighbours' choices: :func:`search_pim`
  solves all of them jointly and exactly (dynamic programming along each stream over the states
  gpu / row / col, per level) and compares with choosing offload first and partitioning after.

**Capacity**: the resident operands of the kernels offloaded in one step must fit the stacks
(``PimDevice.capacity_bytes``), else the plan is refused naming the overflow.

The transform moves the chosen kernels to a PIM resource and inserts the rearrangement, reduction
and link-transfer tasks with their dependencies, so the replay overlaps PIM and GPU work where the
dependencies allow. Resources are **shared** (``ordered=False``, served in ready order): the PIM
units and the link are devices that any stream's commands reach, one at a time — a kernel
partitioned over all units occupies all of them — and their order is set by readiness, not by
one stream's program order.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from whatif.core.dtypes import element_bytes
from whatif.core.kernels import KernelClass
from whatif.core.work import output_shares
from whatif.depgraph.graph import EdgeKind, ResourceKind, TaskGraph, TaskKind
from whatif.hardware.pim import PIM_DEVICES, PimDevice, get_pim
from whatif.tracer.args import Arg

from ..base import Transform, TransformContext, TransformError
from ..edit import (
    NewEdges,
    add_edges,
    add_resource,
    insert_many,
    move,
    new_task,
    remove_edges,
    set_duration,
)
from ..placement import Placement
from ..registry import register
from .layers import gemm_io_bytes, linked_op_rows

STATES = ("gpu", "row", "col")
ACC_BYTES = 4.0     # partial sums accumulate in fp32
ELEM_BYTES = 2.0    # activations taken as 16-bit when counting output elements
NAME = "pim_offload"


# ---------------------------------------------------------------------------------------------
# facts

def pim_device(name: str, link: str | None = None, power_limited: bool = True) -> PimDevice:
    """The PIM device ``name`` of :mod:`whatif.hardware.pim`, on GPU link ``link`` when given, within
    HBM's power budget or not."""
    try:
        dev = get_pim(name).with_power_limit(power_limited)
        return dev.with_link(link) if link else dev
    except (KeyError, ValueError) as exc:
        raise TransformError(f"pim_offload: {exc.args[0]} (devices: {', '.join(PIM_DEVICES)})") from None

def _attention_io(graph: TaskGraph, tasks: np.ndarray) -> np.ndarray:
    """Per attention task: bytes of its query (= its output), from the launching op's first input
    dims times its share after a split (tensor parallelism's heads); NaN when not recorded."""
    out = np.full(len(tasks), np.nan)
    rows = linked_op_rows(graph, tasks)
    if graph.trace is None:
        return out
    all_dims, all_types = graph.trace.arg(Arg.INPUT_DIMS), graph.trace.arg(Arg.INPUT_TYPES)
    for i, r in enumerate(rows):
        if np.isnan(r):
            continue
        dims, types = all_dims[int(r)], all_types[int(r)]
        if isinstance(dims, list) and dims and isinstance(dims[0], list) and dims[0]:
            out[i] = float(np.prod(dims[0])) * (element_bytes(types[0] if types else None) or 2.0)
    return out * output_shares(graph.tasks, tasks)


def kernel_table(graph: TaskGraph, ctx: TransformContext, *, max_intensity: float,
                 classes: tuple[str, ...]) -> pd.DataFrame:
    """Every kernel (stream order per rank and resource) with ``flops``, ``bytes``, ``resident``,
    ``x`` (input activation bytes), ``y`` (output bytes), ``intensity``, ``gpu_ns``, ``is_attention``
    and ``candidate`` (memory-bound enough to consider for PIM)."""
    t = graph.tasks
    k = np.flatnonzero(t["kind"].to_numpy() == int(TaskKind.KERNEL))
    if not len(k):
        raise TransformError(f"{NAME}: the trace has no GPU kernels to offload")
    cost = ctx.require_cost(NAME)
    f = cost.kernel_facts(graph, k)
    flops = np.nan_to_num(np.asarray(f["flops"], float))
    nbytes = np.nan_to_num(np.asarray(f["bytes"], float))
    weight = np.nan_to_num(np.asarray(f["weight_bytes"], float))
    cls = np.asarray(f["kernel_class"], dtype=object)
    attn = cls == KernelClass.ATTENTION.value
    x, _, y = gemm_io_bytes(graph, k, nbytes, weight)
    q = _attention_io(graph, k[attn]) if attn.any() else np.zeros(0)
    xa = np.zeros(len(k))
    xa[attn] = np.where(np.isnan(q), 0.0, q)
    x[attn], y[attn] = xa[attn], xa[attn]
    resident = np.where(attn, np.maximum(nbytes - 2 * xa, 0.0), weight)
    with np.errstate(divide="ignore", invalid="ignore"):
        intensity = np.where(nbytes > 0, flops / nbytes, np.inf)
    cand = np.isin(cls, list(classes)) & ~np.asarray(f["estimated"], bool) & (intensity <= max_intensity) \
        & (resident > 0)
    if attn.any():
        cand[attn] &= ~np.isnan(q)
    start = t["measured_start_ns"].to_numpy()[k]
    df = pd.DataFrame({"task": k, "rank": t["rank"].to_numpy()[k], "resource": t["resource"].to_numpy()[k],
                       "start": start, "name": t["name"].astype(str).to_numpy()[k], "cls": cls, "flops": flops,
                       "bytes": nbytes, "resident": resident, "x": x, "y": y, "intensity": intensity,
                       "gpu_ns": t["dur_ns"].to_numpy()[k].astype(float), "is_attention": attn, "candidate": cand})
    return df.sort_values(["rank", "resource", "start", "task"], kind="stable", ignore_index=True)


# ---------------------------------------------------------------------------------------------
# costs of one level
@dataclass(frozen=True)
class _Level:
    dev: PimDevice
    level: str
    kv_tokens: int
    weight_reuse: int

    def node(self, r: pd.DataFrame) -> dict[str, np.ndarray]:
        """Per kernel and state: compute, operand rearrangement, reduction (ns)."""
        d, lv = self.dev, self.level
        units = d.units(lv)
        comp = np.asarray([d.kernel_time_ns(fl, rb, lv) for fl, rb in zip(r["flops"], r["resident"])])
        refresh = np.where(r["is_attention"], 1.0 / max(self.kv_tokens, 1),
                           1.0 / self.weight_reuse if self.weight_reuse > 0 else 0.0)
        operand = np.asarray([d.rearrange_ns(b) for b in refresh * r["resident"].to_numpy() * (1 - 1 / units)])
        reduce = np.asarray([d.reduce_ns(units * y / ELEM_BYTES * ACC_BYTES) if units > 1 else 0.0 for y in r["y"]])
        return {"compute": comp, "operand": operand, "reduce": reduce}

    def transition(self, a: str, b: str, y_a: float, x_b: float) -> tuple[float, float]:
        """(link ns, rearrangement ns) of handing data from a kernel in state ``a`` to the next in ``b``."""
        d = self.dev
        if a == "gpu" and b == "gpu":
            return 0.0, 0.0
        if a == "gpu":
            return d.transfer_ns(x_b), d.rearrange_ns(x_b) if b == "row" else 0.0
        if b == "gpu":
            return d.transfer_ns(y_a), d.rearrange_ns(y_a) if a == "row" else 0.0
        if (a, b) in (("row", "col"), ("col", "col")):
            return 0.0, 0.0
        return 0.0, d.rearrange_ns(y_a)


def _solve(r: pd.DataFrame, lv: _Level, allowed: np.ndarray) -> tuple[np.ndarray, float]:
    """Viterbi over each (rank, resource) chain: the state per kernel minimizing
    Σ node + Σ transitions; ``allowed[i, s]`` restricts kernel i's states. Returns states, total ns."""
    node = lv.node(r)
    cost = np.stack([r["gpu_ns"].to_numpy(),
                     node["compute"] + node["operand"],
                     node["compute"] + node["reduce"]], axis=1)
    cost = np.where(allowed, cost, np.inf)
    y, x = r["y"].to_numpy(), r["x"].to_numpy()
    chain = (r["rank"].astype(str) + "/" + r["resource"].astype(str)).to_numpy()
    states = np.zeros(len(r), dtype=np.int64)
    total = 0.0
    for key in pd.unique(chain):
        idx = np.flatnonzero(chain == key)
        best = cost[idx[0]].copy()
        back = np.zeros((len(idx), 3), dtype=np.int64)
        for j in range(1, len(idx)):
            p, c = idx[j - 1], idx[j]
            new = np.full(3, np.inf)
            for b in range(3):
                if not np.isfinite(cost[c, b]):
                    continue
                for a in range(3):
                    if not np.isfinite(best[a]):
                        continue
                    link, rea = lv.transition(STATES[a], STATES[b], y[p], x[c])
                    v = best[a] + link + rea
                    if v < new[b]:
                        new[b], back[j, b] = v, a
                new[b] += cost[c, b]
            best = new
        s = int(np.argmin(best))
        total += float(best[s])
        for j in range(len(idx) - 1, -1, -1):
            states[idx[j]] = s
            s = int(back[j, s])
    return states, total


# ---------------------------------------------------------------------------------------------
# the search
@dataclass
class PimSearch:
    """Result of :func:`search_pim`. ``plan``: one row per kernel of the chosen level (``state``
    gpu/row/col, ``gpu_ns``, ``pim_ns``, ``operand_ns``, ``reduce_ns``, and the hand-over to the next
    kernel ``link_ns``, ``rearrange_ns``); ``candidates``: per level and strategy the serial time
    (ns, all steps); ``breakdown``: the chosen plan's totals (ns, all steps) and counts."""

    device: str
    level: str
    plan: pd.DataFrame
    candidates: pd.DataFrame
    breakdown: dict[str, float]
    setup_ns: float
    steps: int

    def offloaded(self) -> pd.DataFrame:
        return self.plan[self.plan["state"] != "gpu"]

    def summary(self) -> str:
        b = self.breakdown
        return (f"{self.device} @ {self.level}: offload {int(b['offloaded'])} of {int(b['candidates'])} candidate "
                f"kernels; per step GPU time saved {b['gpu_saved_ns'] / self.steps / 1e3:.1f} us, PIM "
                f"{b['pim_ns'] / self.steps / 1e3:.1f} us, rearrangement {b['rearrange_ns'] / self.steps / 1e3:.1f} "
                f"us, link {b['link_ns'] / self.steps / 1e3:.1f} us; "
                f"serial time {b['serial_ns'] / self.steps / 1e3:.1f} us "
                f"vs GPU-only {b['gpu_only_ns'] / self.steps / 1e3:.1f} us")


def _plan_rows(r: pd.DataFrame, lv: _Level, states: np.ndarray) -> pd.DataFrame:
    node = lv.node(r)
    st = np.asarray(STATES, dtype=object)[states]
    out = r[["task", "rank", "resource", "name", "cls", "intensity", "gpu_ns", "resident", "x", "y",
             "candidate"]].copy()
    out["state"] = st
    on = st != "gpu"
    out["pim_ns"] = np.where(on, node["compute"], 0.0)
    out["operand_ns"] = np.where(st == "row", node["operand"], 0.0)
    out["reduce_ns"] = np.where(st == "col", node["reduce"], 0.0)
    link, rea = np.zeros(len(r)), np.zeros(len(r))
    chain = (r["rank"].astype(str) + "/" + r["resource"].astype(str)).to_numpy()
    y, x = r["y"].to_numpy(float), r["x"].to_numpy(float)
    for i in range(len(r) - 1):
        if chain[i] == chain[i + 1]:
            link[i], rea[i] = lv.transition(st[i], st[i + 1], y[i], x[i + 1])
    out["link_ns"], out["rearrange_ns"] = link, rea
    return out


def search_pim(graph: TaskGraph, ctx: TransformContext, *, device: str = "attacc", link: str = "",
               level: str = "auto", partition: str = "auto", offload: str = "auto", max_intensity: float = 16.0,
               kv_tokens: int = 2048, weight_reuse: int = 0,
               classes: tuple[str, ...] = ("gemm", "attention"), power_limited: bool = True) -> PimSearch:
    """Search offload choice × partitioning × level jointly for ``graph``'s kernels (see the module
    docstring for the model). ``level``: ``auto`` or one of the device's levels; ``partition``:
    ``auto``, ``row`` or ``col`` for every offloaded kernel; ``offload``: ``auto`` (searched) or
    ``all`` (every candidate). Returns the best plan with its breakdown and, per level, the serial
    time of: the joint search, GPU only, offload-then-partition (offload the kernels whose PIM compute
    beats the GPU, then partition), and offload-all."""
    if partition not in ("auto", "row", "col") or offload not in ("auto", "all"):
        raise TransformError(f"{NAME}: partition must be auto|row|col and offload auto|all "
                             f"(got {partition!r}, {offload!r})")
    if kv_tokens < 1 or weight_reuse < 0 or max_intensity <= 0:
        raise TransformError(f"{NAME}: kv_tokens >= 1, weight_reuse >= 0 and max_intensity > 0 are required")
    dev = pim_device(device, link or None, power_limited)
    levels = dev.levels() if level == "auto" else (level,)
    if level != "auto" and level not in dev.levels():
        raise TransformError(f"{NAME}: {dev.name} has compute units down to {dev.finest}; level {level!r} is not "
                             f"one of {', '.join(dev.levels())}")
    r = kernel_table(graph, ctx, max_intensity=max_intensity, classes=classes)
    cand = r["candidate"].to_numpy()
    if not cand.any():
        raise TransformError(f"{NAME}: no memory-bound {'/'.join(classes)} kernel with recorded shapes and "
                             f"arithmetic intensity <= {max_intensity:g} FLOP/B (decode GEMV/attention); "
                             f"record with record_shapes=True or raise max_intensity")
    gpu_only = float(r["gpu_ns"].sum())
    pim_states = [s for s in ("row", "col") if partition in ("auto", s)]
    allowed = np.zeros((len(r), 3), dtype=bool)
    allowed[:, 0] = True
    allowed[cand, 1] = "row" in pim_states
    allowed[cand, 2] = "col" in pim_states
    if offload == "all":
        allowed[cand, 0] = False
    rows, best = [], None
    for lv_name in levels:
        lv = _Level(dev, lv_name, kv_tokens, weight_reuse)
        states, total = _solve(r, lv, allowed)
        node = lv.node(r)
        faster = cand & (node["compute"] < r["gpu_ns"].to_numpy())
        dec = np.zeros_like(allowed)
        dec[:, 0] = ~faster
        dec[faster, 1], dec[faster, 2] = allowed[faster, 1], allowed[faster, 2]
        _, decoupled = _solve(r, lv, dec)
        every = allowed.copy()
        every[cand, 0] = False
        _, all_on = _solve(r, lv, every)
        rows.append({"level": lv_name, "units": dev.units(lv_name), "internal_TBps": dev.internal_bw(lv_name) / 1e12,
                     "joint_ns": total, "gpu_only_ns": gpu_only, "offload_then_partition_ns": decoupled,
                     "offload_all_ns": all_on, "offloaded": int((states > 0).sum())})
        if best is None or total < best[1]:
            best = (lv, total, states)
    assert best is not None
    lv, total, states = best
    plan = _plan_rows(r, lv, states)
    on = plan["state"] != "gpu"
    row_w = plan["state"].eq("row").to_numpy() & ~r["is_attention"].to_numpy()
    units = dev.units(lv.level)
    setup = dev.rearrange_ns(float((plan.loc[row_w, "resident"] * (1 - 1 / units)).sum())) if weight_reuse == 0 else 0.0
    steps = max(1, int(graph.steps["step"].nunique())) if len(graph.steps) else 1
    _check_capacity(graph, plan, dev)
    breakdown = {"serial_ns": total, "gpu_only_ns": gpu_only, "gpu_saved_ns": float(plan.loc[on, "gpu_ns"].sum()),
                 "pim_ns": float(plan["pim_ns"].sum()),
                 "rearrange_ns": float(plan[["operand_ns", "reduce_ns", "rearrange_ns"]].to_numpy().sum()),
                 "link_ns": float(plan["link_ns"].sum()), "offloaded": float(on.sum()), "candidates": float(cand.sum()),
                 "row": float((plan["state"] == "row").sum()), "col": float((plan["state"] == "col").sum())}
    return PimSearch(device=dev.name, level=lv.level, plan=plan, candidates=pd.DataFrame(rows),
                     breakdown=breakdown, setup_ns=setup, steps=steps)


def _check_capacity(graph: TaskGraph, plan: pd.DataFrame, dev: PimDevice) -> None:
    """The offloaded kernels' resident operands (weights, KV cache) of one rank's largest step must
    fit its PIM stacks; else one line naming the overflow."""
    on = plan["state"].to_numpy() != "gpu"
    if not on.any():
        return
    tasks = plan.loc[on, "task"].to_numpy(np.int64)   # each rank has its own PIM stacks
    keys = [graph.tasks["rank"].to_numpy()[tasks], graph.tasks["step"].to_numpy()[tasks]]
    per_step = pd.Series(plan.loc[on, "resident"].to_numpy(float)).groupby(keys).sum()
    need, cap = float(per_step.max()), dev.capacity_bytes()
    if need > cap:
        raise TransformError(f"{NAME}: the offloaded weights and KV cache of one step need {need / 1e9:.1f} GB but "
                             f"{dev.name}'s {dev.stacks} stacks hold {cap / 1e9:.1f} GB (over by "
                             f"{(need - cap) / 1e9:.1f} GB)")


def pim_placement(placement: Placement, search: PimSearch, graph: TaskGraph, dev: PimDevice) -> Placement:
    """``placement`` after ``search``'s plan: per GPU (the largest rank and step) the offloaded
    weights move out of HBM into the stacks; when every attention kernel is offloaded, the KV cache
    lives in the stacks' remaining ``capacity − weights`` (when only some are, it stays in HBM)."""
    on = search.offloaded()
    if on.empty:
        return placement
    tasks = on["task"].to_numpy(np.int64)
    keys = [graph.tasks["rank"].to_numpy()[tasks], graph.tasks["step"].to_numpy()[tasks]]
    attention = (on["cls"] == KernelClass.ATTENTION.value).to_numpy()
    weights = float(pd.Series(np.where(attention, 0.0, on["resident"].to_numpy(float))).groupby(keys).sum().max())
    out = placement.weights_out(weights)
    all_attention = int(attention.sum()) == int((search.plan["cls"] == KernelClass.ATTENTION.value).sum())
    return out.kv_in(max(0.0, dev.capacity_bytes() - weights), f"{dev.name} PIM stacks") \
        if attention.any() and all_attention else out


# ---------------------------------------------------------------------------------------------
# the graph edit
def _resource(g: TaskGraph, rank: int, kind: ResourceKind, label: str) -> tuple[TaskGraph, int]:
    res = g.resources
    name = f"{label} (rank {rank})"
    hit = np.flatnonzero((res["name"].astype(str).to_numpy() == name) & (res["rank"].to_numpy() == rank))
    if len(hit):
        return g, int(hit[0])
    return add_resource(g, rank=rank, kind=kind, name=name, ordered=False, reason=f"{label}: a shared unit")


def apply_plan(graph: TaskGraph, search: PimSearch) -> TaskGraph:
    """Move the plan's offloaded kernels to PIM and insert its rearrangement, reduction and link tasks."""
    plan = search.plan
    on = plan["state"].to_numpy() != "gpu"
    if not on.any():
        return graph
    g = graph
    pim_res: dict[int, int] = {}
    link_res: dict[tuple[int, str], int] = {}   # (rank, direction): the link is full duplex
    for rank in plan.loc[on, "rank"].unique():
        g, pim_res[int(rank)] = _resource(g, int(rank), ResourceKind.PIM, f"pim {search.device} {search.level}")
        for way in ("gpu->pim", "pim->gpu"):
            g, link_res[int(rank), way] = _resource(g, int(rank), ResourceKind.LINK,
                                                    f"pim link {way} {search.device}")
    where = f"{search.device} ({search.level})"
    for rank, res in pim_res.items():
        ids = plan.loc[on & (plan["rank"].to_numpy() == rank), "task"].to_numpy(np.int64)
        g = move(g, ids, res, reason=f"offloaded to {where}")
        e = g.edges   # a shared resource keeps no program order: drop the chain move() made
        res_of = g.tasks["resource"].to_numpy()
        chain = (e["kind"].to_numpy() == int(EdgeKind.THREAD)) & (res_of[e["src"].to_numpy()] == res) \
            & (res_of[e["dst"].to_numpy()] == res)
        g = remove_edges(g, chain, reason=f"{where} serves offloaded kernels in ready order")
    moved = plan.loc[on, "task"].to_numpy(np.int64)
    order = np.argsort(moved, kind="stable")
    g = set_duration(g, moved[order], np.rint(plan.loc[on, "pim_ns"].to_numpy()[order]).astype(np.int64),
                     reason=f"kernel time on {where}")
    durs: list[int] = []
    names: list[str] = []
    resources: list[int] = []
    kinds: list[int] = []
    attribute: list[int] = []
    src: list[int] = []
    dst: list[int] = []
    origin: dict[int, int] = {}   # new task -> the kernel whose step/phase/layer/op it inherits

    def add(after: int, res: int, dur: float, name: str) -> int:
        i = new_task(len(durs))
        o = origin.get(after, after)
        origin[i] = o
        durs.append(int(round(dur)))
        names.append(name)
        resources.append(res)
        kinds.append(int(TaskKind.MEMCPY))
        attribute.append(o)
        src.append(after)
        dst.append(i)
        return i

    head, tail = {}, {}
    st = dict(zip(plan["task"].to_numpy(np.int64).tolist(), plan["state"].tolist()))
    for row in plan[on].itertuples():
        task, rank = int(row.task), int(row.rank)
        pr = pim_res[rank]
        h = task
        if row.operand_ns > 0:   # new operand rows rearranged before the kernel reads them
            h = add(task, pr, row.operand_ns, f"pim rearrange operand ({row.resident / 2**20:.2f} MiB resident)")
            src.pop()
            dst.pop()
            src.append(h)
            dst.append(task)
        tl = task
        if row.reduce_ns > 0:
            tl = add(task, pr, row.reduce_ns, f"pim reduce partial sums ({row.y / 2**10:.1f} KiB out)")
        head[task], tail[task] = h, tl
    # hand-overs between consecutive kernels of a stream
    chain_key = (plan["rank"].astype(str) + "/" + plan["resource"].astype(str)).to_numpy()
    tasks = plan["task"].to_numpy(np.int64)
    ranks = plan["rank"].to_numpy(np.int64)
    rearrange_ns, link_ns = plan["rearrange_ns"].to_numpy(float), plan["link_ns"].to_numpy(float)
    for i in range(len(plan) - 1):
        a, b = int(tasks[i]), int(tasks[i + 1])
        if chain_key[i] != chain_key[i + 1] or (st[a] == "gpu" and st[b] == "gpu"):
            continue
        rank = int(ranks[i])
        cur = tail.get(a, a)
        if rearrange_ns[i] > 0:
            cur = add(cur, pim_res[rank], rearrange_ns[i], f"pim rearrange activation {st[a]}->{st[b]}")
        if link_ns[i] > 0:
            way = "pim->gpu" if st[b] == "gpu" else "gpu->pim"
            cur = add(cur, link_res[rank, way], link_ns[i], f"pim link {way}")
        src.append(cur)
        dst.append(head.get(b, b))
    if durs:
        g, _ = insert_many(g, kind=np.asarray(kinds), resource=np.asarray(resources, dtype=np.int64), dur_ns=durs,
                           names=names, attribute_from=attribute, edges=NewEdges(src, dst, 0, EdgeKind.FLOW),
                           action=f"offload to {where}: insert", reason=search.summary())
    elif src:
        g = add_edges(g, src, dst, 0, EdgeKind.FLOW, reason=f"offload to {where}: hand-overs")
    return g


@register
@dataclass
class PimOffload(Transform):
    name = NAME
    description = "offload memory-bound kernels (decode GEMV/attention) to HBM-PIM; partitioning searched jointly (DCC)"

    device: str = field(default="attacc", metadata={"help": "PIM device: attacc | hbm_pim | buffer_die"})
    link: str = field(default="", metadata={
        "help": "GPU-PIM link: nvlink3 | nvlink4 | pcie4 | pcie5 (default: the device's)"})
    level: str = field(default="auto", metadata={"help": "partitioning level: auto | bank | bank_group | buffer_die"})
    partition: str = field(default="auto", metadata={"help": "auto (searched per kernel) | row | col"})
    offload: str = field(default="auto", metadata={"help": "auto (searched) | all (every candidate kernel)"})
    max_intensity: float = field(default=16.0, metadata={
        "exclusive_minimum": 0, "help": "candidates: arithmetic intensity <= this (FLOP/B)"})
    kv_tokens: int = field(default=2048, metadata={"minimum": 1,
        "help": "KV-cache tokens per attention (1 new per step is rearranged)"})
    weight_reuse: int = field(default=0, metadata={"minimum": 0,
        "help": "steps one rearranged weight layout serves; 0 = rearranged once at load (reported, not per step)"})
    power_limited: bool = field(default=True, metadata={
        "help": "internal bandwidth within HBM's power budget (x9 bank, x3 bank group; AttAcc) or not (x16, x8)"})

    def _search(self, graph: TaskGraph, ctx: TransformContext) -> PimSearch:
        return search_pim(graph, ctx, device=self.device, link=self.link, level=self.level, partition=self.partition,
                          offload=self.offload, max_intensity=self.max_intensity, kv_tokens=self.kv_tokens,
                          weight_reuse=self.weight_reuse, power_limited=self.power_limited)

    def match(self, graph: TaskGraph, ctx: TransformContext) -> np.ndarray:
        return np.sort(self._search(graph, ctx).offloaded()["task"].to_numpy(np.int64))

    def placement(self, placement: Placement, graph: TaskGraph, ctx: TransformContext) -> Placement:
        """Offloaded GEMMs' weights live in the PIM stacks; when decode attention is offloaded the
        KV cache does too, in what the stacks have left (AttAcc: the larger batch)."""
        return pim_placement(placement, self._search(graph, ctx), graph,
                             pim_device(self.device, self.link or None, self.power_limited))

    def apply(self, graph: TaskGraph, ctx: TransformContext) -> TaskGraph:
        return apply_plan(graph, self._search(graph, ctx))
