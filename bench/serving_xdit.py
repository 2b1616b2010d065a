"""The xDiT what-if: the baseline FLUX.1 trace (AITER fmha attention) -> AITER + SageAttention,
predicted from the baseline trace alone, against the measured second trace's per-step time.

Both traces (../shared/traces/tracelens/xdit_flux1_*_mi300x.json.gz, MI300X) are torch.compile
capture passes of one denoising step: the xdit adapter finds the step and takes its window as the
HIP graph's replay (what later steps repeat). Per-step time = that window's span, measured and
replayed. Variants, each a scenario of ``scale`` transforms by kernel class on the baseline:

* (a) kernel-speed oracle: attention and GEMM time per step of the second trace over the
  baseline's (:func:`speed_ratios`), written to scenarios/xdit_aiter_sage_oracle.toml;
* (a, every class): the same ratio for every kernel class both traces hold (a diagnostic: what
  swapping every kernel's speed, not only attention and GEMMs, gives);
* (b) published speeds: scenarios/xdit_sage_published.toml (sources cited in it).

  .venv/bin/python bench/serving_xdit.py [--write-docs]
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from whatif.analysis import Analysis, analyze, predict
from whatif.core.kernels import KernelClass
from whatif.predictors.serving.dit_steps import measured_spans, replayed_spans, span_ns
from whatif.predictors.serving.engines import FoundIterations, find_iterations, iteration_of_tasks
from whatif.transforms.generic import Scale
from whatif.transforms.scenario import Scenario, load_scenario
from whatif.transforms.select import Selector

try:
    from common.docs import replace_section
except ImportError:  # run as a module from the repo root
    from bench.common.docs import replace_section

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces" / "tracelens"
BASELINE = TRACES / "xdit_flux1_baseline_mi300x.json.gz"
AFTER = TRACES / "xdit_flux1_aiter_sage_mi300x.json.gz"
ORACLE_TOML = ROOT / "scenarios" / "xdit_aiter_sage_oracle.toml"
PUBLISHED_TOML = ROOT / "scenarios" / "xdit_sage_published.toml"
SWAPPED = (KernelClass.ATTENTION, KernelClass.GEMM)
BEGIN, END = "<!-- bench/serving_xdit.py begin -->", "<!-- bench/serving_xdit.py end -->"


@dataclass
class Steps:
    """A trace's analysis, the denoising steps the adapter found in it, and their mean per-step
    time, measured and replayed (ns)."""

    analysis: Analysis
    found: FoundIterations
    measured_ns: float
    replayed_ns: float


def load_steps(path: Path) -> Steps:
    a = analyze(path)
    found = find_iterations(a.graph, "xdit")
    return Steps(a, found, float(span_ns(measured_spans(a.graph, found)).mean()),
                 float(span_ns(replayed_spans(a.replay, found)).mean()))


def class_time_ns(steps: Steps) -> dict[KernelClass, float]:
    """GPU kernel time per step of each kernel class in the found steps (the classes the
    ``kernel_class`` selection of a scenario sees)."""
    g = steps.analysis.graph
    index = iteration_of_tasks(g, steps.found)
    dur = g.tasks["dur_ns"].to_numpy()
    out = {}
    for cls in KernelClass:
        ids = Selector(kind="kernel", kernel_class=cls.value)(g)
        ids = ids[index[ids] >= 0]
        if len(ids):
            out[cls] = float(dur[ids].sum()) / len(steps.found.iterations)
    return out


def speed_ratios(before: Steps, after: Steps,
                 classes: tuple[KernelClass, ...] | None = None) -> dict[KernelClass, float]:
    """Per kernel class (``classes``, default every class both hold): the second trace's kernel
    time per step over the baseline's (< 1: faster)."""
    b, a = class_time_ns(before), class_time_ns(after)
    keep = classes if classes is not None else tuple(c for c in KernelClass if c in b and c in a)
    return {c: a[c] / b[c] for c in keep if b.get(c) and c in a}


def scale_scenario(name: str, ratios: dict[KernelClass, float]) -> Scenario:
    return Scenario(name=name, transforms=[Scale(select=Selector(kind="kernel", kernel_class=c.value), factor=r)
                                           for c, r in ratios.items()])


