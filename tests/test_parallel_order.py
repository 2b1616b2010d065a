"""A GPU move and a parallel plan commute: the collectives a parallel transform inserts are priced
on its topology preset's GPUs and then, like every collective ``gpu`` moves, on the GPU the graph
runs on (the link-ratio rule), so ``gpu`` before or after the parallel transform gives the same
collectives; the kernels a plan re-prices are priced on the recorded kernel's GEMM rate, waves and
launches, so they come out the same too; and derived tasks (a pipeline bubble, an overlap's later
nano-batches) follow the kernels they derive from."""
from __future__ import annotations

import numpy as np
import pytest
from _llm_tracegen import llm_trace

from whatif.api import analyze, make_context
from whatif.depgraph.graph import TaskKind
from whatif.depgraph.schema import BESIDE_SLOWED_COLUMN, DEVICE_COLUMN, FOLLOWS_COLUMN
from whatif.hardware.topology import preset
from whatif.predictors.replay import replay
from whatif.predictors.steps import step_times
from whatif.transforms.beside import lift_beside
from whatif.transforms.optimizations.batch import Batch
from whatif.transforms.optimizations.gpu import Gpu
from whatif.transforms.optimizations.precision import Precision
from whatif.transforms.parallel.data import DataParallel
from whatif.transforms.parallel.overlap import Overlap
from whatif.transforms.parallel.pipeline import PipelineParallel
from whatif.transforms.parallel.sequence import SequenceParallel
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


# -- every transform that changes a kernel's work commutes with a GPU move ------------------------

def kernel_ns(graph) -> np.ndarray:
    return graph.tasks["dur_ns"].to_numpy()[graph.tasks["kind"].to_numpy() == int(TaskKind.KERNEL)]


def both_orders(graph, ctx, transforms, dest: str):
    move = Gpu(device=dest)
    after = graph
    for t in transforms:
        after = t.apply(after, ctx)
    before = move.apply(graph, ctx)
    for t in transforms:
        before = t.apply(before, ctx)
    return move.apply(after, ctx), before


@pytest.fixture(scope="module")
def a100_forward(tmp_path_factory):
    return analyze(llm_trace(tmp_path_factory.mktemp("order") / "fwd.json.gz", new_tokens=2048, kv_tokens=2048,
                             layers=4, backward=False, steps=2, gpu_name="NVIDIA A100-SXM4-80GB",
                             device="A100_SXM_80GB"))


@pytest.mark.parametrize("dest", ["H100_SXM", "MI300X"])
@pytest.mark.parametrize("plan", ["tp4", "batch3", "batch0.5", "pp2"])
def test_training_plans_commute_with_a_gpu_move(a100_train, plan: str, dest: str) -> None:
    """Sharding, a larger or smaller batch, or a pipeline stage, then another GPU, prices every
    kernel as another GPU and then the plan: the GEMM rate is read at the recorded kernel's size
    in both (until 2026-11-28 the move read it at the shard's: TP 4 then MI300X was 13 % slower
    than MI300X then TP 4), the wave term of a batch is re-priced on the destination's SMs, and the
    pipeline bubble follows the stage's kernels."""
    g0, ctx = a100_train.graph, make_context(a100_train.trace)
    transform = {"tp4": TensorParallel(degree=4), "batch3": Batch(factor=3), "batch0.5": Batch(factor=0.5),
                 "pp2": PipelineParallel(degree=2)}[plan]
    x, y = both_orders(g0, ctx, [transform], dest)
    kx, ky = kernel_ns(x), kernel_ns(y)
    assert len(kx) == len(ky)
    assert np.abs(kx - ky).max() <= 2   # whole ns: a rounding per transform
    assert abs(step_ns(x) - step_ns(y)) <= 1e-5 * step_ns(y)


