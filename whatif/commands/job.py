"""A job of many ranks analyzed rank-parallel: its rank files split into groups, each group
read, built and replayed in its own process (or Ray actor), the groups exchanging only their
collectives' arrivals. The replay equals `whatif analyze`'s task for task; each process holds
only its own ranks. Prints the steps measured vs replayed and the time and peak memory of each
stage. See docs/scale.md."""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
from rich.console import Console

from whatif.core.steps import ranks_text
from whatif.documents import Fidelity, JobDocument, JobGroup, StepFidelity, write_json
from whatif.predictors.steps import StepOptions
from whatif.scale.job import Backend, JobReplay, ParallelOptions, replay_job
from whatif.scale.ray_backend import RAY_ADDRESS_ENV, ray_target
from whatif.summary import console, excluded_line, excluded_marks
from whatif.tracer.readers import accepted

from ._dataclass_args import add_dataclass_arguments, from_args
from ._progress import working
from ._tables import print_table
from ._values import positive_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, help=f"folder of per-rank traces or run folder ({accepted()})")
    parser.add_argument("--groups", type=positive_int, default=None, metavar="N",
                        help="rank groups, one process (or Ray actor) each (default: one per CPU core, more when "
                             "the job has over 256 MiB of trace text per group: each process's memory is bounded "
                             "by its group's ranks)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                       help=f"run the groups as Ray actors on the cluster at ADDRESS (default: ${RAY_ADDRESS_ENV}, "
                            "else a local cluster); needs pip install 'whatif[ray]'")
    where.add_argument("--inline", action="store_true", help="run the groups one after the other in this process")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the whatif.job JSON document here")
    parser.add_argument("--steps", action="store_true", help="one row per (rank, step) (default: per rank)")
    add_dataclass_arguments(parser, StepOptions)
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing (with --json)")


def options_of(args: argparse.Namespace) -> ParallelOptions:
    """The :class:`ParallelOptions` the flags ask for (``--ray`` wins over the environment)."""
    target = None if args.inline else ray_target(args.ray)
    if target is not None:
        return ParallelOptions(groups=args.groups or 0, backend=Backend.RAY, ray_address=target.address)
    if args.inline:
        return ParallelOptions(groups=args.groups or 0, backend=Backend.INLINE)
    return ParallelOptions(groups=args.groups or 0)


def run(args: argparse.Namespace) -> int:
    options = options_of(args)
    with working(f"whatif job: {args.path}", args.quiet) as status:
        job = replay_job(args.path, options, progress=lambda line: status(f"whatif job: {line}"))
    steps = counted_steps(job, from_args(StepOptions, args))
    doc = job_document(job, steps)
    if args.json:
        write_json(args.json, doc)
    if not args.quiet:
        render_job(job, doc, steps, console(), per_step=args.steps)
        if args.json:
            print(f"wrote {args.json}")
    return 0


def counted_steps(job: JobReplay, options: StepOptions) -> pd.DataFrame:
    """The job's step rows, ``included`` as ``options`` count them (the groups mark the default:
    warm-up and partial steps left out)."""
    steps = job.steps.copy()
    if len(steps):
        steps["included"] = options.mask(steps["excluded_reason"].tolist())
    return steps


def job_document(job: JobReplay, steps: pd.DataFrame) -> JobDocument:
    """The ``whatif.job`` document of a rank-parallel replay (no timings: same input, same bytes);
    ``steps``: :func:`counted_steps`."""
    marks = excluded_marks(steps)
    abs_err = steps["error"].abs()
    return JobDocument(
        source=str(job.path), ranks=list(job.ranks),
        groups=[JobGroup(ranks=list(g.ranks), events=g.events, tasks=g.tasks, edges=g.edges) for g in job.groups],
        events=job.events, tasks=job.tasks, edges=job.edges, collectives=job.collectives, rounds=job.rounds,
        steps=[StepFidelity(rank=int(r), step=int(s), measured_ns=int(m), predicted_ns=int(p), error=round(float(e), 6),
                            excluded=mark)
               for r, s, m, p, e, mark in zip(steps["rank"], steps["step"], steps["measured_ns"],
                                              steps["predicted_ns"], steps["error"], marks)],
        fidelity=Fidelity(median_abs_error=round(float(abs_err.median()), 6) if len(steps) else None,
                          max_abs_error=round(float(abs_err.max()), 6) if len(steps) else None))


def render_job(job: JobReplay, doc: JobDocument, steps: pd.DataFrame, out: Console, per_step: bool = False) -> None:
    out.print(f"{doc.source}: {len(doc.ranks)} ranks in {len(doc.groups)} rank groups; {doc.events:,} events, "
              f"{doc.tasks:,} tasks, {doc.edges:,} edges; {doc.collectives} collectives matched across ranks, "
              f"released in {doc.rounds} rounds")
    if doc.fidelity.median_abs_error is not None:
        out.print(f"replay error: median {doc.fidelity.median_abs_error:.2%}, worst {doc.fidelity.max_abs_error:.2%}")
    if per_step:
        rows = [[str(s.rank), str(s.step), f"{s.measured_ns / 1e6:.3f}", f"{s.predicted_ns / 1e6:.3f}",
                 f"{s.error:+.2%}"] for s in doc.steps]
        print_table(out, "Steps (ms)", ["rank", "step", "measured", "replayed", "error"], rows, set())
    elif len(steps):
        counted = steps[steps["included"].to_numpy(dtype=bool)]
        by_rank = counted.groupby("rank").agg(n=("step", "size"), measured=("measured_ns", "mean"),
                                              replayed=("predicted_ns", "mean"))
        worst = steps.groupby("rank")["error"].agg(lambda e: e.abs().max())
        rows = [[str(r), str(int(by_rank.n.get(r, 0))), _ms(by_rank.measured.get(r)), _ms(by_rank.replayed.get(r)),
                 f"{w:.2%}"] for r, w in worst.items()]
        print_table(out, "Steps per rank (mean ms over the counted steps; worst error over all)",
                    ["rank", "steps", "measured", "replayed", "worst error"], rows, set())
        line = excluded_line(doc.steps)
        if line:
            out.print(line)
    rows = [[str(i), ranks_text(g.ranks), f"{g.tasks:,}",
             *(f"{g.seconds.get(k, 0.0):.2f}" for k in ("read", "build", "link", "advance", "finish")),
             f"{g.peak_mib:,.0f}"] for i, g in enumerate(job.groups)]
    print_table(out, "Rank groups (seconds per stage, peak resident MiB)",
                ["group", "ranks", "tasks", "read", "build", "link", "replay", "steps", "peak MiB"], rows, {1})
    out.print("wall: " + ", ".join(f"{k} {v:.2f} s" for k, v in job.seconds.items() if k != "coordinator_cpu")
              + f"; coordinator CPU {job.seconds['coordinator_cpu']:.2f} s")


def _ms(ns: float | None) -> str:
    return "-" if ns is None or ns != ns else f"{ns / 1e6:.3f}"
