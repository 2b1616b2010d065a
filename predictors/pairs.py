"""Kernels measured on two GPUs, found in two traces of the same program: the data a
:class:`~whatif.hardware.retarget.RetargetFit` is fitted on.

Kernel names differ between vendors' libraries (cuBLAS ``sm90_xmma_gemm…`` vs hipBLASLt
``Cijk_Alik…``), and one op may launch a different number of kernels on each, so the pairs are
made per **op call**: every aten op that launched GPU work (its kernels, copies and memsets summed),
grouped by (op name, input shapes, dtype, work), matched between the two traces, and compared per
call. Work (FLOPs, bytes) comes from the op's recorded shapes (:func:`whatif.core.kernels.op_flops_bytes`);
the class is that of the op's longest kernel; collectives are left out (their time is the peers',
not the GPU's).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from whatif.core.kernels import KernelClass, classify_kernel
from whatif.hardware.retarget import PairedKernels
from whatif.tracer.kinds import GPU_ACTIVITY_KINDS, codes
from whatif.tracer.op_facts import op_facts
from whatif.tracer.trace import Trace

_KEYS = ["family", "shapes", "dtype", "flops", "bytes"]


def op_calls(trace: Trace) -> pd.DataFrame:
    """One row per op call that launched GPU work: ``family`` (op name), ``shapes`` (the recorded
    Input Dims as text), ``dtype`` (fp32 when no input type says), ``flops`` and ``bytes`` (NaN when
    its shapes give none; :func:`whatif.tracer.op_facts.op_facts`), ``kernel_class`` (of its longest
    activity) and ``gpu_ns`` (its activities' summed time). Collective ops are left out."""
    ev = trace.events
    rows = np.flatnonzero(np.isin(ev["kind"].to_numpy(), codes(GPU_ACTIVITY_KINDS)))
    op_row = trace.launching_op_rows(rows)
    linked = ~np.isnan(op_row)
    rows, ops = rows[linked], op_row[linked].astype(np.int64)
    if not len(rows):
        return pd.DataFrame(columns=[*_KEYS, "kernel_class", "gpu_ns"])
    frame = pd.DataFrame({"op": ops, "dur": ev["dur_ns"].to_numpy()[rows].astype(float),
                          "kernel": ev["name"].astype(str).to_numpy()[rows]})
    total = frame.groupby("op", sort=True)["dur"].sum()
    longest = frame.loc[frame.groupby("op", sort=True)["dur"].idxmax(), ["op", "kernel"]].set_index("op")["kernel"]
    out = []
    for facts, (r, gpu_ns) in zip(op_facts(trace, total.index.to_numpy()), total.items()):
        cls = classify_kernel(longest[r], facts.name)
        if cls is not KernelClass.COLLECTIVE:
            out.append((facts.name, facts.shapes, facts.dtype or "fp32", facts.flops, facts.nbytes, cls.value,
                        float(gpu_ns)))
    return pd.DataFrame(out, columns=[*_KEYS, "kernel_class", "gpu_ns"])


def paired_ops(src: Trace, dst: Trace) -> PairedKernels:
    """Op calls of the same op, shapes, dtype and work in both traces, with their mean GPU time per
    call on each (``src_ns``, ``dst_ns``); calls whose shapes give no work are left out.

    Raises
    ------
    ValueError
        When the two traces share no such op.
    """
    per = []
    for trace in (src, dst):
        calls = op_calls(trace)
        calls = calls[calls["flops"].notna() & calls["bytes"].notna()]
        per.append(calls.groupby(_KEYS, sort=True).agg(kernel_class=("kernel_class", "first"),
                                                        ns=("gpu_ns", "mean")))
    joined = per[0].join(per[1][["ns"]].rename(columns={"ns": "ns_dst"}), how="inner").reset_index()
    if joined.empty:
        raise ValueError(f"{src.source} and {dst.source} share no op of the same shapes and types")
    return PairedKernels(joined.rename(columns={"ns": "src_ns", "ns_dst": "dst_ns"})[list(PairedKernels.COLUMNS)])
