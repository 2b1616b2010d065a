"""Predict serving metrics from a trace of a serving loop: fit an iteration-time model on the
replayed iterations (baseline and each --scenario), then simulate requests arriving at a rate or
from a workload file under a scheduler (vLLM-style continuous batching, static, chunked prefill,
prefill/decode disaggregation) and report TTFT, TPOT, end-to-end latency, throughput and goodput
per scenario. DiT traces (phase:denoise) give request latency and throughput. See docs/serving.md."""
from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from rich.console import Console
from rich.table import Table

from whatif.summary import console
from whatif.api import analyze, predict
from whatif.predictors.serving import logs
from whatif.predictors.serving.arrivals import (RequestSpec, WorkloadError, gamma_arrivals, poisson_arrivals,
                                                read_workload, synthetic_workload)
from whatif.predictors.serving.iteration_model import (DitStepModel, IterationModel, fit_dit_model, fit_llm_model,
                                                       profiler_correction, replayed_iterations)
from whatif.predictors.serving.simulator import SchedulerConfig, SimResult, simulate_dit, simulate_llm
from whatif.transforms.scenario import load_scenario

SCHEMA = "whatif.serving/1"


def _range(text: str) -> tuple[int, int]:
    try:
        lo, _, hi = text.partition(":")
        return int(lo), int(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N or MIN:MAX tokens, got {text!r}") from None


def _mapping(text: str) -> tuple[str, str]:
    field, sep, name = text.partition("=")
    if not sep or not field or not name:
        raise argparse.ArgumentTypeError(f"expected FIELD=COLUMN, got {text!r}")
    return field, name


def add_common_arguments(parser: argparse.ArgumentParser, rate_required: bool = True) -> None:
    """Options shared by ``serve`` and ``sweep``: trace, scenarios, log, workload, scheduler, DiT."""
    parser.add_argument("path", type=Path, help="run folder (or trace) of a serving loop with phase annotations")
    parser.add_argument("-s", "--scenario", type=Path, action="append", default=[], metavar="FILE",
                        help="scenario TOML applied to the graph before fitting (repeatable)")
    parser.add_argument("--iterations-log", type=Path, metavar="FILE",
                        help="the server's JSON log of the recorded run (batch composition per iteration); "
                             "default: the --log named in the run folder's meta.json")
    parser.add_argument("--unprofiled-log", type=Path, metavar="FILE",
                        help="log of the same program run without the profiler: rescales iteration times by "
                             "the measured profiler overhead")
    parser.add_argument("--no-baseline", action="store_true", help="report only the scenarios")
    w = parser.add_argument_group("workload")
    w.add_argument("--workload", type=Path, metavar="FILE", help="CSV/JSONL: arrival_s, prompt_tokens, output_tokens")
    w.add_argument("--column", type=_mapping, action="append", default=[], metavar="FIELD=NAME",
                   help="map a workload field to the file's column name (repeatable)")
    w.add_argument("--time-unit", choices=["s", "ms", "us"], default="s", help="unit of the file's arrival column")
    if rate_required:
        w.add_argument("--rate", type=float, help="arrival rate (req/s); inf: all at t=0")
    w.add_argument("--num-requests", type=int, help="requests to draw (default 20); with --workload, keep the first N")
    w.add_argument("--prompt-tokens", type=_range, default=(16, 64), metavar="MIN[:MAX]")
    w.add_argument("--output-tokens", type=_range, default=(32, 128), metavar="MIN[:MAX]")
    w.add_argument("--cv", type=float, help="gamma arrivals with this coefficient of variation (bursty > 1); "
                                            "default Poisson")
    w.add_argument("--seed", type=int, default=0, help="seeds arrivals and lengths (same draws as the examples)")
    s = parser.add_argument_group("scheduler (LLM)")
    s.add_argument("--policy", default="vllm", choices=["vllm", "static", "chunked", "disagg"])
    s.add_argument("--max-seqs", "--max-batch", dest="max_seqs", type=int, default=8)
    s.add_argument("--max-batched-tokens", type=int, default=512)
    s.add_argument("--chunk-tokens", type=int, help="chunked: token budget per iteration (default max batched tokens)")
    s.add_argument("--kv-capacity-tokens", type=int, help="KV-cache tokens per replica (default unlimited)")
    s.add_argument("--kv-block-tokens", type=int, default=16)
    s.add_argument("--replicas", type=int, default=1, help="replicas (disagg: decode replicas)")
    s.add_argument("--prefill-replicas", type=int, default=1, help="disagg: prefill replicas")
    s.add_argument("--kv-transfer-us-per-token", type=float, default=0.0, help="disagg: KV hand-off time")
    s.add_argument("--router", default="least_loaded", choices=["least_loaded", "round_robin"])
    s.add_argument("--slo-ttft-ms", type=float)
    s.add_argument("--slo-tpot-ms", type=float)
    d = parser.add_argument_group("DiT")
    d.add_argument("--steps", type=int, help="denoising steps per request (default: as recorded)")
    d.add_argument("--resolution", type=int, help="latent side (default: as recorded)")
    d.add_argument("--frames", type=int, help="video frames (default: as recorded)")
    d.add_argument("--batch", type=int, help="max requests denoised together (default: as recorded)")
    d.add_argument("--cfg", dest="cfg", action="store_true", default=None, help="classifier-free guidance on")
    d.add_argument("--no-cfg", dest="cfg", action="store_false", help="classifier-free guidance off")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_common_arguments(parser)
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the whatif.serving JSON document")
    parser.add_argument("--requests", action="store_true", help="include every request in the JSON")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing (with --json)")


class Fitted:
    """The iteration models of the baseline and each scenario, with the log they were fitted on."""

    def __init__(self, args: argparse.Namespace) -> None:
        scenarios = [load_scenario(p) for p in args.scenario]  # validate every file first
        log_path = args.iterations_log or logs.find_log(args.path)
        if log_path is None:
            raise WorkloadError(f"{args.path}: no serving log found; pass --iterations-log FILE (the --log of "
                                "examples/llm_serve.py or dit_serve.py for this recording)")
        self.log_path = log_path
        self.log = logs.read_log(log_path)
        self.kind = "llm" if self.log["schema"] == logs.LLM_SCHEMA else "dit"
        base = analyze(args.path)
        replays = [] if args.no_baseline and scenarios else [("baseline", base.replay)]
        if scenarios:
            pred = predict(base, scenarios)
            replays += [(r.scenario.name, r.replay) for r in pred.scenarios]
        self.models: list[tuple[str, IterationModel | DitStepModel]] = [(n, self._fit(rp)) for n, rp in replays]
        self.factor: Any = None
        if args.unprofiled_log:
            self.factor = self._profiler_factor(logs.read_log(args.unprofiled_log))
            for _, m in self.models:
                if isinstance(m, IterationModel):
                    m.correction = dict(self.factor)
                else:
                    m.factor = self.factor

    def _fit(self, rp: Any) -> IterationModel | DitStepModel:
        iters = replayed_iterations(rp)
        if self.kind == "llm":
            return fit_llm_model(iters, logs.llm_compositions(self.log))
        over = [b["duration_ms"] - sum(b["step_ms"]) for b in self.log["batches"]]
        return fit_dit_model(iters, logs.dit_compositions(self.log), float(np.median(over)) * 1e6 if over else 0.0)

    def _profiler_factor(self, plain: dict[str, Any]) -> Any:
        if plain["schema"] != self.log["schema"]:
            raise WorkloadError(f"--unprofiled-log is a {plain['schema']} log, the recording's is {self.log['schema']}")
        model = self.models[0][1]
        if isinstance(model, IterationModel):
            return profiler_correction(model, [(p, b, d) for (p, b), d in zip(logs.llm_compositions(plain),
                                                                             logs.llm_durations_ms(plain))])

        def ratio(doc: dict[str, Any]) -> float:
            return float(np.median([s["duration_ms"] * 1e6 / model.step_ns(mb, t)
                                    for s, (mb, t) in zip(doc["steps"], logs.dit_compositions(doc))]))
        return ratio(plain) / ratio(self.log)


def llm_requests(args: argparse.Namespace, rate: float | None) -> list[RequestSpec]:
    if args.workload:
        scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6}[args.time_unit]
        reqs = read_workload(args.workload, dict(args.column), scale)
        return reqs[: args.num_requests] if args.num_requests else reqs
    if rate is None:
        raise WorkloadError("give --workload FILE or --rate R")
    return synthetic_workload(_n(args), rate, args.prompt_tokens, args.output_tokens, args.seed, args.cv)


