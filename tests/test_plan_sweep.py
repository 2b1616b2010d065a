"""Plan sweeps (whatif/scale/plans.py, ``whatif sweep --plans``): the grid, refusals as rows, the
Pareto front, a plan equal to ``whatif predict`` of its scenario file, the same bytes from every
backend (serial, local processes, Ray), and the one line without Ray."""
from __future__ import annotations

import importlib.util
import io
import json
import sys
from pathlib import Path

import msgspec
import pytest
from _llm_tracegen import llm_trace
from rich.console import Console

from whatif.api import analyze
from whatif.cli import main
from whatif.commands.sweep import render_plans
from whatif.documents import PlanRow, to_json
from whatif.scale.executor import Execution, chunked, map_chunks
from whatif.scale.plans import (
    Mode,
    PlanGrid,
    PlanOutcome,
    PlanStatus,
    _batches,
    expand,
    pareto_front,
    plan_rows,
    plan_toml,
    plans_table,
    sweep_plans,
)
from whatif.scale.ray_backend import INSTALL_HINT, RayTarget

# an 8192-hidden, 64-head decoder of 6 layers in training: 11.8 GB of forward GEMM weights, which an
# 11 GB RTX 2080 Ti cannot hold whole (tp 1) but can at tp 2
LLM = {"new_tokens": 256, "kv_tokens": 256, "layers": 6, "hidden": 8192, "heads": 64, "ffn": 28672,
       "backward": True, "steps": 2}


