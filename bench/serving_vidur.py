"""Extrapolation check against a Vidur peer run (issue 18): whatif's LLM iteration model fitted on
Vidur's 2 req/s iterations, whatif's simulator serving Vidur's 6 req/s requests, compared with
Vidur's own 6 req/s run (Llama-2-7B, A100, TP 1, Vidur's vLLM replica scheduler).

The runs are in ``bench/data/vidur/`` (README.md there: Vidur's commit, commands, configuration,
the logging patch, what each column means). Per scenario:

* ``fit X -> Y``: the iteration model is fitted on run X's batches (composition and Vidur's
  execution time of every iteration) and the simulator serves run Y's requests (Vidur's arrival
  times and lengths) under a :class:`SchedulerConfig` matching Vidur's scheduler; the result is
  compared with run Y's per-request latencies;
* ``oracle Y``: the model is fitted on run Y's own batches, which separates the scheduler's error
  (what remains here) from the iteration model's (the difference to ``fit X -> Y``).

TTFT, TPOT and end-to-end latency are computed the same way on both sides: TTFT = first token
- arrival, e2e = last token - arrival, TPOT = (e2e - TTFT) / (output tokens - 1). Nothing is
stored or assumed: every figure is computed from the saved runs in this invocation.

  .venv/bin/python bench/serving_vidur.py [--json FILE] [--no-docs]
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from whatif.core.dtypes import DType
from whatif.hardware.devices import get_device
from whatif.predictors.serving.arrivals import RequestSpec
from whatif.predictors.serving.iteration_costs import WeightGemms
from whatif.predictors.serving.iteration_model import fit_llm_model
from whatif.predictors.serving.logs import LLMBatch
from whatif.predictors.serving.metrics import stats
from whatif.predictors.serving.scheduler import PolicyName
from whatif.predictors.serving.simulator import SchedulerConfig, simulate_llm
from whatif.serving import LlmModel, RangeWatch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common.docs import replace_section

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench" / "data" / "vidur"
BEGIN, END = "<!-- bench/serving_vidur.py begin -->", "<!-- bench/serving_vidur.py end -->"
DOCS = (ROOT / "docs" / "serving.md", ROOT / "docs" / "accuracy.md")
METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")
LIMITS = {"mean": 0.15, "p99": 0.25}  # issue 18's "done when" tolerances
# (name, fitted run, target run, whatif applies Vidur's KV admission watermark, the weight GEMMs priced by their law)
SCENARIOS = (("256-1536: fit 2 -> 2", "u1536_qps2", "u1536_qps2", True, True),
             ("256-1536: fit 2 -> 6", "u1536_qps2", "u1536_qps6", True, True),
             ("256-1536: oracle 6", "u1536_qps6", "u1536_qps6", True, True),
             ("256-2048: fit 2 -> 6", "u2048_qps2", "u2048_qps6", True, True),
             ("256-2048: fit 2 -> 6, GEMMs in the fit", "u2048_qps2", "u2048_qps6", True, False),
             ("256-2048: oracle 6", "u2048_qps6", "u2048_qps6", True, True),
             ("256-2048: oracle 6, no watermark", "u2048_qps6", "u2048_qps6", False, True))
# Llama-2-7B (its Hugging Face config.json: hidden 4096, 32 layers, 32 heads, 32 KV heads, gated FFN 11008),
# the weights of its layers' four GEMMs (QKV, output, gate+up, down), what Vidur's MLP table times;
# Vidur's "a100" is an A100 80 GB SXM (../shared/perfdata/README.md)
HIDDEN, LAYERS, FFN = 4096, 32, 11008
LAYER_GEMM_PARAMS = 3 * HIDDEN * HIDDEN + HIDDEN * HIDDEN + 2 * HIDDEN * FFN + FFN * HIDDEN
DEVICE = "A100_SXM_80GB"


@dataclass(frozen=True)
class VidurRun:
    """One saved Vidur run: per request, per batch (start, end) and per (batch, request) rows."""

    tag: str
    rate: float
    requests: pd.DataFrame
    batches: pd.DataFrame
    members: pd.DataFrame
    scheduler: dict
    num_blocks: int


def load_run(tag: str, data: Path = DATA) -> VidurRun:
    """The run ``tag`` (``u1536_qps2``…) of ``data``; its scheduler settings from ``runs.json``."""
    meta = json.loads((data / "runs.json").read_text())[tag]
    return VidurRun(tag, float(meta["qps"]), pd.read_csv(data / f"requests_{tag}.csv"),
                    pd.read_csv(data / f"batches_{tag}.csv.gz"), pd.read_csv(data / f"batch_requests_{tag}.csv.gz"),
                    meta["replica_scheduler"], int(meta["num_blocks"]))


def compositions(run: VidurRun) -> list[tuple[str, LLMBatch]]:
    """``(phase, LLMBatch)`` of each batch in batch order. A prefill member's ``context_before`` is
    its cached tokens; a decode member attends to ``context_before`` tokens (Vidur counts the token
    the prefill produced as processed, as whatif's decode context does)."""
    m = run.members.sort_values(["batch_id", "request_id"], kind="stable")
    ids, ctx, tok, pre = (m[c].to_numpy() for c in ("batch_id", "context_before", "tokens", "is_prefill"))
    cuts = np.flatnonzero(np.diff(ids)) + 1
    out = []
    for c, t, p in zip(np.split(ctx, cuts), np.split(tok, cuts), np.split(pre.astype(bool), cuts)):
        batch = LLMBatch(prefill_tokens=tuple(t[p].tolist()), prefill_cached=tuple(c[p].tolist()),
                         decode_context=tuple(c[~p].tolist()))
        out.append((batch.phase, batch))
    return out


def iterations(run: VidurRun, comps: list[tuple[str, LLMBatch]]) -> pd.DataFrame:
    """The batches as :func:`replayed_iterations` rows: cycle = Vidur's execution time, no gap."""
    b = run.batches.sort_values("batch_id")
    return pd.DataFrame({"rank": 0, "step": b.batch_id.to_numpy(), "phase": [p for p, _ in comps],
                         "cycle_ns": ((b.end_s - b.start_s) * 1e9).to_numpy(), "pre_gap_ns": 0.0, "attn_ns": 0.0,
                         "excluded_reason": None, "included": True})


def weight_gemms() -> WeightGemms:
    """Llama-2-7B's layer GEMMs on Vidur's A100, in fp16 (2 bytes per weight)."""
    return WeightGemms.of(2.0 * LAYERS * LAYER_GEMM_PARAMS, get_device(DEVICE), DType.FP16)


def current_model(run: VidurRun, gemms: bool = True) -> LlmModel:
    """whatif's iteration model fitted on ``run``'s batches (the one function to switch models);
    ``gemms``: the weight GEMMs priced by their law, the fit of the rest (else all in the fit)."""
    comps = compositions(run)
    return fit_llm_model(iterations(run, comps), comps, weight_gemms() if gemms else None)


def scheduler_config(run: VidurRun, watermark: bool = True) -> SchedulerConfig:
    """Vidur's vLLM replica scheduler in whatif's terms (what cannot be expressed: docs/serving.md);
    ``watermark=False`` leaves out its KV admission watermark (a diagnostic)."""
    s = run.scheduler
    return SchedulerConfig(policy=PolicyName.VLLM, max_seqs=int(s["batch_size_cap"]),
                           max_batched_tokens=int(s["max_tokens_in_batch"]),
                           kv_capacity_tokens=run.num_blocks * int(s["block_size"]),
                           kv_block_tokens=int(s["block_size"]),
                           kv_watermark=float(s["watermark_blocks_fraction"]) if watermark else 0.0)


def request_specs(run: VidurRun) -> list[RequestSpec]:
    r = run.requests
    return [RequestSpec(int(i), float(a), int(p), int(o))
            for i, a, p, o in zip(r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens)]


Stats = dict[str, float | None]  # whatif's metrics.stats: mean, p50, p90, p99 (ms)


def vidur_latencies(run: VidurRun) -> dict[str, Stats]:
    r = run.requests
    ttft, e2e = r.ttft_s * 1e3, r.e2e_s * 1e3
    tpot = (e2e - ttft) / (r.output_tokens - 1)
    return {"ttft_ms": stats(ttft.tolist()), "tpot_ms": stats(tpot.tolist()), "e2e_ms": stats(e2e.tolist())}


def batch_error(model: LlmModel, run: VidurRun) -> dict[str, float]:
    """Per phase: mean relative error of ``model`` on ``run``'s own batches."""
    b = run.batches.sort_values("batch_id")
    err: dict[str, list[float]] = {}
    for (phase, batch), y in zip(compositions(run), (b.end_s - b.start_s) * 1e9):
        err.setdefault(phase, []).append(model.time_ns(batch) / y - 1)
    return {p: float(np.mean(v)) for p, v in sorted(err.items())}


def decode_sizes(run: VidurRun) -> tuple[float, int]:
    """Mean and largest decode batch (sequences) of a run."""
    dec = run.members[run.members.is_prefill == 0].groupby("batch_id").size()
    return float(dec.mean()), int(dec.max())


@dataclass
class Comparison:
    """One scenario: whatif's and Vidur's latency statistics and what explains the difference."""

    scenario: str
    fit: str
    target: str
    predicted: dict[str, Stats]
    vidur: dict[str, Stats]
    iterations_whatif: tuple[int, int]      # prefill, decode
    iterations_vidur: tuple[int, int]
    preemptions_whatif: int
    restarts_vidur: int
    batch_error: dict[str, float]           # phase -> mean relative error of the model on the target's batches
    beyond_range: int                       # simulated iterations outside the fitted range
    beyond_drivers: dict[str, int]

    def error(self, metric: str, q: str) -> float:
        return self.predicted[metric][q] / self.vidur[metric][q] - 1  # type: ignore[operator]

    def within(self, metric: str, q: str) -> bool:
        return abs(self.error(metric, q)) <= LIMITS[q]


def scenario(name: str, fit: VidurRun, target: VidurRun, watermark: bool = True, gemms: bool = True,
             fit_model: Callable[[VidurRun, bool], LlmModel] = current_model) -> Comparison:
    model = fit_model(fit, gemms)
    watch = RangeWatch(model)
    sim = simulate_llm(request_specs(target), watch.time_ns, scheduler_config(target, watermark))
    kinds = target.members.groupby("batch_id").is_prefill.max()
    return Comparison(name, fit.tag, target.tag, {k: sim.summary[k] for k in METRICS}, vidur_latencies(target),
                      (sim.iterations["prefill"], sim.iterations["decode"]),
                      (int((kinds == 1).sum()), int((kinds == 0).sum())), sim.summary["preemptions"],
                      int(target.requests.restarts.sum()), batch_error(model, target), watch.iterations,
                      dict(sorted(watch.drivers.items())))


def cell(r: Comparison, metric: str, q: str) -> str:
    """``whatif vs Vidur (error)`` of one metric, MISS when beyond the tolerance."""
    miss = "" if r.within(metric, q) else " MISS"
    return f"{r.predicted[metric][q]:.1f} vs {r.vidur[metric][q]:.1f} ({r.error(metric, q):+.1%}{miss})"


def beyond(r: Comparison) -> str:
    """How many simulated iterations left the fitted range, and on which drivers."""
    drivers = ", ".join(f"{k} {v:,}" for k, v in r.beyond_drivers.items())
    return f"{r.beyond_range:,}" + (f" ({drivers})" if drivers else "")


def table(rows: list[Comparison], runs: dict[str, VidurRun]) -> str:
    head = "| scenario | " + " | ".join(f"{k.removesuffix('_ms').upper()} {q}" for k in METRICS for q in LIMITS) + \
           " | iterations whatif / Vidur (prefill+decode) | preemptions whatif / Vidur" \
           " | iteration-time error on target (prefill, decode) | simulated iterations beyond the fitted range |"
    lines = [head, "|" + "---|" * (5 + len(METRICS) * len(LIMITS))]
    for r in rows:
        (wp, wd), (vp, vd) = r.iterations_whatif, r.iterations_vidur
        be = r.batch_error
        lines.append(f"| {r.scenario} | " + " | ".join(cell(r, k, q) for k in METRICS for q in LIMITS) +
                     f" | {wp}+{wd} / {vp}+{vd} | {r.preemptions_whatif} / {r.restarts_vidur}"
                     f" | {be.get('prefill', float('nan')):+.1%}, {be.get('decode', float('nan')):+.1%}"
                     f" | {beyond(r)} |")
    sizes = ", ".join(f"{t}: mean {m:.1f}, max {x}" for t, (m, x) in ((t, decode_sizes(r)) for t, r in runs.items()))
    lines.append("")
    lines.append(f"Cells: whatif vs Vidur in ms (relative error; MISS beyond {LIMITS['mean']:.0%} on means, "
                 f"{LIMITS['p99']:.0%} on p99). Decode batch sizes in Vidur's runs (sequences): {sizes}.")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--no-docs", action="store_true", help="do not rewrite the tables in docs/")
    args = ap.parse_args()
    runs = {t: load_run(t) for t in sorted({t for _, f, g, _, _ in SCENARIOS for t in (f, g)})}
    rows = [scenario(name, runs[f], runs[g], watermark, gemms) for name, f, g, watermark, gemms in SCENARIOS]
    text = table(rows, runs)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1, sort_keys=True))
    if not args.no_docs:
        for doc in DOCS:
            replace_section(doc, BEGIN, END, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
