"""``sequence_parallel``'s memory in Ulysses mode (``whatif memory -s``): which blocks one rank
holds less of, the all-to-all and all-gather buffers it adds, checked op by op on our own CPU
recording of examples/dit_serve.py, and the predicted peak against the same server run with
Ulysses over two gloo ranks (sample_traces/sp_memory: ``sp1`` and ``sp2``)."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from whatif.cli import main
from whatif.depgraph.build import build_graph
from whatif.memory import memory, memory_edits, memory_table
from whatif.scale.executor import Execution
from whatif.scale.plans import PlanGrid, sweep_plans
from whatif.tracer.trace import Trace, load_trace
from whatif.transforms.base import TransformError
from whatif.transforms.optimizations.batch_memory import (
    BlockRole,
    batch_peaks,
    block_roles,
    gpu_devices,
    with_transients,
)
from whatif.transforms.parallel.sequence import SequenceParallel
from whatif.transforms.parallel.sp_memory import (
    _attention_bytes,
    sequence_parallel_memory_edit,
    ulysses_batch_peaks,
    ulysses_memory,
)

ROOT = Path(__file__).resolve().parents[1]
SP1, SP2 = ROOT / "sample_traces" / "sp_memory" / "sp1", ROOT / "sample_traces" / "sp_memory" / "sp2"
QWEN = "tracelens/hf_h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"


@pytest.fixture(scope="module")
def sp1() -> Trace:
    return load_trace(SP1)


def test_per_token_activations_of_the_blocks_are_split(sp1: Trace) -> None:
    um = ulysses_memory(sp1, 2)
    ops = memory_table(sp1)["op"].to_numpy()[um.roles.rows]
    activation = um.roles.mask(BlockRole.ACTIVATION)
    by_op: dict[str, set[float]] = defaultdict(set)
    for op, share in zip(ops[activation], um.scale[activation]):
        by_op[str(op)].add(float(share))
    # attention on half the heads (the math backend's scores too), the MLP on half the tokens
    assert by_op["aten::_softmax"] == {0.5} and by_op["aten::bmm"] == {0.5} and by_op["aten::gelu"] == {0.5}
    # the patch embedding runs whole on every rank; GEMMs are both: per token (QKV, MLP) and per
    # sample (the adaLN modulation from the conditioning vector, the timestep MLP)
    assert by_op["aten::mkldnn_convolution"] == {1.0} and by_op["aten::addmm"] == {0.5, 1.0}
    assert (um.scale[~activation] == 1).all()   # weights: every rank holds the whole model
    # four model calls (two warm-up, two denoising steps), four blocks each; one gather per call
    assert len(um.calls) == 16 and len(um.gathers) == 4


def test_the_predicted_peak_is_each_ulysses_ranks(sp1: Trace) -> None:
    graph = build_graph(sp1)
    edits, lines = memory_edits(graph, [SequenceParallel(mode="ulysses", degree=2)])
    (line,) = lines
    assert "1/2" in line and "16 attention calls" in line and "4 all-gathers" in line
    (got,) = memory(sp1, graph, edits=edits).devices
    (was,) = memory(sp1, graph).devices
    measured = memory(load_trace(SP2))
    assert len(measured.devices) == 2
    for rank in measured.devices:
        # to the byte but for the one-element fence the example all-reduces after each collective
        assert got.peak_allocated_bytes == pytest.approx(rank.peak_allocated_bytes, abs=64)
        assert was.peak_allocated_bytes > 1.3 * rank.peak_allocated_bytes
    predicted = {s.step: s.peak_allocated_bytes for s in memory(sp1, graph, edits=edits).steps}
    for step in measured.steps:
        assert predicted[step.step] == pytest.approx(step.peak_allocated_bytes, abs=64)


def test_the_buffers_are_added_around_each_attention_call_and_gather(sp1: Trace) -> None:
    edit = sequence_parallel_memory_edit(sp1, 4)
    added = edit.added
    ops = added["op"].tolist()
    # Q, K, V: send, receive and reshaped copy each; the output's three; the gather's four parts
    assert ops.count("(Ulysses all-to-all: Q, K, V)") == 16 * 2 * 9
    assert ops.count("(Ulysses all-to-all: output)") == 16 * 2 * 3 and ops.count("(Ulysses all-gather)") == 4 * 2 * 4
    assert added["bytes"].sum() == 0   # every added block is freed where it is added
    um = ulysses_memory(sp1, 4)
    # Q's [B, H, N, d] fp32 over four ranks: B = 2 in the first warm-up call (one request, CFG), 4 later
    assert [c.qkv_bytes[0] for c in um.calls[::4]] == [2 * 4 * 256 * 48 * 4 // 4] + [4 * 4 * 256 * 48 * 4 // 4] * 3
    sizes = added.loc[added["op"] == "(Ulysses all-to-all: Q, K, V)", "bytes"].to_numpy()
    assert sizes.max() == max(c.qkv_bytes[0] for c in um.calls)


def test_more_ranks_never_need_more_and_one_changes_nothing(sp1: Trace) -> None:
    graph = build_graph(sp1)
    peaks = []
    for p in (1, 2, 4):
        edits, _ = memory_edits(graph, [SequenceParallel(mode="ulysses", degree=p)])
        peaks.append(memory(sp1, graph, edits=edits).devices[0].peak_allocated_bytes)
    assert peaks[0] == memory(sp1, graph).devices[0].peak_allocated_bytes
    assert peaks[0] > peaks[1] > peaks[2]


def test_on_a_gpu_trace_the_buffers_are_gpu_blocks(shared_traces: Path) -> None:
    """Qwen1.5-0.5B inference on an H100 (HF, SDPA): the buffers go on the GPU in whole 512-byte
    blocks, one all-to-all set per layer, and two ranks hold less than one, four less than two."""
    trace = load_trace(shared_traces / QWEN)
    edit = sequence_parallel_memory_edit(trace, 2)
    buffers = edit.added[edit.added["op"].astype(str).str.startswith("(Ulysses")]
    anchors = trace.memory.iloc[buffers["anchor"].to_numpy()]
    assert len(buffers) and (anchors["device_type"] == 1).all() and (buffers["bytes"].abs() % 512 == 0).all()
    assert len(ulysses_memory(trace, 2).calls) == 24
    graph = build_graph(trace)
    peaks = [memory(trace, graph, edits=memory_edits(graph, [SequenceParallel(mode="ulysses", degree=p)])[0])
             .devices[0].peak_allocated_bytes for p in (1, 2, 4)]
    assert peaks[0] > peaks[1] > peaks[2]


def test_the_sweep_reads_a_ulysses_ranks_records(shared_traces: Path) -> None:
    """A plan sweep with sp > 1 (Ulysses, no tensor or pipeline parallelism) reads one rank's
    records: at the traced batch the bytes per GPU are ``whatif memory -s``'s peak, and a larger
    batch grows the buffers with the activations; a plan with tp and sp keeps the memory model."""
    trace = load_trace(shared_traces / QWEN)
    doc = sweep_plans(trace.source, PlanGrid(tp=(1, 2), sp=(1, 2), batch_factor=(1, 4)), Execution(jobs=1))
    rows = {(r.tp, r.sp, r.batch): r for r in doc.plans}
    edited = memory(trace, edits=[sequence_parallel_memory_edit(trace, 2)]).devices[0].peak_allocated_bytes
    assert rows[(1, 2, 1.0)].memory_source == "allocator records"
    assert rows[(1, 2, 1.0)].memory_per_gpu_bytes == edited < rows[(1, 1, 1.0)].memory_per_gpu_bytes
    peaks = ulysses_batch_peaks(trace, 2)
    assert peaks is not None and rows[(1, 2, 4.0)].memory_per_gpu_bytes == peaks.peak_bytes(4.0) > edited
    assert rows[(2, 2, 1.0)].memory_source == "weights + workspace"
    assert "Ulysses plans with sp 2" in doc.memory_model


def test_gqa_kv_heads_are_replicated_when_the_ranks_outnumber_them() -> None:
    """Q, K, V and the output on one rank: each over P; K and V at least one KV head of every token
    (8 query heads, 2 KV heads over 4 ranks: half of K, not a quarter); a split of the heads the
    transform refuses is refused."""
    sdpa = "aten::scaled_dot_product_attention"
    dims = [[2, 8, 256, 64], [2, 2, 256, 64], [2, 2, 256, 64]]
    kinds = ["c10::BFloat16"] * 3
    q, kv = 2 * 8 * 256 * 64 * 2, 2 * 2 * 256 * 64 * 2
    assert _attention_bytes(sdpa, dims, kinds, 2) == (q // 2, kv // 2, kv // 2, q // 2)
    assert _attention_bytes(sdpa, dims, kinds, 4) == (q // 4, kv // 2, kv // 2, q // 4)
    assert _attention_bytes("aten::mm", [[4, 4], [4, 4]], ["float"] * 2, 2) is None


def test_a_split_the_heads_do_not_allow_is_refused(sp1: Trace) -> None:
    with pytest.raises(TransformError, match=r"splits the 4 attention heads .* over 8 GPUs"):
        ulysses_memory(sp1, 8)
    with pytest.raises(TransformError, match="at least 512 query tokens"):
        ulysses_memory(sp1, 512)


def test_a_transient_is_a_point_beside_its_record(shared_traces: Path) -> None:
    """``with_transients``: a burst after a record stands on that record's bytes, one before it on
    the record's before (before a device's first record: its allocated bytes less the record's)."""
    trace = load_trace(shared_traces / QWEN)
    peaks = batch_peaks(trace, block_roles(trace))
    assert peaks is not None
    (rows,) = gpu_devices(trace.memory)
    first, third = int(rows[0]), int(rows[2])
    more = with_transients(trace, peaks, [(first, False, 1000), (third, True, 10), (third, False, 20)])
    (allocated,), (was,) = more.allocated, peaks.allocated
    size = int(trace.memory["bytes"].to_numpy()[first])
    assert allocated[len(was):].tolist() == [was[0] - size + 1000, was[2] + 10, was[1] + 20]
    assert more.live[0][len(was):].tolist() == [1000, peaks.live[0][2] + 10, peaks.live[0][1] + 20]


def test_ring_usp_and_torus_are_not_modelled(sp1: Trace) -> None:
    graph = build_graph(sp1)
    for mode in ("ring", "usp", "torus"):
        edits, (line,) = memory_edits(graph, [SequenceParallel(mode=mode, degree=2)])
        assert edits == [] and "memory not modelled" in line


def test_refusals_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    no_records = load_trace(ROOT / "sample_traces" / "dit_serve")
    with pytest.raises(TransformError, match="has no allocator records"):
        ulysses_memory(no_records, 2)
    scenario = tmp_path / "sp.toml"
    scenario.write_text('[[transform]]\nname = "sequence_parallel"\nmode = "ulysses"\ndegree = 2\n')
    assert main(["memory", str(SP1), "-s", str(scenario)]) == 0
    out = capsys.readouterr().out
    assert "sequence_parallel(ulysses, degree=2)" in out
    assert main(["memory", str(ROOT / "sample_traces" / "dit_serve"), "-s", str(scenario)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no allocator records" in err
    training = build_graph(load_trace(ROOT / "sample_traces" / "tp_memory" / "tp1"))
    with pytest.raises(TransformError, match="backward pass"):
        memory_edits(training, [SequenceParallel(mode="ulysses", degree=2)])