def _n(args: argparse.Namespace) -> int:
    return 20 if args.num_requests is None else args.num_requests


def dit_arrivals(args: argparse.Namespace, rate: float | None) -> list[float]:
    if args.workload:
        scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6}[args.time_unit]
        reqs = read_workload(args.workload, dict(args.column), scale)
        return [r.arrival_s for r in (reqs[: args.num_requests] if args.num_requests else reqs)]
    if rate is None:
        raise WorkloadError("give --workload FILE or --rate R")
    rng = random.Random(args.seed)
    if args.cv is None:
        return poisson_arrivals(_n(args), rate, rng)
    return gamma_arrivals(_n(args), rate, args.cv, rng)


def scheduler_config(args: argparse.Namespace) -> SchedulerConfig:
    cfg = SchedulerConfig(policy=args.policy, max_seqs=args.max_seqs, max_batched_tokens=args.max_batched_tokens,
                          chunk_tokens=args.chunk_tokens, kv_capacity_tokens=args.kv_capacity_tokens,
                          kv_block_tokens=args.kv_block_tokens, replicas=args.replicas,
                          prefill_replicas=args.prefill_replicas,
                          kv_transfer_ns_per_token=args.kv_transfer_us_per_token * 1e3, router=args.router)
    cfg.check()
    return cfg


