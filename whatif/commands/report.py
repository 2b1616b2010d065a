"""Predict every scenario on a trace and write a report for CI: Markdown (also appended to
$GITHUB_STEP_SUMMARY when set), JSON (docs/report-schema.md), self-contained HTML, JUnit XML.

--fail-if EXPR fails the run when EXPR holds, e.g. "speedup(fuse) < 1.10", "step_ms > 120",
"replay_error > 1%"; metrics: step_ms, mean_step_ms, p50_step_ms, p90_step_ms, max_step_ms,
speedup, measured_step_ms, replay_error, ttft_ms, p99_ttft_ms, tpot_ms, p99_tpot_ms; a bare
metric is the baseline's (speedup: the only scenario's), metric(NAME) a scenario's. TTFT/TPOT
come from --serving (the JSON of 'whatif serve' run with the same scenarios).

Exit codes: 0 all checks passed, 1 a check failed (one line per failure on stderr), 2 bad
input or usage (one line)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from whatif.api import analyze, predict
from whatif.core.output import refuse_overwrite
from whatif.ops import ops_table
from whatif.predictors.cost_models import CostConfig
from whatif.predictors.steps import StepOptions
from whatif.report.api import FILE_NAMES, FORMATS, parse_formats, parse_percent, write_report
from whatif.report.document import load_report, load_serving
from whatif.report.thresholds import parse
from whatif.suggest import suggest
from whatif.transforms.scenario import check_distinct_names, load_scenario

from ._dataclass_args import from_args
from ._progress import working
from ._trace_scenarios import add_trace_and_scenarios


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_trace_and_scenarios(parser)
    parser.add_argument("-o", "--output", "--out", dest="out", type=Path, default=Path("whatif-report"),
                        metavar="DIR", help="output folder (default whatif-report/)")
    parser.add_argument("-f", "--force", action="store_true", help="overwrite the report files already in DIR")
    parser.add_argument("--format", default=",".join(FORMATS), metavar="LIST",
                        help=f"comma-separated formats among {','.join(FORMATS)} (default all)")
    parser.add_argument("--fail-if", action="append", default=[], metavar="EXPR",
                        help="fail (exit 1) when EXPR holds, e.g. \"speedup(fuse) < 1.10\" (repeatable)")
    parser.add_argument("--baseline", type=Path, metavar="REPORT.json", help="an earlier report.json to compare with")
    parser.add_argument("--max-regression", metavar="PCT",
                        help="fail when a mean step time grew by more than PCT (e.g. 5%%) over --baseline")
    parser.add_argument("--serving", type=Path, metavar="SERVING.json",
                        help="TTFT/TPOT per scenario from 'whatif serve --json' run with the same scenarios")
    parser.add_argument("--suggest", action="store_true",
                        help="also rank every optimization whatif knows on the trace (whatif suggest) under "
                             "'What to try next'")
    parser.add_argument("--ops", action="store_true",
                        help="also show where the baseline's GPU time goes per op, on the roofline (whatif ops)")
    parser.add_argument("--no-step-summary", action="store_true", help="do not append to $GITHUB_STEP_SUMMARY")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only failures")


def run(args: argparse.Namespace) -> int:
    # every usage error before the slow part
    formats = parse_formats(args.format)
    refuse_overwrite([args.out / FILE_NAMES[f] for f in formats], args.force)
    thresholds = [parse(t) for t in args.fail_if]
    limit = None if args.max_regression is None else parse_percent(args.max_regression)
    if limit is not None and args.baseline is None:
        print("whatif: --max-regression needs --baseline REPORT.json", file=sys.stderr)
        return 2
    if args.baseline:
        load_report(args.baseline)
    if args.serving:
        load_serving(args.serving)   # a usage error before the slow part; its trace is checked with the report
    cost = from_args(CostConfig, args)
    scenarios = [load_scenario(p) for p in args.scenario]
    check_distinct_names(scenarios)
    with working(f"whatif report: predicting {len(scenarios)} scenario(s) on {args.path}", args.quiet) as status:
        prediction = predict(analyze(args.path, from_args(StepOptions, args)), scenarios, cost_model=cost.cost_model)
        suggestions = suggest(prediction.baseline, cost_model=cost.cost_model,
                              progress=lambda what: status(f"whatif report: suggest: {what}")) if args.suggest else None
        ops = ops_table(prediction.baseline.trace) if args.ops else None
    report = write_report(prediction, args.out, formats, thresholds, args.baseline, limit,
                          step_summary=not args.no_step_summary, serving=args.serving, suggestions=suggestions, ops=ops)
    if not args.quiet:
        for row in report.document.rows:
            print(f"{row.name}: {row.mean_step_ns / 1e6:,.3f} ms, {row.speedup:.3f}x")
        for _fmt, path in report.files.items():
            print(f"wrote {path}")
    for line in report.failures:
        print(f"whatif: check failed: {line}", file=sys.stderr)
    return 0 if report.passed else 1
