"""``sequence_parallel``'s memory in Ulysses, Ring and USP mode (``whatif memory -s``): which
blocks one rank holds less of, the all-to-all, ring and all-gather buffers it adds, checked op by
op on our own CPU recording of examples/dit_serve.py, and the predicted peak against the same
server run with Ulysses and with Ring attention over two gloo ranks (sample_traces/sp_memory:
``sp1``, ``sp2`` and ``ring2``), and with USP over four (recorded by the test)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from whatif.cli import main
from whatif.depgraph.build import build_graph
from whatif.memory import memory, memory_edits, memory_table
from whatif.scale.executor import Execution
from whatif.scale.plans import PlanGrid, sweep_plans
from whatif.tracer.memory import Burst
from whatif.tracer.trace import Trace, load_trace
from whatif.transforms.base import Transform, TransformError
from whatif.transforms.optimizations.batch import Batch
from whatif.transforms.optimizations.batch_memory import (
    BlockRole,
    batch_peaks,
    block_roles,
    gpu_devices,
    with_transients,
)
from whatif.transforms.parallel.sequence import SequenceParallel
from whatif.transforms.parallel.sp_memory import (
    attention_call,
    ring_records,
    sequence_memory,
    sequence_parallel_memory_edit,
    sp_batch_peaks,
)

ROOT = Path(__file__).resolve().parents[1]
SP1, SP2 = ROOT / "sample_traces" / "sp_memory" / "sp1", ROOT / "sample_traces" / "sp_memory" / "sp2"
RING2 = ROOT / "sample_traces" / "sp_memory" / "ring2"
QWEN = "tracelens/hf_h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"


@pytest.fixture(scope="module")
def sp1() -> Trace:
    return load_trace(SP1)


def test_per_token_activations_of_the_blocks_are_split(sp1: Trace) -> None:
    um = sequence_memory(sp1, 2)
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
        assert got.peak_allocated_bytes == pytest.approx(rank.peak_allocated_bytes, abs=16)
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
    assert ops.count("(Ulysses all-to-all: output)") == 16 * 2 * 3
    assert ops.count("(sequence-parallel all-gather)") == 4 * 2 * 4
    assert added["bytes"].sum() == 0   # every added block is freed where it is added
    um = sequence_memory(sp1, 4)
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
    assert len(sequence_memory(trace, 2).calls) == 24
    graph = build_graph(trace)
    peaks = [memory(trace, graph, edits=memory_edits(graph, [SequenceParallel(mode="ulysses", degree=p)])[0])
             .devices[0].peak_allocated_bytes for p in (1, 2, 4)]
    assert peaks[0] > peaks[1] > peaks[2]
    # a ring's blocks too, and K, V made by their own projections (dense) are sent as they are
    ring = sequence_parallel_memory_edit(trace, 2, 1)
    blocks = ring.added[ring.added["op"].astype(str).str.startswith("(Ring")]
    assert len(blocks) and (blocks["bytes"].abs() % 512 == 0).all()
    assert not any(c.strided_kv for c in sequence_memory(trace, 2, 1).calls)
    rings = [memory(trace, graph, edits=memory_edits(graph, [SequenceParallel(mode="ring", degree=p)])[0])
             .devices[0].peak_allocated_bytes for p in (2, 4)]
    assert peaks[0] > rings[0] > rings[1]


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
    peaks = sp_batch_peaks(trace, 2)
    assert peaks is not None and rows[(1, 2, 4.0)].memory_per_gpu_bytes == peaks.peak_bytes(4.0) > edited
    assert rows[(2, 2, 1.0)].memory_source == "weights + workspace"
    assert "ulysses plans with sp 2" in doc.memory_model
    ring = sweep_plans(trace.source, PlanGrid(sp=(2,), sp_mode="ring"), Execution(jobs=1))
    (row,) = ring.plans
    assert row.memory_source == "allocator records" and "ring plans with sp 2" in ring.memory_model
    assert row.memory_per_gpu_bytes == memory(trace, edits=[sequence_parallel_memory_edit(trace, 2, 1)]) \
        .devices[0].peak_allocated_bytes


def test_a_larger_batch_on_each_rank_composes_in_either_order(sp1: Trace) -> None:
    """``batch`` and ``sequence_parallel`` in one scenario: each block at the product of their
    factors and the buffers sequence parallelism adds at the batch's factor of the attention they
    serve, whichever comes first; more than the ranks at the recorded batch, less than one GPU at
    the larger batch."""
    graph = build_graph(sp1)
    for sp in (SequenceParallel(mode="ulysses", degree=2), SequenceParallel(mode="ring", degree=2)):
        one, lines = memory_edits(graph, [Batch(factor=2), sp])
        other, _ = memory_edits(graph, [sp, Batch(factor=2)])
        assert len(one) == len(other) == 1 and len(lines) == 3
        assert lines[2].startswith("batch(factor=2) and sequence_parallel(") and "grow with the blocks" in lines[2]
        (alone,) = memory_edits(graph, [sp])[0]
        buffers = [e.added.loc[(e.added["bytes"] > 0) & e.added["op"].isin({b.op for b in e.bursts}), "bytes"].sum()
                   for e in (alone, one[0])]
        assert buffers[0] > 0
        assert buffers[1] == pytest.approx(2 * buffers[0], abs=len(alone.added))
        peaks = [memory(sp1, graph, edits=e).devices[0].peak_allocated_bytes for e in (one, other)]
        assert peaks[0] == peaks[1]
        assert memory(sp1, graph, edits=[alone]).devices[0].peak_allocated_bytes < peaks[0]
        batch_only, _ = memory_edits(graph, [Batch(factor=2)])
        assert peaks[0] < memory(sp1, graph, edits=batch_only).devices[0].peak_allocated_bytes


def test_on_a_gpu_trace_batch_and_sequence_parallel_compose_as_the_sweep_does(shared_traces: Path) -> None:
    """Qwen on an H100 at 8× its batch on a rank of each layout: the timeline's peak is the plan
    sweep's (:func:`sp_batch_peaks`) but for the 512-byte rounding of each block grown."""
    trace = load_trace(shared_traces / QWEN)
    graph = build_graph(trace)
    for sp, ulysses in ((SequenceParallel(mode="ulysses", degree=2), None),
                        (SequenceParallel(mode="ring", degree=2), 1),
                        (SequenceParallel(mode="usp", degree=4, ulysses_degree=2), 2)):
        edits, _ = memory_edits(graph, [Batch(factor=8), sp])
        predicted = memory(trace, graph, edits=edits).devices[0].peak_allocated_bytes
        expected = sp_batch_peaks(trace, sp.degree, ulysses)
        assert expected is not None
        assert abs(predicted / expected.peak_bytes(8.0) - 1) < 1e-3, sp.label()


