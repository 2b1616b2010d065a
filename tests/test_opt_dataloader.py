"""The ``dataloader`` optimization: batch loading moves to N worker processes.

Hand-made CPU-bound loop (per step: a 4 ms in-thread ``__next__``, then 3 × 0.5 ms of training
ops each launching a 0.1 ms kernel), and a regression guard on the real ResNet50 pair.
"""
from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from tracegen import KinetoTrace

from whatif.api import Analysis, analyze, predict
from whatif.depgraph.graph import EdgeKind, ResourceKind
from whatif.transforms.base import TransformContext, TransformError
from whatif.transforms.generic import Remove
from whatif.transforms.optimizations.dataloader import DataLoaderWorkers
from whatif.transforms.scenario import ScenarioError, build_transform
from whatif.transforms.select import Selector

LOAD_US, OP_US, OPS, STEPS = 4000, 500, 3, 48
NEXT = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
CTX = TransformContext()


def loop_trace(steps: int = STEPS, loader: str | None = NEXT) -> KinetoTrace:
    """``steps`` iterations of: load a batch in the training thread, then 3 launching ops."""
    tr = KinetoTrace()
    t, corr = 0, 1
    for n in range(steps):
        begin = t
        t += 10
        if loader:
            tr.op(loader, t, LOAD_US)
            t += LOAD_US + 10
        for _ in range(OPS):
            tr.op("aten::mm", t, OP_US - 20)
            tr.runtime("cudaLaunchKernel", t + OP_US - 60, 20, corr=corr)
            tr.gpu("gemm", t + OP_US - 30, 100, corr=corr)
            corr += 1
            t += OP_US
        t += 10
        tr.step(n, begin, t - begin)
    return tr


@pytest.fixture(scope="module")
def loop(tmp_path_factory: pytest.TempPathFactory) -> Analysis:
    return analyze(loop_trace().write(tmp_path_factory.mktemp("dl") / "loop.json.gz"))


def steady_ms(a: Analysis, transform: DataLoaderWorkers | Remove) -> float:
    """Mean predicted step (ms) over the last 8 steps: past the prefetched warm-up (a full queue of
    N·prefetch_factor batches drains at load/N − train per step), and a whole number of rounds of
    N ∈ {1, 2, 4} workers, whose batches arrive in bursts (N loads that started together)."""
    steps = predict(a, [transform], CTX).scenarios[0].steps
    return float(np.mean(steps["predicted_ns"].to_numpy()[-8:])) / 1e6


def test_measured_loop_is_load_plus_train(loop: Analysis) -> None:
    assert np.median(loop.steps["measured_ns"]) / 1e3 == pytest.approx(LOAD_US + OPS * OP_US + 30, abs=1)


def test_one_worker_keeps_the_step_at_the_load_time(loop: Analysis) -> None:
    assert steady_ms(loop, DataLoaderWorkers(workers=1, fetch_us=50)) == pytest.approx(LOAD_US / 1e3, rel=0.02)


def test_more_workers_drop_the_step_to_max_of_train_and_load_over_n(loop: Analysis) -> None:
    train_ms = steady_ms(loop, Remove(select=Selector(kind="cpu_work", name="DataLoader")))
    assert train_ms == pytest.approx(OPS * OP_US / 1e3, rel=0.05)
    # 4 workers: load/4 = 1 ms < training thread (1.5 ms + fetch): CPU-bound again.
    assert steady_ms(loop, DataLoaderWorkers(workers=4, fetch_us=50)) == pytest.approx(train_ms + 0.05, rel=0.02)
    # 2 workers: load/2 = 2 ms > training thread: data-bound at load / N.
    assert steady_ms(loop, DataLoaderWorkers(workers=2, fetch_us=50)) == pytest.approx(LOAD_US / 2e3, rel=0.02)
    # contention: 4 workers each 2x slower behave like 2 unslowed ones.
    assert steady_ms(loop, DataLoaderWorkers(workers=4, fetch_us=50, load_scale=2.0)) == \
        pytest.approx(LOAD_US / 2e3, rel=0.02)


def test_fetch_cost_lands_on_the_training_thread(loop: Analysis) -> None:
    cheap = steady_ms(loop, DataLoaderWorkers(workers=4, fetch_us=0))
    dear = steady_ms(loop, DataLoaderWorkers(workers=4, fetch_us=300))
    assert dear - cheap == pytest.approx(0.3, abs=0.01)


def test_graph_structure(loop: Analysis) -> None:
    t = DataLoaderWorkers(workers=2, prefetch_factor=2)
    g = t.apply(loop.graph, CTX)
    new = g.resources.iloc[len(loop.graph.resources):]
    assert len(new) == 2 and (new["kind"] == int(ResourceKind.THREAD)).all() and new["ordered"].all()
    loads = t.match(loop.graph, CTX)
    workers = np.flatnonzero(np.isin(g.tasks["resource"].to_numpy(), new.index.to_numpy()))
    assert len(workers) == STEPS - 4  # the first 2*2 batches were prefetched before the window (warm)
    names = g.tasks["name"].astype(str).to_numpy()
    res = g.tasks["resource"].to_numpy()
    e = g.edges
    for w in workers.tolist():
        b = int(names[w].split()[2])
        assert res[w] == new.index[b % 2]
        into = e[(e["dst"] == w) & (e["kind"] == int(EdgeKind.FLOW))]["src"].tolist()
        assert into == [int(loads[b - 4])]  # prefetch window: waits for batch b-4 to be consumed
        out = e[(e["src"] == w) & (e["kind"] == int(EdgeKind.FLOW))]["dst"].tolist()
        assert out == [int(loads[b])]  # its fetch waits for it
        assert g.tasks["dur_ns"].iat[w] == loop.graph.tasks["dur_ns"].iat[loads[b]]
    assert (g.tasks["dur_ns"].to_numpy()[loads] == 1_000_000).all()  # default fetch estimate: 1 ms