@pytest.mark.parametrize("dest", ["H100_SXM", "MI300X"])
@pytest.mark.parametrize("plan", ["pp4_serving", "ulysses4", "tp2_batch2"])
def test_inference_plans_commute_with_a_gpu_move(a100_forward, plan: str, dest: str) -> None:
    """A serving pipeline's micro-batches (each kernel m launches on 1/m of the rows: m launch
    latencies and the wave term on the destination), Ulysses' token split, and two plans in a row."""
    g0, ctx = a100_forward.graph, make_context(a100_forward.trace)
    transforms = {"pp4_serving": [PipelineParallel(degree=4, micro_batches=2, schedule="serving")],
                  "ulysses4": [SequenceParallel(degree=4)],
                  "tp2_batch2": [TensorParallel(degree=2), Batch(factor=2)]}[plan]
    x, y = both_orders(g0, ctx, transforms, dest)
    assert abs(step_ns(x) - step_ns(y)) <= 1e-5 * step_ns(y)


@pytest.mark.parametrize("dest", ["H100_SXM", "MI300X"])
@pytest.mark.parametrize("plan", ["int8", "int4_weight", "tp2_int8", "pp4_serving_int8"])
def test_precision_commutes_with_a_gpu_move(a100_forward, plan: str, dest: str) -> None:
    """Lower precision keeps each kernel's share of the achievable roofline, as the move does, so
    the two telescope (until 2026-11-28 precision used Habitat's blend m^g c^(1-g), whose g depends
    on the GPU's ridge: int8 then MI300X on a TP 2 graph was 2.2 % apart from MI300X then int8)."""
    g0, ctx = a100_forward.graph, make_context(a100_forward.trace)
    transforms = {"int8": [Precision(dtype="int8")], "int4_weight": [Precision(dtype="int4_weight")],
                  "tp2_int8": [TensorParallel(degree=2), Precision(dtype="int8")],
                  "pp4_serving_int8": [PipelineParallel(degree=4, micro_batches=2, schedule="serving"),
                                       Precision(dtype="int8")]}[plan]
    x, y = both_orders(g0, ctx, transforms, dest)
    kx, ky = kernel_ns(x), kernel_ns(y)
    assert kx.sum() < kernel_ns(g0).sum()
    assert np.abs(kx - ky).max() <= 2
    assert abs(step_ns(x) - step_ns(y)) <= 1e-5 * step_ns(y)


def test_precision_and_a_plan_commute(a100_train) -> None:
    """Sharding then quantizing, or quantizing then sharding: both read the GEMM rates at the
    recorded kernel's size, the dtype's at its state then."""
    g0, ctx = a100_train.graph, make_context(a100_train.trace)
    x = Precision(dtype="int8").apply(TensorParallel(degree=2).apply(g0, ctx), ctx)
    y = TensorParallel(degree=2).apply(Precision(dtype="int8").apply(g0, ctx), ctx)
    assert np.abs(kernel_ns(x) - kernel_ns(y)).max() <= 2


@pytest.mark.parametrize("dest", ["H100_SXM", "MI300X"])
def test_overlap_and_a_move_commute(a100_forward, dest) -> None:
    """The share of a nano-batch beside a collective part is re-taken at the durations a later
    transform leaves (a move speeds the compute, not the parts): overlap then a move prices the
    nano-batches as the move then overlap does (before 2026-11-28, evening, 2-4 % apart in step).
    What is left: a part is priced as a share of its whole and moved with a fixed part of its own
    (tens of ns per part)."""
    g0, ctx = a100_forward.graph, make_context(a100_forward.trace)
    plan = [TensorParallel(degree=4), Overlap(nano_batches=2)]
    x, y = both_orders(g0, ctx, plan, dest)
    assert step_ns(x) / step_ns(y) - 1 == pytest.approx(0, abs=3e-4)
    kx, ky = kernel_ns(x), kernel_ns(y)
    assert np.abs(kx - ky).max() <= 0.002 * ky.max()
    assert kx.sum() / ky.sum() - 1 == pytest.approx(0, abs=3e-4)
    fx, fy = (g.tasks[FOLLOWS_COLUMN].to_numpy(dtype=float) for g in (x, y))
    later = np.flatnonzero(np.isfinite(fx))
    assert len(later) and np.array_equal(later, np.flatnonzero(np.isfinite(fy)))
    assert fx[later] == pytest.approx(fy[later], rel=2e-3)


