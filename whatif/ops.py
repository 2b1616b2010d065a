"""The per-op roofline table (TraceLens's everyday view): every GPU activity of a trace grouped
by the op that launched it, its input shapes and dtype (or by kernel as well), with its count,
time, FLOPs, bytes, arithmetic intensity, achieved TFLOP/s and TB/s, the device's roofline at
that intensity, the share of it reached, and what bounds it.

FLOPs and bytes are those of the launching aten op's recorded shapes
(:func:`whatif.core.kernels.op_flops_bytes`, the formulas the cost models use), shared among the
op's kernels by duration (:func:`whatif.core.kernels.duration_shares`). Activities without a
launching op (launched before the window, graph replays, no ``External id``) are grouped under
their kernel name, with no FLOPs. The roofline is the device's *achievable* one
(:func:`whatif.hardware.roofline.achievable_time_ns`: the achievable GEMM rate of the op's dtype at
its size for GEMM, conv and attention, the fp32 peak otherwise, and the achievable streaming
bandwidth), so 100 % is what the hardware reaches in practice, not its datasheet; a device without
achievable figures falls back to its datasheet.

**Bound** (:func:`bound`, the one rule; docs/cost-models.md): *launch* when at least half of the
group's activities found their stream idle waiting for the launch call (it started after the
stream's previous activity ended, HTA's host wait) and ran shorter than that call: a faster kernel
would change nothing; else *latency* when its mean activity is under :data:`SHORT_NS` (fixed
launch, ramp and tail costs dominate); else *compute* or *memory* by which side of the roofline
ridge (achievable FLOP/s / streaming bytes/s) its intensity falls; *unknown* without FLOPs and bytes.

>>> from whatif.tracer.trace import load_trace
>>> doc = ops_table(load_trace("sample_traces/llm_serve"))
>>> sum(r.total_ns for r in doc.rows) == doc.gpu_total_ns
True
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from enum import Enum

import msgspec
import numpy as np
import pandas as pd

from whatif.breakdown import gpu_work
from whatif.core.dtypes import dtype_in_kernel_name
from whatif.core.errors import WhatifError
from whatif.core.kernels import KernelClass, classify_kernel, duration_shares
from whatif.documents import OpRow, OpsDocument
from whatif.hardware.devices import Device, find_device, get_device
from whatif.hardware.roofline import achievable_rate, achievable_time_ns
from whatif.tracer.kinds import EventKind
from whatif.tracer.op_facts import op_facts
from whatif.tracer.trace import Trace

__all__ = ["SHORT_NS", "Bound", "GroupBy", "activities", "bound", "ops_table", "table_frame"]

SHORT_NS = 5_000
"""An activity shorter than this (mean over a group) is latency-bound: its fixed costs (launch,
ramp-up, tail wave; 2 us in Habitat's small-kernel rule) are a large part of it."""
LAUNCH_SHARE = 0.5
"""Share of a group's activities that must be launch-bound for the group to be."""


class Bound(str, Enum):
    COMPUTE = "compute"
    MEMORY = "memory"
    LATENCY = "latency"
    LAUNCH = "launch"
    UNKNOWN = "unknown"


class GroupBy(str, Enum):
    OP = "op"
    KERNEL = "kernel"


def bound(launch_share: float, mean_ns: float, intensity: float | None, ridge: float | None) -> Bound:
    """What bounds a group of activities (the rule of the module docstring).

    >>> bound(0.8, 3_000, 100.0, 295.0), bound(0.0, 3_000, 100.0, 295.0)
    (<Bound.LAUNCH: 'launch'>, <Bound.LATENCY: 'latency'>)
    >>> bound(0.0, 80_000, 600.0, 295.0), bound(0.0, 80_000, 1.0, 295.0), bound(0.0, 80_000, None, None)
    (<Bound.COMPUTE: 'compute'>, <Bound.MEMORY: 'memory'>, <Bound.UNKNOWN: 'unknown'>)
    """
    if launch_share >= LAUNCH_SHARE:
        return Bound.LAUNCH
    if mean_ns < SHORT_NS:
        return Bound.LATENCY
    if intensity is None or ridge is None:
        return Bound.UNKNOWN
    return Bound.COMPUTE if intensity >= ridge else Bound.MEMORY


def _launch_bound(work: pd.DataFrame) -> np.ndarray:
    """Per activity: its stream sat idle waiting for its launch call (the call started after the
    stream's previous activity ended) and it ran shorter than the call."""
    out = np.zeros(len(work), dtype=bool)
    for _, idx in work.groupby(["rank", "stream"], sort=False).indices.items():
        w = work.iloc[idx]
        order = np.argsort(w["ts_ns"].to_numpy(), kind="stable")
        ts, end = w["ts_ns"].to_numpy()[order], w["end_ns"].to_numpy()[order]
        launch, launch_end = w["launch_ns"].to_numpy()[order], w["launch_end_ns"].to_numpy()[order]
        prev_end = np.concatenate([[np.iinfo(np.int64).min], np.maximum.accumulate(end)[:-1]])
        waited = (launch >= 0) & (launch > prev_end) & (end - ts < launch_end - launch)
        out[idx[order]] = waited
    return out


def activities(trace: Trace) -> pd.DataFrame:
    """One row per GPU activity (kernel, copy, memset) of every rank: ``kernel``, ``op`` (the
    launching op, else the kernel name), ``linked`` (whether it has one), ``op_event`` (its row,
    -1), ``shapes``, ``dtype``, ``kernel_class``, ``dur_ns``, ``flops``/``bytes`` (its share of
    its op's, NaN when unknown), ``ideal_ns`` (achievable roofline time, NaN when unknown),
    ``ridge`` (FLOP/byte), ``device`` (catalog name, "" when unknown) and ``launch_bound``."""
    work = gpu_work(trace)
    n = len(work)
    dur = (work["end_ns"] - work["ts_ns"]).to_numpy().astype(np.int64)
    op_row = trace.launching_op_rows(work["event"].to_numpy())
    linked = ~np.isnan(op_row)
    kernels = work["name"].astype(str).to_numpy()
    op = kernels.astype(object).copy()
    shapes = np.full(n, "", dtype=object)
    dtype = np.full(n, "", dtype=object)
    flops = np.full(n, np.nan)
    nbytes = np.full(n, np.nan)
    li = np.flatnonzero(linked)
    if len(li):
        uniq, inv = np.unique(op_row[li].astype(np.int64), return_inverse=True)
        facts = op_facts(trace, uniq)
        op[li] = [facts[i].name for i in inv]
        shapes[li] = [facts[i].shapes for i in inv]
        dtype[li] = [facts[i].dtype for i in inv]
        is_kernel = trace.events["kind"].to_numpy()[work["event"].to_numpy()[li]] == int(EventKind.KERNEL)
        share = duration_shares(inv, dur[li].astype(float), is_kernel)
        flops[li] = np.array([f.flops for f in facts])[inv] * share
        nbytes[li] = np.array([f.nbytes for f in facts])[inv] * share
    named = dtype == ""
    dtype[named] = _per_distinct(kernels[named], lambda k: (d.value if (d := dtype_in_kernel_name(k)) else ""))
    codes, pairs = pd.factorize(pd.MultiIndex.from_arrays([kernels, np.where(linked, op, "")]))
    cls = np.asarray([classify_kernel(k, o or None).value for k, o in pairs] + [""], dtype=object)[codes]
    devices = {r.rank: find_device(r.gpu_name) for r in trace.ranks}
    device = np.array([(d.name if (d := devices.get(r)) else "") for r in work["rank"].tolist()], dtype=object)
    ideal, ridge = _roofline(devices, work["rank"].to_numpy(), cls, dtype, flops, nbytes)
    return pd.DataFrame({"event": work["event"].to_numpy(), "rank": work["rank"].to_numpy(), "kernel": kernels,
                         "op": op, "linked": linked, "op_event": np.where(linked, op_row, -1).astype(np.int64),
                         "shapes": shapes, "dtype": dtype, "kernel_class": cls, "dur_ns": dur, "flops": flops,
                         "bytes": nbytes, "ideal_ns": ideal, "ridge": ridge, "device": device,
                         "launch_bound": _launch_bound(work)})


def _per_distinct(values: np.ndarray, fn: Callable[[str], str]) -> np.ndarray:
    """``fn`` of every value, called once per distinct value."""
    codes, uniques = pd.factorize(np.asarray(values, dtype=object))
    return np.asarray([fn(str(u)) for u in uniques] + [""], dtype=object)[codes]


def _roofline(devices: dict[int, Device | None], ranks: np.ndarray, cls: np.ndarray, dtype: np.ndarray,
              flops: np.ndarray, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per activity: its achievable roofline time (ns) and the ridge point (FLOP/byte) of its class,
    dtype and size on its rank's device (fp32 when the dtype is unknown; datasheet figures for a
    device without achievable ones); NaN without a device or work."""
    ideal = np.full(len(cls), np.nan)
    ridge = np.full(len(cls), np.nan)
    keys = pd.DataFrame({"r": ranks, "c": cls, "t": np.where(dtype == "", "fp32", dtype)})
    for (r, c, t), idx in keys.groupby(["r", "c", "t"]).indices.items():
        dev = devices.get(int(r))
        if dev is None:
            continue
        size = np.nan_to_num(flops[idx])
        ridge[idx] = [achievable_rate(dev, t, KernelClass(c), f) / dev.stream_bw_bytes_per_s for f in size]
        ok = idx[~np.isnan(flops[idx]) & ~np.isnan(nbytes[idx])]
        ideal[ok] = [achievable_time_ns(f, b, dev, t, c) for f, b in zip(flops[ok], nbytes[ok])]
    return ideal, ridge


@dataclass(frozen=True)
class _Columns:
    """The activities' columns as arrays, so a group is an index array, not a frame slice."""

    dur_ns: np.ndarray
    op_event: np.ndarray
    linked: np.ndarray
    event: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray
    ideal_ns: np.ndarray
    ridge: np.ndarray
    device: np.ndarray
    kernel_class: np.ndarray
    launch_bound: np.ndarray

    @classmethod
    def of(cls, acts: pd.DataFrame) -> _Columns:
        return cls(**{f.name: acts[f.name].to_numpy() for f in fields(cls)})


def _sum_known(x: np.ndarray) -> float:
    """The sum, NaN when any value is unknown (pandas' ``sum(min_count=len)``)."""
    return float(x.sum()) if len(x) and not np.isnan(x).any() else np.nan


def _row(key: tuple, idx: np.ndarray, c: _Columns, by: GroupBy) -> OpRow:
    """One group's figures; NaN stands for unknown until the row turns it into None."""
    op, shapes, dtype, kernel = key if by is GroupBy.KERNEL else (*key, "")
    dur = c.dur_ns[idx]
    total = int(dur.sum())
    count = len(idx) if by is GroupBy.KERNEL else len(np.unique(np.where(c.linked[idx], c.op_event[idx],
                                                                          -1 - c.event[idx])))
    flops, nbytes, ideal = (_sum_known(col[idx].astype(float)) for col in (c.flops, c.bytes, c.ideal_ns))
    with np.errstate(divide="ignore", invalid="ignore"):
        intensity = flops / nbytes if nbytes else np.nan
    main = int(idx[int(np.argmax(dur))])   # the longest activity: the group's class and roof
    ridge = float(c.ridge[main])
    bw = get_device(str(c.device[main])).stream_bw_bytes_per_s if c.device[main] else np.nan
    roof = float(np.minimum(ridge, intensity)) * bw
    per_ns = 1 / total if total else np.nan
    known = _round(intensity, 3)
    return OpRow(
        op=op, kernel=kernel, shapes=shapes, dtype=dtype, kernel_class=str(c.kernel_class[main]),
        count=count, kernels=len(idx), total_ns=total, mean_ns=round(total / max(count, 1), 1),
        flops=_round(flops, 1), bytes=_round(nbytes, 1), intensity=known,
        achieved_tflops=_round(flops * per_ns / 1e3, 4), achieved_tbps=_round(nbytes * per_ns / 1e3, 4),
        roofline_tflops=_round(roof / 1e12, 3), roofline_pct=_round(100 * ideal * per_ns, 2),
        bound=bound(float(c.launch_bound[idx].mean()), total / len(idx), known,
                    ridge if np.isfinite(ridge) else None).value)


def _round(x: float, digits: int) -> float | None:
    """``x`` rounded, None when unknown (NaN or infinite)."""
    return round(float(x), digits) if np.isfinite(x) else None


def ops_table(trace: Trace, by: GroupBy | str = GroupBy.OP) -> OpsDocument:
    """The per-op (``by="op"``) or per-op-and-kernel (``by="kernel"``) roofline table of every GPU
    activity of ``trace``, sorted by total time (longest first).

    Parameters
    ----------
    trace : the event table (:func:`whatif.tracer.trace.load_trace`).
    by : group by (launching op, its input shapes, its dtype), plus the kernel name with
        ``"kernel"``.

    Raises
    ------
    WhatifError : ``by`` is neither.
    """
    try:
        by = GroupBy(by)
    except ValueError:
        raise WhatifError(f"--by {by!r}: choose one of {', '.join(g.value for g in GroupBy)}") from None
    acts = activities(trace)
    keys = ["op", "shapes", "dtype"] + (["kernel"] if by is GroupBy.KERNEL else [])
    columns = _Columns.of(acts) if len(acts) else None
    rows = [_row(k if isinstance(k, tuple) else (k,), np.asarray(idx), columns, by)
            for k, idx in sorted(acts.groupby(keys, sort=False).indices.items())] if columns is not None else []
    rows.sort(key=lambda r: -r.total_ns)   # stable: equal times keep the key order
    devices = sorted({d for d in acts["device"].tolist() if d})
    return OpsDocument(source=trace.source, by=by.value, devices=devices, short_ns=SHORT_NS,
                       gpu_total_ns=int(acts["dur_ns"].sum()), rows=rows)


def table_frame(doc: OpsDocument) -> pd.DataFrame:
    """The rows of an ops document as a table, one column per field (CSV and Parquet)."""
    return pd.DataFrame([msgspec.structs.asdict(r) for r in doc.rows],
                        columns=list(OpRow.__struct_fields__))
