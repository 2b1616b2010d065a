"""``autocast`` on our own H200 recording of fp32 training (sample_traces/gpu/pairs/p1_precision-before-r1,
a 4-layer pre-norm transformer, d_model 1024, batch 16 × 256 tokens, vocab 8192), checked against
what the same program recorded under ``torch.autocast(dtype=bfloat16)`` (…-after-r1)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from whatif.api import analyze, make_context, predict
from whatif.core.kernels import KernelClass
from whatif.depgraph.graph import CPU_KINDS, EdgeKind, TaskKind, kind_codes
from whatif.transforms.base import TransformError
from whatif.transforms.optimizations.autocast import Autocast, plan_casts
from whatif.transforms.optimizations.gpu import Gpu
from whatif.transforms.optimizations.precision import Precision
from whatif.transforms.scenario import Scenario
from whatif.transforms.select import kernel_classes

PAIRS = Path(__file__).resolve().parents[1] / "sample_traces" / "gpu" / "pairs"
BEFORE, AFTER = PAIRS / "p1_precision-before-r1", PAIRS / "p1_precision-after-r1"

D, TOKENS, VOCAB, LAYERS = 1024, 16 * 256, 8192, 4
# per layer: qkv (D -> 3D), proj (D -> D), fc1 (D -> 4D), fc2 (4D -> D), each with a bias; the head D -> VOCAB without
PARAMS = LAYERS * (3 * D * D + 3 * D + D * D + D + 4 * D * D + 4 * D + 4 * D * D + D) + VOCAB * D
# fp32 activations cast: qkv's and fc1's input (a layer norm's output) per layer, and the head's;
# proj's (attention's output) and fc2's (GELU of fc1's) are already bf16
ACTIVATIONS = (2 * LAYERS + 1) * TOKENS * D
LOGITS = TOKENS * VOCAB   # cross-entropy is on autocast's fp32 list: the bf16 logits are cast up
CASTS_PER_FORWARD = LAYERS * (3 + 2 + 3 + 2) + 2 + 1


@pytest.fixture(scope="module")
def before():  # type: ignore[no-untyped-def]
    return analyze(BEFORE)


def _plan(a):  # type: ignore[no-untyped-def]
    tr = Autocast()
    ids, lowered, _ = tr._lowered(a.graph, make_context(a.trace))
    return plan_casts(a.graph, ids, lowered, 2.0)


def test_the_forward_casts_are_what_autocast_ran(before) -> None:  # type: ignore[no-untyped-def]
    t = before.graph.tasks
    sites = _plan(before)
    for step in (3, 5):
        fwd = [s for s in sites if not s.backward and t["step"].iat[s.anchor_kernel] == step]
        bwd = [s for s in sites if s.backward and t["step"].iat[s.anchor_kernel] == step]
        assert sum(len(s.bytes) for s in fwd) == CASTS_PER_FORWARD
        assert sum(sum(s.bytes) for s in fwd) == (PARAMS + ACTIVATIONS + LOGITS) * (4 + 2)
        # each forward cast has its ToCopyBackward0 twin, of the same size
        assert sorted(b for s in bwd for b in s.bytes) == sorted(b for s in fwd for b in s.bytes)


def test_the_after_recording_ran_as_many_casts(before) -> None:  # type: ignore[no-untyped-def]
    after = analyze(AFTER)
    t = after.graph.tasks
    casts = (t["kind"].to_numpy() == int(TaskKind.KERNEL)) & t["name"].astype(str).str.contains(
        "bfloat16_copy_kernel|direct_copy_kernel").to_numpy() & (t["step"].to_numpy() == 5)
    assert casts.sum() >= 2 * CASTS_PER_FORWARD


def test_apply_inserts_launched_casts_and_keeps_fp32_ops(before) -> None:  # type: ignore[no-untyped-def]
    g = before.graph
    pred = predict(before, [Autocast()]).scenarios[0]
    h = pred.graph
    new = np.arange(len(g.tasks), len(h.tasks))
    kinds = h.tasks["kind"].to_numpy()[new]
    calls, kernels = new[kinds == int(TaskKind.CPU_CALL)], new[kinds == int(TaskKind.KERNEL)]
    assert len(calls) == len(kernels) == 2 * CASTS_PER_FORWARD * len(set(g.tasks["step"]) - {-1})
    e = h.edges
    launch = e[e["kind"].to_numpy() == int(EdgeKind.LAUNCH)]
    launched_by = dict(zip(launch["dst"].to_numpy(), launch["src"].to_numpy()))
    assert all(launched_by[k] in set(calls) for k in kernels)
    assert (kernel_classes(h)[kernels] == KernelClass.COPY.value).all()
    assert np.isin(h.tasks["kind"].to_numpy()[calls], kind_codes(CPU_KINDS)).all()
    # norms, softmax, elementwise: autocast leaves them in fp32
    cls = kernel_classes(g)
    kept = np.flatnonzero(np.isin(cls, [KernelClass.NORMALIZATION.value, KernelClass.ELEMENTWISE.value]))
    assert (h.tasks["dur_ns"].to_numpy()[kept] == g.tasks["dur_ns"].to_numpy()[kept]).all()
    gemm = np.flatnonzero(cls == KernelClass.GEMM.value)
    assert h.tasks["dur_ns"].to_numpy()[gemm].sum() < 0.2 * g.tasks["dur_ns"].to_numpy()[gemm].sum()


def test_the_casts_cost_what_a_converted_model_does_not(before) -> None:  # type: ignore[no-untyped-def]
    auto, converted = predict(before, [Autocast(), Precision(dtype="bf16")]).scenarios
    measured_before = before.steps.loc[before.steps["included"], "measured_ns"].median()
    a, c = (s.steps.loc[s.steps["included"], "predicted_ns"].median() for s in (auto, converted))
    assert c < a < measured_before


def test_autocast_and_a_gpu_move_commute(before) -> None:  # type: ignore[no-untyped-def]
    one, two = predict(before, [Scenario(name="a then gpu", transforms=[Autocast(), Gpu(device="H100_SXM")]),
                                Scenario(name="gpu then a", transforms=[Gpu(device="H100_SXM"), Autocast()])]).scenarios
    assert (one.steps["predicted_ns"].to_numpy() == two.steps["predicted_ns"].to_numpy()).all()
    busy = [s.graph.tasks["dur_ns"].to_numpy()[s.graph.tasks["kind"].to_numpy() == int(TaskKind.KERNEL)].sum()
            for s in (one, two)]
    assert abs(busy[0] - busy[1]) <= 2 * CASTS_PER_FORWARD * 12   # whole ns: each cast rounded on its own path


def test_refusals() -> None:
    with pytest.raises(TransformError, match="bf16 or fp16"):
        Autocast(dtype="fp8")
    with pytest.raises(TransformError, match="already runs them in lower precision"):
        predict(AFTER, [Autocast()])


def test_suggested_for_an_fp32_program_only(before) -> None:  # type: ignore[no-untyped-def]
    assert [t.setting() for t in Autocast.candidates(before.graph, make_context(before.trace))] == ["autocast()"]
    after = analyze(AFTER)
    with pytest.raises(TransformError, match="not an fp32 program"):
        Autocast.candidates(after.graph, make_context(after.trace))


def test_the_math_attentions_fp32_gemms_are_not_autocasts() -> None:
    """SDPA's math backend upcasts bf16 inputs to fp32 itself (p4 before: a bf16 autocast program
    whose only fp32 GEMMs are the math attention's): autocast has nothing to lower there."""
    p4 = analyze(PAIRS / "p4_sdpa-before-r1")
    ctx = make_context(p4.trace)
    with pytest.raises(TransformError, match="not an fp32 program"):
        Autocast.candidates(p4.graph, ctx)
    assert not len(Autocast().match(p4.graph, ctx))
