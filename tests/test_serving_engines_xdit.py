"""The xDiT / diffusers adapter (predictors/serving/engines/xdit.py), the per-step work it feeds the
DiT step model (predictors/serving/dit_steps.py), and the xDiT what-if (bench/serving_xdit.py).

Expected values for the shared FLUX.1 traces were read by hand from the raw JSON (gzip + json):
each is a torch.compile capture pass of ONE denoising step, `xfuser/.../transformer_flux.py: forward`
once per trace inside `diffusers/pipelines/flux/pipeline_flux.py: __call__`; the step records a
HIP graph (hipStreamBeginCapture .. EndCapture, kernels launched while capturing do not run) and
replays it once with a single hipGraphLaunch, whose kernels are the step's GPU work.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from _cost_data import REPO, TRACES, bench_module, need

from whatif.analysis import analyze
from whatif.core.kernels import KernelClass, classify_kernel
from whatif.depgraph.build import build_graph
from whatif.depgraph.graph import TaskKind
from whatif.predictors.replay import replay
from whatif.predictors.serving import fit_dit_model
from whatif.predictors.serving.dit_steps import dit_fit_inputs, measured_spans, replayed_spans, span_ns
from whatif.predictors.serving.engines import (
    CompositionSource,
    DitBatch,
    FoundIteration,
    FoundIterations,
    IterationPhase,
    find_iterations,
    iteration_of_tasks,
)
from whatif.predictors.serving.engines.xdit import XditAdapter, steps_per_request
from whatif.predictors.serving.logs import LLMBatch, ServingLogError
from whatif.tracer.trace import load_trace

BASELINE = TRACES / "tracelens" / "xdit_flux1_baseline_mi300x.json.gz"
AFTER = TRACES / "tracelens" / "xdit_flux1_aiter_sage_mi300x.json.gz"

# By hand, per trace: the hipGraphLaunch's correlation, how many kernels carry it, the first of
# them to start and the last to end (µs, the file's relative ts), and the launch call's start.
HAND = {
    # baseline: 993 graph kernels (503 hipBLASLt Cijk GEMMs, 57 aiter::fmha_fwd_hd128_bf16_rtz,
    # 433 Triton), hipGraphLaunch at 3520313507192.243, last kernel ends 3520313542792.920.
    BASELINE: dict(correlation=8562, kernels=993, launch_us=3520313507192.243, end_us=3520313542792.920),
    # AITER + Sage: 1566 graph kernels (503 Cijk GEMMs, 57 sage_fwd, 57 sage_quant_kernel, 949 Triton).
    AFTER: dict(correlation=10977, kernels=1566, launch_us=4026146215457.493, end_us=4026146258790.665),
}
# Both: aiter::fmha_v3_fwd / sage_fwd_1 take Q [1, 768, 24, 128] (BSHD) / [1, 24, 768, 128] (BHSD):
# model batch 1 (FLUX.1-dev runs guidance as an input, not a CFG batch) and a joint sequence of
# 768; the patch embedding is aten::mm [256, 64] x [64, 3072] and the final projection
# aten::addmm [256, 3072] x [3072, 64]: 256 latent tokens (256x256 px: /8 VAE, 2x2 patches);
# 768 - 256 = 512 T5 tokens (the input copy holds [1, 512, 4096] T5 embeddings).
FLUX_STEP = DitBatch(model_batch=1, tokens=256, text_tokens=512)


@pytest.fixture(scope="module", params=[BASELINE, AFTER], ids=["baseline", "aiter_sage"])
def flux(request):
    path = need(request.param)
    a = analyze(path)
    return path, a, find_iterations(a.graph)


def test_flux_traces_hold_one_denoising_step_with_its_composition(flux):
    _, _, found = flux
    assert found.adapter == "xdit" and found.kind == "dit"
    assert [it.dit for it in found.iterations] == [FLUX_STEP]
    assert any("steps per call: 1" in n for n in found.notes)
    assert any("recorded a CUDA/HIP graph" in n for n in found.notes)


def test_a_capture_step_window_is_its_graph_replay(flux):
    path, _, found = flux
    hand = HAND[path]
    base_ns = json.loads(gzip.open(path).read())["baseTimeNanoseconds"]
    (it,) = found.iterations
    assert it.start_ns == pytest.approx(base_ns + hand["launch_us"] * 1e3, abs=2)
    assert it.end_ns == pytest.approx(base_ns + hand["end_us"] * 1e3, abs=2)
    assert "capture pass" in it.evidence


def test_each_step_window_holds_exactly_its_graph_kernels(flux):
    path, a, found = flux
    t = a.graph.tasks
    index = iteration_of_tasks(a.graph, found)
    kernels = np.flatnonzero((index == 0) & (t["kind"].to_numpy() == int(TaskKind.KERNEL)))
    assert len(kernels) == HAND[path]["kernels"]
    corr = a.trace.events["correlation"].to_numpy()[t["event"].to_numpy()[kernels]]
    assert set(corr.tolist()) == {HAND[path]["correlation"]}
    (it,) = found.iterations
    start = t["measured_start_ns"].to_numpy()[kernels]
    assert start.min() >= it.start_ns and (start + t["dur_ns"].to_numpy()[kernels]).max() <= it.end_ns + 2


def test_per_step_time_measured_and_replayed(flux):
    path, a, found = flux
    measured = span_ns(measured_spans(a.graph, found))
    replayed = span_ns(replayed_spans(a.replay, found))
    hand = HAND[path]
    assert measured[0] == pytest.approx((hand["end_us"] - hand["launch_us"]) * 1e3, abs=5)
    assert replayed[0] == pytest.approx(measured[0], rel=0.01)


def test_dit_fit_inputs_fit_a_step_model_from_the_trace_alone(flux):
    _, a, found = flux
    x = dit_fit_inputs(a.replay, found)
    assert x.compositions == [(1, 256)]
    assert x.work.attn_ns[0] > 0 and x.work.rest_ns[0] > 10 * x.work.attn_ns[0]
    assert 0 < x.work.cpu_ns[0] < 0.05 * x.iters["cycle_ns"].iloc[0]   # a graph replay: GPU-bound
    model = fit_dit_model(x.iters, x.compositions, x.work)
    assert model.step_ns(1, 256) == pytest.approx(float(x.iters["cycle_ns"].iloc[0]), rel=1e-6)
    assert model.step_ns(2, 256) > 1.9 * model.step_ns(1, 256)


def test_serve_on_one_denoising_step_says_why_it_has_no_loo_error(capsys, tmp_path):
    """One recorded step leaves nothing to leave out: the model line says so instead of ``LOO nan%``,
    and the JSON document says null there and reads back."""
    from whatif.cli import main
    from whatif.documents import ServingDocument, from_json
    doc = tmp_path / "serve.json"
    assert main(["serve", str(need(BASELINE)), "--rate", "2", "--num-requests", "3", "--json", str(doc)]) == 0
    out = capsys.readouterr().out
    assert "(n=1, MAPE 0.0%, LOO n/a (one denoising step))" in out and "nan" not in out
    back = from_json(doc.read_bytes(), ServingDocument)
    assert back.scenarios[0].iteration_model.loo_mape is None


def test_sage_attention_kernels_are_attention():
    assert classify_kernel("sage_quant_kernel") is KernelClass.ATTENTION
    assert classify_kernel("sage_fwd") is KernelClass.ATTENTION


def test_oracle_ratios_from_the_two_kernel_tables():
    need(BASELINE), need(AFTER)
    bench = bench_module("serving_xdit")
    before, after = bench.load_steps(BASELINE), bench.load_steps(AFTER)
    ratios = bench.speed_ratios(before, after, bench.SWAPPED)
    # Not faster: by hand, attention 2,422 µs (57 aiter::fmha_fwd) -> 3,498 µs (57 sage_fwd 2,470 +
    # 57 sage_quant_kernel 1,028); GEMMs 28,106 -> 29,784 µs, the same 503 hipBLASLt kernels.
    assert ratios[KernelClass.ATTENTION] == pytest.approx(3498 / 2422, rel=0.01)
    assert ratios[KernelClass.GEMM] == pytest.approx(29784 / 28106, rel=0.01)
    oracle = bench.predicted_step_ns(before, bench.scale_scenario("oracle", ratios))
    assert before.replayed_ns < oracle < after.measured_ns
    assert abs(oracle / after.measured_ns - 1) < 0.15   # the goal, met by variant (a)


def test_oracle_scenario_file_matches_the_bench():
    need(BASELINE), need(AFTER)
    bench = bench_module("serving_xdit")
    before, after = bench.load_steps(BASELINE), bench.load_steps(AFTER)
    text = bench.scenario_toml("AITER + SageAttention, kernel-speed oracle",
                               bench.speed_ratios(before, after, bench.SWAPPED))
    assert (REPO / "scenarios" / "xdit_aiter_sage_oracle.toml").read_text() == text


# ---- synthetic traces: the eager diffusers path, nesting, a UNet, no shapes ----

def _x(cat: str, name: str, ts: float, dur: float, tid: int = 1, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _eager_step(ts: float, corr: int, shapes: bool = True) -> list[dict]:
    dims = {"Input Dims": None}
    ev = [_x("python_function", "diffusers/models/transformers/transformer_flux.py(400): forward", ts, 300),
          _x("python_function", "diffusers/models/transformers/transformer_flux.py(80): forward", ts + 10, 50)]
    for i, (name, d) in enumerate([("aten::linear", [[2, 256, 64], [3072, 64], [3072]]),
                                   ("aten::_scaled_dot_product_flash_attention",
                                    [[2, 24, 768, 128], [2, 24, 768, 128], [2, 24, 768, 128]]),
                                   ("aten::linear", [[2, 256, 3072], [64, 3072], [64]])]):
        dims["Input Dims"] = d
        ev.append(_x("cpu_op", name, ts + 20 + 60 * i, 40, **(dict(dims) if shapes else {})))
    ev.append(_x("cuda_runtime", "cudaLaunchKernel", ts + 250, 5, correlation=corr))
    ev.append({"ph": "X", "cat": "kernel", "name": "ampere_bf16_s16816gemm", "pid": 0, "tid": 7, "ts": ts + 260,
               "dur": 100, "args": {"correlation": corr, "device": 0, "stream": 7}})
    return ev


def _write(tmp_path: Path, events: list[dict]) -> Path:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events, "deviceProperties": [{"id": 0, "name": "NVIDIA H100"}]}))
    return path


def _found(path: Path):
    return XditAdapter().find(build_graph(load_trace(path)))


def test_eager_diffusers_steps_nested_forwards_and_a_step_without_shapes(tmp_path):
    events = [_x("python_function", "diffusers/pipelines/flux/pipeline_flux.py(652): __call__", 0, 2000),
              _x("python_function", "transformers/models/t5/modeling_t5.py(55): forward", 20, 50),
              *_eager_step(100, 1), *_eager_step(600, 2, shapes=False)]
    found = _found(_write(tmp_path, events))
    assert found is not None and len(found.iterations) == 2
    # CFG batch 2 (SDPA BHSD [2, 24, 768, 128]); [2, 256, 64] rows 512 / 2 = 256 latent tokens
    assert [it.dit for it in found.iterations] == [DitBatch(2, 256, 512)] * 2
    assert [(it.start_ns, it.end_ns) for it in found.iterations] == [(100_000, 400_000), (600_000, 900_000)]
    assert any("step 1: no shapes recorded" in n for n in found.notes)
    assert any("steps per call: 2" in n for n in found.notes)
    assert steps_per_request(load_trace(tmp_path / "trace.json")) == [2]


def test_a_step_with_no_shapes_and_none_before_is_one_line_error(tmp_path):
    with pytest.raises(ServingLogError, match="records no shapes"):
        _found(_write(tmp_path, _eager_step(100, 1, shapes=False)))


def test_a_unet_pipeline_and_a_non_dit_trace_give_none(tmp_path):
    unet = [_x("python_function", "diffusers/models/unets/unet_2d_condition.py(1000): forward", 100, 800),
            *_eager_step(200, 1)]
    assert _found(_write(tmp_path, unet)) is None
    llm = REPO / "sample_traces" / "llm_serve"
    assert XditAdapter().find(build_graph(load_trace(llm))) is None


def test_fit_inputs_refuse_llm_iterations_and_steps_without_tasks(tmp_path):
    graph = build_graph(load_trace(_write(tmp_path, _eager_step(100, 1))))
    rp = replay(graph)
    llm = FoundIterations("x", (FoundIteration(0, 100_000, 400_000, IterationPhase.DECODE, "e",
                                               llm=LLMBatch(decode_context=(5,))),), CompositionSource.SHAPES)
    with pytest.raises(ServingLogError, match="not denoising steps"):
        dit_fit_inputs(rp, llm)
    far = FoundIterations("x", (FoundIteration(0, 10**12, 10**12 + 5, IterationPhase.DENOISE, "e",
                                               dit=DitBatch(1, 256)),), CompositionSource.SHAPES)
    with pytest.raises(ServingLogError, match="holds no task"):
        dit_fit_inputs(rp, far)
