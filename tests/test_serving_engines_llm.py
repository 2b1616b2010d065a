"""LLM serving-engine adapters (predictors/serving/engines: vllm, sglang, examples, generic): the
iterations and compositions each finds, pinned on the shared vLLM and SGLang traces (expected
values read off the traces by hand), on this project's example recording (equal to the serving
log path) and on hand-made traces for the spellings no shared trace has."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tracegen import KinetoTrace

from whatif.depgraph.build import build_graph
from whatif.depgraph.graph import TaskGraph, TaskKind
from whatif.predictors.serving import logs
from whatif.predictors.serving.engines import (
    CompositionSource,
    IterationPhase,
    ServingLogError,
    find_iterations,
    iteration_of_tasks,
)
from whatif.predictors.serving.engines.examples import ExamplesAdapter
from whatif.predictors.serving.engines.generic import GenericAdapter
from whatif.predictors.serving.engines.sglang import SglangAdapter
from whatif.predictors.serving.engines.vllm import VllmAdapter
from whatif.tracer.trace import load_trace

ROOT = Path(__file__).resolve().parents[1]
LLM_SERVE = ROOT / "sample_traces" / "llm_serve"
VLLM = "tracelens/vllm_decode_full_graph_execution_mi300x.json.gz"
SGLANG = "tracelens/sglang_qwen3_8b_decode_mi300x.json.gz"
QWEN_HF = "tracelens/hf_h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
B200 = "tracelens/b200_eager_rank0of8.json.gz"


def graph_of(path: Path) -> TaskGraph:
    return build_graph(load_trace(path))


def kernels_in(graph: TaskGraph, found, index: int) -> tuple[int, int]:
    """(kernels of ``graph``, those :func:`iteration_of_tasks` puts in iteration ``index``)."""
    kernel = graph.tasks["kind"].to_numpy() == int(TaskKind.KERNEL)
    return int(kernel.sum()), int((iteration_of_tasks(graph, found)[kernel] == index).sum())


def test_vllm_full_graph_decode_is_one_iteration_of_32_sequences(shared_traces: Path) -> None:
    graph = graph_of(shared_traces / VLLM)
    found = find_iterations(graph)
    assert found.adapter == "vllm" and found.source is CompositionSource.ANNOTATION
    (it,) = found.iterations
    # the one user_annotation: execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk55086sqsq32sqsk55086),
    # ts 6520618853487.683 us after baseTimeNanoseconds 1767189312000000000, dur 2408.598 us
    assert (it.start_ns, it.end_ns - it.start_ns) == (1773709930853487683, 2408598)
    assert it.phase is IterationPhase.DECODE and it.llm is not None
    # 32 decode requests attending to 55086 keys in all (sk): 55086 = 32 x 1721 + 14, equal shares
    assert it.llm.decode_context == (1722,) * 14 + (1721,) * 18 and not it.llm.prefill_tokens
    assert any("equal shares" in n for n in found.notes)
    # the hipGraphLaunch replays 421 kernels (no launch flow of their own) at 8.4-18.8 ms, after the
    # annotation closed at 2.4 ms; with the 4 launched kernels all 425 belong to the iteration
    assert kernels_in(graph, found, 0) == (425, 425)


def test_sglang_decode_reads_the_execute_range_around_its_step(shared_traces: Path) -> None:
    graph = graph_of(shared_traces / SGLANG)
    assert VllmAdapter().find(graph) is not None          # vLLM's spelling is there too ...
    found = find_iterations(graph)
    assert found.adapter == "sglang"                       # ... but SGLang's step[...] claims it first
    (it,) = found.iterations
    ev = graph.trace.events
    execute = ev[ev["name"].astype(str).str.startswith("execute_")].iloc[0]
    # step[DECODE bs=32] (465248.054 us) lies in execute_32_..._generation_32(sq32sk32785...) (465716.634 us)
    assert (it.start_ns, it.end_ns - it.start_ns) == (int(execute["ts_ns"]), 465716634)
    assert it.evidence.startswith("step[DECODE bs=32] in execute_32_context_0")
    # 32785 = 32 x 1024 + 17
    assert it.phase is IterationPhase.DECODE and it.llm is not None
    assert it.llm.decode_context == (1025,) * 17 + (1024,) * 15
    # 544 graph-replayed kernels and 11 launched ones, the last one ending at 473.8 ms
    assert kernels_in(graph, found, 0) == (555, 555)


def test_vllm_eager_prefill_with_the_native_annotation(shared_traces: Path) -> None:
    graph = graph_of(shared_traces / B200)
    found = find_iterations(graph)
    (it,) = found.iterations
    # execute_context_1(888_788544)_generation_0(0), 87412.863 us: one prompt of 888 tokens (888² = 788544;
    # the ops take 888 rows: aten::linear [[888, 2880], ...], vllm::unified_attention_with_output [[888, 8, 64], ...])
    assert found.adapter == "vllm" and it.phase is IterationPhase.PREFILL and it.end_ns - it.start_ns == 87412863
    assert it.llm == logs.LLMBatch(prefill_tokens=(888,), prefill_cached=(0,))
    assert any("native annotation" in n for n in found.notes)
    assert kernels_in(graph, found, 0) == (694, 694)     # and the 74 NCCL kernels are COMM tasks


def test_a_trace_of_no_engine_is_left_to_the_next_adapter(shared_traces: Path) -> None:
    vllm = graph_of(shared_traces / VLLM)
    assert SglangAdapter().find(vllm) is None and ExamplesAdapter().find(vllm) is None
    # HF inference: one forward pass (ProfilerStep#6) with SDPA shapes: not a serving loop
    hf = graph_of(shared_traces / QWEN_HF)
    assert [cls().find(hf) for cls in (SglangAdapter, VllmAdapter, ExamplesAdapter, GenericAdapter)] == [None] * 4
    with pytest.raises(ServingLogError, match=r"no serving-engine adapter finds iterations in .*Qwen.*tried: sglang"):
        find_iterations(hf)


def test_examples_adapter_gives_the_log_compositions_in_order() -> None:
    graph = graph_of(LLM_SERVE)
    found = find_iterations(graph)
    assert found.adapter == "examples" and found.source is CompositionSource.LOG
    expected = logs.llm_compositions(logs.read_log(LLM_SERVE / "serving.log"))
    assert [(it.phase.value, it.llm) for it in found.iterations] == expected
    steps = graph.steps.set_index("step")
    assert [(it.start_ns, it.end_ns) for it in found.iterations[:3]] == [
        (int(steps.loc[s, "measured_begin_ns"]), int(steps.loc[s, "measured_end_ns"])) for s in (0, 1, 2)]


def test_examples_adapter_reads_the_dit_log() -> None:
    run = ROOT / "sample_traces" / "dit_serve"
    found = find_iterations(graph_of(run))
    expected = logs.dit_compositions(logs.read_log(logs.find_log(run)))
    assert found.adapter == "examples" and found.kind == "dit" and len(expected) == 6
    assert [(it.dit.model_batch, it.dit.tokens) for it in found.iterations if it.dit] == expected


def test_examples_adapter_passes_over_a_log_that_is_no_serving_log() -> None:
    """A decode benchmark (bench/gpu_harvest) marked with whatif.phase("decode"), recorded with shapes,
    whose --log is its own program log: compositions from shapes, saying why the log was not used."""
    found = find_iterations(graph_of(ROOT / "sample_traces" / "gpu" / "pairs" / "p2_cuda_graph-before-r1"))
    assert found.adapter == "examples" and found.source is CompositionSource.SHAPES
    assert "program.log: not a serving log" in found.notes[0]
    assert {it.llm for it in found.iterations} == {logs.LLMBatch(decode_context=(512,) * 8)}
    assert len(found.iterations) == 60


def test_examples_adapter_refuses_a_log_of_another_recording(tmp_path: Path) -> None:
    short = tmp_path / "short.log"
    doc = json.loads((LLM_SERVE / "serving.log").read_text())
    doc["iterations"] = doc["iterations"][:-1]
    short.write_text(json.dumps(doc))
    with pytest.raises(ServingLogError, match=r"disagree: 160 phase steps on rank 0 vs 159 logged") as err:
        ExamplesAdapter(log=short).find(graph_of(LLM_SERVE))
    assert "\n" not in str(err.value) and "rank0" in str(err.value)


@pytest.mark.slow
def test_examples_adapter_reads_recorded_shapes_without_a_log(tmp_path: Path) -> None:
    """A --record-shapes recording whose log is moved away: compositions from shapes agree with
    the log on phases, prompt tokens, sequences and the padded decode context."""
    run, elsewhere = tmp_path / "run", tmp_path / "logs"
    done = subprocess.run([sys.executable, "-m", "whatif.cli", "record", "-o", str(run), "--record-shapes",
                           "--no-summary", str(ROOT / "examples" / "llm_serve.py"), "--", "--device", "cpu",
                           "--seed", "0", "--num-requests", "4", "--rate", "40", "--output-max", "36",
                           "--log", str(elsewhere / "serving.log")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    shutil.move(elsewhere / "serving.log", tmp_path / "moved.log")
    found = find_iterations(graph_of(run))
    assert found.adapter == "examples" and found.source is CompositionSource.SHAPES
    expected = logs.llm_compositions(logs.read_log(tmp_path / "moved.log"))
    assert len(found.iterations) == len(expected)
    for it, (phase, batch) in zip(found.iterations, expected):
        assert it.phase.value == phase and it.llm is not None
        assert sum(it.llm.prefill_tokens) == sum(batch.prefill_tokens)
        assert len(it.llm.prefill_tokens) == len(batch.prefill_tokens)
        assert it.llm.decode_context == (max(batch.decode_context),) * len(batch.decode_context) \
            if batch.decode_context else not it.llm.decode_context


def vllm_trace(path: Path, names: list[str], frame: str = "vllm/v1/worker/gpu_model_runner.py(3380): execute_model") \
        -> Path:
    tr = KinetoTrace()
    for i, name in enumerate(names):
        tr.annotation(name, 1000 * i, 900)
        tr.python(frame, 1000 * i + 10, 800)
    return tr.write(path)


def test_vllm_detailed_mixed_iteration_and_an_idle_one(tmp_path: Path) -> None:
    names = [  # TraceLens's example: 2 prefills (4096 + 2048 tokens, 1000 cached) and 3 decodes
        "execute_6147_context_2(sq6144sk7144sqsq20971520sqsk23019520)_generation_3(sq3sk6144sqsq3sqsk6144)",
        "execute_0_context_0(sq0sk0sqsq0sqsk0)_generation_0(sq0sk0sqsq0sqsk0)",
        "execute_3_context_0(sq0sk0sqsq0sqsk0)_generation_3(sq3sk6147sqsq3sqsk6147)",
    ]
    found = find_iterations(graph_of(vllm_trace(tmp_path / "v.json.gz", names)))
    mixed, decode = found.iterations
    assert mixed.phase is IterationPhase.MIXED and mixed.llm is not None and decode.llm is not None
    assert mixed.llm.prefill_tokens == (4096, 2048) and mixed.llm.prefill_cached == (0, 1000)
    assert mixed.llm.decode_context == (2048, 2048, 2048)
    assert decode.phase is IterationPhase.DECODE and decode.llm.decode_context == (2049, 2049, 2049)
    assert any("1 idle iteration" in n for n in found.notes)


def test_vllm_native_annotation_says_what_it_lacks(tmp_path: Path) -> None:
    found = find_iterations(graph_of(vllm_trace(tmp_path / "v.json.gz", [
        "execute_context_2(100)_generation_0(0)", "execute_context_0(0)_generation_2(2)"])))
    prefill, decode = found.iterations
    assert prefill.llm is not None and prefill.llm.prefill_tokens == (50, 50)
    assert decode.llm is not None and decode.llm.decode_context == (1, 1)
    assert any("detailed_trace_annotation" in n for n in found.notes)


@pytest.mark.parametrize("name, problem", [
    ("execute_32_context_0(sq0sk0)_generation_32(sq32sk100sqsq32sqsk100)", "not execute_N_context_R"),
    ("execute_40_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk100sqsq32sqsk100)", "40 scheduled tokens"),
    ("execute_3_context_0(sq0sk0sqsq0sqsk0)_generation_4(sq3sk100sqsq3sqsk100)", "3 tokens for 4 requests"),
])
def test_malformed_vllm_annotation_is_one_line_naming_the_trace(tmp_path: Path, name: str, problem: str) -> None:
    path = vllm_trace(tmp_path / "bad.json.gz", [name])
    with pytest.raises(ServingLogError) as err:
        find_iterations(graph_of(path))
    assert str(err.value).startswith(str(path)) and problem in str(err.value) and "\n" not in str(err.value)


def sdpa(tr: KinetoTrace, ts: float, batch: int, queries: int, keys: int) -> None:
    tr.op("aten::scaled_dot_product_attention", ts, 5, args={
        "Input Dims": [[batch, 8, queries, 64], [batch, 8, keys, 64], [batch, 8, keys, 64], [], [], [], [], []],
        "Input type": ["float", "float", "float", "", "Scalar", "Scalar", "", "Scalar"]})


def test_vllm_without_annotations_reads_attention_shapes(tmp_path: Path) -> None:
    tr = KinetoTrace()
    for i, (b, q, k) in enumerate([(1, 12, 12), (1, 1, 13), (1, 1, 14)]):
        tr.python("vllm/worker/model_runner.py(1560): execute_model", 100 * i, 90)
        sdpa(tr, 100 * i + 10, b, q, k)
    found = find_iterations(graph_of(tr.write(tmp_path / "v0.json.gz")))
    assert found.adapter == "vllm" and found.source is CompositionSource.SHAPES
    assert [it.llm for it in found.iterations] == [logs.LLMBatch((12,), (0,)), logs.LLMBatch(decode_context=(13,)),
                                                   logs.LLMBatch(decode_context=(14,))]
    bare = KinetoTrace()
    bare.python("vllm/worker/model_runner.py(1560): execute_model", 0, 90)
    with pytest.raises(ServingLogError, match="without iteration annotations or attention shapes"):
        find_iterations(graph_of(bare.write(tmp_path / "bare.json.gz")))


def test_only_idle_iterations_is_an_error_and_sglang_frames_claim_execute_ranges(tmp_path: Path) -> None:
    idle = "execute_0_context_0(sq0sk0sqsq0sqsk0)_generation_0(sq0sk0sqsq0sqsk0)"
    with pytest.raises(ServingLogError, match="every vLLM iteration annotation is idle"):
        find_iterations(graph_of(vllm_trace(tmp_path / "idle.json.gz", [idle])))
    busy = "execute_1_context_0(sq0sk0sqsq0sqsk0)_generation_1(sq1sk9sqsq1sqsk9)"
    frame = "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py(1100): run_batch"
    found = find_iterations(graph_of(vllm_trace(tmp_path / "sgl.json.gz", [busy], frame)))
    assert found.adapter == "sglang" and found.iterations[0].llm == logs.LLMBatch(decode_context=(9,))


def test_sglang_native_steps(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.annotation("step[EXTEND bs=2 toks=100]", 0, 90)
    tr.annotation("step[DECODE bs=2]", 100, 90)
    tr.annotation("step[MIXED bs=3 c=1 g=2 c_sq=5 c_sk=8 c_sqsq=25 c_sqsk=40 g_sq=2 g_sk=24 g_sqsq=2 g_sqsk=24]",
                  200, 90)
    found = find_iterations(graph_of(tr.write(tmp_path / "s.json.gz")))
    assert found.adapter == "sglang"
    assert [it.llm for it in found.iterations] == [
        logs.LLMBatch((50, 50), (0, 0)), logs.LLMBatch(decode_context=(1, 1)),
        logs.LLMBatch((5,), (3,), (12, 12))]
    bad = KinetoTrace()
    bad.annotation("step[MIXED bs=2]", 0, 90)
    with pytest.raises(ServingLogError, match=r"malformed SGLang .*MIXED step without"):
        find_iterations(graph_of(bad.write(tmp_path / "bad.json.gz")))


def test_generic_finds_repeated_steps_with_attention_shapes(tmp_path: Path) -> None:
    tr = KinetoTrace()
    for i, (b, q, k) in enumerate([(1, 12, 12), (2, 1, 13), (2, 1, 14)]):
        tr.step(i, 100 * i, 90)
        sdpa(tr, 100 * i + 10, b, q, k)
    found = find_iterations(graph_of(tr.write(tmp_path / "g.json.gz")))
    assert found.adapter == "generic" and found.source is CompositionSource.SHAPES
    assert [it.phase for it in found.iterations] == [IterationPhase.PREFILL] + [IterationPhase.DECODE] * 2
    assert found.iterations[2].llm == logs.LLMBatch(decode_context=(14, 14))
    assert found.notes[0].startswith("guessed")


def test_generic_leaves_training_steps_alone(tmp_path: Path) -> None:
    tr = KinetoTrace()
    for i in range(3):
        tr.step(i, 100 * i, 90)
        sdpa(tr, 100 * i + 10, 4, 128, 128)
        tr.op("autograd::engine::evaluate_function: ScaledDotProductFlashAttentionBackward0", 100 * i + 50, 20)
    assert GenericAdapter().find(graph_of(tr.write(tmp_path / "train.json.gz"))) is None


def test_generic_falls_back_to_the_repeated_outermost_module(tmp_path: Path) -> None:
    tr = KinetoTrace()
    for i in range(3):
        tr.python("nn.Module: LlamaForCausalLM_0", 100 * i, 90)
        tr.python("nn.Module: LlamaAttention_0", 100 * i + 5, 20)
        sdpa(tr, 100 * i + 10, 4, 1, 20 + i)
    tr.python("nn.Module: Sampler_0", 400, 10)
    found = GenericAdapter().find(graph_of(tr.write(tmp_path / "m.json.gz")))
    assert found is not None and len(found.iterations) == 3
    assert "calls of nn.Module: LlamaForCausalLM" in found.notes[0]
    assert [it.llm.decode_context for it in found.iterations if it.llm] == [(20,) * 4, (21,) * 4, (22,) * 4]
    one = KinetoTrace()
    one.python("nn.Module: LlamaForCausalLM_0", 0, 90)
    sdpa(one, 10, 4, 1, 20)
    assert GenericAdapter().find(graph_of(one.write(tmp_path / "one.json.gz"))) is None


def test_iteration_windows_hold_every_phase_task_of_the_example() -> None:
    graph = graph_of(LLM_SERVE)
    found = find_iterations(graph)
    index = iteration_of_tasks(graph, found)
    t = graph.tasks
    marked = t["phase"].notna().to_numpy()
    assert (index[marked] >= 0).all()
    steps = t["step"].to_numpy()
    first_of_step = {int(s): i for i, s in enumerate(sorted(set(steps[marked])))}
    assert np.array_equal(index[marked], [first_of_step[int(s)] for s in steps[marked]])


def test_iterations_of_every_rank_on_its_own_clock(tmp_path: Path) -> None:
    """Two tensor-parallel ranks, rank 1's clock 1000 us ahead: the build aligns the graph on the
    all-reduces, the iterations stay on each rank's trace clock, and every kernel lands in its own."""
    run = tmp_path / "tp2"
    run.mkdir()
    name = "execute_2_context_0(sq0sk0sqsq0sqsk0)_generation_2(sq2sk{k}sqsq2sqsk{k})"
    for rank, skew in ((0, 0), (1, 1000)):
        tr = KinetoTrace(rank=rank, world_size=2)
        for i, t0 in enumerate((0, 300)):
            tr.annotation(name.format(k=40 + 2 * i), skew + t0, 100)
            tr.runtime("cudaLaunchKernel", skew + t0 + 10, 5, corr=10 * i + 1)
            tr.gpu("gemm_kernel", skew + t0 + 20, 50, corr=10 * i + 1)
            tr.runtime("cudaLaunchKernel", skew + t0 + 20, 5, corr=10 * i + 2)
            tr.gpu("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*)", skew + t0 + 70, 60, corr=10 * i + 2,
                   stream=20, **{"Collective name": "allreduce", "Process Group Name": "0"})
        tr.write(run / f"rank{rank}.pt.trace.json.gz")
    graph = graph_of(run)
    assert graph.report["clock_offsets_ns_max_abs"] == 1_000_000
    found = find_iterations(graph)
    assert [(it.rank, it.llm.decode_context) for it in found.iterations if it.llm] == [
        (0, (20, 20)), (0, (21, 21)), (1, (20, 20)), (1, (21, 21))]
    index = iteration_of_tasks(graph, found)
    t = graph.tasks
    gemm = np.flatnonzero(t["name"].astype(str).to_numpy() == "gemm_kernel")
    assert sorted(zip(t["rank"].to_numpy()[gemm].tolist(), index[gemm].tolist())) == [(0, 0), (0, 1), (1, 2), (1, 3)]
