"""A DiT request shape beyond what the step model was fitted on (docs/serving.md, "Out of range"):
the simulator counts the denoising steps run beyond the recorded latent tokens or model batches,
by the LLM models' rule (more than 1.25x beyond, or below 1/1.25), and `whatif serve` prints the
requests' shape next to the recording's and the warning the LLM path prints, worded by the same
function; the JSON carries the counts. The shared xDiT trace is skipped when ../shared is absent."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from whatif.commands.serve import extrapolation_line
from whatif.predictors.serving import DitStepModel, simulate_dit
from whatif.predictors.serving.iteration_costs import RANGE_SLACK


def _model(tokens_ref: int = 64, batches_seen: tuple[int, ...] = (2, 4)) -> DitStepModel:
    """1 ms of GPU work per model-batch element at ``tokens_ref`` tokens, attention half of it."""
    return DitStepModel(tokens_ref=tokens_ref, attn=(0.0, 0.5e6), rest=(0.0, 0.5e6), cpu=(0.0, 0.0),
                        overlap_ns=0.0, batch_overhead_ns=0.0, n=1, mape=0.0, loo_mape=0.0,
                        batches_seen=list(batches_seen))


def test_steps_within_the_fitted_range_are_not_counted() -> None:
    """Tokens up to 1.25x the recorded count and model batches within the ones seen are in range."""
    res = simulate_dit([0.0, 0.0], _model(), 3, int(64 * RANGE_SLACK), 2)   # 2 requests, CFG: model batch 4
    assert res.iterations == {"denoise": 3}
    assert res.extrapolated_iterations == 0 and res.extrapolated_drivers == {} and res.extrapolated_values == {}


def test_steps_beyond_the_fitted_tokens_and_batches_are_counted_per_step() -> None:
    """Requests of 2 steps at 4x the tokens and 3 steps at the recorded tokens, alone (model batch 1
    without CFG, below the smallest seen, 2): every step leaves the range on the model batch, the
    first request's also on the tokens; the values reached are reported."""
    res = simulate_dit([0.0, 10.0], _model(), 2, 64, 1, cfg_guidance=False, shapes=[(2, 256), (3, 64)])
    assert res.iterations == {"denoise": 5}
    assert res.extrapolated_iterations == 5
    assert res.extrapolated_drivers == {"tokens": 2, "model_batch": 5}
    assert res.extrapolated_values == {"tokens": (256.0, 256.0), "model_batch": (1.0, 1.0)}


XDIT = "tracelens/xdit_flux1_baseline_mi300x.json.gz"


def _text(out: str) -> str:
    """The printed output with the console's line wrapping undone."""
    return re.sub(r"\s+", " ", out)


@pytest.fixture(scope="module")
def xdit_serve(shared_traces: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[str, dict]]:
    """`whatif serve` on the FLUX.1 trace (one 16x16 latent, 256 tokens) at a side given as if in
    pixels (2048) and at the recorded side (16): printed text and JSON of each."""
    trace = shared_traces / XDIT
    if not trace.exists():
        pytest.skip(f"{trace} not found")
    return {side: _serve(trace, side, tmp_path_factory.mktemp(f"serve{side}")) for side in (2048, 16)}


def _serve(trace: Path, side: int, tmp: Path) -> tuple[str, dict]:
    import contextlib
    import io

    from whatif.cli import main

    out = tmp / "serve.json"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["serve", str(trace), "--rate", "0.5", "--num-requests", "20", "--steps", "28",
                     "--resolution", str(side), "--json", str(out)]) == 0
    return _text(buf.getvalue()), json.loads(out.read_text())


def test_serve_prints_the_recorded_resolution_next_to_the_requested_one(xdit_serve) -> None:
    text, doc = xdit_serve[2048]
    recorded = doc["recorded"]
    assert recorded["resolution"] ** 2 == recorded["tokens"] and recorded["patch"] == 1   # a square latent
    assert doc["scheduler"]["tokens"] == 2048 ** 2
    assert (f"requests: resolution 2,048 (latent side, patch 1) = {2048 ** 2:,} latent tokens, 28 steps"
            in text)
    assert (f"recorded: resolution {recorded['resolution']} (latent side, patch 1) = {recorded['tokens']:,} "
            "latent tokens" in text)


