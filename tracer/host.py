"""How fast one host runs a program's CPU work compared with another: the CPU ops two traces share.

The two traces are of the same program (or one whose ops overlap), recorded on two machines. CPU
ops are matched by name and recorded input shapes (an op's CPU time depends on its arguments);
each matched op contributes ``log(median on the other host / median on this one)``, weighted by
its total time on this host, and the ratio is the exponential of the weighted mean (a geometric
mean, so one outlier op cannot dominate). It scales the CPU side of a moved trace
(``gpu(host_from=...)``).

Matching ops of *different* programs by name alone does not work: on the Hugging Face H100/MI300X
pairs it gives host ratios from 0.76 to 1.37 where the same program gives 0.88 to 0.95
(docs/accuracy.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from whatif.core.errors import WhatifError

from .args import Arg
from .kinds import EventKind
from .trace import Trace

MIN_MATCHED_OPS = 5


@dataclass(frozen=True)
class HostRatio:
    """``time_ratio``: CPU time on the other host per CPU time on this one (< 1: it is faster);
    ``matched_ops``: distinct (op, shapes) both traces ran; ``coverage``: the share of this
    trace's CPU-op time they hold."""

    time_ratio: float
    matched_ops: int
    coverage: float


def _per_op(trace: Trace) -> pd.DataFrame:
    ev = trace.events
    rows = np.flatnonzero(ev["kind"].to_numpy() == int(EventKind.CPU_OP))
    dims = trace.arg(Arg.INPUT_DIMS)
    frame = pd.DataFrame({"name": ev["name"].astype(str).to_numpy()[rows],
                          "shapes": [repr(dims[r]) for r in rows],
                          "dur": ev["dur_ns"].to_numpy()[rows].astype(float)})
    return frame.groupby(["name", "shapes"], sort=True)["dur"].agg(["median", "sum"])


def host_time_ratio(this: Trace, other: Trace) -> HostRatio:
    """CPU time of ``other``'s host per CPU time of ``this`` one, from the CPU ops both ran.

    Raises
    ------
    WhatifError
        When fewer than ``MIN_MATCHED_OPS`` (op, shapes) pairs match: the traces are not of one
        program, and a ratio from them would say more about the programs than the hosts.
    """
    a, b = _per_op(this), _per_op(other)
    both = a.join(b.add_suffix("_other"), how="inner")
    both = both[(both["median"] > 0) & (both["median_other"] > 0)]
    if len(both) < MIN_MATCHED_OPS:
        raise WhatifError(f"{other.source}: only {len(both)} CPU ops of the same name and shapes as in "
                          f"{this.source} (need {MIN_MATCHED_OPS}): record the same program on the other host")
    w = both["sum"].to_numpy()
    log_ratio = np.log(both["median_other"].to_numpy() / both["median"].to_numpy())
    total = float(a["sum"].sum())
    return HostRatio(float(np.exp(np.average(log_ratio, weights=w))), len(both),
                     float(w.sum() / total) if total > 0 else 0.0)
