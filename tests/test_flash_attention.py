"""``flash_attention`` on our own H200 recording of bf16 training with SDPA's math backend
(sample_traces/gpu/pairs/p4_sdpa-before-r1: 4 layers, 16 heads of 64, batch 4 × 1,024 tokens,
causal), checked against the same program recorded with the flash backend (…-after-r1)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from whatif.api import analyze, make_context, predict
from whatif.core.kernels import KernelClass, fused_attention_flops_bytes
from whatif.depgraph.graph import CPU_KINDS, TaskKind, kind_codes
from whatif.hardware.devices import find_device
from whatif.transforms.base import TransformError
from whatif.transforms.optimizations.flash_attention import (
    FLASH_BACKWARD_EVENTS,
    FLASH_FORWARD_EVENTS,
    FlashAttention,
    calibrated_efficiency,
    dispatch_ns_per_event,
    find_unfused,
)
from whatif.transforms.optimizations.gpu import Gpu
from whatif.transforms.scenario import Scenario
from whatif.transforms.select import kernel_classes

PAIRS = Path(__file__).resolve().parents[1] / "sample_traces" / "gpu" / "pairs"
BEFORE, AFTER = PAIRS / "p4_sdpa-before-r1", PAIRS / "p4_sdpa-after-r1"
LAYERS, STEPS = 4, 12
B, H, S, D = 4, 16, 1024, 64


@pytest.fixture(scope="module")
def before():  # type: ignore[no-untyped-def]
    return analyze(BEFORE)


@pytest.fixture(scope="module")
def after():  # type: ignore[no-untyped-def]
    return analyze(AFTER)


def _per_step_ms(graph, steps, classes=None) -> float:  # type: ignore[no-untyped-def]
    t = graph.tasks
    counted = steps.loc[steps["included"], "step"].to_numpy()
    keep = (t["kind"].to_numpy() == int(TaskKind.KERNEL)) & np.isin(t["step"].to_numpy(), counted)
    if classes is not None:
        keep &= np.isin(kernel_classes(graph), classes)
    return float(t["dur_ns"].to_numpy()[keep].sum() / 1e6 / len(counted))


def test_every_attention_call_and_its_backward_nodes_are_found(before) -> None:  # type: ignore[no-untyped-def]
    calls = find_unfused(before.graph)
    assert len(calls) == LAYERS * STEPS
    ev = before.trace.events
    names = ev["name"].astype(str).to_numpy()
    for c in calls:
        assert names[c.op_row] == "aten::scaled_dot_product_attention"
        assert c.backward is not None
        # the causal flash kernel's work: 4·D FLOPs per head and unmasked pair, 2.5x backward
        assert c.flops[0] == 4 * D * B * H * S * (S + 1) // 2 and c.flops[1] == 2.5 * c.flops[0]
        # forward launches the upcasts, mask, two batched GEMMs, softmax and downcast; backward the
        # gradients of each, nothing of the layer around them (no linear, norm or GELU gradient)
        fwd_ops = set(before.graph.tasks["op"].astype(str).to_numpy()[c.forward.gpu])
        assert "aten::bmm" in fwd_ops and "aten::addmm" not in fwd_ops
        bwd_names = set(names[before.graph.tasks["event"].to_numpy()[c.backward.cpu]])
        assert not any("Addmm" in n or "LayerNorm" in n or "Gelu" in n for n in bwd_names)
    # the nodes of one call are those of its forward ops: two bmm gradients (two GEMMs each), one
    # softmax gradient, the scale's and the casts' gradients
    bwd = list(before.graph.tasks["op"].astype(str).to_numpy()[calls[5].backward.gpu])
    assert bwd.count("aten::bmm") == 4 and bwd.count("aten::_softmax_backward_data") == 1


def test_the_predicted_gpu_work_is_what_the_flash_recording_ran(before, after) -> None:  # type: ignore[no-untyped-def]
    pred = predict(before, [FlashAttention()]).scenarios[0]
    was, got, measured = (_per_step_ms(x.graph, x.steps) for x in (before, pred, after))
    assert measured / was < 0.5                       # the math backend more than doubled the GPU work
    assert got == pytest.approx(measured, rel=0.05)
    # every class the rewrite leaves alone is the flash recording's, the attention within 20 %
    for cls in (KernelClass.GEMM, KernelClass.ELEMENTWISE, KernelClass.NORMALIZATION, KernelClass.COPY):
        assert _per_step_ms(pred.graph, pred.steps, [cls.value]) == pytest.approx(
            _per_step_ms(after.graph, after.steps, [cls.value]), rel=0.10), cls
    att = KernelClass.ATTENTION.value
    assert _per_step_ms(pred.graph, pred.steps, [att]) == pytest.approx(
        _per_step_ms(after.graph, after.steps, [att]), rel=0.20)


def test_each_call_dispatches_one_op_at_this_hosts_speed(before) -> None:  # type: ignore[no-untyped-def]
    calls = find_unfused(before.graph)
    g = FlashAttention().apply(before.graph, make_context(before.trace))
    t = g.tasks
    fwd = t["op"].astype(str).to_numpy() == "aten::_scaled_dot_product_flash_attention"
    cpu = np.isin(t["kind"].to_numpy(), kind_codes(CPU_KINDS))
    assert (fwd & cpu).sum() == len(calls)
    per_event = dispatch_ns_per_event(calls)
    assert 4_000 < per_event[False] < 10_000 and 4_000 < per_event[True] < 10_000   # µs-scale dispatch
    assert (t["dur_ns"].to_numpy()[fwd & cpu] == round(per_event[False] * FLASH_FORWARD_EVENTS)).all()
    bwd = (t["op"].astype(str).to_numpy() == "aten::_scaled_dot_product_flash_attention_backward") & cpu
    assert (t["dur_ns"].to_numpy()[bwd] == round(per_event[True] * FLASH_BACKWARD_EVENTS)).all()
    # one kernel per pass, and no task outside the calls changes its duration
    kernels = t["name"].astype(str).str.startswith("flash_").to_numpy()
    assert kernels.sum() == 2 * len(calls)
    touched = np.unique(np.concatenate([np.concatenate([c.forward.cpu, c.forward.gpu, c.backward.cpu,
                                                        c.backward.gpu]) for c in calls if c.backward]))
    rows = before.graph.tasks["event"].to_numpy()
    untouched = np.setdiff1d(np.arange(len(rows)), touched)
    kept = pd.Series(t["dur_ns"].to_numpy(), index=t["event"].to_numpy())
    kept = kept[kept.index >= 0]
    kept = kept[~kept.index.duplicated()]
    rows_left = rows[untouched][rows[untouched] >= 0]
    same = before.graph.tasks.set_index("event")["dur_ns"]
    same = same[~same.index.duplicated()]
    common = np.intersect1d(rows_left, kept.index.to_numpy())
    assert (kept.reindex(common).to_numpy() == same.reindex(common).to_numpy()).all()


def test_calibrated_on_the_flash_recording_it_prices_the_flash_kernels(before, after) -> None:  # type: ignore[no-untyped-def]
    fwd, bwd, n_fwd, n_bwd = calibrated_efficiency(after.graph, find_device(after.trace.ranks[0].gpu_name))
    assert n_fwd == n_bwd == LAYERS * STEPS
    assert fwd is not None and bwd is not None and 0 < bwd < fwd < 1
    att = [KernelClass.ATTENTION.value]
    for e, back in ((fwd, False), (bwd, True)):
        pred = predict(before, [FlashAttention(efficiency=round(e, 3))]).scenarios[0]
        t = pred.graph.tasks
        name = "flash_bwd" if back else "flash_fwd"
        got = t["dur_ns"].to_numpy()[t["name"].astype(str).str.startswith(name).to_numpy()]
        a = after.graph.tasks
        measured = a["dur_ns"].to_numpy()[(kernel_classes(after.graph) == att[0])
                                          & (a["op"].astype(str).str.contains("backward").to_numpy() == back)]
        # the flash backward runs three kernels per call; the fused one stands for all three
        assert got.sum() == pytest.approx(measured.sum(), rel=0.05), name


def test_a_faster_flash_kernel_never_makes_a_step_slower(before) -> None:  # type: ignore[no-untyped-def]
    slow, fast = predict(before, [FlashAttention(efficiency=0.2), FlashAttention(efficiency=0.8)]).scenarios
    assert _per_step_ms(fast.graph, fast.steps) < _per_step_ms(slow.graph, slow.steps)
    assert (fast.steps["predicted_ns"].to_numpy() <= slow.steps["predicted_ns"].to_numpy()).all()


def test_moved_first_the_flash_kernels_are_priced_on_the_new_gpu(before) -> None:  # type: ignore[no-untyped-def]
    first, then = predict(before, [Scenario(name="flash then gpu", transforms=[FlashAttention(), Gpu(device="MI300X")]),
                                   Scenario(name="gpu then flash", transforms=[Gpu(device="MI300X"), FlashAttention()])]
                          ).scenarios
    assert _per_step_ms(first.graph, first.steps) == pytest.approx(_per_step_ms(then.graph, then.steps), rel=0.02)
    t = then.graph.tasks
    fwd = t["dur_ns"].to_numpy()[t["name"].astype(str).str.startswith("flash_fwd").to_numpy()]
    c = find_unfused(before.graph)[0]
    assert fwd[0] > c.flops[0] / find_device("MI300X").peak_flops("bf16") * 1e9


def test_a_trace_without_the_math_backend_is_refused(after) -> None:  # type: ignore[no-untyped-def]
    ctx = make_context(after.trace)
    with pytest.raises(TransformError, match="no attention through SDPA's math backend"):
        FlashAttention().apply(after.graph, ctx)
    with pytest.raises(TransformError, match="no attention through SDPA's math backend"):
        FlashAttention.candidates(after.graph, ctx)


def test_the_fused_work_of_a_gqa_call() -> None:
    # 32 query heads on 8 KV heads: K and V are read at their own (smaller) shape
    dims = [[2, 32, 512, 128], [2, 8, 512, 128], [2, 8, 512, 128], [], [], [], [], []]
    concrete = ["", "", "", "", "0.", "False", "", "False"]
    work = fused_attention_flops_bytes("aten::scaled_dot_product_attention", dims, ["c10::BFloat16"] * 3, concrete)
    assert work is not None
    (ff, fb), (bf, bb) = work
    q = 2 * 32 * 512 * 128
    kv = 2 * 8 * 512 * 128
    assert ff == 4 * 128 * 2 * 32 * 512 * 512 and bf == ff * 5 // 2
    assert fb == (q + 2 * kv + q) * 2          # Q, K, V, O
    assert bb == (3 * q + 4 * kv) * 2          # Q, dO, dQ; K, V, dK, dV
