"""The build's memory-saving forms give exactly what the plain pandas forms gave: the task
table's text columns factorized part by part, resource ids from one sort, categorical columns
copied by code, memoized facts dropped on every change, freed memory handed back
(docs/scale.md, "Where the memory goes")."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from whatif.core.heap import release_freed_memory
from whatif.depgraph.build import build_graph
from whatif.depgraph.rules import RULES, LauncherAttribution
from whatif.depgraph.state import TaskColumns
from whatif.depgraph.tasks import _resource_ids, initial_state
from whatif.tracer.trace import load_trace

SAMPLE_GPU_TRACE = Path(__file__).resolve().parents[1] / "sample_traces" / "gpu" / "pairs" / "p6_batch-before-r1" / \
    "rank0.pt.trace.json.gz"
"""A real H100 trace our harvest recorded (launches with phase/op attribution)."""


def _texts(rng: np.random.Generator, n: int) -> list[str | None]:
    pool = ["aten::mm", "b", "a", "ProfilerStep#3", "", "nccl:all_reduce", "Z"]
    return [None if rng.random() < 0.3 else pool[int(rng.integers(0, len(pool)))] for _ in range(n)]


@pytest.mark.parametrize("seed", range(4))
def test_text_columns_are_what_pd_categorical_makes(seed: int) -> None:
    rng = np.random.default_rng(seed)
    cols = TaskColumns()
    parts = [_texts(rng, int(rng.integers(0, 40))) for _ in range(5)]
    if seed == 3:
        parts = [[None] * len(p) for p in parts]  # no text at all: empty categories, object
    for p in parts:
        n = len(p)
        cols.add(**{k: np.zeros(n, dtype=np.int64) for k in cols.parts if k not in ("phase", "layer", "op", "name")},
                 phase=p, layer=np.asarray(p, dtype=object), op=[None] * n, name=p)
    joined = np.concatenate([np.asarray(p, dtype=object) for p in parts])
    frame = cols.frame()
    for column in ("phase", "layer", "op", "name"):
        expect = pd.Categorical(joined if column != "op" else np.full(len(joined), None, dtype=object))
        got = frame[column].array
        assert list(got.categories) == list(expect.categories)
        assert got.categories.dtype == expect.categories.dtype
        assert got.codes.tolist() == expect.codes.tolist()
    assert cols.parts == {}  # consumed


@pytest.mark.parametrize("seed", range(3))
def test_resource_ids_follow_sorted_keys(seed: int) -> None:
    rng = np.random.default_rng(seed)
    a, b, c = (rng.integers(-3, 4, size=200) for _ in range(3))
    made: list[tuple[int, int, int]] = []
    ids = _resource_ids(lambda *k: made.append(k) or len(made) - 1, a, b, c)
    groups = pd.DataFrame({"a": a, "b": b, "c": c}).groupby(["a", "b", "c"], sort=True).ngroup().to_numpy()
    assert ids.tolist() == groups.tolist()
    assert made == sorted(set(zip(a.tolist(), b.tolist(), c.tolist())))


def test_attribution_keeps_text_columns_categorical() -> None:
    """Copying the launch call's phase/layer/op onto GPU tasks copies codes: a column turned into
    one Python object per task cost ~100 MiB at 1.1 M tasks."""
    state = initial_state(load_trace(SAMPLE_GPU_TRACE))
    before = {c: state.tasks[c].tolist() for c in ("phase", "layer", "op")}
    for step in RULES:
        step.run(state)
        if isinstance(step, LauncherAttribution):
            break
    launched = state.launch_of >= 0
    for c in ("phase", "layer", "op"):
        assert isinstance(state.tasks[c].dtype, pd.CategoricalDtype)
        after = state.tasks[c].tolist()
        calls = state.launch_of[launched]
        assert [after[i] for i in np.flatnonzero(launched)] == [before[c][j] for j in calls]


def test_changes_drop_memoized_facts() -> None:
    state = initial_state(load_trace(SAMPLE_GPU_TRACE))
    first = state.start_ns
    assert state.memo("x", lambda: 1) == 1
    state.set_column("measured_start_ns", np.array([0]), first[0] + 5)
    assert state.memo("x", lambda: 2) == 2
    assert state.start_ns[0] == first[0] + 5


def test_graph_does_not_share_columns_with_a_later_build() -> None:
    """``assemble`` hands the state's columns to the graph without a copy: two builds of one trace
    are equal, and an edit of one graph's table leaves the other's alone."""
    trace = load_trace(SAMPLE_GPU_TRACE)
    g1, g2 = build_graph(trace), build_graph(trace)
    pd.testing.assert_frame_equal(g1.tasks, g2.tasks)
    g1.tasks.loc[0, "dur_ns"] += 1
    assert g1.tasks.loc[0, "dur_ns"] == g2.tasks.loc[0, "dur_ns"] + 1


def test_release_freed_memory_is_harmless() -> None:
    kept = np.arange(1_000_000)
    assert isinstance(release_freed_memory(), bool)
    assert int(kept.sum()) == 999_999 * 1_000_000 // 2
