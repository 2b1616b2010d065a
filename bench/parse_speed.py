"""Trace parsing speed: whatif's ``load_trace`` vs HolisticTraceAnalysis 0.5, side by side.

For each trace (a file, or a folder of per-rank files) of a representative set from
``../shared/traces``, a temporary folder outside the repository gets symlinks to the trace
files; then, in fresh subprocesses and interleaved (HTA, whatif, HTA, whatif, ...):

* HTA:    ``TraceAnalysis(trace_dir=folder)`` (its default JSON backend; a multi-rank folder
  is parsed by HTA's own process pool, one process per rank up to the core count),
* whatif: ``load_trace(folder)``,
* optionally (``--baseline REV``) whatif's reader as it was at git revision REV, to measure
  a change before/after.

Only the call is timed (imports excluded); each figure is the median over ``--repeat`` runs.
HTA is installed, when missing, into its own venv (``bench/common/hta.py``: it needs pandas < 3,
whatif does not), so anyone can rerun this script.

    .venv/bin/python bench/parse_speed.py                     # table on stdout
    .venv/bin/python bench/parse_speed.py --baseline HEAD~1 --update-docs
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common.docs import replace_section
from common.hta import HTA_SPEC, hta_python

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
DOC = REPO / "docs" / "traces.md"
BEGIN, END = "<!-- parse-speed:begin -->", "<!-- parse-speed:end -->"

# The representative set: big 2021 ResNet traces, HTA's own test traces, the largest AMD
# traces (python_function heavy), HF inference on H100, and a multi-rank folder.
DEFAULT_SET = [
    "kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz",
    "kineto/resnet50_autograd_api_num_workers_0__worker0.pt.trace.json.gz",
    "hta/negative_queue_a100_rank0of16.json.gz",
    "hta/trace_diff_control_rank3.json.gz",
    "hta/df_index_resolver_v100_rank1of2.json.gz",
    "tracelens/xdit_flux1_baseline_mi300x.json.gz",
    "tracelens/xdit_flux1_aiter_sage_mi300x.json.gz",
    "tracelens/hf_h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "tracelens/hf_h100/Falconsai_nsfw_image_detection__1016002.json.gz",
    "hta/sampled_world128",
]

# Run in a child process: import the reader, then time one load. Prints one JSON line.
CHILD = r"""
import json, sys, time
which, folder = sys.argv[1], sys.argv[2]
if which == "hta":
    import logging
    logging.disable(logging.CRITICAL)
    from hta.trace_analysis import TraceAnalysis
    t0 = time.perf_counter()
    ta = TraceAnalysis(trace_dir=folder)
    seconds = time.perf_counter() - t0
    events = sum(len(df) for df in ta.t.traces.values())
else:
    if which == "baseline":
        sys.path.insert(0, sys.argv[3])
        from baseline_tracer.trace import load_trace
    else:
        from whatif.tracer.trace import load_trace
    t0 = time.perf_counter()
    trace = load_trace(folder)
    seconds = time.perf_counter() - t0
    events = len(trace.events)
print(json.dumps({"seconds": seconds, "events": events}))
"""


@dataclass
class Row:
    """Timings of one trace (seconds per run) for each reader."""

    trace: str
    json_mb: float
    events: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, list[float]] = field(default_factory=dict)

    def median(self, which: str) -> float | None:
        runs = self.seconds.get(which)
        return statistics.median(runs) if runs else None


def ensure_hta_venv() -> Path:
    """The python of the benches' HTA 0.5.0 venv (:func:`common.hta.hta_python`); exits when it
    cannot be installed."""
    python = hta_python()
    if python is None:
        sys.exit("bench/parse_speed.py: installing HTA failed (pip install " + " ".join(HTA_SPEC) + ")")
    return python


def export_baseline(rev: str, into: Path) -> Path:
    """``tracer/`` at git revision ``rev``, importable as package ``baseline_tracer`` under ``into``."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "tracer"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    (into / "tracer").rename(into / "baseline_tracer")
    return into


def trace_files(item: Path) -> list[Path]:
    if item.is_dir():
        return sorted(p for p in item.iterdir() if p.name.endswith((".json", ".json.gz")))
    return [item]


def json_megabytes(files: list[Path]) -> float:
    """Uncompressed JSON size in MB (gzip's trailer holds it modulo 4 GiB)."""
    total = 0
    for f in files:
        if f.name.endswith(".gz"):
            with f.open("rb") as fh:
                fh.seek(-4, os.SEEK_END)
                total += int.from_bytes(fh.read(4), "little")
        else:
            total += f.stat().st_size
    return total / 1e6


