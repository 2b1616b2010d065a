"""Write a replay as a Chrome/Kineto trace that Perfetto, chrome://tracing and HTA open.

One track per resource (CPU thread, GPU stream, link...), Kineto's categories (``cpu_op``,
``cuda_runtime``, ``kernel``, ``gpu_memcpy``, ``gpu_memset``), ``ProfilerStep#N`` annotations
spanning each predicted step, launch flows (``ac2g``) keyed by the original correlation id, and
``ts`` relative to ``baseTimeNanoseconds`` (float microseconds with nanosecond resolution).
Predicted slices on one track never overlap.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson

from whatif.core.output import gzip_bytes, write_output
from whatif.depgraph.graph import EdgeKind, ResourceKind, TaskKind

from .replay import Replay
from .steps import step_end_tasks

_CATEGORY = {TaskKind.CPU_CALL: "cuda_runtime", TaskKind.WAIT: "cuda_runtime", TaskKind.CPU_WORK: "cpu_op",
             TaskKind.KERNEL: "kernel", TaskKind.COMM: "kernel", TaskKind.MEMCPY: "gpu_memcpy",
             TaskKind.MEMSET: "gpu_memset"}
RANK_PID_STRIDE = 1_000_000


def _track_ids(replay: Replay) -> tuple[np.ndarray, np.ndarray, dict[int, str], dict[tuple[int, int], str]]:
    """pid and tid of every resource, with process and thread names."""
    res = replay.graph.resources
    multi = res["rank"].nunique() > 1
    pids, tids = [], []
    pnames: dict[int, str] = {}
    tnames: dict[tuple[int, int], str] = {}
    for i, (rank, kind, device, key, name) in enumerate(zip(res["rank"], res["kind"], res["device"], res["key"],
                                                            res["name"])):
        base = int(rank) * RANK_PID_STRIDE if multi else 0
        kind = ResourceKind(int(kind))
        if kind == ResourceKind.STREAM:
            pid, tid, pname = base + int(device), int(key), f"GPU {device}"
        elif kind == ResourceKind.THREAD:
            pid, tid, pname = base + (int(key) >> 32), int(key) & 0xFFFFFFFF, "CPU"
        else:
            pid, tid, pname = base + RANK_PID_STRIDE - 1, i, kind.name.lower()
        pids.append(pid)
        tids.append(tid)
        pnames[pid] = f"rank {rank} {pname}" if multi else pname
        tnames[(pid, tid)] = str(name)
    return np.asarray(pids), np.asarray(tids), pnames, tnames


def chrome_trace(replay: Replay) -> dict[str, Any]:
    """The predicted timeline as a Chrome-trace document (a dict ready for JSON)."""
    g = replay.graph
    t = g.tasks
    start, end = replay.start_ns, replay.end_ns
    base_ns = int(start.min()) if len(start) else 0
    pids, tids, pnames, tnames = _track_ids(replay)
    res = t["resource"].to_numpy()
    kinds = t["kind"].to_numpy()
    names = t["name"].astype(str).to_numpy()
    events_col = t["event"].to_numpy()
    corr = g.trace.events["correlation"].to_numpy() if g.trace is not None else None
    ext = g.trace.events["external_id"].to_numpy() if g.trace is not None else None
    steps = t["step"].to_numpy()
    m_start, m_end = t["measured_start_ns"].to_numpy(), t["measured_end_ns"].to_numpy()
    out: list[dict[str, Any]] = []
    for pid, name in pnames.items():
        out.append({"ph": "M", "name": "process_name", "pid": int(pid), "tid": 0, "args": {"name": name}})
    for (pid, tid), name in tnames.items():
        out.append({"ph": "M", "name": "thread_name", "pid": int(pid), "tid": int(tid), "args": {"name": name}})

    def us(ns: int) -> float:
        return round((ns - base_ns) / 1000.0, 3)

    for i in range(len(t)):
        k = TaskKind(int(kinds[i]))
        cat = _CATEGORY.get(k)
        if cat is None:
            continue
        args: dict[str, Any] = {"whatif task": i, "step": int(steps[i])}
        row = int(events_col[i])
        if row >= 0 and corr is not None and ext is not None:
            if corr[row] >= 0:
                args["correlation"] = int(corr[row])
            if ext[row] >= 0:
                args["External id"] = int(ext[row])
        if m_start[i] >= 0:
            args["measured dur_ns"] = int(m_end[i] - m_start[i])
        if k.on_gpu:
            args["stream"] = int(tids[res[i]])
            args["device"] = int(pids[res[i]] % RANK_PID_STRIDE)
        out.append({"ph": "X", "cat": cat, "name": names[i], "pid": int(pids[res[i]]), "tid": int(tids[res[i]]),
                    "ts": us(int(start[i])), "dur": round((int(end[i]) - int(start[i])) / 1000.0, 3), "args": args})

    _, finisher = step_end_tasks(replay, start, end)
    begin = start[g.steps["begin_task"].to_numpy()]
    for row, (b, f) in enumerate(zip(g.steps["begin_task"].to_numpy(), finisher)):
        r = int(res[b])
        if ResourceKind(int(g.resources["kind"].to_numpy()[r])) != ResourceKind.THREAD:
            continue
        out.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{int(g.steps['step'].to_numpy()[row])}",
                    "pid": int(pids[r]), "tid": int(tids[r]), "ts": us(int(begin[row])),
                    "dur": round((int(end[f]) - int(begin[row])) / 1000.0, 3), "args": {}})

    e = g.edges
    launch = e[e["kind"] == int(EdgeKind.LAUNCH)]
    for s, d in zip(launch["src"].to_numpy(), launch["dst"].to_numpy()):
        row = int(events_col[d])
        if row < 0 or corr is None or corr[row] < 0:
            continue
        fid = int(corr[row])
        out.append({"ph": "s", "id": fid, "pid": int(pids[res[s]]), "tid": int(tids[res[s]]),
                    "ts": us(int(start[s])), "cat": "ac2g", "name": "ac2g"})
        out.append({"ph": "f", "id": fid, "pid": int(pids[res[d]]), "tid": int(tids[res[d]]),
                    "ts": us(int(start[d])), "cat": "ac2g", "name": "ac2g", "bp": "e"})
    doc: dict[str, Any] = {"schemaVersion": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": base_ns,
                           "traceName": "whatif predicted timeline", "traceEvents": out}
    if g.trace is not None and len(g.trace.ranks) == 1:
        meta = g.trace.ranks[0].metadata
        for key in ("deviceProperties", "distributedInfo"):
            if key in meta and _writable(meta[key]):
                doc[key] = meta[key]
    return doc


def _writable(value: Any) -> bool:
    """Whether a copied metadata value can be written back (a hostile trace may hold integers
    beyond 64 bits there, which the reader never uses and the writer cannot encode)."""
    try:
        orjson.dumps(value)
    except TypeError:
        return False
    return True


def write_chrome_trace(replay: Replay, path: str | Path) -> Path:
    """Write :func:`chrome_trace` to ``path`` (gzip when it ends in ``.gz``)."""
    path = Path(path)
    data = orjson.dumps(chrome_trace(replay))
    write_output(path, gzip_bytes(data) if path.suffix == ".gz" else data)
    return path
