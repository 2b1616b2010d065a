"""``autocast``'s memory (``whatif memory -s``): what each forward op outputs under autocast, the
casts it adds and how long autograd holds them, checked on our own CPU recording of
examples/train.py in fp32 (``sample_traces/tp_memory/tp1``: 2 layers, 4 × 256 tokens, SDPA math)
against the same program recorded under ``--autocast bf16`` (``sample_traces/tp_memory/tp1_bf16``)."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from whatif.cli import main
from whatif.depgraph.build import build_graph
from whatif.depgraph.hierarchy import build_hierarchy, enclosing, record_steps
from whatif.memory import memory, memory_edits
from whatif.tracer.trace import Trace, load_trace
from whatif.transforms.base import TransformError
from whatif.transforms.optimizations.autocast import Autocast
from whatif.transforms.optimizations.autocast_memory import Rule, autocast_memory, autocast_memory_edit, op_dtypes
from whatif.transforms.parallel.forward_ops import forward_ops

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
MiB = 2**20


@pytest.fixture(scope="module")
def fp32() -> Trace:
    return load_trace(SAMPLES / "tp_memory" / "tp1")


@pytest.fixture(scope="module")
def bf16() -> Trace:
    return load_trace(SAMPLES / "tp_memory" / "tp1_bf16")


def test_each_op_of_a_transformer_layer_gets_autocasts_rule(fp32: Trace) -> None:
    """GEMMs output bf16, SDPA's math backend computes in fp32 inside, norms and losses stay fp32,
    GELU takes its GEMM's bf16, the residual add is fp32, and ``logits.float()`` is a real cast."""
    ops = forward_ops(fp32)
    dt = op_dtypes(fp32, ops)
    names = fp32.events["name"].astype(str).to_numpy()[ops.hierarchy.rows]
    seen: dict[str, set[tuple[str, bool, bool]]] = {}
    for w in np.flatnonzero(dt.rule >= 0).tolist():
        seen.setdefault(str(names[w]), set()).add((Rule(int(dt.rule[w])).name, bool(dt.outputs_low[w]),
                                                   bool(dt.fed_low[w])))
    assert seen["aten::linear"] >= {("LOWERED", True, False), ("LOWERED", True, True)}
    assert seen["aten::scaled_dot_product_attention"] == {("UPCAST", True, True)}
    assert seen["aten::layer_norm"] == {("FP32", False, False)}
    assert seen["aten::gelu"] == {("KEEPS", True, True)}
    assert seen["aten::add"] == {("WIDEST", False, False), ("WIDEST", False, True)}
    assert ("TO_FP32", False, True) in seen["aten::to"]
    assert seen["aten::cross_entropy_loss"] == {("FP32", False, False)}


def test_predicted_peak_is_the_autocast_runs_and_beats_no_change(fp32: Trace, bf16: Trace) -> None:
    graph = build_graph(fp32)
    edits, lines = memory_edits(graph, [Autocast()])
    predicted = memory(fp32, graph, edits=edits, predicted=lines)
    measured = memory(bf16, build_graph(bf16))
    recorded = memory(fp32, graph)
    got, truth, was = (d.devices[0].peak_allocated_bytes for d in (predicted, measured, recorded))
    assert abs(got / truth - 1) < 0.02
    assert abs(got - truth) < abs(was - truth) / 4
    by_step = {s.step: s.peak_allocated_bytes for s in measured.steps}
    for s in predicted.steps:
        assert abs(s.peak_allocated_bytes / by_step[s.step] - 1) < 0.03, s.step


def _measured_casts(trace: Trace, step: int) -> Counter[str]:
    """Bytes the autocast recording allocates in ``aten::_to_copy`` in ``step``, by the op that
    called the ``aten::to`` (``ToCopyBackward0`` for a backward cast)."""
    h = build_hierarchy(trace.events)
    names = trace.events["name"].astype(str).to_numpy()[h.rows]
    mem = trace.memory
    pos = enclosing(h, trace.events, mem)
    steps = record_steps(trace.events, mem)
    out: Counter[str] = Counter()
    for i in np.flatnonzero((pos >= 0) & (mem["bytes"].to_numpy() > 0) & (steps == step)).tolist():
        up = h.parent[pos[i]]
        if up < 0 or names[up] != "aten::_to_copy":
            continue
        caller = h.parent[h.parent[up]]
        out[str(names[caller]) if caller >= 0 else ""] += int(mem["bytes"].iat[i])
    return out


