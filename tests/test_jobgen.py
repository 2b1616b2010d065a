"""Jobs generated from one real rank (issue 15 item 6): the analyses recover what was injected
(the straggler, every call's skew, the clock offsets) and the replay reproduces the job."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from whatif.api import analyze
from whatif.collectives import collectives
from whatif.core.errors import TraceError, WhatifError
from whatif.jobgen import JobOptions, generate_job

SOURCE = "hta/nccl_data_a100_rank0of2.json.gz"   # A100, 21 collectives with sizes and process groups


@pytest.fixture(scope="module")
def job(shared_traces: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    out = tmp_path_factory.mktemp("job")
    plan = generate_job(shared_traces / SOURCE, out, JobOptions(ranks=4, jitter_ns=20_000, seed=3),
                        stragglers={2: 300_000})
    return out, plan


def test_the_analyses_recover_what_was_injected(job: tuple[Path, object]) -> None:
    folder, plan = job
    a = analyze(folder)
    doc = collectives(a.trace, a.graph)
    assert len(doc.calls) == plan.arrival_delay_ns.shape[1] == 21
    assert all(len(c.ranks) == 4 and c.group_size == 4 and c.straggler == 2 for c in doc.calls)
    assert [c.skew_ns for c in doc.calls] == [plan.skew_ns(k) for k in range(21)]
    top = max(doc.ranks, key=lambda r: r.caused_wait_ns)
    assert (top.rank, top.straggler_calls) == (2, 21)
    assert a.graph.report["collectives_matched"] == 21
    assert a.graph.report["clock_offsets_ns_max_abs"] == int(np.abs(plan.clock_offset_ns).max())


def test_the_replay_reproduces_the_generated_job(job: tuple[Path, object]) -> None:
    folder, _ = job
    steps = analyze(folder).steps
    error = (steps["predicted_ns"] / steps["measured_ns"] - 1).abs()
    assert len(steps) == 4 * 3 and float(error.max()) < 1e-3


def test_same_seed_same_bytes(shared_traces: Path, tmp_path: Path) -> None:
    opts = JobOptions(ranks=2, seed=7)
    a = generate_job(shared_traces / SOURCE, tmp_path / "a", opts)
    b = generate_job(shared_traces / SOURCE, tmp_path / "b", opts)
    assert [p.read_bytes() for p in a.files] == [p.read_bytes() for p in b.files]
    c = generate_job(shared_traces / SOURCE, tmp_path / "c", JobOptions(ranks=2, seed=8))
    assert c.files[1].read_bytes() != b.files[1].read_bytes()


def test_refusals(shared_traces: Path, tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no collective kernel"):
        generate_job(shared_traces / "hta" / "cuda_event_sync_a100.json.gz", tmp_path / "x")
    with pytest.raises(ValueError, match=r"straggler rank 9 is not in 0\.\.3"):
        generate_job(shared_traces / SOURCE, tmp_path / "y", JobOptions(ranks=4), stragglers={9: 1})
    with pytest.raises(WhatifError, match="ranks must be"):
        JobOptions(ranks=1)
