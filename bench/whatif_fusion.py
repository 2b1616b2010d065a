"""Predicted effect of ``fuse`` and ``cuda_graph`` on shared real traces.

There is no measured ground truth for these what-ifs here (nobody re-ran the traced programs
fused or graphed), except as a sanity reference: the vLLM MI300X decode trace is already a full
CUDA/HIP-graph run, so ``cuda_graph`` must leave it about unchanged. The numbers are predictions:
per trace, the baseline predicted time (sum over steps), each transform's speedup, both in turn,
and the time to apply each transform.

Usage: python bench/whatif_fusion.py [--traces DIR]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from whatif.api import analyze, make_context
from whatif.predictors.replay import replay
from whatif.predictors.steps import step_times
from whatif.transforms.base import TransformError
from whatif.transforms.optimizations.cuda_graph import CudaGraph
from whatif.transforms.optimizations.fuse import Fuse

ROOT = Path(__file__).resolve().parents[1]
TRACES = [
    "tracelens/hf_h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "tracelens/hf_h100/gaunernst_bert-small-uncased__1016001.json.gz",
    "tracelens/hf_h100/Falconsai_nsfw_image_detection__1016002.json.gz",
    "hta/negative_queue_a100_rank0of16.json.gz",
    "kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz",
    "tracelens/sglang_qwen3_8b_decode_mi300x.json.gz",
    "tracelens/vllm_decode_full_graph_execution_mi300x.json.gz",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=ROOT.parent / "shared" / "traces")
    args = ap.parse_args()
    if not args.traces.is_dir():
        print(f"traces not found: {args.traces} (../shared is absent?)", file=sys.stderr)
        return 2
    print(f"{'trace':58s} {'base ms':>9s} {'fuse':>7s} {'graph':>7s} {'both':>7s}  apply fuse/graph s")
    for rel in TRACES:
        path = args.traces / rel
        if not path.exists():
            print(f"{rel:58s} (missing)")
            continue
        a = analyze(path)
        ctx = make_context(a.trace)
        base = a.steps["predicted_ns"].sum()
        cells, times, g = [], [], a.graph
        for t in (Fuse(), CudaGraph()):
            t0 = time.perf_counter()
            try:
                h = t.apply(a.graph, ctx)
                cells.append(f"{base / step_times(replay(h))['predicted_ns'].sum():6.3f}x")
            except TransformError:
                cells.append(f"{'n/a':>7s}")
            times.append(time.perf_counter() - t0)
            try:
                g = t.apply(g, ctx)
            except TransformError:
                pass
        cells.append(f"{base / step_times(replay(g))['predicted_ns'].sum():6.3f}x")
        print(f"{rel[-58:]:58s} {base / 1e6:9.2f} {' '.join(cells)}  {times[0]:.3f}/{times[1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
