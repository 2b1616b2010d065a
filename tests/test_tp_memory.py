"""``tensor_parallel``'s memory (``whatif memory -s``, the plan sweep): which blocks a rank of
tensor parallelism holds less of, checked op by op and parameter by parameter on our own CPU
recording of examples/train.py, and the predicted peak checked against the same program run with
Megatron tensor parallelism over two gloo ranks (sample_traces/tp_memory: ``tp1`` and ``tp2``)."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from whatif.cli import main
from whatif.depgraph.build import build_graph
from whatif.memory import memory, memory_edits, memory_table
from whatif.scale.executor import Execution
from whatif.scale.plans import PlanGrid, sweep_plans
from whatif.tracer.trace import Trace, load_trace
from whatif.transforms.base import TransformError
from whatif.transforms.optimizations.batch_memory import BlockRole, batch_peaks, block_roles
from whatif.transforms.parallel.tensor import TensorParallel
from whatif.transforms.parallel.tp_memory import tensor_parallel_memory_edit, tensor_parallel_shares

ROOT = Path(__file__).resolve().parents[1]
TP1, TP2 = ROOT / "sample_traces" / "tp_memory" / "tp1", ROOT / "sample_traces" / "tp_memory" / "tp2"
QWEN = "tracelens/hf_h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"


@pytest.fixture(scope="module")
def tp1() -> Trace:
    return load_trace(TP1)


def _activation_shares(trace: Trace, sequence_parallel: bool = False) -> dict[str, list[float]]:
    """The shares of the activation blocks made in each op (the op ``whatif memory`` names)."""
    shares = tensor_parallel_shares(trace, 2, sequence_parallel)
    table = memory_table(trace)
    assert (table["ts_ns"].to_numpy() == trace.memory["ts_ns"].to_numpy()).all()   # one device: the same rows
    ops = table["op"].to_numpy()[shares.roles.rows]
    out: dict[str, list[float]] = defaultdict(list)
    activation = shares.roles.codes == list(BlockRole).index(BlockRole.ACTIVATION)
    for op, share in zip(ops[activation], shares.scale[activation]):
        out[str(op)].append(float(share))
    return out


def test_each_activation_takes_the_share_of_the_op_it_is_made_in(tp1: Trace) -> None:
    by_op = _activation_shares(tp1)
    # forward: attention's heads and the MLP activation are split; residual adds and the loss are not
    assert set(by_op["aten::_softmax"]) == {0.5} and set(by_op["aten::gelu"]) == {0.5}
    assert set(by_op["aten::add"]) == {1.0} and set(by_op["aten::_log_softmax"]) == {1.0}
    # the four linears of a block: QKV and MLP up (column-parallel) split, attention out and MLP down not
    addmm = by_op["aten::addmm"]
    assert sorted(set(addmm)) == [0.5, 1.0] and addmm.count(0.5) == addmm.count(1.0)
    # backward: the gradients of split activations are split (the QKV output's, stacked by a cat,
    # too: the view ops between QKV and attention output what QKV output), the loss's not
    assert set(by_op["aten::_softmax_backward_data"]) == {0.5} and set(by_op["aten::gelu_backward"]) == {0.5}
    assert set(by_op["aten::cat"]) == {0.5} and set(by_op["aten::_log_softmax_backward_data"]) == {1.0}
    # with sequence parallelism the residual adds run on half the sequence; per step the embeddings'
    # sum does not, nor does the last block's MLP residual (after its last GEMM, outside the blocks found)
    adds = _activation_shares(tp1, sequence_parallel=True)["aten::add"]
    assert sorted(set(adds)) == [0.5, 1.0] and adds.count(1.0) == 2 * 3


def test_parameter_blocks_take_their_parameters_share(tp1: Trace) -> None:
    """Blocks made to last are told by their bytes: a column-parallel weight's (QKV, 768 x 256 fp32)
    is halved, an embedding table's (512 x 256) kept; 256 x 256 is both the position embedding's
    (kept, used once) and the attention output weight's (split, two layers): 2/3 each."""
    shares = tensor_parallel_shares(tp1, 2)
    sizes = tp1.memory["bytes"].to_numpy()[shares.roles.rows]
    lasting = shares.roles.codes != list(BlockRole).index(BlockRole.ACTIVATION)
    found = {}
    for nbytes, expected in ((768 * 256 * 4, 0.5), (512 * 256 * 4, 1.0), (256 * 256 * 4, (2 / 2 + 1) / 3)):
        at = lasting & (sizes == nbytes)
        assert at.sum() >= 3                      # the weight's gradient and AdamW's two moments at least
        found[nbytes] = set(np.round(shares.scale[at], 12).tolist())
        assert found[nbytes] == {round(expected, 12)}


