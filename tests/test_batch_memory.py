"""``batch``'s memory (``whatif memory -s``): which allocations grow with the batch, checked block
by block on a hand-made training step, and the predicted peak checked against our own CPU
recordings of one bf16 training program at batch 2 and at batch 4 (sample_traces/sdpa_memory:
``math_batch2`` and ``math``)."""
from __future__ import annotations

from pathlib import Path

import pytest
from tracegen import KinetoTrace

from whatif.cli import main
from whatif.depgraph.build import build_graph
from whatif.memory import memory, memory_edits
from whatif.tracer.trace import load_trace
from whatif.transforms.base import TransformError
from whatif.transforms.optimizations.batch import Batch
from whatif.transforms.optimizations.batch_memory import (
    BlockRole,
    batch_memory_edit,
    batch_peaks,
    block_roles,
    largest_factor,
)
from whatif.transforms.optimizations.flash_attention import FlashAttention

ROOT = Path(__file__).resolve().parents[1]
BATCH2, BATCH4 = ROOT / "sample_traces" / "sdpa_memory" / "math_batch2", ROOT / "sample_traces" / "sdpa_memory" / "math"
NODE = "autograd::engine::evaluate_function: AddmmBackward0"


def one_linear_step(tmp_path: Path, *, shapes: bool = True) -> Path:
    """One training step of ``linear(x[8, 16], W[32, 16], b[32])`` on a GPU: each allocation made
    where a block of its role is made (in time order: roles listed in ``ROLES``)."""
    t = KinetoTrace()
    dims = (lambda d, types=None, concrete=None: {"Input Dims": d, **({"Input type": types} if types else {}),
                                                  **({"Concrete Inputs": concrete} if concrete else {})}) \
        if shapes else (lambda d, types=None, concrete=None: {})
    t.step(0, 0, 1000)
    t.op("aten::linear", 10, 30, args=dims([[8, 16], [32, 16], [32]], ["float", "float", "float"]))
    t.op("aten::addmm", 12, 20, args=dims([[32], [8, 16], [16, 32], [], []], ["float"] * 3 + ["Scalar"] * 2))
    t.memory(15, 1000, addr=1)                                    # the output: an activation
    t.op("aten::to", 50, 10, args=dims([[32, 16], [], []], ["float", "Scalar", "Scalar"]))
    t.memory(55, 1024, addr=2)                                    # a copy of the weight
    t.memory(70, -1024, addr=2)
    t.op("aten::empty", 80, 5, args=dims([[], [], []], ["ScalarList", "", ""], ["[32, 16]", "", ""]))
    t.memory(82, 2048, addr=3)                                    # a weight made, then converted
    t.memory(88, -2048, addr=3)
    t.op("aten::empty", 90, 8, args=dims([[], [], []], ["ScalarList", "", ""], ["[4]", "", ""]))
    t.memory(95, 16, addr=4)                                      # state kept for good
    t.op(NODE, 200, 100)
    t.op("aten::mm", 210, 10, args=dims([[8, 32], [32, 16]], ["float", "float"]))
    t.memory(215, 512, addr=5)                                    # the input's gradient
    t.op("aten::mm", 230, 10, args=dims([[32, 8], [8, 16]], ["float", "float"]))
    t.memory(235, 2048, addr=6)                                   # the weight's, accumulated
    t.op("aten::sum", 250, 10, args=dims([[8, 32], [], [], []], ["float", "ScalarList", "Scalar", ""]))
    t.memory(255, 128, addr=7)                                    # the bias's
    t.op("aten::add", 262, 6, args=dims([[32, 16], [32, 16], []], ["float", "float", "Scalar"]))
    t.memory(265, 2048, addr=8)                                   # a .grad, held for the optimizer
    t.memory(280, -512, addr=5)
    t.memory(290, -2048, addr=6)
    t.memory(295, -128, addr=7)
    t.memory(298, -1000, addr=1)
    t.annotation("Optimizer.step#AdamW.step", 400, 100)
    t.op("aten::mul", 420, 10, args=dims([[32, 16], []], ["float", "Scalar"]))
    t.memory(425, 2048, addr=9)
    t.memory(480, -2048, addr=9)
    t.memory(950, -2048, addr=8)
    t.op("aten::mul", 1100, 10, args=dims([[8, 16], []], ["float", "Scalar"]))
    t.memory(1105, 4096, addr=10)                                 # after the last step
    t.memory(1150, -4096, addr=10)
    path = tmp_path / "linear.json.gz"
    t.write(path)
    return path


