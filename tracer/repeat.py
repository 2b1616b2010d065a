"""Make a long trace from a real one by repeating its recorded window (for scale tests).

Copy ``c`` of the window is shifted by ``c`` window lengths; correlation and external ids are
offset so launches still pair within each copy, and ``ProfilerStep#N`` becomes
``ProfilerStep#(N + c * S)`` with ``S`` the span of step numbers. Nothing is random: the
result is the recorded program run ``copies`` times back to back.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from .args import EventArgs
from .kineto import step_number
from .trace import Trace


def repeat_trace(trace: Trace, copies: int) -> Trace:
    """``trace`` with its events repeated ``copies`` times (``copies >= 1``).

    >>> import pandas as pd
    >>> from whatif.tracer.trace import Trace
    >>> ev = pd.DataFrame({"rank": [0, 0], "ts_ns": [0, 10], "dur_ns": [100, 5], "kind": [1, 3],
    ...                    "name": pd.Categorical(["ProfilerStep#7", "cudaLaunchKernel"]), "pid": 1, "tid": 1,
    ...                    "device": -1, "stream": -1, "correlation": [-1, 4], "external_id": -1})
    >>> big = repeat_trace(Trace(events=ev, ranks=[]), 3)
    >>> big.events["name"].astype(str).tolist()[::2], big.events["ts_ns"].tolist()[::2]
    (['ProfilerStep#7', 'ProfilerStep#8', 'ProfilerStep#9'], [0, 100, 200])
    """
    if copies < 1:
        raise ValueError("copies must be >= 1")
    ev = trace.events
    window = int((ev["ts_ns"] + ev["dur_ns"]).max() - ev["ts_ns"].min())
    corr_span = int(ev["correlation"].max()) + 1
    ext_span = int(ev["external_id"].max()) + 1
    categories = [str(x) for x in ev["name"].cat.categories]
    codes = ev["name"].cat.codes.to_numpy()
    numbers = [n for n in map(step_number, categories) if n is not None]
    step_span = (max(numbers) - min(numbers) + 1) if numbers else 0

    parts = []
    for c in range(copies):
        part = ev.copy()
        part["ts_ns"] = ev["ts_ns"].to_numpy() + c * window
        corr = ev["correlation"].to_numpy()
        part["correlation"] = np.where(corr >= 0, corr + c * corr_span, corr)
        ext = ev["external_id"].to_numpy()
        part["external_id"] = np.where(ext >= 0, ext + c * ext_span, ext)
        renamed = [f"ProfilerStep#{n + c * step_span}" if (n := step_number(x)) is not None else x
                   for x in categories]
        part["name"] = np.asarray(renamed, dtype=object)[codes]
        parts.append(part)
    events = pd.concat(parts, ignore_index=True)
    events["name"] = pd.Categorical(events["name"])
    order = np.lexsort((-events["dur_ns"].to_numpy(), events["ts_ns"].to_numpy(), events["rank"].to_numpy()))
    events = events.iloc[order].reset_index(drop=True)
    args = EventArgs.of(np.tile(trace.raw_args(), copies)[order])
    flows = [(r, replace(f, ts_ns=f.ts_ns + c * window, flow_id=f.flow_id + c * (1 << 40)))
             for c in range(copies) for r, f in trace.flows] if trace.flows else []
    return Trace(events=events, ranks=trace.ranks, flows=flows, args=args)
