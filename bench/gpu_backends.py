"""Both recording backends on one GPU: each program of ``sample_traces/gpu/backends`` recorded by
``whatif record`` (Kineto, ``-torch``) and ``whatif record --backend cupti`` (``-cupti``), on the
H200 of the first GPU harvest (``bench/gpu_harvest/run.py``; environment in
``sample_traces/gpu/manifest.json``). Per program it prints:

1. kernels: the multiset of kernel names per step and in total, same or not (names as the reader
   normalizes them, ``tracer/names.py``), and the steps whose multisets differ;
2. kernel time: per kernel name, the ratio of total GPU time cupti / torch (median, 10th-90th
   percentile and extremes over the names) and the ratio of all kernel time;
3. launch links: the fraction of kernels whose correlation id matches a runtime/driver call, and
   of kernels with an ``External id`` (Kineto: the launching operator's; cupti: the innermost
   ``record_function`` or step range pushed on the launching thread);
4. steps: how many, their numbers, which count, and the measured step time (mean and median of
   the counted steps) in each trace;
5. CPU calls: runtime and driver calls in each trace, and how many are calls the converter now
   leaves out as Kineto does (``cupti_records.is_noise_call``): the committed cupti recordings
   were converted before, so they carry them all.

The two recordings are separate runs of the program, so kernel durations differ by run-to-run
noise; step times also differ by each backend's own overhead (Kineto records every CPU operator).
Prints figures measured in one run; a few seconds.

    .venv/bin/python bench/gpu_backends.py
"""
from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from whatif.depgraph.build import build_graph
from whatif.depgraph.graph import TaskGraph, TaskKind
from whatif.predictors.steps import counted_steps, measured_step_ns
from whatif.tracer import EventKind, load_trace
from whatif.tracer.record.cupti_records import KIND_DRIVER, KIND_RUNTIME, is_noise_call

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ROOT / "sample_traces" / "gpu" / "backends"
PROGRAMS = ("train", "llm_serve", "dit_serve")
SIDES = ("torch", "cupti")


@dataclass(frozen=True)
class Recording:
    """What one backend's trace of a program shows."""

    kernels_per_step: dict[int, Counter[str]]
    kernel_ns_per_name: dict[str, int]
    kernels: int
    kernels_launched: int
    kernels_with_external_id: int
    steps: tuple[int, ...]
    counted: tuple[int, ...]
    step_ms: dict[int, float]
    runtime_calls: int
    driver_calls: int
    noise_calls: int

    @property
    def total_kernels(self) -> Counter[str]:
        return sum(self.kernels_per_step.values(), Counter())

    @property
    def launched_fraction(self) -> float:
        return self.kernels_launched / self.kernels if self.kernels else float("nan")


def read_recording(run: Path) -> Recording:
    """Load a run folder, build its graph and collect the figures compared."""
    trace = load_trace(run)
    graph = build_graph(trace)
    return _recording(graph)


def _recording(graph: TaskGraph) -> Recording:
    ev = graph.trace.events
    kinds = ev["kind"].to_numpy()
    corr = ev["correlation"].to_numpy()
    calls = np.isin(kinds, [int(EventKind.RUNTIME), int(EventKind.DRIVER)])
    names = ev["name"].astype(str).to_numpy()
    cupti_kind = {int(EventKind.RUNTIME): KIND_RUNTIME, int(EventKind.DRIVER): KIND_DRIVER}
    noise = sum(is_noise_call(cupti_kind[int(k)], str(n)) for k, n in zip(kinds[calls], names[calls], strict=True))
    kernel_rows = kinds == int(EventKind.KERNEL)
    launched = np.isin(corr[kernel_rows], corr[calls & (corr > 0)]) & (corr[kernel_rows] > 0)

    tasks = graph.tasks[graph.tasks["kind"] == int(TaskKind.KERNEL)]
    per_step: dict[int, Counter[str]] = {}
    for step, names in tasks.groupby("step")["name"]:
        per_step[int(step)] = Counter(str(n) for n in names)
    ns = tasks.groupby("name")["dur_ns"].sum()
    steps = graph.steps
    step_ns = measured_step_ns(graph)
    counted = counted_steps(graph)
    return Recording(kernels_per_step=per_step, kernel_ns_per_name={str(k): int(v) for k, v in ns.items()},
                     kernels=int(kernel_rows.sum()), kernels_launched=int(launched.sum()),
                     kernels_with_external_id=int((ev["external_id"].to_numpy()[kernel_rows] > 0).sum()),
                     steps=tuple(int(s) for s in steps["step"]),
                     counted=tuple(int(s) for s, c in zip(steps["step"], counted, strict=True) if c),
                     step_ms={int(s): float(t) / 1e6 for s, t in zip(steps["step"], step_ns, strict=True)},
                     runtime_calls=int((kinds == int(EventKind.RUNTIME)).sum()),
                     driver_calls=int((kinds == int(EventKind.DRIVER)).sum()), noise_calls=int(noise))