def scenario_toml(name: str, ratios: dict[KernelClass, float]) -> str:
    """A scenario file of ``scale`` transforms by kernel class."""
    lines = ["# Written by bench/serving_xdit.py: each kernel class's time per denoising step in",
             f"# {AFTER.name} over {BASELINE.name}.", f'name = "{name}"']
    for c, r in ratios.items():
        lines += ["", "[[transform]]", 'name = "scale"', f"factor = {r:.4f}",
                  f'select = {{ kind = "kernel", kernel_class = "{c.value}" }}']
    return "\n".join(lines) + "\n"


def predicted_step_ns(before: Steps, scenario: Scenario) -> float:
    """Mean replayed per-step time of the baseline's found steps under ``scenario``."""
    result = predict(before.analysis, [scenario]).scenarios[0]
    return float(span_ns(replayed_spans(result.replay, before.found)).mean())


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.2f}"


def _err(pred: float, meas: float) -> str:
    return f"{(pred / meas - 1) * 100:+.1f} %"


def report(before: Steps, after: Steps) -> str:
    oracle = speed_ratios(before, after, SWAPPED)
    attention = {KernelClass.ATTENTION: oracle[KernelClass.ATTENTION]}
    every = speed_ratios(before, after)
    variants = [("no change (baseline's own step)", before.replayed_ns, "—"),
                ("(a) kernel-speed oracle: attention + GEMM",
                 predicted_step_ns(before, scale_scenario("oracle", oracle)),
                 ", ".join(f"{c.value} ×{r:.3f}" for c, r in oracle.items())),
                ("(a) oracle, attention only (GEMMs as in the baseline)",
                 predicted_step_ns(before, scale_scenario("attention", attention)),
                 f"attention ×{oracle[KernelClass.ATTENTION]:.3f}"),
                ("(a, every class) diagnostic", predicted_step_ns(before, scale_scenario("every", every)),
                 ", ".join(f"{c.value} ×{r:.3f}" for c, r in every.items())),
                ("(b) published: SageAttention 2.1× (GEMMs unchanged)",
                 predicted_step_ns(before, load_scenario(PUBLISHED_TOML)), "attention ×0.476")]
    rows = ["| trace | steps found | composition | measured per step | replayed per step |", "|---|---|---|---|---|"]
    for label, s in (("baseline", before), ("AITER + SageAttention", after)):
        d = s.found.iterations[0].dit
        rows.append(f"| {label} | {len(s.found.iterations)} | batch {d.model_batch if d else '?'}, "
                    f"{d.tokens if d else '?'} latent + {d.text_tokens if d else '?'} text tokens | "
                    f"{_ms(s.measured_ns)} ms | {_ms(s.replayed_ns)} ms ({_err(s.replayed_ns, s.measured_ns)}) |")
    rows += ["", "| variant (on the baseline trace) | factors | predicted per step | measured (second trace) | error |",
             "|---|---|---|---|---|"]
    rows += [f"| {name} | {factors} | {_ms(p)} ms | {_ms(after.measured_ns)} ms | {_err(p, after.measured_ns)} |"
             for name, p, factors in variants]
    b, a = class_time_ns(before), class_time_ns(after)
    rows += ["", "| kernel class | baseline ms per step | AITER + Sage ms per step |", "|---|---|---|"]
    rows += [f"| {c.value} | {_ms(b.get(c, 0.0))} | {_ms(a.get(c, 0.0))} |" for c in KernelClass if c in b or c in a]
    return "\n".join(rows) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write-docs", action="store_true",
                    help="write the table into docs/serving.md and docs/accuracy.md, and the oracle scenario")
    args = ap.parse_args()
    if not BASELINE.exists() or not AFTER.exists():
        print(f"needs {BASELINE} and {AFTER} (../shared next to the repository)", file=sys.stderr)
        return 2
    before, after = load_steps(BASELINE), load_steps(AFTER)
    text = report(before, after)
    print(text, end="")
    if args.write_docs:
        ORACLE_TOML.write_text(scenario_toml("AITER + SageAttention, kernel-speed oracle",
                                             speed_ratios(before, after, SWAPPED)))
        for doc in ("serving.md", "accuracy.md"):
            replace_section(ROOT / "docs" / doc, BEGIN, END, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
