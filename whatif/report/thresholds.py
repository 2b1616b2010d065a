"""``--fail-if`` expressions: a tiny, safe language parsed with :mod:`ast` (never evaluated).

An expression is a *failure condition*: the check fails when it holds. Allowed: metric names
(``step_ms``: the baseline), metric calls naming a scenario (``speedup(fuse)``, names may hold
spaces: ``speedup(fused and bf16)``), numbers, percentages (``5%`` = 0.05), ``+ - * /``,
comparisons (chains too) and ``and``/``or``/``not``.

>>> from whatif.documents import BaselinePrediction, PredictionDocument, ScenarioPrediction
>>> doc = PredictionDocument(source="t", device=None,
...     baseline=BaselinePrediction(mean_step_ns=10_000_000, steps=[], critical_path=[]),
...     scenarios=[ScenarioPrediction(name="fuse", source=None, transforms=[], mean_step_ns=8_000_000, speedup=1.25,
...                                   steps=[], waterfall=[], changes=[], critical_path=[])])
>>> r = evaluate("speedup(fuse) < 1.10", doc)
>>> r.failed, r.values
(False, {'speedup(fuse)': 1.25})
>>> evaluate("step_ms > 0.9 * step_ms(fuse)", doc).failed
True
>>> try:
...     parse("__import__('os').system('ls') > 0")
... except ThresholdError as exc:
...     print(str(exc).split(" (")[0])
"__import__('os').system('ls') > 0": this call is not allowed
"""
from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from whatif.core.errors import WhatifError
from whatif.documents import (
    BaselinePrediction,
    BaselineStep,
    PredictionDocument,
    RowServing,
    ScenarioPrediction,
    ScenarioStep,
    Stat,
    counted,
)


class ThresholdError(WhatifError):
    """A threshold expression that cannot be parsed or evaluated (a usage error: exit 2)."""


Entry = BaselinePrediction | ScenarioPrediction  # a row of a whatif.prediction document


def _step_pct(q: float) -> Callable[[Entry], float | None]:
    def get(e: Entry) -> float | None:
        ns = [s.predicted_ns for s in _steps(e)]
        return float(np.percentile(ns, q)) / 1e6 if ns else None
    return get


def _serving(key: Literal["ttft_ms", "tpot_ms"], stat: Stat) -> Callable[[Entry], float | None]:
    def get(e: Entry) -> float | None:
        stats = e.serving.stats(key) if isinstance(e.serving, RowServing) else None
        value = stats.get(stat) if stats is not None else None
        return None if value is None else float(value)
    return get


def _steps(e: Entry) -> list[BaselineStep | ScenarioStep]:
    """The steps that count in the mean (warm-up and partial steps left out, as ``mean_step_ns``
    leaves them out; all when none counts)."""
    steps: list[BaselineStep | ScenarioStep] = list(e.steps)
    return counted(steps)


def _baseline_steps(e: Entry) -> list[BaselineStep]:
    return e.steps if isinstance(e, BaselinePrediction) else []


def _replay_error(e: Entry) -> float | None:
    """Over every step, warm-up and partial ones too: replay fidelity, as the analysis document's
    ``fidelity``, not a step statistic."""
    errs = [abs(s.predicted_ns / s.measured_ns - 1) for s in _baseline_steps(e) if s.measured_ns]
    return max(errs) if errs else None


def _measured(e: Entry) -> float | None:
    ns = [s.measured_ns for s in counted(_baseline_steps(e))]
    return float(np.mean(ns)) / 1e6 if ns else None


@dataclass(frozen=True)
class Metric:
    help: str
    get: Callable[[Entry], float | None]
    scope: str = "any"  # "any": bare = baseline; "scenario": bare = the only scenario; "baseline": no argument


METRICS: dict[str, Metric] = {
    "step_ms": Metric("mean predicted step time, ms", lambda e: e.mean_step_ns / 1e6),
    "mean_step_ms": Metric("same as step_ms", lambda e: e.mean_step_ns / 1e6),
    "p50_step_ms": Metric("median predicted step time, ms (steps that count in the mean)", _step_pct(50)),
    "p90_step_ms": Metric("90th percentile predicted step time, ms (steps that count in the mean)", _step_pct(90)),
    "max_step_ms": Metric("longest predicted step, ms (steps that count in the mean)", _step_pct(100)),
    "speedup": Metric("baseline time / scenario time (> 1 is faster)", lambda e: e.speedup, "scenario"),
    "measured_step_ms": Metric("mean measured step time of the trace, ms (steps that count in the mean)",
                               _measured, "baseline"),
    "replay_error": Metric("worst |replayed / measured - 1| over the trace's steps (warm-up and partial too)",
                           _replay_error, "baseline"),
    "ttft_ms": Metric("mean time to first token, ms (needs serving metrics)", _serving("ttft_ms", "mean")),
    "p99_ttft_ms": Metric("99th percentile TTFT, ms (needs serving metrics)", _serving("ttft_ms", "p99")),
    "tpot_ms": Metric("mean time per output token, ms (needs serving metrics)", _serving("tpot_ms", "mean")),
    "p99_tpot_ms": Metric("99th percentile TPOT, ms (needs serving metrics)", _serving("tpot_ms", "p99")),
}

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_CMPOPS = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
           ast.Eq: operator.eq, ast.NotEq: operator.ne}
_CALL = re.compile(r"\b([A-Za-z_]\w*)\(\s*([^()'\"]*?)\s*\)")
_PERCENT = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*%")


@dataclass(frozen=True)
class Threshold:
    """A parsed ``--fail-if`` expression."""

    text: str
    tree: ast.Expression = field(repr=False, compare=False)


