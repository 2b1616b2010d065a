"""Predict serving metrics from a trace of a serving loop: fit an iteration-time model on the
replayed iterations (baseline and each --scenario), then simulate requests arriving at a rate or
from a workload file under a scheduler (vLLM-style continuous batching, static, chunked prefill,
prefill/decode disaggregation) and report TTFT, TPOT, end-to-end latency, throughput and goodput
per scenario. DiT traces (phase:denoise) give request latency and throughput. The work is done by
:func:`whatif.serving.serve`; this module maps the flags onto it and prints. See docs/serving.md."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from whatif.predictors.serving.simulator import SchedulerConfig
from whatif.serving import DitOptions, Workload, serve
from whatif.summary import console


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


def workload(args: argparse.Namespace) -> Workload:
    """The :class:`~whatif.serving.Workload` of the workload options."""
    return Workload(rate=getattr(args, "rate", None), num_requests=args.num_requests,
                    prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens, cv=args.cv, seed=args.seed,
                    file=args.workload, columns=dict(args.column), time_unit=args.time_unit)


def options(args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments of :func:`whatif.serving.serve` / ``sweep`` shared by both commands."""
    sched = SchedulerConfig(policy=args.policy, max_seqs=args.max_seqs, max_batched_tokens=args.max_batched_tokens,
                            chunk_tokens=args.chunk_tokens, kv_capacity_tokens=args.kv_capacity_tokens,
                            kv_block_tokens=args.kv_block_tokens, replicas=args.replicas,
                            prefill_replicas=args.prefill_replicas,
                            kv_transfer_ns_per_token=args.kv_transfer_us_per_token * 1e3, router=args.router)
    dit = DitOptions(steps=args.steps, resolution=args.resolution, frames=args.frames, batch=args.batch, cfg=args.cfg)
    return {"scheduler": sched, "dit": dit, "slo_ttft_ms": args.slo_ttft_ms, "slo_tpot_ms": args.slo_tpot_ms,
            "iterations_log": args.iterations_log, "unprofiled_log": args.unprofiled_log,
            "baseline": not args.no_baseline}


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))


def run(args: argparse.Namespace) -> int:
    doc = serve(args.path, args.scenario, workload(args), requests=args.requests, **options(args))
    if args.json:
        write_json(args.json, doc)
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