ROLES = [BlockRole.ACTIVATION, BlockRole.PARAMETER, BlockRole.PARAMETER, BlockRole.PERSISTENT, BlockRole.ACTIVATION,
         BlockRole.WEIGHT_GRADIENT, BlockRole.WEIGHT_GRADIENT, BlockRole.GRADIENT, BlockRole.AFTER_BACKWARD,
         BlockRole.OUTSIDE]


def _roles(path: Path) -> list[BlockRole]:
    r = block_roles(load_trace(path))
    order = list(BlockRole)
    return [order[c] for c in r.codes]


def test_each_block_gets_the_role_of_where_and_by_what_it_was_made(tmp_path: Path) -> None:
    assert _roles(one_linear_step(tmp_path)) == ROLES
    roles = block_roles(load_trace(one_linear_step(tmp_path)))
    assert {(32, 16), (32,)} <= roles.param_shapes and (8, 16) not in roles.param_shapes


def test_activations_grow_by_the_factor_on_whole_gpu_blocks(tmp_path: Path) -> None:
    trace = load_trace(one_linear_step(tmp_path))
    edit = batch_memory_edit(trace, 2.0)
    assert edit.dropped.tolist() == [0, 6, 10, 13]                # the two activations and their frees
    assert edit.added["bytes"].tolist() == [2048, -2048, 1024, -1024]   # 1000 x2 and 512 x2, on 512 B blocks
    assert edit.what.startswith("batch(factor=2): 2 activation blocks (0.0 MiB allocated) at 2x")
    gpu = memory(trace, edits=[edit]).devices[0]
    assert gpu.peak_allocated_bytes == memory(trace).devices[0].peak_allocated_bytes + (2048 - 1000) + (1024 - 512)
    half = batch_memory_edit(trace, 0.5)
    assert half.added["bytes"].tolist() == [512, -512, 512, -512]      # 500 and 256 round up to 512


def test_refuses_a_trace_it_cannot_read(tmp_path: Path) -> None:
    with pytest.raises(TransformError, match="no recorded shapes"):
        block_roles(load_trace(one_linear_step(tmp_path, shapes=False)))
    with pytest.raises(TransformError, match="no allocator records"):
        block_roles(load_trace(ROOT / "sample_traces" / "dit_serve"))


@pytest.mark.parametrize(("source", "target", "factor"), [(BATCH2, BATCH4, 2.0), (BATCH4, BATCH2, 0.5)])
def test_predicts_the_peak_at_the_other_batch(source: Path, target: Path, factor: float) -> None:
    before, after = load_trace(source), load_trace(target)
    graph = build_graph(before)
    edits, lines = memory_edits(graph, [Batch(factor=factor)])
    predicted = memory(before, graph, edits=edits, predicted=lines)
    measured, recorded = memory(after), memory(before, graph)
    got, truth, was = (d.devices[0].peak_allocated_bytes for d in (predicted, measured, recorded))
    assert abs(got / truth - 1) < 1e-3 < abs(was / truth - 1) / 100    # no change: 39-64 % off
    steps = {s.step: s.peak_allocated_bytes for s in measured.steps}
    assert all(abs(s.peak_allocated_bytes / steps[s.step] - 1) < 1e-3 for s in predicted.steps)


def test_a_larger_batch_never_needs_less_memory() -> None:
    trace = load_trace(BATCH2)
    peaks = [memory(trace, edits=[batch_memory_edit(trace, k)]).devices[0].peak_allocated_bytes
             for k in (0.25, 0.5, 1.0, 2.0, 4.0)]
    assert peaks == sorted(peaks) and peaks[2] == memory(trace).devices[0].peak_allocated_bytes
    roles = block_roles(trace)
    by_role = roles.bytes_by_role(trace.memory["bytes"].to_numpy())
    assert set(by_role) == set(BlockRole) - {BlockRole.OUTSIDE}   # the recorder's steps cover the run
    assert by_role[BlockRole.ACTIVATION] > 0.75 * sum(by_role.values())
    assert {(768, 256), (256, 1024), (1024, 256), (256,)} <= roles.param_shapes   # d_model 256, MLP 1,024