def test_cold_start_makes_the_first_fetch_wait_a_whole_load(loop: Analysis) -> None:
    warm = predict(loop, [DataLoaderWorkers(workers=4, fetch_us=50)], CTX).scenarios[0].steps
    cold = predict(loop, [DataLoaderWorkers(workers=4, fetch_us=50, warm=False)], CTX).scenarios[0].steps
    first_gap = (cold["predicted_ns"].iat[0] - warm["predicted_ns"].iat[0]) / 1e6
    assert first_gap == pytest.approx(LOAD_US / 1e3, rel=0.02)
    assert np.median(cold["predicted_ns"].to_numpy()[-6:]) == np.median(warm["predicted_ns"].to_numpy()[-6:])


def test_input_unchanged_and_change_log(loop: Analysis) -> None:
    g0 = loop.graph
    before = (g0.tasks.copy(), g0.edges.copy(), g0.resources.copy(), list(g0.changes))
    g = DataLoaderWorkers(workers=3).apply(g0, CTX)
    assert g0.tasks.equals(before[0]) and g0.edges.equals(before[1]) and g0.resources.equals(before[2])
    assert g0.changes == before[3]
    mine = [c for c in g.changes[len(g0.changes):]]
    assert mine and all(c.transform == "dataloader" for c in mine)
    assert "3 worker processes" in str(mine[-1]) and mine[-1].tasks == STEPS


def test_refusals(tmp_path: Path, loop: Analysis) -> None:
    with pytest.raises(TransformError, match=r"workers must be an integer >= 1 and <= 4096, got 0"):
        DataLoaderWorkers(workers=0)
    with pytest.raises(TransformError, match="prefetch_factor"):
        DataLoaderWorkers(workers=2, prefetch_factor=0)
    bare = analyze(loop_trace(steps=3, loader=None).write(tmp_path / "bare.json.gz"))
    with pytest.raises(TransformError, match=r"no data-loading task.*_SingleProcessDataLoaderIter\.__next__"):
        DataLoaderWorkers(workers=2).apply(bare.graph, CTX)
    multi = analyze(loop_trace(steps=3, loader="enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__")
                    .write(tmp_path / "multi.json.gz"))
    with pytest.raises(TransformError, match="already uses worker processes"):
        DataLoaderWorkers(workers=2).apply(multi.graph, CTX)
    # applied twice: the fetches are named as a multi-process loader's, so the second is refused
    once = DataLoaderWorkers(workers=2).apply(loop.graph, CTX)
    with pytest.raises(TransformError, match="already uses worker processes"):
        DataLoaderWorkers(workers=2).apply(once, CTX)


def test_a_long_kernel_name_costs_no_memory_per_event(tmp_path: Path) -> None:
    """Finding the loading ranges reads each distinct name once: one 40,000-character kernel name
    in a trace of ~3,500 events is not copied into a fixed-width text array per event (that took
    ~4 GB on a 193k-event xDiT trace with a 5,160-character Triton name)."""
    tr = loop_trace(steps=192)
    tr.gpu("k" * 40_000, 10, 5, corr=10**6)
    a = analyze(tr.write(tmp_path / "long.json.gz"))
    tracemalloc.start()
    try:
        DataLoaderWorkers(workers=2).apply(a.graph, CTX)
        peak_bytes = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak_bytes < 64 * 2**20, f"{peak_bytes / 2**20:.0f} MiB"


def test_scenario_parameters() -> None:
    t = build_transform("dataloader", {"workers": 4, "fetch_us": 200, "select": {"name": "__next__"}})
    assert isinstance(t, DataLoaderWorkers) and t.select == Selector(name="__next__") and t.fetch_us == 200.0
    with pytest.raises(ScenarioError, match="missing parameter 'workers'"):
        build_transform("dataloader", {})


NW0_A = "kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz"
NW4 = ("kineto/resnet50_num_workers_4__worker0.1623212756351.pt.trace.json.gz",
       "kineto/resnet50_num_workers_4__worker0.1623213129365.pt.trace.json.gz")


def test_resnet50_nw0_to_nw4_within_20_percent(shared_traces: Path) -> None:
    """Regression guard (bench/whatif_dataloader.py reports the exact figures): the workers=4
    prediction from num_workers=0 capture A, median of steps 2..6, vs each num_workers=4 capture."""
    pred = predict(shared_traces / NW0_A, [DataLoaderWorkers(workers=4)]).scenarios[0].steps
    predicted = float(np.median(pred["predicted_ns"].to_numpy()[1:]))
    for path in NW4:
        measured = float(np.median(analyze(shared_traces / path).steps["measured_ns"].to_numpy()[1:]))
        assert abs(predicted / measured - 1) < 0.20, (path, predicted / 1e6, measured / 1e6)
