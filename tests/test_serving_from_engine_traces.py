"""`whatif serve` on third-party engine traces with no serving log: the iterations come from the
engine adapters, the iteration models from the trace alone (skipped without ../shared)."""
from __future__ import annotations

from pathlib import Path

import pytest

from whatif.api import Workload, serve
from whatif.documents import DitServingDocument
from whatif.serving import DitOptions

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "tracelens"
XDIT = SHARED / "xdit_flux1_baseline_mi300x.json.gz"
needs_shared = pytest.mark.skipif(not XDIT.exists(), reason="needs ../shared/traces (third-party traces)")


@needs_shared
def test_a_dit_is_served_from_its_denoising_steps_alone() -> None:
    """One FLUX step (the HIP-graph replay, 35.6 ms) found by the xdit adapter: a request of 28 steps
    served alone takes 28 steps; a scenario that speeds the attention and GEMM kernels serves faster."""
    doc = serve(XDIT, ["scenarios/xdit_aiter_sage_oracle.toml"], Workload(rate=0.01, num_requests=3),
                dit=DitOptions(steps=28))
    assert isinstance(doc, DitServingDocument)
    assert doc.scheduler.tokens == 256 and doc.scheduler.steps == 28
    base, swapped = doc.scenarios
    step_ms = base.service_ms.get("mean") / 28
    assert 33.0 < step_ms < 38.0
    assert any("xdit adapter" in n for n in doc.notes)
    assert swapped.service_ms.get("mean") > base.service_ms.get("mean")   # the oracle: the second trace was slower


VLLM = SHARED / "vllm_decode_full_graph_execution_mi300x.json.gz"
SGLANG = SHARED / "sglang_qwen3_8b_decode_mi300x.json.gz"


@needs_shared
@pytest.mark.parametrize("trace, adapter", [(VLLM, "vllm"), (SGLANG, "sglang")])
def test_an_llm_engine_trace_is_served_from_its_iterations_alone(trace: Path, adapter: str) -> None:
    """The adapter's decode of 32 sequences is the anchor: priced at its own composition it is its
    replayed cycle; more load gives longer TTFT; the output says which adapter found what."""
    from whatif.predictors.serving.iteration_costs import CostIterationModel
    from whatif.serving import fit_serving

    fitted = fit_serving(trace)
    model = fitted.models[0][1]
    assert isinstance(model, CostIterationModel) and model.adapter == adapter
    anchor = model.phases["decode"].anchors[0]
    assert len(anchor.batch.decode_context) == 32
    assert model.raw_time_ns(anchor.batch) == pytest.approx(anchor.cycle_ns)
    work = {"prompt_tokens": (256, 512), "output_tokens": (32, 64), "num_requests": 40}
    light_doc = serve(fitted, workload=Workload(rate=1, **work))
    assert light_doc.scheduler.engine_profile == adapter     # the adapter's engine sizes the replica
    light = light_doc.scenarios[0]
    heavy = serve(fitted, workload=Workload(rate=50, **work)).scenarios[0]
    assert heavy.ttft_ms.get("mean") > light.ttft_ms.get("mean")  # queueing (SGLang: prefills first, TPOT may fall)
    assert light.iteration_model.adapter == adapter and light.iteration_model.kind == "operator costs"
    assert heavy.extrapolated_iterations > 0 and "seqs" in heavy.extrapolated_drivers


@needs_shared
def test_an_iteration_the_gpu_works_little_of_is_noted() -> None:
    """SGLang's recorded decode holds a 463 ms blocking copy beside 9.8 ms of GPU work: the model
    notes that every predicted iteration keeps that time; vLLM's HIP-graph decode gets no note."""
    from whatif.serving import fit_serving

    notes = {name: [n for n in fit_serving(trace).models[0][1].notes if "the GPU works" in n]
             for name, trace in (("sglang", SGLANG), ("vllm", VLLM))}
    assert len(notes["sglang"]) == 1 and "(2%)" in notes["sglang"][0] and "TPOT inherit it" in notes["sglang"][0]
    assert notes["vllm"] == []


@needs_shared
def test_an_unknown_engine_is_one_line(capsys) -> None:
    from whatif.cli import main

    assert main(["serve", str(VLLM), "--rate", "1", "--engine", "trt"]) == 2
    errors = [x for x in capsys.readouterr().err.strip().splitlines() if not x.startswith("whatif: warning:")]
    assert len(errors) == 1 and "unknown serving engine 'trt'" in errors[0] and "vllm" in errors[0]


@pytest.mark.slow
def test_the_multi_process_example_is_served_from_its_trace_alone(tmp_path: Path) -> None:
    """examples/engine_split.py (a front-end and an EngineCore_0 child, vLLM V1's split) recorded by
    `whatif record`: the engine core's file holds vLLM's detailed annotation, so the vllm adapter
    finds every iteration and `whatif serve` runs with no serving log."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "whatif.cli", "record", "--no-summary", "-o", str(run), "--",
                    str(root / "examples" / "engine_split.py"), "--num-requests", "5", "--output-len", "6"],
                   check=True, capture_output=True, cwd=tmp_path, timeout=300)
    doc = serve(run, workload=Workload(rate=5, num_requests=8))
    model = doc.scenarios[0].iteration_model
    assert model.adapter == "vllm" and doc.log == ""
    assert model.iterations_found == 6       # one prefill of the 5 prompts, then 5 decodes of 6 tokens
    assert doc.scheduler.engine_profile == "vllm"