def test_the_predicted_peak_is_the_tensor_parallel_runs(tp1: Trace) -> None:
    """Run with two gloo ranks, the program peaks at 50.9 MiB on each (recorded alone: 80.6, "no
    change" 58 % over); predicted the same to a byte (a share of an odd size rounds), at the same op.
    (Recorded with gloo's two threads, the ranks had held blocks the communication thread freed
    unseen: 53.9 and 55.9 MiB.)"""
    predicted = memory(tp1, edits=[tensor_parallel_memory_edit(tp1, 2)]).devices[0]
    recorded = memory(tp1).devices[0].peak_allocated_bytes
    for rank in memory(load_trace(TP2)).devices:
        measured = rank.peak_allocated_bytes
        assert predicted.peak_allocated_bytes == pytest.approx(measured, abs=8)
        assert recorded > 1.5 * measured and rank.held_at_peak_unrecorded_bytes == 0
        assert predicted.peak_op == rank.peak_op == "aten::_log_softmax_backward_data"


def test_degree_one_changes_nothing_and_more_ranks_never_need_more(tp1: Trace) -> None:
    edit = tensor_parallel_memory_edit(tp1, 1)
    assert not len(edit.dropped) and not len(edit.added)
    peaks = [memory(tp1, edits=[tensor_parallel_memory_edit(tp1, t)]).devices[0].peak_allocated_bytes
             for t in (1, 2, 4, 8)]
    assert peaks[0] == memory(tp1).devices[0].peak_allocated_bytes
    assert peaks == sorted(peaks, reverse=True) and peaks[-1] < peaks[0]


def test_cli_predicts_a_tensor_parallel_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "tp2.toml"
    scenario.write_text('name = "tp2"\n\n[[transform]]\nname = "tensor_parallel"\ndegree = 2\n')
    assert main(["memory", str(TP1), "-s", str(scenario)]) == 0
    text = capsys.readouterr().out
    assert "tensor_parallel(degree=2): 405 blocks held at less than their bytes on one rank" in text
    assert "80.6" in text and "50.9" in text


def test_a_trace_without_a_transformer_block_is_refused(tmp_path: Path) -> None:
    from test_batch_memory import one_linear_step

    trace = load_trace(one_linear_step(tmp_path))
    with pytest.raises(TransformError, match=r"tensor_parallel: found no transformer block .* its memory cannot"):
        memory_edits(build_graph(trace), [TensorParallel(degree=2)])
    doc = sweep_plans(trace.source, PlanGrid(tp=(1, 2)), Execution(jobs=1))
    assert doc.plans[0].memory_source == "allocator records"
    assert doc.plans[1].memory_source != "allocator records"
    assert "tp > 1 plans keep the model: tensor_parallel: found no transformer block" in doc.memory_model


def test_on_a_gpu_trace_the_sweep_reads_one_ranks_records(shared_traces: Path) -> None:
    """Qwen1.5-0.5B on an H100 (HF generate): the weights were loaded before the recording (939 MiB);
    one rank of tp 2 holds less of them and of the activations. The sweep's bytes per GPU equal
    ``whatif memory -s``'s peak, but for the 512-byte rounding of the blocks it splits."""
    trace = load_trace(shared_traces / QWEN)
    roles = block_roles(trace)
    shares = tensor_parallel_shares(trace, 2, roles=roles)
    assert 0.5 < shares.before < 1
    peaks = batch_peaks(trace, roles, shares.scaling())
    edited = memory(trace, edits=[tensor_parallel_memory_edit(trace, 2)]).devices[0]
    assert 0 <= edited.peak_allocated_bytes - peaks.peak_bytes(1.0) <= 512 * len(shares.sharded()) + 512
    recorded = memory(trace).devices[0].peak_allocated_bytes
    assert edited.peak_allocated_bytes < recorded
    doc = sweep_plans(trace.source, PlanGrid(tp=(1, 2), batch_factor=(1, 8)), Execution(jobs=1))
    rows = {(r.tp, r.batch): r for r in doc.plans}
    assert {r.memory_source for r in doc.plans} == {"allocator records"}
    assert rows[(2, 1.0)].memory_per_gpu_bytes == peaks.peak_bytes(1.0)
    assert rows[(2, 8.0)].memory_per_gpu_bytes == peaks.peak_bytes(8.0) < rows[(1, 8.0)].memory_per_gpu_bytes