def dit_settings(args: argparse.Namespace, log: dict[str, Any]) -> dict[str, Any]:
    c = log["config"]
    res = args.resolution or c["resolution"]
    frames = args.frames or c["frames"]
    if res % c["patch"]:
        raise WorkloadError(f"--resolution {res} is not a multiple of the recorded patch {c['patch']}")
    cfg = (c["cfg_scale"] > 1.0) if args.cfg is None else args.cfg
    return {"steps": args.steps or c["steps"], "resolution": res, "frames": frames, "patch": c["patch"],
            "tokens": frames * (res // c["patch"]) ** 2, "batch": args.batch or c["batch"], "cfg": cfg,
            "replicas": args.replicas}


def simulate(fitted: Fitted, model: Any, args: argparse.Namespace, rate: float | None) -> SimResult:
    if fitted.kind == "llm":
        return simulate_llm(llm_requests(args, rate), model.time_ns, scheduler_config(args),
                            args.slo_ttft_ms, args.slo_tpot_ms)
    d = dit_settings(args, fitted.log)
    return simulate_dit(dit_arrivals(args, rate), model, d["steps"], d["tokens"], d["batch"], d["cfg"], d["replicas"])


def scenario_entry(name: str, model: Any, res: SimResult, with_requests: bool) -> dict[str, Any]:
    entry = {"name": name, **res.summary, "iteration_model": model.to_dict()}
    if "latency_ms" in entry:
        entry["e2e_ms"] = entry["latency_ms"]
    if with_requests:
        entry["requests"] = res.requests
    return entry


def workload_doc(args: argparse.Namespace, rate: float | None) -> dict[str, Any]:
    if args.workload:
        return {"file": str(args.workload), "columns": dict(args.column), "time_unit": args.time_unit}
    return {"arrivals": "poisson" if args.cv is None else "gamma", "rate_req_per_s": rate, "cv": args.cv,
            "num_requests": _n(args), "prompt_tokens": list(args.prompt_tokens),
            "output_tokens": list(args.output_tokens), "seed": args.seed}


def run(args: argparse.Namespace) -> int:
    rate = args.rate
    if args.workload is None and rate is None:
        raise WorkloadError("give --workload FILE or --rate R")
    fitted = Fitted(args)
    results = [scenario_entry(n, m, simulate(fitted, m, args, rate), args.requests) for n, m in fitted.models]
    doc = {"schema": SCHEMA, "source": str(args.path), "log": str(fitted.log_path), "kind": fitted.kind,
           "workload": workload_doc(args, rate),
           "scheduler": scheduler_config(args).to_dict() if fitted.kind == "llm" else dit_settings(args, fitted.log),
           "profiler_correction": fitted.factor, "scenarios": results}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    if not args.quiet:
        render(doc, console())
    return 0


def _f(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def render(doc: dict[str, Any], console: Console) -> None:
    """One table of scenarios, then each iteration model's fit quality."""
    w = doc["workload"]
    where = w.get("file") or f"{w['arrivals']} {w['rate_req_per_s']} req/s x {w['num_requests']}"
    console.print(f"[bold]{doc['source']}[/bold] ({doc['kind']}), workload: {where}")
    table = Table(title="Predicted serving metrics per scenario", title_justify="left")
    table.add_column("scenario", overflow="ellipsis", no_wrap=True, max_width=32)
    if doc["kind"] == "llm":
        cols = [("TTFT mean", "ttft_ms", "mean"), ("TTFT p99", "ttft_ms", "p99"), ("TPOT mean", "tpot_ms", "mean"),
                ("TPOT p99", "tpot_ms", "p99"), ("e2e mean", "e2e_ms", "mean"), ("e2e p99", "e2e_ms", "p99")]
    else:
        cols = [("latency mean", "latency_ms", "mean"), ("latency p50", "latency_ms", "p50"),
                ("latency p99", "latency_ms", "p99"), ("queue mean", "queue_ms", "mean"),
                ("service mean", "service_ms", "mean")]
    for label, _, _ in cols:
        table.add_column(f"{label} ms", justify="right", no_wrap=True)
    extra = ["out tok/s", "req/s", "busy"] if doc["kind"] == "llm" else ["req/s", "busy"]
    for e in extra:
        table.add_column(e, justify="right", no_wrap=True)
    for s in doc["scenarios"]:
        vals = [_f(s[k][q]) for _, k, q in cols]
        tail = ([_f(s["throughput_tokens_per_s"], "{:.0f}")] if doc["kind"] == "llm" else []) + \
            [_f(s["throughput_req_per_s"]), _f(s["busy_fraction"], "{:.0%}")]
        table.add_row(s["name"], *vals, *tail)
    console.print(table)
    for s in doc["scenarios"]:
        m = s["iteration_model"]
        if doc["kind"] == "llm":
            parts = [f"{p}: {'+'.join(f['features']) or 'constant'} (n={f['n']}, R²={f['r2']:.2f}, "
                     f"MAPE {f['mape']:.1%}, LOO {f['loo_mape']:.1%})" for p, f in m["phases"].items()]
        else:
            parts = [f"denoise step at model batches {m['model_batches_seen']} (n={m['n']}, MAPE {m['mape']:.1%}, "
                     f"LOO {m['loo_mape']:.1%})"]
        console.print(f"  {s['name']} iteration model: " + "; ".join(parts))
    if doc.get("profiler_correction") is not None:
        console.print(f"  profiler-overhead correction applied: {doc['profiler_correction']}")
