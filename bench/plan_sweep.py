"""Plan sweeps locally and on Ray (issue 15 item 4): ``whatif sweep --plans`` over more than
1,000 plans of an 8-rank job generated from the real A100 rank ``hta/nccl_data_a100_rank0of2``
(``whatif.jobgen``), run twice as the same command: on local processes (``--jobs 2``) and with
``--ray`` on a local Ray cluster that the command starts; checks that the two tables and JSON
documents are the same bytes and prints plans per second for both. Then the same sweep machinery on
a synthetic 6-layer transformer training step (tests/_llm_tracegen.py), where tensor and pipeline
parallelism apply (the A100 job is a ResNet, whose TP/PP plans the transforms refuse).

Run: .venv/bin/python bench/plan_sweep.py [--dp-max 21] [--write-docs] [--transformer-only]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from _llm_tracegen import llm_trace
from common.docs import replace_section

from whatif.documents import PlanSweepDocument, from_json
from whatif.hardware.devices import DEVICES
from whatif.jobgen import JobOptions, generate_job

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT.parent / "shared" / "traces" / "hta" / "nccl_data_a100_rank0of2.json.gz"
WHATIF = Path(sys.executable).with_name("whatif")
BEGIN, END = "<!-- bench/plan_sweep.py begin -->", "<!-- bench/plan_sweep.py end -->"
ACC_BEGIN, ACC_END = "<!-- bench/plan_sweep.py accuracy begin -->", "<!-- bench/plan_sweep.py accuracy end -->"


def sweep(trace: Path, grid: list[str], out: Path, backend: list[str]) -> tuple[float, bytes, bytes]:
    """Run ``whatif sweep --plans`` once; (wall seconds, -o table bytes, --json bytes)."""
    table, doc = out.with_suffix(".csv"), out.with_suffix(".json")
    argv = [str(WHATIF), "sweep", str(trace), "--plans", *grid, *backend, "-o", str(table), "--json", str(doc),
            "-f", "-q", "--no-cache"]
    t = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[1:])}: exit {done.returncode}: {done.stderr.strip()[-500:]}")
    return wall, table.read_bytes(), doc.read_bytes()


def counts(doc: PlanSweepDocument) -> dict[str, int]:
    out = {s: sum(r.status == s for r in doc.plans) for s in ("ok", "refused", "does not fit")}
    out["front"] = sum(r.pareto for r in doc.plans)
    return out


def front_lines(doc: PlanSweepDocument, top: int) -> list[str]:
    rows = sorted((r for r in doc.plans if r.pareto), key=lambda r: (r.gpus, r.step_ns or 0, r.plan))
    return [f"| {r.plan} | {r.gpus} | {(r.step_ns or 0) / 1e6:.2f} | {r.throughput_per_s:,.2f} | "
            f"{'-' if r.memory_per_gpu_bytes is None else f'{r.memory_per_gpu_bytes / 1e9:.1f}'} |"
            for r in rows[:top]]


def transformer_sweep(tmp: Path, say) -> None:
    """The sweep machinery on a synthetic 6-layer transformer training step (TP and PP apply)."""
    llm = llm_trace(tmp / "llm.json.gz", new_tokens=512, kv_tokens=512, layers=6, hidden=8192, heads=64,
                    ffn=28672, backward=True, steps=2)
    llm_grid = ["--tp", "1,2,4,8", "--pp", "1,2,3,6", "--micro-batches", "2,4,8", "--dp", "1,2,4",
                "--device", "H100_SXM,A100_SXM_80GB,RTX_2080_TI", "--samples-per-step", "8"]
    wall_llm, _, json_llm = sweep(llm, llm_grid, tmp / "llm", ["--jobs", "2"])
    ldoc = from_json(json_llm, PlanSweepDocument)
    lc = counts(ldoc)
    say(f"synthetic 6-layer transformer training step (hidden 8192, 64 heads, FFN 28672, bf16, 8 sequences of "
        f"512 tokens, traced on an H100; {ldoc.memory_model}): {len(ldoc.plans)} plans in {wall_llm:.1f} s "
        f"({len(ldoc.plans) / wall_llm:.1f} plans/s), {lc['ok']} predicted, {lc['refused']} refused, "
        f"{lc['does not fit']} over the device's memory, {lc['front']} on the Pareto front:")
    say()
    say("| plan | GPUs | step ms | samples/s | GB per GPU |")
    say("|---|---|---|---|---|")
    for line in front_lines(ldoc, 12):
        say(line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dp-max", type=int, default=21, help="data-parallel degrees 1..N (1,008 plans at 21)")
    parser.add_argument("--write-docs", action="store_true", help="write the results into docs/scale.md")
    parser.add_argument("--transformer-only", action="store_true",
                        help="only the synthetic transformer sweep (half a minute), printed, no docs written")
    args = parser.parse_args()
    if args.transformer_only and args.write_docs:
        parser.error("--transformer-only prints its table; it writes no docs (run the whole bench with --write-docs)")
    if args.transformer_only:
        with tempfile.TemporaryDirectory() as tmp_dir:
            transformer_sweep(Path(tmp_dir), print)
        return 0
    if not SOURCE.exists():
        raise SystemExit(f"{SOURCE}: missing (the shared traces live in ../shared/traces)")
    if importlib.util.find_spec("ray") is None:
        raise SystemExit("ray is not installed: .venv/bin/pip install 'whatif[ray]'")
    devices = list(DEVICES)
    grid = ["--tp", "1,2", "--dp", ",".join(map(str, range(1, args.dp_max + 1))), "--device", ",".join(devices)]
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        generate_job(SOURCE, tmp / "job", JobOptions(ranks=8, seed=8))
        wall_local, table_local, json_local = sweep(tmp / "job", grid, tmp / "local", ["--jobs", "2"])
        wall_ray, table_ray, json_ray = sweep(tmp / "job", grid, tmp / "ray", ["--jobs", "2", "--ray"])
        doc = from_json(json_local, PlanSweepDocument)
        c = counts(doc)
        n = len(doc.plans)
        same = table_local == table_ray and json_local == json_ray
        say(f"8-rank job from {SOURCE.name} ({doc.ranks} ranks, {doc.mode}, traced step "
            f"{doc.baseline_step_ns / 1e6:.1f} ms), {os.cpu_count()} CPU cores:")
        say()
        say("| backend | plans | predicted | refused | does not fit | wall s | plans/s | predicted plans/s |")
        say("|---|---|---|---|---|---|---|---|")
        for name, wall in (("local processes (--jobs 2)", wall_local),
                           ("Ray, local cluster (--ray --jobs 2)", wall_ray)):
            say(f"| {name} | {n:,} | {c['ok']:,} | {c['refused']:,} | {c['does not fit']:,} | {wall:.1f} | "
                f"{n / wall:.2f} | {c['ok'] / wall:.2f} |")
        say()
        say(f"tables identical (-o CSV and --json, byte for byte): {'yes' if same else 'NO'}; "
            f"Pareto front: {c['front']} plans")
        steps = sorted({r.step_ns for r in doc.plans if r.step_ns})
        say(f"predicted steps: {len(steps)} distinct value(s), {steps[0] / 1e6:.3f} to {steps[-1] / 1e6:.3f} ms; "
            f"refusals: {sorted({r.reason.split(':')[0] for r in doc.plans if r.reason})}")

        say()
        transformer_sweep(tmp, say)
    if args.write_docs:
        replace_section(ROOT / "docs" / "scale.md", BEGIN, END, "\n".join(lines) + "\n")
        summary = (f"Plan sweep (`bench/plan_sweep.py`): {n:,} plans of an 8-rank job, {n / wall_local:.2f} plans/s on "
                   f"local processes and {n / wall_ray:.2f} plans/s on a local Ray cluster (2 cores), tables "
                   f"{'identical' if same else 'DIFFERENT'} (docs/scale.md).")
        replace_section(ROOT / "docs" / "accuracy.md", ACC_BEGIN, ACC_END, summary + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