@dataclass
class CheckResult:
    """One check: ``failed`` is None when it was skipped; ``values`` are the metrics it read."""

    kind: Literal["threshold", "regression"]
    name: str
    failed: bool | None
    values: dict[str, float] = field(default_factory=dict)
    message: str = ""


def _check_node(node: ast.AST, text: str) -> None:
    def bad(what: str) -> ThresholdError:
        return ThresholdError(f"{text!r}: {what} is not allowed (use metrics, metric(scenario), numbers, "
                              f"+ - * /, comparisons, and/or/not)")

    if isinstance(node, ast.Expression):
        _check_node(node.body, text)
    elif isinstance(node, ast.Compare):
        if not all(type(op) in _CMPOPS for op in node.ops):
            raise bad("this comparison")
        for child in (node.left, *node.comparators):
            _check_node(child, text)
    elif isinstance(node, ast.BoolOp):
        for child in node.values:
            _check_node(child, text)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub, ast.UAdd)):
        _check_node(node.operand, text)
    elif isinstance(node, ast.BinOp):
        if type(node.op) not in _BINOPS:
            raise bad(f"operator {type(node.op).__name__}")
        _check_node(node.left, text)
        _check_node(node.right, text)
    elif isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise bad(f"the constant {node.value!r}")
    elif isinstance(node, ast.Name):
        _metric(node.id, text)
    elif isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.keywords or len(node.args) != 1 \
                or not isinstance(node.args[0], ast.Constant) or not isinstance(node.args[0].value, str):
            raise bad("this call")
        metric = _metric(node.func.id, text)
        if metric.scope == "baseline":
            raise ThresholdError(f"{text!r}: {node.func.id} is a property of the trace; write it without a scenario")
    else:
        raise bad(type(node).__name__)


def _metric(name: str, text: str) -> Metric:
    if name not in METRICS:
        raise ThresholdError(f"{text!r}: {name} is not a metric (metrics: {', '.join(METRICS)})")
    return METRICS[name]


def parse(text: str) -> Threshold:
    """Parse and validate one expression; raises :class:`ThresholdError` naming it."""
    source = _PERCENT.sub(r"(\1/100)", _CALL.sub(lambda m: f"{m.group(1)}({m.group(2)!r})", text.strip()))
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError:
        raise ThresholdError(f"{text!r}: not a valid expression (e.g. \"speedup(fuse) < 1.1\")") from None
    _check_node(tree, text)
    if not isinstance(tree.body, (ast.Compare, ast.BoolOp)) and not (
            isinstance(tree.body, ast.UnaryOp) and isinstance(tree.body.op, ast.Not)):
        raise ThresholdError(f"{text!r}: must be a comparison, e.g. \"{text.strip()} < 1.1\"")
    return Threshold(text=text.strip(), tree=tree)


def _entry(doc: PredictionDocument, metric: str, scenario: str | None, text: str) -> tuple[str, Entry]:
    names = [s.name for s in doc.scenarios]
    if scenario is None:
        if METRICS[metric].scope != "scenario":
            return metric, doc.baseline
        if len(names) != 1:
            raise ThresholdError(f"{text!r}: {metric} needs a scenario name, "
                                 f"e.g. {metric}({names[0] if names else 'fuse'})")
        scenario = names[0]
    if scenario == "baseline":
        return f"{metric}(baseline)", doc.baseline
    for s in doc.scenarios:
        if s.name == scenario:
            return f"{metric}({scenario})", s
    by_stem = [s for s in doc.scenarios if s.source and Path(s.source).stem == scenario]
    if len(by_stem) == 1:   # the scenario's file name without .toml, as in `-s scenarios/fuse.toml`
        return f"{metric}({scenario})", by_stem[0]
    raise ThresholdError(f"{text!r}: unknown scenario {scenario!r} (scenarios: {', '.join(names) or 'none'}; "
                         "a scenario file's stem works too)")


def evaluate(threshold: Threshold | str, doc: PredictionDocument) -> CheckResult:
    """Evaluate against a ``whatif.prediction`` document (baseline entries may carry ``serving``)."""
    th = parse(threshold) if isinstance(threshold, str) else threshold
    values: dict[str, float] = {}

    def value(metric: str, scenario: str | None) -> float:
        label, entry = _entry(doc, metric, scenario, th.text)
        v = METRICS[metric].get(entry)
        if v is None:
            what = "serving metrics (TTFT/TPOT)" if "serving" in METRICS[metric].help else "steps"
            whose = f"the row {entry.name!r} has" if scenario is not None else "the prediction has"
            raise ThresholdError(f"{th.text!r}: {label} is not available: {whose} no {what}")
        values[label] = round(v, 6)
        return v

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Compare):
            left = ev(node.left)
            for op, comp in zip(node.ops, node.comparators):
                right = ev(comp)
                if not _CMPOPS[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.BoolOp):
            results = [bool(ev(v)) for v in node.values]  # evaluate all, so every value is reported
            return all(results) if isinstance(node.op, ast.And) else any(results)
        if isinstance(node, ast.UnaryOp):
            v = ev(node.operand)
            return (not v) if isinstance(node.op, ast.Not) else (-v if isinstance(node.op, ast.USub) else +v)
        if isinstance(node, ast.BinOp):
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise ThresholdError(f"{th.text!r}: division by zero")
            return _BINOPS[type(node.op)](left, right)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return value(node.id, None)
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        return value(node.func.id, node.args[0].value)  # type: ignore[attr-defined]

    failed = bool(ev(th.tree))
    shown = ", ".join(f"{k} = {v:g}" for k, v in values.items())
    return CheckResult(kind="threshold", name=th.text, failed=failed, values=values, message=shown)