def test_the_sweep_runs_each_usp_layout(shared_traces: Path) -> None:
    """``--sp-mode usp --ulysses-degree 1,2,4`` sweeps each layout of sp 4 (a ring of 4, USP 2×2,
    Ulysses over 4; 3 does not divide 4 and is left out): each plan's scenario names its Ulysses
    degree, and its bytes per GPU are ``whatif memory -s``'s peak for that layout."""
    trace = load_trace(shared_traces / QWEN)
    grid = PlanGrid(sp=(4,), sp_mode="usp", ulysses_degree=(1, 2, 4, 3))
    assert grid.size() == 3
    doc = sweep_plans(trace.source, grid, Execution(jobs=1))
    rows = {r.plan: r for r in doc.plans}
    assert list(rows) == ["tp1·pp1·sp4u1·dp1", "tp1·pp1·sp4u2·dp1", "tp1·pp1·sp4u4·dp1"]
    for u in (1, 2, 4):
        want = memory(trace, edits=[sequence_parallel_memory_edit(trace, 4, u)]).devices[0].peak_allocated_bytes
        assert rows[f"tp1·pp1·sp4u{u}·dp1"].memory_per_gpu_bytes == want
        assert rows[f"tp1·pp1·sp4u{u}·dp1"].ulysses == u
    assert "usp plans with sp 4 (u 1), 4 (u 2), 4 (u 4)" in doc.memory_model
    # the scenario carries the layout: a ring of four hops over every rank, Ulysses does not
    assert rows["tp1·pp1·sp4u1·dp1"].step_ns != rows["tp1·pp1·sp4u4·dp1"].step_ns
    # the default (0: a DGX H100's GPUs, 4 here) is not swept twice; no layout of sp 2 is refused
    assert PlanGrid(sp=(4,), sp_mode="usp", ulysses_degree=(0, 4)).sp_layouts() == [(4, 4)]
    with pytest.raises(ValueError, match="no Ulysses degree of 4 divides the sequence-parallel degree 2"):
        PlanGrid(sp=(2, 4), sp_mode="usp", ulysses_degree=(4,))


