"""The trace reader on every third-party trace in ../shared/traces (skipped when absent).

Each file loads, or is refused with a one-line reason; the refused ones are exactly the three
traces that hold no GPU work we could analyze. Counts (steps, kernels, copies, streams, NCCL
kernels) are checked against the README's table, which was made by a different counter.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np
import pytest

from whatif.tracer import EventKind, Trace, TraceError, load_trace
from whatif.tracer.kinds import GPU_KINDS
from whatif.tracer.trace import COLUMNS

SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
pytestmark = [pytest.mark.shared, pytest.mark.slow]  # the whole corpus: the full suite, not the fast lane

# The README's "Edge cases" that cannot be analyzed, and the words our refusal must use.
REFUSED = {
    "zoology/mqar_a100_no_gpu_activity.json.gz": "no GPU activity recorded",  # GPU tracing was off
    "hta/cupti_range_profiler_a100.json.gz": "CUPTI range profiler",          # kernels not traced
    "hta/mtia_inference_rank0.json.gz": "MTIA",                               # not a GPU
}


def _trace_files() -> list[str]:
    if not SHARED_TRACES.is_dir():
        return []
    return sorted(str(p.relative_to(SHARED_TRACES)) for p in SHARED_TRACES.rglob("*")
                  if p.is_file() and p.name.endswith((".json", ".json.gz")))


FILES = _trace_files()


@pytest.fixture(scope="module", autouse=True)
def _need_shared() -> None:
    if not SHARED_TRACES.is_dir():
        pytest.skip(f"third-party traces not found at {SHARED_TRACES} (../shared is absent)")


@functools.cache
def outcome(rel: str) -> Trace | str:
    """The loaded trace, or the refusal's message."""
    try:
        return load_trace(SHARED_TRACES / rel)
    except TraceError as exc:
        return str(exc)


def readme_counts() -> dict[str, dict[str, int]]:
    """Steps, GPU event counts, streams and NCCL kernels per file, from the README's files table."""
    columns = {"steps": 6, "kernel": 10, "memcpy": 11, "memset": 12, "streams": 14, "nccl": 15}
    counts = {}
    for line in (SHARED_TRACES / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) > 15 and cells[0].startswith("`") and all(cells[i].isdigit() for i in columns.values()):
            counts[cells[0].strip("`")] = {k: int(cells[i]) for k, i in columns.items()}
    return counts


@pytest.mark.parametrize("rel", FILES or ["(none)"])
def test_loads_or_is_refused_in_one_line(rel: str) -> None:
    result = outcome(rel)
    if isinstance(result, str):
        assert rel in REFUSED, f"unexpected refusal: {result}"
        assert "\n" not in result and result.startswith(f"{SHARED_TRACES / rel}: ")
        assert REFUSED[rel] in result
        return
    assert rel not in REFUSED, f"{rel} should be refused ({REFUSED[rel]})"
    ev = result.events
    assert tuple(ev.columns) == COLUMNS and len(ev) > 0
    rank, ts, dur = (ev[c].to_numpy() for c in ("rank", "ts_ns", "dur_ns"))
    assert (dur >= 0).all()
    same_rank = rank[1:] == rank[:-1]
    assert (np.diff(ts)[same_rank] >= 0).all()  # sorted by (rank, ts)
    gpu = ev["kind"].isin([int(k) for k in GPU_KINDS]).to_numpy()
    work = ev["kind"].isin([EventKind.KERNEL, EventKind.MEMCPY, EventKind.MEMSET]).to_numpy()
    assert (ev["device"].to_numpy()[gpu] >= 0).all() and (ev["device"].to_numpy()[~gpu] == -1).all()
    assert (ev["stream"].to_numpy()[work] >= 0).all()  # event/context syncs may be on no stream (-1)


def test_refused_files_are_exactly_the_three_without_gpu_work() -> None:
    refused = {rel for rel in FILES if isinstance(outcome(rel), str)}
    assert refused == set(REFUSED)


def test_counts_match_the_readme() -> None:
    expected = readme_counts()
    assert len(expected) >= 40, "README table not parsed"
    step = re.compile(r"ProfilerStep#\d+$")
    for rel, want in expected.items():
        trace = outcome(rel)
        if isinstance(trace, str):
            continue
        ev = trace.events
        names = ev.loc[ev["kind"] == EventKind.ANNOTATION, "name"].astype(str)
        work = ev["kind"].isin([EventKind.KERNEL, EventKind.MEMCPY, EventKind.MEMSET])
        kernels = ev.loc[ev["kind"] == EventKind.KERNEL, "name"].astype(str).str.lower()
        got = {"steps": names[names.str.match(step)].nunique(), "kernel": trace.count(EventKind.KERNEL),
               "memcpy": trace.count(EventKind.MEMCPY), "memset": trace.count(EventKind.MEMSET),
               "streams": len(ev.loc[work, ["device", "stream"]].drop_duplicates()),
               "nccl": int(kernels.str.contains("nccl|rccl").sum())}
        assert got == want, rel


def test_multi_rank_folder() -> None:
    trace = load_trace(SHARED_TRACES / "hta" / "sampled_world128")
    assert [(r.rank, r.world_size) for r in trace.ranks] == [(0, 128), (1, 128)]
    assert set(trace.events["rank"]) == {0, 1}
    per_rank = trace.events.groupby("rank", observed=True).size().to_dict()
    assert per_rank == {0: len(outcome("hta/sampled_world128/rank-0.json.gz").events),
                        1: len(outcome("hta/sampled_world128/rank-1.json.gz").events)}


def test_2021_trace_links_ops_to_kernels() -> None:
    """2021 schema: string tids, lowercase 'external id', launch and kernel share correlation."""
    ev = outcome("kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz").events
    kernels = ev[ev["kind"] == EventKind.KERNEL]
    assert set(kernels["stream"]) == {7} and (kernels["external_id"] >= 0).all()
    launches = ev[(ev["kind"] == EventKind.RUNTIME) & (ev["correlation"] >= 0)]
    assert set(kernels["correlation"]) <= set(launches["correlation"])


def test_float_relative_timestamps_become_absolute() -> None:
    trace = outcome("hta/nccl_data_a100_rank0of2.json.gz")
    start = trace.events["ts_ns"].min()
    assert 1_716_000_000 * 10**9 < start < 1_717_000_000 * 10**9  # May 2024, as the README says
