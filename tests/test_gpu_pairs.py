"""The GPU harvest's before/after pairs (sample_traces/gpu/pairs, recorded on an H200): each
"after" predicted from its "before" trace, against what "after" measured and against predicting
no change. Runs on CPU; the recordings are in the repository. Figures: bench/gpu_pairs.py and
docs/accuracy.md ("Our own GPU pairs").
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from whatif.api import analyze, predict
from whatif.depgraph.graph import TaskKind
from whatif.transforms.optimizations.dataloader import fold_loader_ranges

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from gpu_pairs import PAIRS_DIR as PAIRS  # noqa: E402  (the bench's figures, computed once)
from gpu_pairs import SCENARIOS, precision_classes  # noqa: E402
from gpu_pairs import kernel_busy_ms as kernel_ms_per_step  # noqa: E402
from gpu_pairs import median_counted_ms as median_ms  # noqa: E402


def pair(name: str):  # type: ignore[no-untyped-def]
    """(before analysis, after analysis, the scenario's prediction on before) of round 1."""
    before, after = analyze(PAIRS / f"{name}-before-r1"), analyze(PAIRS / f"{name}-after-r1")
    return before, after, predict(before, [SCENARIOS / f"{name}.toml"]).scenarios[0]


def judged(name: str, tolerance: float) -> tuple[float, float]:
    """(prediction error, no-change error) of a step-time pair; asserts it is within ``tolerance``
    of the measured after and beats predicting no change."""
    before, after, pred = pair(name)
    measured = median_ms(after.steps, "measured_ns")
    err = median_ms(pred.steps, "predicted_ns") / measured - 1
    unchanged = median_ms(before.steps, "measured_ns") / measured - 1
    assert abs(err) <= tolerance, f"{name}: predicted {err:+.1%} from the measured after"
    assert abs(err) < abs(unchanged), f"{name}: {err:+.1%} is no better than unchanged ({unchanged:+.1%})"
    return err, unchanged


def test_cuda_graphs_predict_the_launch_bound_decode_step() -> None:
    _, unchanged = judged("p2_cuda_graph", 0.05)
    assert unchanged > 5  # eager decode was launch-bound: >6x slower than the graph replay


def test_bf16_autocast_predicts_the_cpu_bound_step() -> None:
    before, _, pred = pair("p1_precision")
    judged("p1_precision", 0.10)
    # GPU work shrinks about 5x, but the bf16 step is bound by the CPU thread: the prediction is
    # capped by it instead of following the GPU.
    gpu_ratio = kernel_ms_per_step(pred.graph, pred.steps) / kernel_ms_per_step(before.graph, before.steps)
    step_ratio = median_ms(pred.steps, "predicted_ns") / median_ms(before.steps, "measured_ns")
    assert gpu_ratio < 0.25 and step_ratio > 0.45
    # the casts autocast runs (each fp32 weight every forward, and back in backward) are the copies
    # the after recording measured: 0.41 -> 1.10 ms per step
    copies = precision_classes(PAIRS / "p1_precision-before-r1", PAIRS / "p1_precision-after-r1").loc["copy"]
    assert abs(copies["autocast"] / copies["after"] - 1) < 0.15 and copies["converted"] < 0.5 * copies["after"]


def test_dataloader_workers_from_a_pytorch2_trace() -> None:
    judged("p5_dataloader", 0.10)


def test_loader_ranges_become_one_task_per_batch() -> None:
    before = analyze(PAIRS / "p5_dataloader-before-r1")
    g = before.graph
    named = g.tasks["name"].astype(str).str.contains("DataLoader").to_numpy()
    assert named.sum() == 1  # PyTorch 2.x: the ranges hold ops, so they are no tasks of their own
    folded = fold_loader_ranges(g, reason="test")
    t = folded.tasks
    loads = t[t["name"].astype(str).str.contains("DataLoader").to_numpy()]
    big = loads[loads["dur_ns"] > 5e6]  # the example spends --load-ms 6 per batch
    assert len(big) == 16 and (loads["kind"] == int(TaskKind.CPU_WORK)).all()
    assert len(folded.tasks) < len(g.tasks)
    assert len(g.tasks) == len(before.graph.tasks)  # the input graph is not edited


def test_tensor_parallel_compute_part() -> None:
    before, after, pred = pair("p9_tp")
    predicted = kernel_ms_per_step(pred.graph, pred.steps)
    measured = kernel_ms_per_step(after.graph, after.steps)
    assert abs(predicted / measured - 1) < 0.10
    assert kernel_ms_per_step(before.graph, before.steps) > 1.4 * measured


def test_a_launch_bound_decode_does_not_feel_a_bigger_batch() -> None:
    """Batch 8 -> 32: the GPU work grows, the step does not (launch-bound); the batch transform
    grows the kernels (nearer the measured after than unchanged: tests/test_batch.py) and leaves
    the predicted step where it was, as measured."""
    before, after = analyze(PAIRS / "p6_batch-before-r1"), analyze(PAIRS / "p6_batch-after-r1")
    pred = predict(before, [SCENARIOS / "p6_batch.toml"]).scenarios[0]
    b, a = median_ms(before.steps, "measured_ns"), median_ms(after.steps, "measured_ns")
    assert kernel_ms_per_step(after.graph, after.steps) > 1.4 * kernel_ms_per_step(before.graph, before.steps)
    assert kernel_ms_per_step(pred.graph, pred.steps) > 1.4 * kernel_ms_per_step(before.graph, before.steps)
    assert abs(a / b - 1) < 0.05
    assert abs(median_ms(pred.steps, "predicted_ns") / b - 1) < 0.02


def serve_prediction(name: str, *flags: str, tmp_path: Path) -> dict:  # type: ignore[type-arg]
    out = tmp_path / f"{name}.json"
    subprocess.run([sys.executable, "-m", "whatif.cli", "serve", str(PAIRS / f"{name}-before-r1"), *flags,
                    "--json", str(out), "-q"], check=True, cwd=REPO)
    return json.loads(out.read_text())["scenarios"][0]


def summary(run: str) -> dict:  # type: ignore[type-arg]
    return json.loads((PAIRS / run / "program.log").read_text())["summary"]


@pytest.mark.slow
def test_serving_at_three_times_the_rate_beats_unchanged(tmp_path: Path) -> None:
    doc = serve_prediction("p7_serve_rate", "--rate", "24", "--num-requests", "16", "--prompt-tokens", "16:64",
                           "--output-tokens", "32:48", "--seed", "0", tmp_path=tmp_path)
    before, after = summary("p7_serve_rate-before-r1"), summary("p7_serve_rate-after-r1")
    for metric in ("ttft_ms", "e2e_ms"):
        err = doc[metric]["mean"] / after[metric]["mean"] - 1
        unchanged = before[metric]["mean"] / after[metric]["mean"] - 1
        assert abs(err) < abs(unchanged), f"{metric}: {err:+.1%} vs unchanged {unchanged:+.1%}"


@pytest.mark.slow
def test_dit_steps_grow_with_the_tokens_only_once_the_gpu_is_the_bottleneck(tmp_path: Path) -> None:
    """4x the tokens (latent 16 -> 32) measured no slower: the step is launch-bound on the H200. The
    step model keeps it where it was, and lets it grow once the GPU work overtakes the CPU's."""
    steps = {}
    for res in (16, 32, 64, 128):
        steps[res] = serve_prediction("p8_dit_tokens", "--rate", "inf", "--num-requests", "8", "--resolution", str(res),
                                      "--steps", "8", "--batch", "4", tmp_path=tmp_path)["step_ms_at_full_batch"]
    before, after = summary("p8_dit_tokens-before-r1"), summary("p8_dit_tokens-after-r1")
    measured = after["step_ms"]["p50"]
    assert abs(steps[32] / measured - 1) < 0.05
    assert abs(steps[32] / measured - 1) <= abs(before["step_ms"]["p50"] / measured - 1)
    assert steps[32] == pytest.approx(steps[16], rel=0.01)
    assert steps[64] > 1.5 * steps[32] and steps[128] > 5 * steps[64]  # GPU-bound: attention ~ tokens^2
