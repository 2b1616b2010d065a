"""Server-side state: the loaded runs and their analyses, scenarios and predictions.

Everything heavy (graphs, replays, 100 k-task timelines) stays in this process, keyed by run
id; the browser only holds run ids and small scenario specs. Analyses are computed on first
use, once per run (a lock per run), and predictions are kept in a small LRU per run. Documents
(means, phase tables, charts, serving fits) depend on which steps count
(:class:`~whatif.core.steps.StepOptions`, the "count warm-up and partial steps" box): they are
cached per options; graphs and replays are shared.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from whatif.analysis import scenario_cost_model
from whatif.api import (
    Analysis,
    Prediction,
    ScenarioResult,
    analyze,
    make_context,
    predict,
)
from whatif.core.steps import COUNT_DEFAULT, StepOptions
from whatif.documents import (
    AnalysisDocument,
    BaselinePrediction,
    PredictionDocument,
    ScenarioHeadline,
    ScenarioPrediction,
    ServingDocument,
    SweepDocument,
)
from whatif.predictors.cost_models import COST_MODELS, CostModelName
from whatif.predictors.serving.logs import find_log
from whatif.serving import Workload, fit_serving, serve, sweep
from whatif.summary import analysis_document, baseline_document, prediction_document, scenario_headline
from whatif.tracer.kinds import GPU_ACTIVITY_KINDS, codes
from whatif.tracer.readers import accepted, is_trace_file, run_meta_path
from whatif.transforms.base import TransformContext
from whatif.transforms.scenario import Scenario, scenario_from_dict

from .guard import PathGuard
from .jobs import Jobs, Pending

RANK_FILE = re.compile(r"rank[-_]?\d+", re.IGNORECASE)
MAX_PREDICTIONS = 8  # per run
# Traces parsed at once, whatever the number of request threads: a burst of requests for many runs
# waits for a slot instead of holding every trace in memory together.
ANALYSIS_SLOTS = threading.BoundedSemaphore(max(1, min(4, (os.cpu_count() or 2) // 2)))


def discover(path: Path) -> list[Path]:
    """The runs at ``path``: a trace file (by its name: :func:`~whatif.tracer.readers.is_trace_file`;
    another file is none); a run folder (its metadata file or ``rank<k>`` files) or a
    folder of per-rank files; otherwise each trace file and each run folder inside it."""
    if path.is_file():
        return [path] if is_trace_file(path) else []
    if not path.is_dir():
        return []
    traces = sorted(p for p in path.iterdir() if is_trace_file(p))
    if run_meta_path(path) is not None or (traces and all(RANK_FILE.search(p.name) for p in traces)):
        return [path]
    runs = list(traces)
    for sub in sorted(p for p in path.iterdir() if p.is_dir()):
        inner = [p for p in sub.iterdir() if is_trace_file(p)]
        if run_meta_path(sub) is not None or (inner and all(RANK_FILE.search(p.name) for p in inner)):
            runs.append(sub)
    return runs


def spec_key(spec: dict[str, Any]) -> str:
    """A canonical key of a scenario spec (``{"name":…, "transform": […]}``)."""
    return json.dumps(spec, sort_keys=True, default=str)


@dataclass
class Run:
    """One loaded run: its source, and (once computed) its analysis and derived data."""

    id: str
    path: Path | None
    label: str
    _analysis: Analysis | None = None
    error: str | None = None
    scenarios: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> spec
    _docs_by_options: dict[StepOptions, AnalysisDocument] = field(default_factory=dict)
    _contexts: dict[tuple[Enum, tuple[tuple, ...]], TransformContext] = field(default_factory=dict)
    _baseline_docs: dict[StepOptions, BaselinePrediction] = field(default_factory=dict)
    _results: OrderedDict[tuple[str, StepOptions], ScenarioResult] = field(default_factory=OrderedDict)
    _docs: dict[tuple[str, StepOptions], ScenarioPrediction] = field(default_factory=dict)
    cache: dict[Hashable, Any] = field(default_factory=dict)  # derived views (timeline arrays, phase table…)
    lock: threading.RLock = field(default_factory=threading.RLock)

    @property
    def loaded(self) -> bool:
        return self._analysis is not None

    @property
    def analysis(self) -> Analysis:
        """The analysis, computed on first use (raises the reader's error, also kept, in one line, in
        ``error``)."""
        with self.lock:
            if self._analysis is None:
                if self.path is None:
                    raise RuntimeError(f"run {self.id} has no source")
                try:
                    with ANALYSIS_SLOTS:
                        self._analysis = analyze(self.path)
                except Exception as exc:
                    self.error = " ".join(str(exc).split())  # one line, for the Runs table's status
                    raise
                self.error = None
            return self._analysis

    def analysis_for(self, options: StepOptions = COUNT_DEFAULT) -> Analysis:
        """The analysis counting the steps ``options`` selects (graph and replay shared)."""
        return self.analysis.with_options(options)

    def document(self, options: StepOptions = COUNT_DEFAULT) -> AnalysisDocument:
        """The ``whatif.analysis`` document (the one ``whatif analyze --json`` writes with these
        ``--include-*`` options), cached per options."""
        with self.lock:
            if options not in self._docs_by_options:
                self._docs_by_options[options] = analysis_document(self.analysis_for(options))
            return self._docs_by_options[options]

    @property
    def doc(self) -> AnalysisDocument:
        """The ``whatif.analysis`` document of the default steps."""
        return self.document()

    def summary(self) -> dict[str, Any]:
        """One row of the Runs table (without forcing an analysis)."""
        row: dict[str, Any] = {"id": self.id, "run": self.label, "path": str(self.path or ""),
                               "status": f"error: {self.error}" if self.error
                               else ("loaded" if self.loaded else "not loaded")}
        if self.loaded:
            a = self._analysis
            assert a is not None
            row.update(device=self.device, ranks=len(a.trace.ranks), steps=len(a.steps), tasks=a.graph.num_tasks)
        return row

    @property
    def device(self) -> str:
        """What ran the run (analysed first): its ranks' GPU names, "GPU unknown" for a rank whose
        trace has GPU activity (kernels, copies, memsets) but names no GPU, "CPU only" for a rank
        without any."""
        with self.lock:
            if "device" not in self.cache:
                trace = self.analysis.trace
                ev = trace.events
                busy = set(ev["rank"].to_numpy()[np.isin(ev["kind"].to_numpy(), codes(GPU_ACTIVITY_KINDS))].tolist())
                self.cache["device"] = ", ".join(sorted({r.gpu_name or ("GPU unknown" if r.rank in busy else "CPU only")
                                                         for r in trace.ranks}))
            return str(self.cache["device"])

    def context(self, cost_model: str | Enum = CostModelName.TRACE,
                collective_points: tuple[tuple, ...] = ()) -> TransformContext:
        """The transform context of this run priced by ``cost_model`` and calibrated on the measured
        ``collective_points`` too (built once per pair)."""
        key = (COST_MODELS.key(cost_model), collective_points)
        with self.lock:
            if key not in self._contexts:
                self._contexts[key] = make_context(self.analysis.trace, *key)
            return self._contexts[key]

    def scenario(self, spec: dict[str, Any]) -> Scenario:
        return scenario_from_dict(spec, source=f"<{spec.get('name', 'scenario')}>",
                                  default_name=str(spec.get("name") or "scenario"))

    def result(self, spec: dict[str, Any], options: StepOptions = COUNT_DEFAULT) -> ScenarioResult:
        """The prediction of a scenario spec on this run, its steps counted under ``options``
        (cached, LRU of :data:`MAX_PREDICTIONS`; other options share the default's graphs)."""
        key = (spec_key(spec), options)
        with self.lock:
            if key in self._results:
                self._results.move_to_end(key)
                return self._results[key]
            if options != COUNT_DEFAULT:
                res = replace(self.result(spec), options=options)
            else:
                scenario = self.scenario(spec)
                pred = predict(self.analysis, [scenario],
                               self.context(scenario_cost_model(scenario), scenario.collective_points))
                res = pred.scenarios[0]
            self._results[key] = res
            while len(self._results) > MAX_PREDICTIONS:
                old, _ = self._results.popitem(last=False)
                self._docs.pop(old, None)
            return res

    def quick_document(self, spec: dict[str, Any], options: StepOptions = COUNT_DEFAULT) -> ScenarioHeadline:
        """Headline numbers of a scenario (speedup, per-transform waterfall, change log) without the
        per-step critical paths, which take seconds on 100 k-task graphs (:func:`whatif.summary.scenario_headline`,
        the numbers the prediction document carries)."""
        return scenario_headline(self.analysis_for(options), self.result(spec, options))

    @property
    def serving_log(self) -> Path | None:
        """The serving log `whatif serve` would use for this run (see ``find_log``), if any."""
        return find_log(self.path) if self.path is not None else None

    def serving(self, specs: list[dict[str, Any]], workload: Workload, rates: list[float],
                options: StepOptions = COUNT_DEFAULT) -> tuple[ServingDocument, SweepDocument]:
        """The ``whatif serve`` and ``whatif sweep`` documents of the baseline and ``specs`` under
        ``workload`` (iteration models fitted once per scenario set and steps counted; documents
        cached per workload)."""
        log_path = self.serving_log
        if log_path is None:
            raise FileNotFoundError(f"{self.label}: no serving log for this run")
        keys = tuple(spec_key(s) for s in specs)
        with self.lock:
            docs_key = ("serving", keys, options, repr(workload), tuple(rates))
            if docs_key not in self.cache:
                models_key = ("serving-models", keys, options)
                if models_key not in self.cache:
                    self.cache[models_key] = fit_serving(self.analysis_for(options),
                                                         [self.result(s, options) for s in specs],
                                                         iterations_log=log_path)
                models = self.cache[models_key]
                self.cache[docs_key] = (serve(models, workload=workload), sweep(models, rates, workload=workload))
            return self.cache[docs_key]  # type: ignore[no-any-return]

    def prediction(self, specs: list[dict[str, Any]], options: StepOptions = COUNT_DEFAULT) -> PredictionDocument:
        """The ``whatif.prediction`` document of several scenario specs (each scenario cached), steps
        counted under ``options``."""
        with self.lock:
            analysis = self.analysis_for(options)
            if options not in self._baseline_docs:
                self._baseline_docs[options] = baseline_document(analysis)
            baseline = self._baseline_docs[options]
            scenarios = []
            for spec in specs:
                key = (spec_key(spec), options)
                if key not in self._docs:
                    doc = prediction_document(Prediction(baseline=analysis, scenarios=[self.result(spec, options)]),
                                              baseline)
                    self._docs[key] = doc.scenarios[0]
                scenarios.append(self._docs[key])
            base = prediction_document(Prediction(baseline=analysis, scenarios=[]), baseline)
            return msgspec.structs.replace(base, scenarios=scenarios)


def step_options(count_all: Sequence[str] | None) -> StepOptions:
    """The :class:`StepOptions` of the "count warm-up and partial steps" box (its value: the
    checked items)."""
    return StepOptions(include_warmup=True, include_partial=True) if count_all else COUNT_DEFAULT


class RunStore:
    """All runs of one dashboard, the path guard, and the upload folder."""

    def __init__(self, paths: Sequence[str | Path] = (), upload_dir: str | Path | None = None,
                 max_upload_bytes: int = 200 * 1024 * 1024) -> None:
        self._owns_upload_dir = upload_dir is None
        self.upload_dir = Path(upload_dir or tempfile.mkdtemp(prefix="whatif-dashboard-")).resolve()
        self.upload_dir.mkdir(parents=True, exist_ok=True)
        if self._owns_upload_dir:
            atexit.register(self.close)
        self.guard = PathGuard.for_paths(paths, extra=[self.upload_dir])
        self.max_upload_bytes = max_upload_bytes
        self.runs: dict[str, Run] = {}
        self.jobs = Jobs()
        """Heavy work of this dashboard's callbacks (analyses, breakdowns, suggestions), off the request threads."""
        self._lock = threading.Lock()
        for p in paths:
            self.add_path(p)

    def add_path(self, path: str | Path) -> list[Run]:
        """Add the runs at ``path`` (must lie inside the allowed folders; a file must be named as a
        trace: :func:`~whatif.tracer.readers.accepted`)."""
        resolved = self.guard.check(path)
        if not resolved.exists():
            raise FileNotFoundError(f"{path}: no such file or folder")
        if resolved.is_file() and not is_trace_file(resolved):
            raise ValueError(f"{path}: not a trace file (accepted: {accepted()})")
        found = discover(resolved)
        if not found:
            raise ValueError(f"{path}: no trace files ({accepted()}) or run folders here")
        return [self._add(p) for p in found]

    def _add(self, path: Path) -> Run:
        rid = hashlib.sha1(str(path).encode()).hexdigest()[:8]
        with self._lock:
            if rid not in self.runs:
                self.runs[rid] = Run(id=rid, path=path, label=self._label(path))
            return self.runs[rid]

    def _label(self, path: Path) -> str:
        """The run menu's name of ``path``: its folder and name, an upload its name only (its folder
        is a content hash), with " (2)", " (3)"… after a name another run has."""
        if path.parent.parent == self.upload_dir or path.parent.name in ("", "/"):
            name = path.name
        else:
            name = f"{path.parent.name}/{path.name}"
        taken = {r.label for r in self.runs.values()}
        label, k = name, 2
        while label in taken:
            label, k = f"{name} ({k})", k + 1
        return label

    def add_analysis(self, label: str, analysis: Analysis) -> Run:
        """Add an analysis built in Python (benchmarks, notebooks): no file behind it."""
        rid = hashlib.sha1(f"mem:{label}".encode()).hexdigest()[:8]
        with self._lock:
            self.runs[rid] = Run(id=rid, path=None, label=label, _analysis=analysis)
            return self.runs[rid]

    def analysed(self, run: Run) -> Analysis | Pending:
        """``run``'s analysis, or :class:`~whatif.dashboard.jobs.Pending` while one of this store's
        jobs parses and analyses its trace (raises the reader's error once it failed)."""
        return run.analysis if run.loaded else self.jobs.result(("analysis", run.id), lambda: run.analysis)

    def start_analysis(self, run: Run) -> None:
        """Start analysing ``run`` in a job unless it is analysed or the job was started; raises
        nothing: a failure is kept in ``run.error`` (the Runs table's status)."""
        if not run.loaded:
            self.jobs.start(("analysis", run.id), lambda: run.analysis)

    def get(self, run_id: str | None) -> Run:
        if not run_id or run_id not in self.runs:
            raise KeyError("no run selected: pick one in the run menu, or add one on the Runs page")
        return self.runs[run_id]

    def options(self) -> list[dict[str, str]]:
        return [{"label": r.label, "value": r.id} for r in self.runs.values()]

    def close(self) -> None:
        """Remove the upload folder this store made (not one it was given), start no more jobs;
        called on exit."""
        self.jobs.close()
        if self._owns_upload_dir:
            shutil.rmtree(self.upload_dir, ignore_errors=True)


_STORE: RunStore | None = None


def set_store(store: RunStore) -> None:
    global _STORE
    _STORE = store


def get_store() -> RunStore:
    """The store of the running dashboard (page layouts are module functions, so they look it up)."""
    if _STORE is None:
        raise RuntimeError("the dashboard has no run store (use whatif.dashboard.create_app)")
    return _STORE
