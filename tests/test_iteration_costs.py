"""The operator-cost serving iteration model (predictors/serving/iteration_costs.py): recorded
iterations re-priced at other batches by their kernels' laws must move as the hardware does.

Ground truth: traces of the same model generated at the other batch with every kernel timed by the
catalog's achievable roofline and the weight GEMMs by the weight-GEMM law (tests/_llm_tracegen.py,
``device=``, ``gemm_law=True``), so a prediction from one batch can be checked against the measured
iteration at another."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _llm_tracegen import llm_trace

from whatif.analysis import analyze, make_context
from whatif.hardware.devices import get_device
from whatif.predictors.replay import replay
from whatif.predictors.serving.engines import (
    CompositionSource,
    FoundIteration,
    FoundIterations,
    IterationPhase,
    iteration_of_tasks,
)
from whatif.predictors.serving.iteration_costs import (
    CostIterationModel,
    Drivers,
    KernelLaw,
    cpu_only_replay,
    fit_cost_model,
)
from whatif.predictors.serving.logs import LLMBatch
from whatif.transforms.base import TransformContext
from whatif.transforms.generic import Scale
from whatif.transforms.parallel.memory import model_shape
from whatif.transforms.select import Selector

H100 = "H100_SXM"
KW = {"layers": 2, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336, "device": H100, "steps": 3,
      "gemm_law": True}


def _decode(seqs: int, context: int) -> LLMBatch:
    return LLMBatch(decode_context=(context,) * seqs)


def _prefill(tokens: int) -> LLMBatch:
    return LLMBatch(prefill_tokens=(tokens,))


def _trace(tmp: Path, batch: LLMBatch) -> Path:
    name = f"{batch.phase}_{len(batch.prefill_tokens or batch.decode_context)}_{sum(batch.prefill_tokens)}.json"
    if batch.prefill_tokens:
        return llm_trace(tmp / name, batch=1, new_tokens=batch.prefill_tokens[0], kv_tokens=batch.prefill_tokens[0],
                         **KW)
    return llm_trace(tmp / name, batch=len(batch.decode_context), new_tokens=1, kv_tokens=batch.decode_context[0],
                     **KW)


def _found(graph, batch: LLMBatch) -> FoundIterations:
    """Every step of a generated trace is one iteration of ``batch`` (its ProfilerStep window)."""
    steps = graph.steps
    its = tuple(FoundIteration(rank=int(r.rank), start_ns=int(r.measured_begin_ns), end_ns=int(r.measured_end_ns),
                               phase=IterationPhase(batch.phase), evidence=f"step {int(r.step)}", llm=batch)
                for r in steps.itertuples())
    return FoundIterations("test", its, CompositionSource.ANNOTATION)


def _fit(graph, batch: LLMBatch, trace) -> CostIterationModel:
    found = _found(graph, batch)
    rp = replay(graph)
    shape = model_shape(graph, make_context(trace), "serve")
    return fit_cost_model(rp, cpu_only_replay(rp), found, get_device(H100), shape)


def _measured_ns(path: Path) -> float:
    """The generated iteration's measured time (mean step, the warm-up included: all steps alike)."""
    a = analyze(path)
    s = a.graph.steps
    return float((s["measured_end_ns"] - s["measured_begin_ns"]).mean())


@pytest.fixture(scope="module")
def decode8(tmp_path_factory) -> tuple[CostIterationModel, Path]:
    tmp = tmp_path_factory.mktemp("decode8")
    batch = _decode(8, 2048)
    path = _trace(tmp, batch)
    a = analyze(path)
    return _fit(a.graph, batch, a.trace), tmp


def test_drivers_of_a_mixed_batch() -> None:
    d = Drivers.of(LLMBatch(prefill_tokens=(100,), prefill_cached=(50,), decode_context=(10, 30)))
    assert (d.tokens, d.seqs, d.keys, d.context) == (102.0, 3.0, 190.0, 40.0)
    assert d.pairs == 100 * 50 + 100 * 101 / 2 + 40


def test_every_kernel_of_an_iteration_gets_its_law(decode8) -> None:
    model, _ = decode8
    anchor = model.phases["decode"].anchors[0]
    counts = np.bincount(anchor.kernels.law, minlength=len(KernelLaw))
    # per layer: 4 GEMMs, 1 attention, 5 norms/elementwise (2 layers)
    assert counts.tolist() == [8, 2, 10]


@pytest.mark.parametrize("target", [_decode(64, 2048), _decode(8, 8192), _decode(256, 1024)])
def test_decode_extrapolates_within_15_percent_and_beats_no_change(decode8, target: LLMBatch) -> None:
    """Fitted on decode of 8 sequences at 2k context, predicted at 8x the sequences, 4x the context,
    32x the sequences at half the context: each against a trace generated at that batch."""
    model, tmp = decode8
    measured = _measured_ns(_trace(tmp, target))
    predicted = model.raw_time_ns(target)
    unchanged = model.raw_time_ns(_decode(8, 2048))
    assert abs(predicted / measured - 1) < 0.15, (predicted, measured)
    assert abs(predicted - measured) < abs(unchanged - measured)


