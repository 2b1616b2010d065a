"""Try every optimization whatif knows on a trace and rank them: each registered transform whose
needs the trace meets (GPU kernels, a GPU of the catalog, collectives…) is applied alone at its
candidate settings, the graph replayed, and the optimizations ranked by predicted mean-step
speedup, with where each acts and what caps it; transforms not tried are listed with the reason.
Extra scenarios (-s) are ranked with them. See docs/suggest.md."""
from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from whatif.api import analyze
from whatif.documents import SuggestDocument, write_json
from whatif.predictors.cost_models import CostConfig
from whatif.predictors.steps import StepOptions
from whatif.suggest import suggest
from whatif.summary import console
from whatif.transforms.scenario import check_distinct_names, load_scenario

from ._dataclass_args import from_args
from ._progress import working
from ._trace_scenarios import add_trace_and_scenarios
from ._values import positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_trace_and_scenarios(parser, scenario_help="an extra scenario TOML file to rank with the suggestions "
                                                  "(repeatable)")
    parser.add_argument("--top", type=positive_int, default=10, help="suggestions shown (default 10)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the whatif.suggest JSON document")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing (with --json)")


def run(args: argparse.Namespace) -> int:
    cost = from_args(CostConfig, args)
    extra = [load_scenario(p) for p in args.scenario]   # every file checked before the slow part
    check_distinct_names(extra)
    out = console()
    with working(f"whatif suggest: analyzing {args.path}", args.quiet) as status:
        base = analyze(args.path, from_args(StepOptions, args))
        doc = suggest(base, extra, cost_model=cost.cost_model,
                      progress=lambda label: status(f"whatif suggest: predicting {label}"))
    if args.json:
        write_json(args.json, doc)
    if not args.quiet:
        render_suggestions(doc, out, top=args.top)
    return 0


def render_suggestions(doc: SuggestDocument, out: Console, top: int = 10) -> None:
    """The ranked table, then what was not tried and why."""
    out.print(f"whatif suggest: {doc.source} ({doc.device or 'no GPU'}), mean step "
              f"{doc.baseline_mean_step_ns / 1e6:.3f} ms")
    if doc.suggestions:
        t = Table(show_edge=False)
        for col, just in (("#", "right"), ("optimization", "left"), ("speedup", "right"), ("step ms", "right"),
                          ("saved ms", "right"), ("acts on (recorded time)", "left"), ("cap", "left")):
            t.add_column(col, justify=just)  # type: ignore[arg-type]
        for s in doc.suggestions[:top]:
            h = s.headline
            t.add_row(str(s.rank), s.setting, f"{h.speedup:.3f}x", f"{h.mean_step_ns / 1e6:.3f}",
                      f"{s.saved_ns_per_step / 1e6:.3f}", "\n".join(s.where[:2]) or "-",
                      h.cap.reason if h.cap else "-")
        out.print(t)
        hidden = len(doc.suggestions) - top
        if hidden > 0:
            out.print(f"({hidden} more; --top {len(doc.suggestions)} shows all)")
    else:
        out.print("no optimization applies to this trace (see why below)")
    by_reason: dict[str, list[str]] = {}
    for k in doc.skipped:
        by_reason.setdefault(k.reason, []).append(k.transform)
    for reason, names in by_reason.items():
        out.print(f"not tried: {', '.join(names)}: {reason}", highlight=False)
