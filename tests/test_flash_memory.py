"""The memory a what-if predicts (``whatif memory -s``): allocator-record edits applied to the
recorded timeline, and ``flash_attention``'s edit checked against our own CPU recordings of one
bf16 training program with SDPA's math backend and with its flash backend
(sample_traces/sdpa_memory)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_memory import known_trace

from whatif.cli import main
from whatif.core.kernels import flash_buffers
from whatif.depgraph.build import build_graph
from whatif.documents import MemoryDocument, from_json
from whatif.memory import NO_OP, memory, memory_edits, memory_table
from whatif.tracer.memory import RecordEdit, RecordEditor
from whatif.tracer.trace import load_trace
from whatif.transforms.base import TransformError
from whatif.transforms.generic import Scale
from whatif.transforms.optimizations.flash_attention import FlashAttention, flash_memory_edit

ROOT = Path(__file__).resolve().parents[1]
MATH, FLASH = ROOT / "sample_traces" / "sdpa_memory" / "math", ROOT / "sample_traces" / "sdpa_memory" / "flash"
MiB = 2**20
B, H, S, D, LAYERS, STEPS = 4, 4, 512, 64, 2, 4


def _added(*rows: tuple[int, bool, int, int, str]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["anchor", "after", "bytes", "addr", "op"])


def test_an_edit_drops_blocks_and_adds_them_where_it_says(tmp_path: Path) -> None:
    # known_trace's GPU 0 (rows of Trace.memory): 0 mm +8 MiB, 1 relu +4, 2 free of 0, 3 mm +16 (the
    # peak, 120 MiB), 4 its free on the backward thread, 5 a CPU record, 6 free of 1; 100 MiB before
    trace = load_trace(known_trace(tmp_path))
    editor = RecordEditor(trace.memory)
    assert [editor.free_of(r) for r in (0, 1, 3)] == [2, 6, 4]
    editor.drop_block(3)
    editor.add_block(2 * MiB, (3, False), (4, True), "aten::flash")
    edit = editor.edit("the 16 MiB block as a 2 MiB one")
    assert edit.dropped.tolist() == [3, 4] and edit.added_bytes == 2 * MiB
    doc = memory(trace, edits=[edit], predicted=[edit.what])
    gpu = doc.devices[0]
    assert (gpu.peak_allocated_bytes, gpu.peak_op, gpu.peak_step) == (112 * MiB, "aten::relu", 0)
    assert (gpu.end_allocated_bytes, gpu.start_allocated_bytes) == (100 * MiB, 100 * MiB)
    assert gpu.peak_reserved_bytes is None                 # reserved memory is not predicted
    held = {o.op: o.held_at_peak_bytes for o in doc.ops if o.device == "GPU 0"}
    assert held["aten::mm"] == 8 * MiB and held["aten::relu"] == 4 * MiB and held["aten::flash"] == 0
    flash = next(o for o in doc.ops if o.op == "aten::flash")
    assert (flash.allocations, flash.allocated_bytes, flash.freed_bytes) == (1, 2 * MiB, 2 * MiB)
    assert [(s.step, s.peak_allocated_bytes) for s in doc.steps if s.device == "GPU 0"] == \
        [(0, 112 * MiB), (1, 106 * MiB)]
    assert doc.predicted == [edit.what] and memory(trace).predicted is None
    table = memory_table(trace, [edit])
    gpu_rows = table[table["device"] == "GPU 0"]
    assert gpu_rows["op"].tolist() == ["aten::mm", "aten::relu", NO_OP, "aten::flash", "aten::flash", NO_OP]
    assert (gpu_rows["allocated_bytes"] // MiB).tolist() == [108, 112, 104, 106, 104, 100]
    # the CPU device has no anchor of the edit: as recorded
    assert doc.devices[1].peak_allocated_bytes == memory(trace).devices[1].peak_allocated_bytes


def test_an_empty_edit_keeps_the_recorded_figures(tmp_path: Path) -> None:
    trace = load_trace(known_trace(tmp_path))
    empty = RecordEdit("nothing", np.empty(0, dtype=np.int64), _added())
    was, now = memory(trace), memory(trace, edits=[empty])
    assert [d.peak_allocated_bytes for d in was.devices] == [d.peak_allocated_bytes for d in now.devices]
    assert was.ops == now.ops and was.steps == now.steps


def test_the_blocks_of_two_edits_stay_apart(tmp_path: Path) -> None:
    trace = load_trace(known_trace(tmp_path))
    none = np.empty(0, dtype=np.int64)
    a = RecordEdit("a", none, _added((1, False, 10 * MiB, -2, "a"), (6, True, -10 * MiB, -2, "a")))
    b = RecordEdit("b", none, _added((1, False, 20 * MiB, -2, "b"), (6, True, -20 * MiB, -2, "b")))
    doc = memory(trace, edits=[a, b])
    assert doc.devices[0].peak_allocated_bytes == 150 * MiB          # 120 + 10 + 20, at the 16 MiB mm block
    held = {o.op: o.held_at_peak_bytes for o in doc.ops if o.device == "GPU 0"}
    assert held["a"] == 10 * MiB and held["b"] == 20 * MiB


def test_free_of_refuses_a_free() -> None:
    mem = pd.DataFrame({"rank": [0, 0], "ts_ns": [1, 2], "pid": [1, 1], "tid": [1, 1], "device_type": [1, 1],
                        "device_id": [0, 0], "bytes": [8, -8], "total_allocated_bytes": [8, 0],
                        "total_reserved_bytes": [0, 0], "addr": [5, 5]})
    with pytest.raises(ValueError, match="not an allocation"):
        RecordEditor(mem).free_of(1)


def test_flash_buffers_follow_flash_attention_2() -> None:
    mha = flash_buffers("aten::scaled_dot_product_attention", [[B, H, S, D]] * 3, ["c10::BFloat16"] * 3)
    assert mha is not None
    q_bytes = B * H * S * D * 2
    assert (mha.output_bytes, mha.lse_bytes, mha.inputs_bytes) == (q_bytes, B * H * S * 4, 3 * q_bytes)
    assert mha.backward_workspace_bytes == B * H * S * 4 * (1 + D)       # 512 is a multiple of 128, 64 of 32
    odd = flash_buffers("aten::scaled_dot_product_attention", [[1, 2, 100, 80]] * 3, ["c10::Half"] * 3)
    assert odd is not None and odd.backward_workspace_bytes == 2 * 128 * 4 * (1 + 96)
    gqa = flash_buffers("aten::scaled_dot_product_attention", [[2, 8, 100, 64], [2, 2, 100, 64], [2, 2, 100, 64]],
                        ["c10::BFloat16"] * 3)
    assert gqa is not None and gqa.inputs_bytes == (2 * 8 * 100 * 64 + 2 * 2 * 100 * 128) * 2
    # dK and dV expanded to the 8 query heads before they are summed back to 2
    assert gqa.backward_workspace_bytes == 2 * 8 * 128 * 4 * (1 + 64) + 2 * 100 * 8 * 128 * 2
    assert flash_buffers("aten::mm", [[4, 4], [4, 4]]) is None
    assert flash_buffers("aten::scaled_dot_product_attention", [[1, 2], [], []]) is None


@pytest.fixture(scope="module")
def math_trace():  # type: ignore[no-untyped-def]
    return load_trace(MATH)


def test_flash_memory_is_what_the_flash_recording_allocated(math_trace) -> None:  # type: ignore[no-untyped-def]
    edit = flash_memory_edit(math_trace)
    assert edit.what.startswith(f"flash_attention: {LAYERS * STEPS} of {LAYERS * STEPS} SDPA math calls")
    measured_trace = load_trace(FLASH)
    recorded, measured = memory(math_trace), memory(measured_trace)
    predicted = memory(math_trace, edits=[edit])
    (was,), (got,), (truth,) = recorded.devices, predicted.devices, measured.devices
    assert truth.peak_allocated_bytes / was.peak_allocated_bytes < 0.7   # the S×S scores held a third of it
    assert got.peak_allocated_bytes == pytest.approx(truth.peak_allocated_bytes, rel=0.02)
    # every step's peak too, and where the memory ends
    assert [s.peak_allocated_bytes for s in predicted.steps] == \
        pytest.approx([s.peak_allocated_bytes for s in measured.steps], rel=0.02)
    assert got.end_allocated_bytes == truth.end_allocated_bytes
    # the math backend's own blocks are gone: its softmax held 32 MiB at the peak, the flash op holds
    # the saved inputs and log-sum-exp of the two layers
    held = {o.op: o.held_at_peak_bytes for o in predicted.ops}
    assert "aten::_softmax" not in held or held["aten::_softmax"] == 0
    assert held["aten::_scaled_dot_product_flash_attention"] == LAYERS * (3 * B * H * S * D * 2 + B * H * S * 4)


def test_memory_edits_say_which_transforms_model_memory(math_trace) -> None:  # type: ignore[no-untyped-def]
    graph = build_graph(math_trace)
    edits, lines = memory_edits(graph, [Scale(factor=0.5), FlashAttention()])
    assert len(edits) == 1 and lines[0] == "scale(factor=0.5): memory not modelled (its allocations stay as recorded)"
    assert lines[1] == edits[0].what
    with pytest.raises(TransformError, match="SDPA's math backend"):
        flash_memory_edit(load_trace(FLASH))


def test_cli_predicts_beside_the_recorded_peak(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "flash.toml"
    scenario.write_text('name = "flash"\n\n[[transform]]\nname = "flash_attention"\n')
    out = tmp_path / "m.json"
    assert main(["memory", str(MATH), "-s", str(scenario), "--json", str(out), "-o", str(tmp_path / "m.csv")]) == 0
    text = capsys.readouterr().out
    assert "scenario flash: the predicted timeline" in text and "125.3" in text and "79.3" in text
    doc = from_json(out.read_text(), MemoryDocument)
    assert doc.predicted is not None and doc.predicted[0].startswith("flash_attention: 8 of 8")
    assert doc.devices[0].peak_allocated_bytes < 80 * MiB
    table = pd.read_csv(tmp_path / "m.csv")
    assert table["allocated_bytes"].max() == doc.devices[0].peak_allocated_bytes
    assert main(["memory", str(FLASH), "-s", str(scenario)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "SDPA's math backend" in err[0]
