"""How the operator-cost serving iteration model (predictors/serving/iteration_costs.py) moves with
the batch: fitted on one recorded iteration, predicted at other batch sizes and context lengths,
against an iteration generated at that batch.

Ground truth: tests/_llm_tracegen.py writes Kineto traces of a decoder layer stack whose kernels
are timed by the catalog's achievable roofline of the GPU (each kernel at its own size, plus a
fixed 3 us; the weight GEMMs by the weight-GEMM law, ``gemm_law=True``, which
bench/serving_op_laws.py checks against Vidur's measured GEMMs), the same physics the model
prices with but not its approximations (the model infers
each GEMM's weights from its measured time, knows no shapes, adds 4·h·s bytes per token to the
elementwise kernels). So this measures the laws' algebra on clean data, not the hardware: the
hardware check is bench/serving_vidur.py (Vidur's measured A100 costs). "no change" is the error
of predicting the recorded iteration's time at the new batch.

Run: .venv/bin/python bench/serving_extrapolation.py [--write-docs]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _llm_tracegen import llm_trace  # noqa: E402
from common.docs import replace_section  # noqa: E402

from whatif.analysis import analyze, make_context  # noqa: E402
from whatif.hardware.devices import get_device  # noqa: E402
from whatif.predictors.serving.engines import (  # noqa: E402
    CompositionSource,
    FoundIteration,
    FoundIterations,
    IterationPhase,
)
from whatif.predictors.serving.iteration_costs import cpu_only_replay, fit_cost_model  # noqa: E402
from whatif.predictors.serving.logs import LLMBatch  # noqa: E402
from whatif.transforms.parallel.memory import model_shape  # noqa: E402

BEGIN, END = "<!-- bench/serving_extrapolation.py begin -->", "<!-- bench/serving_extrapolation.py end -->"
MODELS = {  # a few layers of each: the laws are per kernel
    "Llama-3-8B-like (4096, GQA 32/8, FFN 14336)": {"hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336},
    "Llama-2-70B-like (8192, GQA 64/8, FFN 28672)": {"hidden": 8192, "heads": 64, "kv_heads": 8, "ffn": 28672},
}
DEVICES = {"H100_SXM": "NVIDIA H100 80GB HBM3", "MI300X": "AMD Instinct MI300X",
           "A100_SXM_80GB": "NVIDIA A100-SXM4-80GB"}
CASES = [  # (recorded, target)
    (("decode", 8, 2048), ("decode", 64, 2048)),
    (("decode", 8, 2048), ("decode", 256, 2048)),
    (("decode", 8, 2048), ("decode", 8, 16384)),
    (("decode", 32, 1024), ("decode", 1, 1024)),
    (("prefill", 1, 256), ("prefill", 1, 2048)),
    (("prefill", 1, 2048), ("prefill", 1, 8192)),
    (("prefill", 1, 2048), ("prefill", 1, 128)),
]


def batch_of(phase: str, seqs: int, tokens: int) -> LLMBatch:
    return LLMBatch(prefill_tokens=(tokens,)) if phase == "prefill" else LLMBatch(decode_context=(tokens,) * seqs)


def trace(tmp: Path, dev: str, shape: dict, phase: str, seqs: int, tokens: int) -> Path:
    kw = {**shape, "layers": 2, "steps": 3, "device": dev, "gpu_name": DEVICES[dev], "gemm_law": True}
    name = f"{dev}_{shape['hidden']}_{phase}_{seqs}_{tokens}.json"
    if phase == "prefill":
        return llm_trace(tmp / name, batch=seqs, new_tokens=tokens, kv_tokens=tokens, **kw)
    return llm_trace(tmp / name, batch=seqs, new_tokens=1, kv_tokens=tokens, **kw)


def measured_ns(path: Path) -> float:
    """The iteration period: one step's begin to the next (the serving loop's time between forward
    passes included, as the simulator spends it)."""
    begins = analyze(path).graph.steps["measured_begin_ns"].to_numpy(float)
    return float((begins[1:] - begins[:-1]).mean())


def predict(path: Path, dev: str, batch: LLMBatch, target: LLMBatch) -> float:
    a = analyze(path)
    g = a.graph
    its = tuple(FoundIteration(rank=int(r.rank), start_ns=int(r.measured_begin_ns), end_ns=int(r.measured_end_ns),
                               phase=IterationPhase(batch.phase), evidence="step", llm=batch)
                for r in g.steps.itertuples())
    found = FoundIterations("generated", its, CompositionSource.ANNOTATION)
    shape = model_shape(g, make_context(a.trace), "bench")
    model = fit_cost_model(a.replay, cpu_only_replay(a.replay), found, get_device(dev), shape)
    return model.raw_time_ns(target)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write-docs", action="store_true", help="write the table into docs/serving.md")
    args = ap.parse_args()
    rows, errs, beats = [], [], 0
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        for mname, shape in MODELS.items():
            for dev in DEVICES:
                for (p0, s0, t0), (p1, s1, t1) in CASES:
                    src = trace(tmp, dev, shape, p0, s0, t0)
                    rec = measured_ns(src)
                    truth = measured_ns(trace(tmp, dev, shape, p1, s1, t1))
                    pred = predict(src, dev, batch_of(p0, s0, t0), batch_of(p1, s1, t1))
                    err, same = pred / truth - 1, rec / truth - 1
                    errs.append(abs(err))
                    beats += abs(err) < abs(same)
                    what = "tokens" if p0 == "prefill" else "context"
                    rows.append(f"| {mname.split(' ')[0]} | {dev} | {p0} {s0} seq x {t0} {what} | "
                                f"{p1} {s1} seq x {t1} {what} | {rec / 1e3:,.0f} | {truth / 1e3:,.0f} | "
                                f"{pred / 1e3:,.0f} | {err:+.1%} | {same:+.1%} |")
    errs.sort()
    summary = (f"{len(errs)} cases: median |error| {errs[len(errs) // 2]:.1%}, worst {errs[-1]:.1%}; "
               f"closer than \"no change\" in {beats} of {len(errs)}")
    table = "\n".join(["| model | GPU | recorded | predicted at | recorded us | truth us | predicted us | error | "
                       "no change |", "|---|---|---|---|---|---|---|---|---|", *rows, "", summary])
    print(table)
    if args.write_docs:
        replace_section(ROOT / "docs" / "serving.md", BEGIN, END, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