def test_the_casts_are_the_ones_autocast_makes(fp32: Trace, bf16: Trace) -> None:
    """Per step, the bf16 copies made before the linears (weights, biases, fp32 activations) are
    the bytes the autocast run allocates in ``_to_copy`` under ``aten::linear``; the copies made at
    a cast in the backward (``ToCopyBackward0``) within 10 % of the run's."""
    model = autocast_memory(fp32)
    ops = forward_ops(fp32)
    names = fp32.events["name"].astype(str).to_numpy()[ops.hierarchy.rows]
    steps = record_steps(fp32.events, fp32.memory)
    measured = _measured_casts(bf16, 1)
    linear = sum(b.nbytes for b in model.added if names[b.made_in] == "aten::linear" and steps[b.alloc_at[0]] == 1)
    assert linear == pytest.approx(measured["aten::linear"], rel=0.01)
    backward = sum(r.then for r in model.recasts if steps[model.roles.rows[r.i]] == 1)
    assert backward == pytest.approx(measured["ToCopyBackward0"], rel=0.10)


def test_a_norm_output_a_gemm_casts_is_freed_once_cast(fp32: Trace) -> None:
    """The fp32 output of each layer norm feeds a linear that saves its bf16 copy instead: two
    norms a layer and the final one, every step; each freed right after the cast, not in the
    backward as recorded."""
    model = autocast_memory(fp32)
    mem = fp32.memory
    rows = model.roles.rows[model.freed_early]
    steps = record_steps(fp32.events, mem)[rows]
    assert Counter(steps.tolist()) == {0: 5, 1: 5, 2: 5}
    ts = mem["ts_ns"].to_numpy()
    for row, (anchor, _) in zip(rows.tolist(), model.freed_at):
        assert ts[anchor] < ts[model.roles.frees[np.searchsorted(model.roles.rows, row)]]


def test_an_autocast_recording_is_refused(bf16: Trace) -> None:
    with pytest.raises(TransformError, match="already take 16-bit inputs; autocast's memory is predicted from an fp32"):
        autocast_memory_edit(bf16)


def test_memory_dash_s_predicts_autocast(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "amp.toml"
    scenario.write_text('[[transform]]\nname = "autocast"\ndtype = "fp16"\n')
    assert main(["memory", str(SAMPLES / "tp_memory" / "tp1"), "-s", str(scenario)]) == 0
    out = capsys.readouterr().out
    assert "autocast(dtype=fp16):" in out and "cast copies added" in out
    assert "0.93" in out


def test_on_a_gpu_every_block_is_a_whole_number_of_the_allocators_512_bytes(fp32: Trace) -> None:
    """The same recording read as a GPU's, one recast block made 1,200 bytes (600 in 16 bits):
    each block the edit adds (cast copies, a recast's two halves, halved activations) is rounded up
    as the caching allocator rounds it; the predicted peak is at least the CPU one's and at most
    512 B a block above it."""
    from dataclasses import replace

    from whatif.tracer.memory import DeviceType

    gpu = replace(fp32, memory=fp32.memory.assign(device_type=int(DeviceType.CUDA)))
    on_cpu = memory(fp32, edits=[autocast_memory_edit(fp32)]).devices[0].peak_allocated_bytes
    edit = autocast_memory_edit(gpu)
    on_gpu = memory(gpu, edits=[edit]).devices[0].peak_allocated_bytes
    assert on_cpu <= on_gpu <= on_cpu + 512 * len(edit.added)
    first = autocast_memory(fp32).recasts[0].i
    roles = autocast_memory(fp32).roles
    sizes = gpu.memory["bytes"].to_numpy().copy()
    sizes[roles.rows[first]], sizes[roles.frees[first]] = 1200, -1200
    odd = replace(gpu, memory=gpu.memory.assign(bytes=sizes))
    added = autocast_memory_edit(odd).added["bytes"].to_numpy()
    assert len(added) and (added % 512 == 0).all()