def run_child(python: Path, which: str, folder: Path, extra: list[str]) -> dict:
    result = subprocess.run([str(python), "-c", CHILD, which, str(folder), *extra],
                            capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"{which} failed on {folder}: {tail}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def measure(items: list[str], repeat: int, baseline: str | None) -> list[Row]:
    """Time every reader on every trace, ``repeat`` interleaved rounds."""
    hta_python = ensure_hta_venv()
    work = Path(tempfile.mkdtemp(prefix="whatif-parse-speed-"))
    try:
        readers: list[tuple[str, Path, list[str]]] = [("hta", hta_python, []),
                                                      ("whatif", Path(sys.executable), [])]
        if baseline:
            (work / "baseline").mkdir()
            base_dir = export_baseline(baseline, work / "baseline")
            readers.append(("baseline", Path(sys.executable), [str(base_dir)]))
        rows, folders = [], []
        for i, item in enumerate(items):
            source = TRACES / item
            if not source.exists():
                print(f"skipping {item}: not in {TRACES}", file=sys.stderr)
                continue
            folder = work / f"t{i}"
            folder.mkdir()
            files = trace_files(source)
            for f in files:
                (folder / f.name).symlink_to(f)
            rows.append(Row(trace=item, json_mb=json_megabytes(files)))
            folders.append(folder)
        for rep in range(repeat):
            for row, folder in zip(rows, folders):
                for which, python, extra in readers:
                    out = run_child(python, which, folder, extra)
                    row.seconds.setdefault(which, []).append(out["seconds"])
                    row.events[which] = out["events"]
                print(f"run {rep + 1}/{repeat} {row.trace}: " + ", ".join(
                    f"{w} {row.seconds[w][-1]:.3f}s" for w, _, _ in readers), file=sys.stderr)
        return rows
    finally:
        shutil.rmtree(work, ignore_errors=True)


def markdown(rows: list[Row], repeat: int, baseline: str | None, load: tuple[float, float]) -> str:
    """The results as a markdown section (header line, table, summary)."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() \
        else platform.processor()
    head = ["trace", "JSON MB", "events (whatif)", "HTA 0.5 s", "whatif s", "HTA / whatif"]
    if baseline:
        head += [f"whatif@{baseline} s", "before / after"]
    lines = [f"Measured {dt.date.today().isoformat()} by `bench/parse_speed.py --repeat {repeat}` on "
             f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}; "
             f"median of {repeat} interleaved runs, each in a fresh process, import time excluded; "
             f"1-minute load average {load[0]:.1f} before, {load[1]:.1f} after (the machine is shared, "
             "so absolute times vary between runs more than the ratios do).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ratios = []
    for r in rows:
        hta, ours = r.median("hta"), r.median("whatif")
        ratio = hta / ours
        ratios.append(ratio)
        cells = [f"`{r.trace}`", f"{r.json_mb:.1f}", f"{r.events['whatif']:,}", f"{hta:.3f}", f"{ours:.3f}",
                 f"**{ratio:.1f}x**" if ratio >= 5 else f"{ratio:.1f}x (below 5x)"]
        if baseline:
            before = r.median("baseline")
            cells += [f"{before:.3f}", f"{before / ours:.1f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    geo = statistics.geometric_mean(ratios)
    below = [r.trace for r, x in zip(rows, ratios) if x < 5]
    lines += ["", f"Geometric mean HTA / whatif: {geo:.1f}x over {len(rows)} traces; "
              + (f"below 5x on: {', '.join(f'`{t}`' for t in below)}." if below else "at least 5x on every one.")]
    return "\n".join(lines) + "\n"


def update_docs(section: str) -> None:
    replace_section(DOC, BEGIN, END, section)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="*", help="paths relative to ../shared/traces (default: a representative set)")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved runs per reader and trace (default 3)")
    parser.add_argument("--baseline", metavar="REV", help="also time tracer/ as of this git revision")
    parser.add_argument("--update-docs", action="store_true", help=f"write the table into {DOC.relative_to(REPO)}")
    args = parser.parse_args(argv)
    if not TRACES.is_dir():
        print(f"bench/parse_speed.py: {TRACES} not found, nothing to measure", file=sys.stderr)
        return 0
    load_before = os.getloadavg()[0]
    rows = measure(args.traces or DEFAULT_SET, args.repeat, args.baseline)
    section = markdown(rows, args.repeat, args.baseline, (load_before, os.getloadavg()[0]))
    print(section)
    if args.update_docs:
        update_docs(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