def test_a_larger_batch_on_one_rank_composes_in_either_order(tp1: Trace) -> None:
    """``batch`` and ``tensor_parallel`` both scale blocks, so a scenario of both is each block at
    the product of their factors, whichever comes first."""
    from whatif.transforms.optimizations.batch import Batch

    graph = build_graph(tp1)
    one, lines = memory_edits(graph, [Batch(factor=2), TensorParallel(degree=2)])
    other, _ = memory_edits(graph, [TensorParallel(degree=2), Batch(factor=2)])
    assert len(one) == len(other) == 1 and lines[0].startswith("batch(factor=2)")
    assert lines[1].startswith("tensor_parallel(degree=2)") and len(lines) == 3
    assert lines[2].startswith("batch(factor=2) and tensor_parallel(degree=2")
    assert "product of their factors" in lines[2]
    peaks = [memory(tp1, edits=e).devices[0].peak_allocated_bytes for e in (one, other)]
    tp_only = memory(tp1, edits=[tensor_parallel_memory_edit(tp1, 2)]).devices[0].peak_allocated_bytes
    assert abs(peaks[0] - peaks[1]) <= 2 and peaks[0] > tp_only
    assert peaks[0] < memory(tp1, edits=memory_edits(graph, [Batch(factor=2)])[0]).devices[0].peak_allocated_bytes


def test_on_a_gpu_trace_batch_and_tensor_parallel_compose_as_the_sweep_does(shared_traces: Path) -> None:
    from whatif.transforms.optimizations.batch import Batch

    trace = load_trace(shared_traces / QWEN)
    roles = block_roles(trace)
    shares = tensor_parallel_shares(trace, 2, roles=roles)
    edits, _ = memory_edits(build_graph(trace), [Batch(factor=8), TensorParallel(degree=2)])
    predicted = memory(trace, edits=edits).devices[0].peak_allocated_bytes
    expected = batch_peaks(trace, roles, shares.scaling()).peak_bytes(8.0)
    assert 0 <= predicted - expected <= 512 * len(roles.rows)
    assert abs(predicted / expected - 1) < 1e-3


def test_a_merged_scaling_still_meets_the_edits_between(tp1: Trace) -> None:
    """Scalings merge into the first one, and the merged edit is still checked against every other
    edit: a non-scaling edit that drops a block ``tensor_parallel`` scales is refused whether or
    not a ``batch`` came before it."""
    import pandas as pd

    from whatif.tracer.memory import RecordEdit
    from whatif.transforms.optimizations.batch import Batch

    shares = tensor_parallel_shares(tp1, 2)
    activation = shares.roles.codes == list(BlockRole).index(BlockRole.ACTIVATION)
    lasting = shares.roles.rows[(shares.scale < 1) & ~activation]
    row = int(lasting[0])

    class DropsOneBlock(Batch):
        def memory_edit(self, graph):  # type: ignore[no-untyped-def]
            return RecordEdit("drops a block", np.array([row]), pd.DataFrame(
                {"anchor": [], "after": [], "bytes": [], "addr": [], "op": []}))

    graph = build_graph(tp1)
    for scenario in ([Batch(factor=2), DropsOneBlock(factor=3), TensorParallel(degree=2)],
                     [DropsOneBlock(factor=3), TensorParallel(degree=2)]):
        refused = r"batch\(factor=3\) and tensor_parallel\(degree=2.*\) both change 1 of the same"
        with pytest.raises(TransformError, match=refused):
            memory_edits(graph, scenario)