def test_overlap_interference_is_retaken_after_a_move(a100_forward) -> None:
    """After a move to a faster GPU the compute nano-batches shrink and the collective parts do not
    (NVLink is priced on the topology preset): a larger share of each nano-batch runs beside a part,
    so the nano-batches' slowdown grows; lifting it gives back the kernels' own durations."""
    g0, ctx = a100_forward.graph, make_context(a100_forward.trace)
    overlapped = Overlap(nano_batches=2, interference=1.5).apply(TensorParallel(degree=4).apply(g0, ctx), ctx)
    moved = Gpu(device="H100_SXM").apply(overlapped, ctx)
    slowed0 = overlapped.tasks[BESIDE_SLOWED_COLUMN].to_numpy(dtype=float)
    slowed1 = moved.tasks[BESIDE_SLOWED_COLUMN].to_numpy(dtype=float)
    hit = np.isfinite(slowed0) & (slowed0 > 1)
    assert hit.any() and (slowed1[hit] > slowed0[hit]).all() and (slowed1[hit] <= 1.5).all()
    bare = lift_beside(overlapped)
    d0, d1 = overlapped.tasks["dur_ns"].to_numpy(), bare.tasks["dur_ns"].to_numpy()
    assert (d1[hit] < d0[hit]).all() and np.array_equal(np.rint(d1[hit] * slowed0[hit]), d0[hit])
    assert (bare.tasks[BESIDE_SLOWED_COLUMN].to_numpy(dtype=float)[hit] == 1).all()


def test_a_pipeline_bubble_follows_later_transforms(a100_train) -> None:
    """The 1F1B bubble, (p-1)/m of the stage's kernels, shrinks with them when a later transform
    speeds them up (it stayed at its A100 length after a move to the H100 until 2026-11-28)."""
    g0, ctx = a100_train.graph, make_context(a100_train.trace)
    pp = PipelineParallel(degree=2)
    staged = pp.apply(g0, ctx)
    moved = Gpu(device="H100_SXM").apply(staged, ctx)
    for g in (staged, moved):
        t = g.tasks
        bubble = np.flatnonzero(t["name"].astype(str).str.startswith("pipeline bubble").to_numpy())
        kern = (t["kind"].to_numpy() == int(TaskKind.KERNEL)) & ~np.isin(np.arange(len(t)), bubble)
        assert len(bubble) == 1
        b = int(bubble[0])
        rank, step = t["rank"].to_numpy(), t["step"].to_numpy()
        same = kern & (rank == rank[b]) & (step == step[b])
        assert t["dur_ns"].to_numpy()[b] == round(t["dur_ns"].to_numpy()[same].sum() * (2 - 1) / pp.m)
    assert moved.tasks["dur_ns"].to_numpy()[bubble[0]] < staged.tasks["dur_ns"].to_numpy()[bubble[0]]


def test_the_physics_relation_checks_the_move_and_the_batch_commute(a100_forward, monkeypatch) -> None:
    """``device_commutes`` (whatif.physics, run on every shared trace by tests/test_physics.py)
    holds here, and fails when the move reads the GEMM rate at the work now (as before 2026-11-28)."""
    from whatif.physics import Relation, check
    from whatif.predictors import costs
    got = {r.relation: r for r in check(a100_forward)}[Relation.DEVICE_COMMUTES]
    assert got.applies and got.holds, got.detail
    plain = costs.retarget_ns
    monkeypatch.setattr(costs, "retarget_ns", lambda *a, size_flops=None, **k: plain(*a, **k))
    got = {r.relation: r for r in check(a100_forward)}[Relation.DEVICE_COMMUTES]
    assert got.applies and not got.holds and "order matters" in got.detail


def test_the_physics_relation_checks_precision_and_the_move_commute(a100_forward, monkeypatch) -> None:
    """``device_commutes`` also moves int8 (W8A8) quantization across the GPU move, and fails
    under a precision law whose ratio does not telescope with the move's (the factor to a power)."""
    from whatif.physics import Relation, check
    from whatif.predictors import costs
    plain = costs.TraceCostModel.precision_factor
    monkeypatch.setattr(costs.TraceCostModel, "precision_factor",
                        lambda self, *a, **k: plain(self, *a, **k) ** 1.2)
    got = {r.relation: r for r in check(a100_forward)}[Relation.DEVICE_COMMUTES]
    assert got.applies and not got.holds and "precision(int8)" in got.detail