def test_cli_predicts_a_batch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "batch.toml"
    scenario.write_text('name = "twice"\n\n[[transform]]\nname = "batch"\nfactor = 2\n')
    assert main(["memory", str(BATCH2), "-s", str(scenario)]) == 0
    text = capsys.readouterr().out
    assert "scenario twice: the predicted timeline" in text and "76.3" in text and "125.3" in text


SHARED = ["tracelens/hf_h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
          "tracelens/hf_mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
          "tracelens/hf_h100/Falconsai_nsfw_image_detection__1016002.json.gz",
          "tracelens/hf_h100/gaunernst_bert-small-uncased__1016001.json.gz"]


@pytest.mark.parametrize("name", SHARED)
def test_on_third_party_traces_memory_moves_with_the_batch(shared_traces: Path, name: str) -> None:
    trace = load_trace(shared_traces / name)
    recorded = memory(trace).devices
    per_factor = [memory(trace, edits=[batch_memory_edit(trace, k)]).devices for k in (0.5, 1.0, 2.0)]
    for i, d in enumerate(recorded):
        small, same, large = (p[i].peak_allocated_bytes for p in per_factor)
        assert same == d.peak_allocated_bytes and small <= same <= large
        # what was allocated before the recording (the weights) does not grow
        assert large - same <= same - (d.start_allocated_bytes or 0)
    gpu = recorded[0]
    assert per_factor[2][0].peak_allocated_bytes > gpu.peak_allocated_bytes > per_factor[0][0].peak_allocated_bytes


def test_refuses_records_without_block_addresses(shared_traces: Path) -> None:
    trace = load_trace(shared_traces / "kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz")
    with pytest.raises(TransformError, match=r"6,420 of 6,420 allocator records .* carry no block address"):
        block_roles(trace)


def test_two_edits_of_the_same_blocks_are_refused() -> None:
    graph = build_graph(load_trace(BATCH2))
    refused = r"flash_attention\(\) and batch\(factor=2\) both change [\d,]+ of the same"
    with pytest.raises(TransformError, match=refused):
        memory_edits(graph, [FlashAttention(), Batch(factor=2)])


def test_the_largest_batch_that_fits_fills_the_device(tmp_path: Path) -> None:
    trace = load_trace(one_linear_step(tmp_path))
    roles = block_roles(trace)
    # the peak (5,752 B at the .grad's allocation) holds 1,000 + 512 B of activations: 1 + 248 / 1,512
    assert largest_factor(trace, roles, 6000) == pytest.approx(1 + 248 / 1512)
    assert largest_factor(trace, roles, 5000) < 1
    cpu = load_trace(BATCH2)
    assert largest_factor(cpu, block_roles(cpu), 1e9) is None    # a CPU trace has no GPU
    edit = batch_memory_edit(trace, 2.0, ("A100_SXM", 80 * 2**30))
    at_peak = 1 + (80 * 2**30 - 5752) / 1512
    assert edit.what.endswith(f"fits in the A100_SXM's 80 GiB: {at_peak:,.2f}x the recorded one")


@pytest.mark.parametrize("factor", [0.5, 1.0, 2.0, 8.0])
def test_the_peak_at_any_batch_is_the_edited_timelines(tmp_path: Path, factor: float) -> None:
    trace = load_trace(one_linear_step(tmp_path))
    peaks = batch_peaks(trace, block_roles(trace))
    assert peaks is not None
    edited = memory(trace, edits=[batch_memory_edit(trace, factor)]).devices[0].peak_allocated_bytes
    assert 0 <= edited - peaks.peak_bytes(factor) < 2 * 512   # two activation blocks, each rounded up to 512 B
    if factor == 1.0:
        assert peaks.peak_bytes(1.0) == memory(trace).devices[0].peak_allocated_bytes == 5752


def test_the_largest_batch_on_a_third_party_trace_reaches_the_capacity(shared_traces: Path) -> None:
    trace = load_trace(shared_traces / SHARED[0])
    capacity = 80 * 2**30
    k = largest_factor(trace, block_roles(trace), capacity)
    assert k is not None and 10 < k < 100
    peak = memory(trace, edits=[batch_memory_edit(trace, k)]).devices[0].peak_allocated_bytes
    assert abs(peak / capacity - 1) < 1e-4                       # the GPU's 512-byte blocks, left out
    line = memory_edits(build_graph(trace), [Batch(factor=2)])[1][0]
    assert f"fits in the H100_SXM's 80 GiB: {k:,.2f}x the recorded one" in line