def test_gqa_kv_heads_are_replicated_when_the_ranks_outnumber_them() -> None:
    """Q, K, V and the output on one rank: each over P; K and V at least one KV head of every token
    (8 query heads, 2 KV heads over 4 ranks: half of K, not a quarter); a split of the heads the
    transform refuses is refused."""
    sdpa = "aten::scaled_dot_product_attention"
    dims = [[2, 8, 256, 64], [2, 2, 256, 64], [2, 2, 256, 64]]
    kinds = ["c10::BFloat16"] * 3
    q, kv = 2 * 8 * 256 * 64 * 2, 2 * 2 * 256 * 64 * 2
    def moved(ulysses: int, ring: int = 1) -> tuple[int, int, int, int]:
        call = attention_call(sdpa, dims, kinds, [], ulysses, ring)
        assert call is not None
        return (*call.qkv_bytes, call.out_bytes)

    assert moved(2) == (q // 2, kv // 2, kv // 2, q // 2)
    assert moved(4) == (q // 4, kv // 2, kv // 2, q // 4)
    # a ring keeps every KV head and cuts the tokens: USP 2 x 2 holds a quarter of K
    assert moved(1, 4) == (q // 4, kv // 4, kv // 4, q // 4) and moved(2, 2) == (q // 4, kv // 4, kv // 4, q // 4)
    assert attention_call("aten::mm", [[4, 4], [4, 4]], ["float"] * 2, [], 2, 1) is None


def test_a_split_the_heads_do_not_allow_is_refused(sp1: Trace) -> None:
    with pytest.raises(TransformError, match=r"splits the 4 attention heads .* over 8 GPUs"):
        sequence_memory(sp1, 8)
    with pytest.raises(TransformError, match="at least 512 query tokens"):
        sequence_memory(sp1, 512)


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


def test_torus_is_not_modelled(sp1: Trace) -> None:
    edits, (line,) = memory_edits(build_graph(sp1), [SequenceParallel(mode="torus", degree=2)])
    assert edits == [] and "memory not modelled" in line


def test_refusals_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    no_records = load_trace(ROOT / "sample_traces" / "dit_serve")
    with pytest.raises(TransformError, match="has no allocator records"):
        sequence_memory(no_records, 2)
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


def test_a_ring_ranks_peak_is_predicted_to_the_byte(sp1: Trace) -> None:
    """Ring attention over two gloo ranks (``--sp 2 --ring 2``): the predicted peak of the run and
    of every step is each rank's, but for the one-element fence after each collective."""
    graph = build_graph(sp1)
    edits, (line,) = memory_edits(graph, [SequenceParallel(mode="ring", degree=2)])
    assert line.startswith("sequence_parallel(ring, degree=2)") and "ring blocks of 16 attention calls" in line
    predicted = memory(sp1, graph, edits=edits)
    measured = memory(load_trace(RING2))
    assert len(measured.devices) == 2
    for rank in measured.devices:
        assert predicted.devices[0].peak_allocated_bytes == pytest.approx(rank.peak_allocated_bytes, abs=16)
    steps = {s.step: s.peak_allocated_bytes for s in predicted.steps}
    for step in measured.steps:
        assert steps[step.step] == pytest.approx(step.peak_allocated_bytes, abs=16)
    # the Ulysses prediction is not the ring's: its all-to-alls and 1/P scores are not what a ring holds
    ulysses = memory(sp1, graph, edits=memory_edits(graph, [SequenceParallel(mode="ulysses", degree=2)])[0])
    assert abs(ulysses.devices[0].peak_allocated_bytes - measured.devices[0].peak_allocated_bytes) > 4096


def test_a_ring_makes_its_own_attention(sp1: Trace) -> None:
    """Under a ring the recorded call's scores (the math backend's, made and freed inside it) are
    not made, its output is 1/P, and the fused QKV projection's K and V are copied to be sent
    (Ring alone: they are strided views; USP: the all-to-all's copies are already whole)."""
    ring, usp = sequence_memory(sp1, 2, 1), sequence_memory(sp1, 4, 2)
    ops = memory_table(sp1)["op"].to_numpy()[ring.roles.rows]
    softmax = (ops == "aten::_softmax") & ring.roles.mask(BlockRole.ACTIVATION)
    assert softmax.any() and (ring.scale[softmax] == 0).all()
    assert set(ring.scale[(ops == "aten::bmm")].tolist()) == {0.0, 0.5}   # Q·K^T not made; the output at 1/2
    assert all(c.strided_kv for c in ring.calls) and len(ring.calls) == 16
    assert sequence_parallel_memory_edit(sp1, 4, 2).added["op"].str.startswith("(Ulysses").any()
    assert not sequence_parallel_memory_edit(sp1, 2, 1).added["op"].str.startswith("(Ulysses all-to-all").any()
    assert usp.ring == 2 and usp.calls[0].qkv_bytes == tuple(b // 2 for b in ring.calls[0].qkv_bytes)
    with pytest.raises(TransformError, match="Ulysses degree 3 does not divide the degree 4"):
        sequence_memory(sp1, 4, 3)


def test_ring_records_follow_the_tensors() -> None:
    """One rank's ring burst (K, V blocks of 8 bytes, a 16-byte output, 4-byte log-sum-exp): each
    step's received K, V are made before its attention and the block held before is freed once
    they arrive; a 16-bit output adds its fp32 conversion and a conversion back; copies of strided K,
    V live until the first blocks arrive; on the CPU ``log_sigmoid`` adds a buffer; every block made
    is freed."""
    def most(steps: int, out: int = 16, lse: int = 4, **kw: bool) -> int:
        flags = {"converts": out != 16, "copy_kv": False, "log_sigmoid_buffer": False, **kw}
        records = ring_records(steps, (8, 8), out, 16, lse, **flags)
        made = [b for b, n in records if n]
        assert sorted(made) == sorted(b for b, n in records if not n) and len(set(made)) == len(made)
        return Burst((0, False), tuple(records), "ring", 0).most_held_bytes(gpu=False)

    # two steps: received K, V (16), both steps' output and lse (40), the update's (4 + 16 + 16)
    assert most(2) == 92
    # more steps hold one more pair of K, V blocks (the next ones arrive while this one is used)
    assert most(3) == most(4) == 92 + 16
    assert most(2, copy_kv=True) == 92 and most(3, copy_kv=True) == 108   # the copies go when step 1's arrive
    assert most(2, out=8) == 92 - 8 + 16   # a 16-bit step output (8) is converted to fp32 (16) to be folded
    # with a log-sum-exp larger than the output the lse update is the peak: K, V (16), two steps'
    # outputs and lse (160), the new output (16), two temporaries (128), and on the CPU
    # log_sigmoid's buffer (64)
    assert most(2, lse=64) == 320 and most(2, lse=64, log_sigmoid_buffer=True) == 384


TINY_DIT = ("--device", "cpu", "--seed", "0", "--rate", "inf", "--warmup", "0", "--steps", "1", "--resolution", "16",
            "--layers", "2", "--d-model", "64", "--heads", "4", "--sdpa", "math")


def record_dit(out: Path, args: tuple[str, ...], ranks: int = 1) -> Trace:
    """examples/dit_serve.py recorded with allocator records and shapes, alone or as gloo ranks."""
    record = ["-m", "whatif.cli", "record", "-f", "--no-summary", "--memory", "--record-shapes", "-o", str(out),
              str(ROOT / "examples" / "dit_serve.py"), "--", *args]
    if ranks > 1:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        record = ["-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--master-port", str(port), *record]
    done = subprocess.run([sys.executable, *record], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    return load_trace(out)


def assert_each_rank(alone: Trace, ranks: Trace, count: int, *transforms: Transform) -> None:
    """The peak ``transforms`` predict from ``alone`` is each of the ``count`` ranks' to 16 bytes
    (the example's gloo groups hold one-element fences the model leaves out)."""
    graph = build_graph(alone)
    edits, _ = memory_edits(graph, list(transforms))
    (got,) = memory(alone, graph, edits=edits).devices
    measured = memory(ranks).devices
    assert len(measured) == count
    for rank in measured:
        assert got.peak_allocated_bytes == pytest.approx(rank.peak_allocated_bytes, abs=16)


@pytest.mark.slow
def test_a_usp_ranks_peak_is_predicted(tmp_path: Path) -> None:
    """USP over four gloo ranks (``--sp 4 --ring 2``: Ulysses over pairs, a ring of two) against
    the run alone: the predicted peak is each rank's but for the fences (three groups)."""
    args = (*TINY_DIT, "--num-requests", "1", "--batch", "1")
    alone = record_dit(tmp_path / "alone", args)
    usp = record_dit(tmp_path / "usp", (*args, "--sp", "4", "--ring", "2"), ranks=4)
    assert_each_rank(alone, usp, 4, SequenceParallel(mode="usp", degree=4, ulysses_degree=2))


@pytest.mark.slow
def test_a_larger_batch_on_each_rank_is_predicted(tmp_path: Path) -> None:
    """Two requests denoised one at a time, recorded alone, predict each rank of the two denoised
    together over two gloo ranks (``batch`` and ``sequence_parallel`` in one scenario), with
    Ulysses and with a ring."""
    args = (*TINY_DIT, "--num-requests", "2")
    alone = record_dit(tmp_path / "alone", (*args, "--batch", "1"))
    for sp, ring in ((SequenceParallel(mode="ulysses", degree=2), "1"), (SequenceParallel(mode="ring", degree=2), "2")):
        ranks = record_dit(tmp_path / f"ring{ring}", (*args, "--batch", "2", "--sp", "2", "--ring", ring), ranks=2)
        assert_each_rank(alone, ranks, 2, Batch(factor=2), sp)