@pytest.mark.parametrize("target", [_decode(64, 2048), _decode(8, 8192)])
def test_decode_extrapolates_on_a_trace_timed_by_the_plain_roofline(tmp_path: Path, target: LLMBatch) -> None:
    """The same, with every kernel of the truth timed by the achievable roofline at its own size
    (``gemm_law=False``: not the law the model prices GEMMs with), so the GEMM part is not circular."""
    kw = {**KW, "gemm_law": False}

    def trace(batch: LLMBatch) -> Path:
        name = f"plain_{len(batch.decode_context)}_{batch.decode_context[0]}.json"
        return llm_trace(tmp_path / name, batch=len(batch.decode_context), new_tokens=1,
                         kv_tokens=batch.decode_context[0], **kw)

    recorded = _decode(8, 2048)
    a = analyze(trace(recorded))
    model = _fit(a.graph, recorded, a.trace)
    measured = _measured_ns(trace(target))
    predicted = model.raw_time_ns(target)
    assert abs(predicted / measured - 1) < 0.15, (predicted, measured)
    assert abs(predicted - measured) < abs(model.raw_time_ns(recorded) - measured)


def test_prefill_extrapolates_in_tokens(tmp_path: Path) -> None:
    """Fitted on a 256-token prefill (GEMMs below the knee), predicted at 2,048 tokens (above it)."""
    batch = _prefill(256)
    a = analyze(_trace(tmp_path, batch))
    model = _fit(a.graph, batch, a.trace)
    target = _prefill(2048)
    measured = _measured_ns(_trace(tmp_path, target))
    predicted = model.raw_time_ns(target)
    assert abs(predicted / measured - 1) < 0.15, (predicted, measured)


def test_more_work_is_never_faster(decode8) -> None:
    model, _ = decode8
    for seqs in (1, 4, 16, 64, 256):
        times = [model.raw_time_ns(_decode(seqs, c)) for c in (128, 512, 2048, 8192)]
        assert times == sorted(times)
    for ctx in (256, 4096):
        times = [model.raw_time_ns(_decode(s, ctx)) for s in (1, 8, 32, 128, 512)]
        assert times == sorted(times)
    pre = [model.raw_time_ns(_prefill(n)) for n in (16, 128, 1024, 8192)]
    assert pre == sorted(pre)


def test_decode_below_the_knee_reads_weights_in_the_same_time(decode8) -> None:
    """Decode GEMMs are bound by reading the weights: 1 to 64 sequences at short context cost within
    a few percent; beyond the knee (~250 tokens on an H100 in bf16) they grow."""
    model, _ = decode8
    law = model.device_law
    assert 150 < law.knee_tokens < 400
    one, sixty_four = model.raw_time_ns(_decode(1, 16)), model.raw_time_ns(_decode(64, 16))
    assert sixty_four / one < 1.15
    assert model.raw_time_ns(_decode(2048, 16)) / one > 3


def test_out_of_range_batches_are_named(decode8) -> None:
    model, _ = decode8
    assert model.extrapolation(_decode(8, 2048)) == ()
    assert model.extrapolation(_decode(9, 2048)) == ()            # within 25 %
    assert set(model.extrapolation(_decode(64, 2048))) == {"tokens", "seqs", "context"}
    assert model.extrapolation(_decode(8, 8192)) == ("context",)


def test_a_scenario_that_speeds_up_gemms_speeds_up_every_batch(tmp_path: Path) -> None:
    batch = _decode(8, 2048)
    a = analyze(_trace(tmp_path, batch))
    base = _fit(a.graph, batch, a.trace)
    fast_graph = Scale(select=Selector(kernel_class="gemm"), factor=0.5).apply(a.graph, TransformContext())
    fast = _fit(fast_graph, batch, a.trace)
    for target in (_decode(1, 512), _decode(64, 2048), _decode(512, 4096), _prefill(4096)):
        assert fast.raw_time_ns(target) < base.raw_time_ns(target)


def test_iteration_of_tasks_holds_every_kernel(tmp_path: Path) -> None:
    batch = _decode(4, 1024)
    a = analyze(_trace(tmp_path, batch))
    member = iteration_of_tasks(a.graph, _found(a.graph, batch))
    kernels = a.graph.tasks["kind"].to_numpy() == 4
    assert (member[kernels] >= 0).all()
    assert sorted(np.unique(member[kernels]).tolist()) == list(range(len(a.graph.steps)))


def test_a_gpu_scenario_prices_the_batches_on_the_destination(tmp_path: Path) -> None:
    """After ``gpu(device=A100_SXM_80GB)`` the laws read the A100's roofline (its knee, its bandwidth),
    and a prefill far beyond the recorded decode batch costs what the destination's GEMM rate says."""
    from whatif.transforms.optimizations.gpu import Gpu

    batch = _decode(8, 2048)
    a = analyze(_trace(tmp_path, batch))
    ctx = make_context(a.trace)
    moved = Gpu(device="A100_SXM_80GB").apply(a.graph, ctx)
    base, slow = _fit(a.graph, batch, a.trace), _fit(moved, batch, a.trace)
    assert slow.device_law.knee_tokens != base.device_law.knee_tokens
    assert slow.raw_time_ns(_prefill(4096)) > 1.5 * base.raw_time_ns(_prefill(4096))   # A100 < H100 in bf16