@pytest.fixture(scope="module")
def training(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return llm_trace(tmp_path_factory.mktemp("plans") / "train.json.gz", **LLM)


@pytest.fixture(scope="module")
def training_analysis(training: Path):
    return analyze(training)


def _row(doc, label: str) -> PlanRow:
    return next(r for r in doc.plans if r.plan == label)


def test_the_grid_expands_in_order_with_micro_batches_for_pipelines_only():
    grid = PlanGrid(tp=(1, 2), pp=(1, 4), dp=(1, 2), sp=(1,), micro_batches=(4, 8),
                    device=("A100_SXM_80GB", "H100_SXM"))
    plans = expand(grid, recorded_device="NVIDIA H100 80GB HBM3", mode=Mode.TRAINING)
    assert len(plans) == grid.size() == 2 * 2 * (1 + 2) * 2
    assert plans[0].label == "tp1·pp1·sp1·dp1 on A100_SXM_80GB" and plans[1].label == "tp1·pp1·sp1·dp2 on A100_SXM_80GB"
    assert [p.micro_batches for p in plans if p.pp == 1] == [0] * 8      # no micro-batch axis without a pipeline
    assert sorted({p.micro_batches for p in plans if p.pp == 4}) == [4, 8]
    assert {p.device for p in plans} == {"A100_SXM_80GB", None}          # the recorded GPU needs no gpu transform
    names = [[t["name"] for t in p.transforms()] for p in plans]
    assert names[plans.index(next(p for p in plans if p.tp == 2 and p.pp == 4 and p.dp == 2 and p.device))] == \
        ["gpu", "tensor_parallel", "pipeline_parallel", "data_parallel"]
    assert next(p for p in plans if p.device is None and p.tp == 1 and p.pp == 1 and p.dp == 1).transforms() == []


def test_bad_grid_values_are_refused():
    from whatif.scale.plans import _degrees, _names
    with pytest.raises(ValueError, match="comma-separated"):
        _degrees("2,x")
    with pytest.raises(ValueError, match=r"1\.\."):
        _degrees("0,2")
    with pytest.raises(ValueError, match="not a GPU of the catalog"):
        _names("H100_SXM,NO_SUCH_GPU")


def test_pareto_front_on_a_hand_made_table():
    gpus = [1, 2, 2, 4, 4, 8]
    step = [10.0, 6.0, 8.0, 6.0, 3.0, 3.0]
    thru = [1.0, 2.0, 1.5, 2.0, 5.0, 5.0]
    # (2, 8, 1.5) is beaten by (2, 6, 2.0); (4, 6, 2.0) by (2, 6, 2.0); (8, 3, 5) by (4, 3, 5)
    assert pareto_front(gpus, step, thru).tolist() == [True, True, False, False, True, False]
    assert pareto_front([2, 2], [5.0, 5.0], [1.0, 1.0]).tolist() == [True, True]    # equals do not dominate


def test_rows_count_gpus_and_throughput_and_leave_refusals_off_the_front():
    plans = expand(PlanGrid(tp=(1, 2), dp=(1, 2)), recorded_device=None, mode=Mode.TRAINING)
    outcomes = [PlanOutcome(PlanStatus.OK, 100_000_000, None, None, ""),
                PlanOutcome(PlanStatus.OK, 110_000_000, None, None, ""),
                PlanOutcome(PlanStatus.REFUSED, None, None, None, "tensor_parallel: no"),
                PlanOutcome(PlanStatus.NO_FIT, None, 9, False, "weights ...")]
    rows = plan_rows(plans, outcomes, ranks=8, samples_per_step=64)
    assert [r.gpus for r in rows] == [8, 16, 16, 32]
    assert rows[0].throughput_per_s == pytest.approx(640.0) and rows[1].throughput_per_s == pytest.approx(2 * 64 / 0.11)
    assert [r.pareto for r in rows] == [True, True, False, False]
    assert rows[2].status == "refused" and rows[2].reason == "tensor_parallel: no" and rows[2].step_ns is None
    assert rows[3].status == "does not fit" and rows[3].fits is False


def test_refused_and_oversized_plans_are_rows_with_their_reason(training_analysis):
    grid = PlanGrid(tp=(1, 2), pp=(1, 8), sp=(1, 2), device=("RTX_2080_TI",))
    doc = sweep_plans(training_analysis, grid, Execution(jobs=1))
    assert len(doc.plans) == grid.size() == 8 and doc.mode == "training"
    tp1 = _row(doc, "tp1·pp1·sp1·dp1 on RTX_2080_TI")
    assert tp1.status == "does not fit" and tp1.fits is False and "of the device (over by" in tp1.reason
    assert tp1.memory_per_gpu_bytes and tp1.memory_per_gpu_bytes > 11e9 and tp1.step_ns is None
    tp2 = _row(doc, "tp2·pp1·sp1·dp1 on RTX_2080_TI")
    assert tp2.status == "ok" and tp2.fits is True and tp2.step_ns and tp2.pareto
    assert tp2.memory_per_gpu_bytes == pytest.approx(tp1.memory_per_gpu_bytes - (tp1.memory_per_gpu_bytes - 1.1e9) / 2,
                                                     rel=0.01)
    sp = _row(doc, "tp2·pp1·sp2·dp1 on RTX_2080_TI")
    assert sp.status == "refused" and sp.reason.startswith("sequence_parallel:") and "backward" in sp.reason
    pp = _row(doc, "tp2·pp8·sp1·dp1 on RTX_2080_TI")
    assert pp.status == "refused" and "8 stages for 6 blocks" in pp.reason
    assert "weights" in doc.memory_model
    # the front is of the plans that ran, and its header names the source whole, on one line
    ran = sum(r.status == "ok" for r in doc.plans)
    assert 0 < ran < len(doc.plans)
    source = "/a/long/folder/" + "x" * 120 + ".json.gz"
    text = io.StringIO()
    render_plans(msgspec.structs.replace(doc, source=source), Console(file=text, width=80), top=10)
    header = text.getvalue().splitlines()[0]
    assert header.startswith(f"{source}: Pareto front of the {ran} plan") and " that ran (training, " in header


def test_a_plan_row_equals_whatif_predict_of_its_scenario_file(training, training_analysis, tmp_path):
    grid = PlanGrid(tp=(1, 2), pp=(2,), dp=(2,), micro_batches=(4,))
    doc = sweep_plans(training_analysis, grid, Execution(jobs=1))
    plans = expand(grid, recorded_device="NVIDIA H100 80GB HBM3", mode=Mode.TRAINING)
    plan = plans[1]
    assert plan.label == "tp2·pp2·mb4·sp1·dp2"
    toml = tmp_path / "plan.toml"
    toml.write_text(plan_toml(plan))
    out = tmp_path / "pred.json"
    assert main(["predict", str(training), "-s", str(toml), "--json", str(out), "-q"]) == 0
    predicted = json.loads(out.read_text())["scenarios"][0]
    assert predicted["name"] == plan.label and predicted["transforms"][0].startswith("tensor_parallel")
    row = _row(doc, plan.label)
    assert row.status == "ok" and row.step_ns == predicted["mean_step_ns"]
    assert row.step_ns != _row(doc, plans[0].label).step_ns            # the plans differ
    assert doc.baseline_step_ns == json.loads(out.read_text())["baseline"]["mean_step_ns"]


def test_local_processes_give_the_same_bytes_as_one_process(training_analysis):
    grid = PlanGrid(tp=(1, 2, 4), pp=(1, 2), dp=(1, 2), micro_batches=(2,))
    one = to_json(sweep_plans(training_analysis, grid, Execution(jobs=1), source="t"))
    assert one == to_json(sweep_plans(training_analysis, grid, Execution(jobs=1), source="t"))
    done: list[tuple[int, int]] = []
    two = to_json(sweep_plans(training_analysis, grid, Execution(jobs=2), source="t",
                              progress=lambda d, t: done.append((d, t))))
    assert two == one
    assert done[-1] == (12, 12) and [d for d, _ in done] == sorted(d for d, _ in done)


def _add(offset: int) -> int:
    return offset


def _work(offset: int, chunk: list[int]) -> list[int]:
    return [offset + x for x in chunk]


def test_chunks_come_back_in_the_items_order():
    assert chunked(list(range(7)), 2) == [[0], [1], [2], [3], [4], [5], [6]]
    assert map_chunks(_add, 100, _work, list(range(50)), Execution(jobs=2)) == [100 + x for x in range(50)]
    assert map_chunks(_add, 0, _work, [], Execution(jobs=2)) == []


def test_cli_writes_the_table_the_document_and_the_figure_and_refuses_to_overwrite(training, tmp_path, capsys):
    table, doc, html = tmp_path / "plans.csv", tmp_path / "plans.json", tmp_path / "pareto.html"
    args = ["sweep", str(training), "--plans", "--tp", "1,2", "--dp", "1,2", "--jobs", "1", "-o", str(table),
            "--json", str(doc), "--html", str(html)]
    assert main(args) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Pareto front of the 4 plans that ran" in text and "4 plans predicted, 0 refused" in text
    lines = table.read_text().splitlines()
    assert lines[0].startswith("plan,tp,pp,micro_batches,sp,ulysses,dp,batch,device,gpus,status,step_ns")
    assert len(lines) == 5
    assert json.loads(doc.read_text())["schema"] == "whatif.plan-sweep/1"
    assert "Pareto front" in html.read_text()
    first = table.read_bytes()
    assert main([*args, "-q"]) == 2 and "exists; --force overwrites it" in capsys.readouterr().err
    assert main([*args, "-q", "-f"]) == 0 and table.read_bytes() == first


def test_ray_asked_for_without_ray_is_one_line(training, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)       # import ray raises ImportError
    assert main(["sweep", str(training), "--plans", "--ray"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"whatif: {INSTALL_HINT}"]
    monkeypatch.setenv("WHATIF_RAY_ADDRESS", "ray://nowhere:10001")
    assert main(["sweep", str(training), "--plans"]) == 2
    assert capsys.readouterr().err.splitlines() == ["whatif: --ray needs Ray: pip install 'whatif[ray]'"]


@pytest.mark.slow
def test_ray_gives_the_same_table_as_local_processes(training_analysis):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed (pip install 'whatif[ray]')")
    import ray

    grid = PlanGrid(tp=(1, 2), pp=(1, 2), dp=(1, 2), micro_batches=(4,))
    local = sweep_plans(training_analysis, grid, Execution(jobs=2), source="t")
    try:
        on_ray = sweep_plans(training_analysis, grid, Execution(jobs=2, ray=RayTarget(), ray_cpus=2), source="t")
    finally:
        ray.shutdown()
    assert not ray.is_initialized()
    assert to_json(on_ray) == to_json(local)
    assert plans_table(on_ray).equals(plans_table(local))


def test_batch_axis_prices_the_bigger_batch_and_counts_its_samples(training, training_analysis, tmp_path):
    """The batch factor is the ``batch`` transform before the parallel ones; the throughput counts
    its samples; a plan of twice the batch equals ``whatif predict`` of its scenario file."""
    grid = PlanGrid(tp=(1, 2), batch_factor=(1, 2), samples_per_step=16)
    assert grid.size() == 4
    doc = sweep_plans(training_analysis, grid, Execution(jobs=1))
    one, two = _row(doc, "tp2·pp1·sp1·dp1"), _row(doc, "tp2·pp1·sp1·dp1·b2")
    assert two.batch == 2.0 and one.batch == 1.0
    assert one.step_ns < two.step_ns < 2 * one.step_ns   # weights read once: less than twice the time
    assert two.throughput_per_s == pytest.approx(2 * 16 / (two.step_ns / 1e9), rel=1e-6)
    assert two.throughput_per_s > one.throughput_per_s
    plan = next(p for p in expand(grid, recorded_device=None, mode=Mode.TRAINING) if p.label == two.plan)
    assert [t["name"] for t in plan.transforms()] == ["batch", "tensor_parallel"]
    toml = tmp_path / "b2.toml"
    toml.write_text(plan_toml(plan))
    out = tmp_path / "pred.json"
    assert main(["predict", str(training), "-s", str(toml), "--json", str(out), "-q"]) == 0
    assert two.step_ns == json.loads(out.read_text())["scenarios"][0]["mean_step_ns"]


def test_batch_axis_memory_comes_from_the_allocator_records(tmp_path):
    """On a trace with GPU allocator records, a plan of one GPU per rank is checked against the
    recorded timeline at its batch (batch's memory model), exactly what ``whatif memory -s`` predicts."""
    from test_batch_memory import one_linear_step

    from whatif.tracer.trace import load_trace
    from whatif.transforms.optimizations.batch_memory import batch_peaks, block_roles

    path = one_linear_step(tmp_path)
    doc = sweep_plans(path, PlanGrid(batch_factor=(1, 2, 8)), Execution(jobs=1))
    trace = load_trace(path)
    peaks = batch_peaks(trace, block_roles(trace))
    assert [(r.memory_source, r.memory_per_gpu_bytes, r.fits) for r in doc.plans] == [
        ("allocator records", peaks.peak_bytes(b), True) for b in (1, 2, 8)]
    one, two, eight = (r.memory_per_gpu_bytes for r in doc.plans)
    assert one == 5752 < two < eight
    assert doc.memory_model.startswith("plans with sp = 1, tp 1 and pp 1: the peak of the recorded allocator")


def test_a_batch_over_the_gpu_is_a_row_that_does_not_fit(shared_traces):
    from whatif.transforms.optimizations.batch_memory import batch_peaks, block_roles

    analysis = analyze(shared_traces / "tracelens/hf_h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    k = batch_peaks(analysis.trace, block_roles(analysis.trace)).largest_factor(80 * 2**30)
    small, large = float(int(k)), float(int(k) + 1)
    doc = sweep_plans(analysis, PlanGrid(batch_factor=(small, large)), Execution(jobs=1))
    fits, over = doc.plans
    assert (fits.status, fits.fits, over.status, over.fits) == ("ok", True, "does not fit", False)
    assert fits.memory_per_gpu_bytes <= 80 * 2**30 < over.memory_per_gpu_bytes
    assert over.reason.startswith(f"the recorded allocator timeline at {large:g}x the batch peaks at ")
    assert over.step_ns is None and not over.pareto


def test_batch_factors_are_checked():
    with pytest.raises(ValueError, match="batch factors must be in"):
        _batches("1,0")