def test_serve_warns_when_the_requested_tokens_leave_the_fitted_range(xdit_serve) -> None:
    text, doc = xdit_serve[2048]
    base = doc["scenarios"][0]
    steps = 20 * 28
    recorded_tokens = doc["recorded"]["tokens"]
    assert base["iterations"] == {"denoise": steps}
    assert base["extrapolated_iterations"] == steps and base["extrapolated_drivers"] == {"tokens": steps}
    assert base["extrapolated_values"] == {"tokens": {"low": 2048 ** 2, "high": 2048 ** 2}}
    assert base["iteration_model"]["ranges"]["denoise"]["tokens"] == {"low": recorded_tokens, "high": recorded_tokens}
    ratio = 2048 ** 2 // recorded_tokens
    assert (f"warning: baseline: {steps} of {steps} simulated denoising steps left the recorded range: "
            f"tokens {steps} at {2048 ** 2:,}, {ratio:,}x the largest seen (denoise saw tokens "
            f"{recorded_tokens}-{recorded_tokens}" in text)
    assert "treat with care" in text


def test_serve_at_the_recorded_resolution_does_not_warn(xdit_serve) -> None:
    text, doc = xdit_serve[16]
    assert doc["scenarios"][0]["extrapolated_iterations"] == 0
    assert "warning" not in text and "left the recorded range" not in text


def test_the_llm_warning_is_worded_by_the_same_function_and_says_how_far() -> None:
    """The example LLM server at prompts far beyond its recorded 34-64 tokens: the document gives the
    values each driver took beyond the range, and the shared line reports them against what was seen."""
    from whatif.serving import Workload, serve

    doc = serve(Path(__file__).resolve().parents[1] / "sample_traces" / "llm_serve",
                workload=Workload(rate=50, num_requests=10, prompt_tokens=(300, 500)))
    s = doc.scenarios[0]
    assert s.extrapolated_iterations > 0 and set(s.extrapolated_values) == set(s.extrapolated_drivers)
    largest = max(rs["tokens"].high for rs in s.iteration_model.ranges.values())
    assert s.extrapolated_values["tokens"].high >= 300 > largest * RANGE_SLACK
    line = extrapolation_line(s)
    assert line.startswith(f"{s.extrapolated_iterations:,} of {sum(s.iterations.values()):,} simulated iterations "
                           "left the recorded range: ")
    ratio = s.extrapolated_values["tokens"].high / largest
    assert f"{ratio:.2g}x the largest seen" in line or f"{ratio:,.0f}x the largest seen" in line


def test_sweep_points_count_the_steps_beyond_the_range() -> None:
    """The example DiT recording (16x16 latent, patch 2: 64 tokens) swept at 4x the side (16x the
    tokens): every simulated step is beyond the range, and each point counts them (as many as
    `serve` simulates at that rate), as the LLM sweep points do."""
    from whatif.serving import DitOptions, Workload, fit_serving, serve, sweep

    fitted = fit_serving(Path(__file__).resolve().parents[1] / "sample_traces" / "dit_serve")
    work, dit = Workload(num_requests=4), DitOptions(resolution=64)
    doc = sweep(fitted, [1.0, 4.0], workload=work, dit=dit)
    (curve,) = doc.curves
    assert curve.iteration_model.ranges["denoise"]["tokens"].high == curve.iteration_model.tokens_ref
    assert doc.scheduler.tokens > RANGE_SLACK * curve.iteration_model.tokens_ref
    for p in curve.points:
        served = serve(fitted, workload=Workload(rate=p.rate_req_per_s, num_requests=4), dit=dit).scenarios[0]
        assert p.extrapolated_iterations == served.iterations["denoise"] == served.extrapolated_iterations > 0