def differing_steps(a: Recording, b: Recording) -> list[int]:
    """Steps (of either recording) whose kernel-name multisets differ."""
    steps = sorted(set(a.kernels_per_step) | set(b.kernels_per_step))
    return [s for s in steps if a.kernels_per_step.get(s, Counter()) != b.kernels_per_step.get(s, Counter())]


def duration_ratios(torch_rec: Recording, cupti_rec: Recording) -> np.ndarray:
    """Per kernel name found in both: total GPU time under cupti / under torch."""
    names = sorted(set(torch_rec.kernel_ns_per_name) & set(cupti_rec.kernel_ns_per_name))
    return np.array([cupti_rec.kernel_ns_per_name[n] / torch_rec.kernel_ns_per_name[n] for n in names
                     if torch_rec.kernel_ns_per_name[n] > 0], dtype=float)


def _counted_ms(rec: Recording) -> np.ndarray:
    return np.array([rec.step_ms[s] for s in rec.counted], dtype=float)


def report(program: str, torch_rec: Recording, cupti_rec: Recording) -> list[str]:
    """The printed lines for one program."""
    diff = differing_steps(torch_rec, cupti_rec)
    ratios = duration_ratios(torch_rec, cupti_rec)
    total_t = sum(torch_rec.kernel_ns_per_name.values())
    total_c = sum(cupti_rec.kernel_ns_per_name.values())
    lines = [f"== {program}",
             f"kernels: torch {torch_rec.kernels}, cupti {cupti_rec.kernels}; distinct names "
             f"{len(torch_rec.kernel_ns_per_name)} / {len(cupti_rec.kernel_ns_per_name)}; "
             f"total multiset same: {torch_rec.total_kernels == cupti_rec.total_kernels}; "
             f"steps with different multisets: {diff if diff else 'none'}"]
    if len(ratios):
        p10, p50, p90 = np.percentile(ratios, [10, 50, 90])
        lines.append(f"kernel time cupti/torch over {len(ratios)} names: median {p50:.3f}, p10-p90 "
                     f"{p10:.3f}-{p90:.3f}, min {ratios.min():.3f}, max {ratios.max():.3f}; all kernels "
                     f"{total_c / total_t:.3f} ({total_t / 1e6:.3f} ms torch, {total_c / 1e6:.3f} ms cupti)")
    lines.append(f"kernels with a launch call: torch {torch_rec.launched_fraction:.3f}, "
                 f"cupti {cupti_rec.launched_fraction:.3f}; with an External id: torch "
                 f"{torch_rec.kernels_with_external_id / torch_rec.kernels:.3f}, cupti "
                 f"{cupti_rec.kernels_with_external_id / cupti_rec.kernels:.3f}")
    for side, rec in (("torch", torch_rec), ("cupti", cupti_rec)):
        ms = _counted_ms(rec)
        first = rec.steps[0] if rec.steps else None
        lines.append(f"{side}: {len(rec.steps)} steps {rec.steps[0]}..{rec.steps[-1]}, counted {len(rec.counted)}; "
                     f"step ms mean {ms.mean():.3f}, median {np.median(ms):.3f} (min {ms.min():.3f}, "
                     f"max {ms.max():.3f}); step {first} {rec.step_ms[first]:.1f} ms; "
                     f"runtime calls {rec.runtime_calls}, driver calls {rec.driver_calls}, of which Kineto's noise "
                     f"{rec.noise_calls} ({rec.noise_calls / max(1, rec.runtime_calls + rec.driver_calls):.1%})")
    return lines


def main() -> int:
    if not BACKENDS.is_dir():
        print(f"no recordings in {BACKENDS}", file=sys.stderr)
        return 2
    for program in PROGRAMS:
        runs = [BACKENDS / f"{program}-{side}" for side in SIDES]
        if not all(r.is_dir() for r in runs):
            print(f"== {program}: missing {[str(r) for r in runs if not r.is_dir()]}")
            continue
        torch_rec, cupti_rec = (read_recording(r) for r in runs)
        print("\n".join(report(program, torch_rec, cupti_rec)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
