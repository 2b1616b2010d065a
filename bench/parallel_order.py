"""Does the order of a plan (or lower precision) and a GPU move matter? Each plan applied to a
hand-made A100 trace (tests/_llm_tracegen.py) then moved to another GPU, against the move then the plan: the kernels'
total and the replayed step, as (plan then move) / (move then plan) - 1. 0 is right: the hardware
does not know the order a scenario lists them in. docs/multi-gpu.md ("A GPU move and a parallel
plan commute") holds the output. Run: .venv/bin/python bench/parallel_order.py (~10 s)."""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from _llm_tracegen import llm_trace  # noqa: E402

from whatif.api import analyze, make_context  # noqa: E402
from whatif.depgraph.graph import TaskGraph, TaskKind  # noqa: E402
from whatif.predictors.replay import replay  # noqa: E402
from whatif.predictors.steps import step_times  # noqa: E402
from whatif.transforms.base import Transform, TransformContext  # noqa: E402
from whatif.transforms.optimizations.batch import Batch  # noqa: E402
from whatif.transforms.optimizations.gpu import Gpu  # noqa: E402
from whatif.transforms.optimizations.precision import Precision  # noqa: E402
from whatif.transforms.parallel.overlap import Overlap  # noqa: E402
from whatif.transforms.parallel.pipeline import PipelineParallel  # noqa: E402
from whatif.transforms.parallel.sequence import SequenceParallel  # noqa: E402
from whatif.transforms.parallel.tensor import TensorParallel  # noqa: E402

DESTINATIONS = ("H100_SXM", "MI300X")
TRAINING = {"tp2": [TensorParallel(degree=2)], "tp4": [TensorParallel(degree=4)], "batch x3": [Batch(factor=3)],
            "batch x0.5": [Batch(factor=0.5)], "pp2 1f1b": [PipelineParallel(degree=2)],
            "int8": [Precision(dtype="int8")], "int4 weight-only": [Precision(dtype="int4_weight")],
            "tp2 + int8": [TensorParallel(degree=2), Precision(dtype="int8")]}
INFERENCE = {"pp4 serving m2": [PipelineParallel(degree=4, micro_batches=2, schedule="serving")],
             "ulysses4": [SequenceParallel(degree=4)], "tp2 + batch x2": [TensorParallel(degree=2), Batch(factor=2)],
             "tp4 + overlap(2)": [TensorParallel(degree=4), Overlap(nano_batches=2)],
             "int8": [Precision(dtype="int8")], "int4 weight-only": [Precision(dtype="int4_weight")]}


def _apply(graph: TaskGraph, ctx: TransformContext, transforms: list[Transform]) -> TaskGraph:
    for t in transforms:
        graph = t.apply(graph, ctx)
    return graph


def _kernels_ns(graph: TaskGraph) -> int:
    return int(graph.tasks["dur_ns"].to_numpy()[graph.tasks["kind"].to_numpy() == int(TaskKind.KERNEL)].sum())


def _step_ns(graph: TaskGraph) -> int:
    return int(step_times(replay(graph))["predicted_ns"].sum())


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        traces = {
            "training": analyze(llm_trace(Path(tmp) / "train.json.gz", new_tokens=1024, kv_tokens=1024, layers=2,
                                          backward=True, steps=1, gpu_name="NVIDIA A100-SXM4-80GB",
                                          device="A100_SXM_80GB")),
            "inference": analyze(llm_trace(Path(tmp) / "fwd.json.gz", new_tokens=2048, kv_tokens=2048, layers=4,
                                           backward=False, steps=2, gpu_name="NVIDIA A100-SXM4-80GB",
                                           device="A100_SXM_80GB")),
        }
    print("| trace (A100) | plan | to | kernels, plan then move vs move then plan | step |")
    print("|---|---|---|---|---|")
    for trace_name, plans in (("training", TRAINING), ("inference", INFERENCE)):
        a = traces[trace_name]
        ctx = make_context(a.trace)
        for plan, transforms in plans.items():
            for dest in DESTINATIONS:
                move = [Gpu(device=dest)]
                x = _apply(a.graph, ctx, transforms + move)
                y = _apply(a.graph, ctx, move + transforms)
                kx, ky, sx, sy = _kernels_ns(x), _kernels_ns(y), _step_ns(x), _step_ns(y)
                print(f"| {trace_name} | {plan} | {dest} | {(kx / ky - 1) * 100:+.2f} % | "
                      f"{(sx / sy - 1) * 100:+.2f} % |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
