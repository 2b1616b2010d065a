"""A GPU move and a parallel plan commute: the collectives a parallel transform inserts are priced
on its topology preset's GPUs and then, like every collective ``gpu`` moves, on the GPU the graph
runs on (the link-ratio rule), so ``gpu`` before or after the parallel transform gives the same
collectives and, for data parallelism, the same step."""
from __future__ import annotations

import numpy as np
import pytest
from _llm_tracegen import llm_trace

from whatif.api import analyze, make_context
from whatif.depgraph.graph import TaskKind
from whatif.depgraph.schema import DEVICE_COLUMN
from whatif.hardware.topology import preset
from whatif.predictors.replay import replay
from whatif.predictors.steps import step_times
from whatif.transforms.optimizations.gpu import Gpu
from whatif.transforms.parallel.data import DataParallel
from whatif.transforms.parallel.tensor import TensorParallel


def step_ns(graph) -> int:
    return int(step_times(replay(graph))["predicted_ns"].sum())


def comm_ns(graph) -> int:
    t = graph.tasks
    return int(t["dur_ns"].to_numpy()[t["kind"].to_numpy() == int(TaskKind.COMM)].sum())


@pytest.fixture(scope="module")
def a100_train(tmp_path_factory):
    return analyze(llm_trace(tmp_path_factory.mktemp("order") / "train.json.gz", new_tokens=1024, kv_tokens=1024,
                             layers=2, backward=True, steps=1, gpu_name="NVIDIA A100-SXM4-80GB",
                             device="A100_SXM_80GB"))


@pytest.mark.parametrize("dest, topology", [("H100_SXM", "dgx_h100"), ("H100_SXM", "dgx_a100"),
                                            ("A100_SXM_80GB", "dgx_h100"), ("MI300X", "dgx_h100")])
def test_gpu_and_data_parallel_commute(a100_train, dest: str, topology: str) -> None:
    g0, ctx = a100_train.graph, make_context(a100_train.trace)
    dp, move = DataParallel(degree=8, topology=topology), Gpu(device=dest)
    after = move.apply(dp.apply(g0, ctx), ctx)
    before = dp.apply(move.apply(g0, ctx), ctx)
    n = int((after.tasks["kind"].to_numpy() == int(TaskKind.COMM)).sum())   # whole ns: one rounding each
    assert comm_ns(before) > 0 and abs(comm_ns(after) - comm_ns(before)) <= n
    assert abs(step_ns(after) - step_ns(before)) <= n


def test_collectives_keep_the_preset_price_on_the_presets_gpu(a100_train) -> None:
    """Data parallelism over DGX H100s, then the A100 trace moved to the H100: the all-reduces were
    priced on H100 links and stay so (until 2026-11-28 the move scaled them again by A100/H100,
    1.5x too fast)."""
    g0, ctx = a100_train.graph, make_context(a100_train.trace)
    on_h100 = Gpu(device="H100_SXM").apply(DataParallel(degree=8, topology="dgx_h100").apply(g0, ctx), ctx)
    plain = DataParallel(degree=8, topology="dgx_h100").apply(Gpu(device="H100_SXM").apply(g0, ctx), ctx)
    comm = np.flatnonzero(on_h100.tasks["kind"].to_numpy() == int(TaskKind.COMM))
    assert set(on_h100.tasks[DEVICE_COLUMN].to_numpy()[comm]) == {preset("dgx_h100").device}
    assert comm_ns(on_h100) == comm_ns(plain)


def test_a_preset_of_another_gpu_takes_the_graphs_links(a100_train) -> None:
    """On the A100 trace, DGX H100's fabric with A100 GPUs: the all-reduces slow by the NVLink
    ratio (450 / 300 GB/s per direction) beyond their fixed latency, and are marked as on the A100."""
    g0, ctx = a100_train.graph, make_context(a100_train.trace)
    on_a100 = DataParallel(degree=8, topology="dgx_h100").apply(g0, ctx)
    on_h100 = DataParallel(degree=8, topology="dgx_h100").apply(Gpu(device="H100_SXM").apply(g0, ctx), ctx)
    assert 1.3 < comm_ns(on_a100) / comm_ns(on_h100) <= 1.5
    comm = np.flatnonzero(on_a100.tasks["kind"].to_numpy() == int(TaskKind.COMM))
    assert set(on_a100.tasks[DEVICE_COLUMN].to_numpy()[comm]) == {"A100_SXM_80GB"}


def test_gpu_and_tensor_parallel_give_the_same_collectives(a100_train) -> None:
    g0, ctx = a100_train.graph, make_context(a100_train.trace)
    tp, move = TensorParallel(degree=2, topology="dgx_h100"), Gpu(device="H100_SXM")
    after, before = move.apply(tp.apply(g0, ctx), ctx), tp.apply(move.apply(g0, ctx), ctx)
    n = int((after.tasks["kind"].to_numpy() == int(TaskKind.COMM)).sum())
    assert comm_ns(before) > 0 and abs(comm_ns(after) - comm_ns(before)) <= n
