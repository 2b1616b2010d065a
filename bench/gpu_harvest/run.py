"""The GPU harvest: every recording issue 19 asks for, in one command on a lent GPU.

Runs, one after another (GPU timings must not share the device), in this order so that a run cut
short by its time budget still holds the most needed parts:

1. ``backends``: ``examples/train.py``, ``llm_serve.py`` and ``dit_serve.py`` recorded by
   ``whatif record`` with the Kineto backend and with ``--backend cupti``;
2. ``pairs`` round 1: the nine before/after pairs (:data:`PAIRS`), each side recorded once;
3. ``overhead`` round 1: the training and serving examples with no profiler, under bare
   ``torch.profiler`` (``bench/record_overhead.py --_bare``), under ``whatif record`` and under
   ``whatif record --backend cupti``; only the programs' own logs are kept;
4. ``pairs`` round 2 and ``overhead`` round 2: the same again (run-to-run noise).

Each job is a fresh process with its own timeout; one that fails is written down (exit status,
the end of its stderr) and the harvest goes on. ``manifest.json`` lists every job, ``env.json``
the machine. With ``--pack DIR`` the output folder is also written as one tar file per group
into DIR (the device tool brings back at most 8 files, 16 MiB each).

``--device cpu`` is the rehearsal: the same jobs with small sizes (:func:`shrink`), CUDA-only jobs
skipped with their reason, so a GPU's minutes are spent recording, not debugging::

  python bench/gpu_harvest/run.py --device cpu --out /tmp/harvest --only backends

On a lent GPU: ``bench/gpu_harvest/wheels.sh`` here (the wheels the machine lacks, into ``.whl``),
then the device tool runs ``bash bench/gpu_harvest/device.sh --budget-s 400`` with ``.whl``
carried. On the H200 each job took 10-20 s (process start, CUDA context, trace writing), so the
58 jobs need two calls of about 7 and 5 minutes: the second names what is left with ``--jobs``
(sample_traces/gpu/README.md). Keep the repository's working tree under the tool's 64 MiB with
the wheels (about 18 MB) included.

Nothing here predicts or compares: ``bench/gpu_pairs.py`` and the tests read the recordings.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DECODE = EXAMPLES / "decode.py"
BARE = ROOT / "bench" / "record_overhead.py"
GROUPS = ("backends", "pairs", "overhead")
MODES = ("plain", "bare", "torch", "cupti")  # no profiler, bare torch.profiler, whatif record x2
STDERR_TAIL = 1500
PART_BYTES = 15 * 2**20


@dataclass(frozen=True)
class Program:
    """A workload: a script and its arguments (the GPU sizes; :func:`shrink` makes the CPU ones)."""

    script: Path
    args: tuple[str, ...]
    needs_cuda: bool = False
    timeout_s: float = 90.0


@dataclass(frozen=True)
class Pair:
    """A before/after pair: one program, two argument lists differing in the change."""

    name: str
    what: str
    before: Program
    after: Program


def train(*args: str, **kw: object) -> Program:
    return Program(EXAMPLES / "train.py", args, **kw)  # type: ignore[arg-type]


def decode(*args: str, **kw: object) -> Program:
    return Program(DECODE, args, **kw)  # type: ignore[arg-type]


LLM = EXAMPLES / "llm_serve.py"
DIT = EXAMPLES / "dit_serve.py"
# A training step that keeps an H100 busy for milliseconds (4 layers, d 1024, 4,096 tokens).
TRAIN_GPU = ("--d-model", "1024", "--heads", "16", "--layers", "4", "--vocab", "8192",
             "--batch-size", "16", "--seq-len", "256", "--steps", "12")
# A decode loop small enough to be launch-bound (what CUDA graphs and fusion remove).
DECODE_SMALL = ("--steps", "60")
DECODE_WIDE = ("--d-model", "1024", "--heads", "16", "--layers", "8", "--context", "1024", "--steps", "40")
TP_STACK = ("--d-model", "2048", "--heads", "16", "--layers", "4", "--batch", "4", "--query-len", "256",
            "--context", "1024", "--steps", "20")

# The example servers' attention pinned: torch's default on Hopper can be cuDNN, which builds an
# execution plan for every new key length (40-52 ms of CPU in the 2026-11-27 harvest's llm_serve
# decode iterations, docs/accuracy.md p7), which no real engine pays.
SERVER_SDPA = ("--sdpa", "efficient")

PAIRS: tuple[Pair, ...] = (
    Pair("p1_precision", "fp32 -> bf16 autocast (precision)",
         train(*TRAIN_GPU), train(*TRAIN_GPU, "--autocast", "bf16")),
    Pair("p2_cuda_graph", "eager -> CUDA graph decode step (cuda_graph)",
         decode(*DECODE_SMALL), decode(*DECODE_SMALL, "--cuda-graph", needs_cuda=True)),
    Pair("p3_compile", "eager -> torch.compile (fuse)",
         decode(*DECODE_SMALL), decode(*DECODE_SMALL, "--compile", timeout_s=180.0)),
    Pair("p4_sdpa", "SDPA math -> flash backend (attention faster)",
         train(*TRAIN_GPU, "--autocast", "bf16", "--seq-len", "1024", "--batch-size", "4", "--sdpa", "math"),
         train(*TRAIN_GPU, "--autocast", "bf16", "--seq-len", "1024", "--batch-size", "4", "--sdpa", "flash",
               needs_cuda=True)),
    Pair("p5_dataloader", "DataLoader num_workers 0 -> 4 (dataloader)",
         train(*TRAIN_GPU, "--autocast", "bf16", "--steps", "16", "--workers", "0", "--load-ms", "6"),
         train(*TRAIN_GPU, "--autocast", "bf16", "--steps", "16", "--workers", "4", "--load-ms", "6")),
    Pair("p6_batch", "decode batch 8 -> 32 (iteration model extrapolation)",
         decode(*DECODE_WIDE, "--batch", "8"), decode(*DECODE_WIDE, "--batch", "32")),
    Pair("p7_serve_rate", "LLM server at 1x and 3x request rate (serve extrapolation)",
         Program(LLM, ("--num-requests", "16", "--rate", "8", "--output-max", "48", "--seed", "0", *SERVER_SDPA)),
         Program(LLM, ("--num-requests", "16", "--rate", "24", "--output-max", "48", "--seed", "0", *SERVER_SDPA))),
    Pair("p8_dit_tokens", "DiT latent 16 -> 32 (tokens x4)",
         Program(DIT, ("--num-requests", "8", "--rate", "inf", "--steps", "8", "--resolution", "16")),
         Program(DIT, ("--num-requests", "8", "--rate", "inf", "--steps", "8", "--resolution", "32"))),
    Pair("p9_tp", "layer stack TP-1 -> TP-2 emulated (tensor_parallel compute)",
         decode(*TP_STACK, "--tp", "1"), decode(*TP_STACK, "--tp", "2")),
)

BACKEND_PROGRAMS = {
    "train": train("--steps", "12"),
    "llm_serve": Program(LLM, ("--num-requests", "12", "--rate", "inf", "--output-max", "48", "--seed", "0")),
    "dit_serve": Program(DIT, ("--num-requests", "4", "--rate", "inf", "--steps", "6")),
}
OVERHEAD_PROGRAMS = {
    "train": train(*TRAIN_GPU, "--autocast", "bf16", "--steps", "30"),
    "llm_serve": Program(LLM, ("--num-requests", "16", "--rate", "inf", "--output-max", "48", "--seed", "0",
                               *SERVER_SDPA)),
}

# --device cpu: the sizes a 2-core machine runs in seconds, and an attention backend the CPU has
# (CUDA-only backends stay only in jobs that need CUDA, which the rehearsal skips).
CPU_SIZES = {"--sdpa": "math", "--d-model": "64", "--heads": "4", "--layers": "2", "--vocab": "512",
             "--batch-size": "4", "--seq-len": "32", "--steps": "4", "--context": "64", "--query-len": "8",
             "--num-requests": "4", "--load-ms": "2"}
CPU_SCALED = {"--batch": 4, "--resolution": 2}  # divided, so a pair's ratio survives


def shrink(args: tuple[str, ...]) -> tuple[str, ...]:
    """The CPU rehearsal's arguments: every size flag of :data:`CPU_SIZES` set small, those of
    :data:`CPU_SCALED` divided (so pair 6 stays 1:4 and pair 8 4x the tokens), the change untouched.

    >>> shrink(("--d-model", "1024", "--batch", "32", "--autocast", "bf16"))
    ('--d-model', '64', '--batch', '8', '--autocast', 'bf16')
    """
    out = list(args)
    for i in range(len(out) - 1):
        if out[i] in CPU_SIZES:
            out[i + 1] = CPU_SIZES[out[i]]
        elif out[i] in CPU_SCALED:
            out[i + 1] = str(max(1, int(out[i + 1]) // CPU_SCALED[out[i]]))
    return tuple(out)


@dataclass
class Job:
    """One process of the harvest and, once run, what it did."""

    name: str
    group: str
    mode: str  # one of MODES
    program: Program
    round: int = 1
    pair: str = ""
    side: str = ""
    status: str = "pending"  # ok | failed | timeout | skipped
    reason: str = ""
    exit_code: int | None = None
    wall_s: float = 0.0
    command: list[str] = field(default_factory=list)
    run_dir: str = ""
    log: str = ""
    summary: dict[str, object] = field(default_factory=dict)
    stderr_tail: str = ""

    def record(self) -> dict[str, object]:
        d = asdict(self)
        d["program"] = {"script": str(self.program.script.relative_to(ROOT)), "args": list(self.program.args)}
        return d


def plan(only: set[str]) -> list[Job]:
    """Every job in harvest order (see the module docstring), restricted to the ``only`` groups."""
    jobs: list[Job] = []
    if "backends" in only:
        for name, prog in BACKEND_PROGRAMS.items():
            for mode in ("torch", "cupti"):
                jobs.append(Job(f"{name}-{mode}", "backends", mode, prog))
    for rnd in (1, 2):
        if "pairs" in only:
            for pair in PAIRS:
                for side, prog in (("before", pair.before), ("after", pair.after)):
                    jobs.append(Job(f"{pair.name}-{side}-r{rnd}", "pairs", "torch", prog, rnd, pair.name, side))
        if "overhead" in only:
            for name, prog in OVERHEAD_PROGRAMS.items():
                for mode in MODES:
                    jobs.append(Job(f"{name}-{mode}-r{rnd}", "overhead", mode, prog, rnd))
    return jobs


def command(job: Job, device: str, out: Path) -> tuple[list[str], Path, Path]:
    """(argv, run folder, program log) of ``job``."""
    args = job.program.args if device.startswith("cuda") else shrink(job.program.args)
    run_dir = out / job.group / job.name
    log = run_dir / "program.log"
    program = [str(job.program.script), *args, "--device", device, "--log", str(log)]
    py = sys.executable
    if job.mode == "plain":
        return [py, *program], run_dir, log
    if job.mode == "bare":
        return [py, str(BARE), "--_bare", str(run_dir / "bare.pt.trace.json.gz"), *program], run_dir, log
    backend = ["--backend", "cupti"] if job.mode == "cupti" else []
    shapes = ["--record-shapes"] if job.group == "pairs" else []  # the ops table's FLOPs and bytes
    return [py, "-m", "whatif.cli", "record", "-f", "--no-summary", *backend, *shapes, "-o", str(run_dir),
            "--", *program], run_dir, log


def run_job(job: Job, device: str, out: Path, work: Path) -> None:
    if device == "cpu" and (job.program.needs_cuda or job.mode == "cupti"):
        job.status, job.reason = "skipped", "needs CUDA"
        return
    argv, run_dir, log = command(job, device, out)
    run_dir.mkdir(parents=True, exist_ok=True)
    job.command, job.run_dir, job.log = argv, str(run_dir.relative_to(out)), str(log.relative_to(out))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(argv, cwd=work, capture_output=True, text=True, timeout=job.program.timeout_s,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    except subprocess.TimeoutExpired as e:
        job.wall_s = time.perf_counter() - t0
        job.status, job.reason = "timeout", f"over {job.program.timeout_s:.0f} s"
        job.stderr_tail = (e.stderr or b"")[-STDERR_TAIL:].decode(errors="replace") \
            if isinstance(e.stderr, bytes) else (e.stderr or "")[-STDERR_TAIL:]
        return
    job.wall_s = time.perf_counter() - t0
    job.exit_code = proc.returncode
    job.stderr_tail = proc.stderr[-STDERR_TAIL:]
    (run_dir / "stdout.log").write_text(proc.stdout)
    (run_dir / "stderr.log").write_text(proc.stderr)
    if log.exists():
        job.summary = json.loads(log.read_text()).get("summary", {})
    job.status = "ok" if proc.returncode == 0 and log.exists() else "failed"
    if job.group == "overhead":  # only the programs' own clocks are kept
        for trace in run_dir.glob("*.json.gz"):
            trace.unlink()


def environment(device: str) -> dict[str, object]:
    """The machine and software the harvest ran on."""
    env: dict[str, object] = {"python": sys.version.split()[0], "platform": platform.platform(),
                              "cpu_count": os.cpu_count(), "device": device}
    try:
        import torch
        env["torch"] = torch.__version__
        env["cuda_runtime"] = torch.version.cuda
        env["tf32_matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
        if device.startswith("cuda") and torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            env["gpu"] = {"name": p.name, "sm_count": p.multi_processor_count,
                          "memory_bytes": p.total_memory, "capability": f"{p.major}.{p.minor}"}
    except ImportError as e:
        env["torch"] = f"missing: {e}"
    try:
        from cupti import cupti  # type: ignore[import-not-found]  # noqa: F401  (loading it is the check)
        env["cupti_python"] = importlib.metadata.version("cupti-python")
    except Exception as e:  # noqa: BLE001  (any failure to load is the answer)
        env["cupti_python"] = f"unavailable: {type(e).__name__}: {e}"[:300]
    if shutil.which("nvidia-smi"):
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,"
                            "power.limit,memory.total", "--format=csv,noheader"], capture_output=True, text=True)
        env["nvidia_smi"] = q.stdout.strip() or q.stderr.strip()
    return env


def pack(out: Path, dest: Path, part_bytes: int = PART_BYTES) -> list[Path]:
    """``manifest.json`` (which holds ``env.json``) and the run folders of each group as uncompressed tars
    (traces are gzip already) of at most about ``part_bytes`` each: ``pairs-1.tar``,
    ``pairs-2.tar``... (the device tool brings back files of at most 16 MiB)."""
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    if (out / "manifest.json").exists():
        shutil.copy(out / "manifest.json", dest / "manifest.json")
        written.append(dest / "manifest.json")
    for group in GROUPS:
        runs = sorted(d for d in (out / group).glob("*") if d.is_dir()) if (out / group).is_dir() else []
        parts: list[list[Path]] = [[]]
        size = 0
        for run in runs:
            run_bytes = sum(f.stat().st_size for f in run.rglob("*") if f.is_file())
            if parts[-1] and size + run_bytes > part_bytes:
                parts.append([])
                size = 0
            parts[-1].append(run)
            size += run_bytes
        for k, members in enumerate(p for p in parts if p):
            path = dest / f"{group}-{k + 1}.tar"
            with tarfile.open(path, "w") as tar:
                for run in members:
                    tar.add(run, arcname=f"{group}/{run.name}")
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (the harvest) or cpu (the rehearsal)")
    p.add_argument("--out", type=Path, required=True, help="output folder (emptied first)")
    p.add_argument("--only", default=",".join(GROUPS), help=f"comma-separated groups of {GROUPS}")
    p.add_argument("--jobs", default="", help="comma-separated job names to run (default: all)")
    p.add_argument("--budget-s", type=float, default=480.0, help="start no job after this many seconds")
    p.add_argument("--pack", type=Path, default=None, help="also write one tar per group here")
    opts = p.parse_args(argv)
    only = set(opts.only.split(","))
    if not only <= set(GROUPS):
        p.error(f"--only: unknown group(s) {sorted(only - set(GROUPS))}")
    jobs = plan(only)
    if opts.jobs:
        names = set(opts.jobs.split(","))
        jobs = [j for j in jobs if j.name in names]
        if not jobs:
            p.error(f"--jobs: none of {sorted(names)} is a job")
    out = opts.out.resolve()
    if out.exists() and not out.is_dir():
        p.error(f"--out {out}: not a folder")
    shutil.rmtree(out, ignore_errors=True)
    work = out / ".work"
    work.mkdir(parents=True)
    env = environment(opts.device)
    (out / "env.json").write_text(json.dumps(env, indent=1))
    print(json.dumps(env), flush=True)
    start = time.perf_counter()
    for i, job in enumerate(jobs):
        if time.perf_counter() - start > opts.budget_s:
            job.status, job.reason = "skipped", f"budget of {opts.budget_s:.0f} s spent"
        else:
            run_job(job, opts.device, out, work)
        mean = job.summary.get("mean_step_ms", job.summary.get("duration_s", ""))
        print(f"[{time.perf_counter() - start:6.1f} s] {i + 1}/{len(jobs)} {job.name}: {job.status} "
              f"{job.reason} {job.wall_s:.1f} s {mean}", flush=True)
        if job.status in ("failed", "timeout"):
            print("   " + job.stderr_tail[-600:].replace("\n", "\n   "), flush=True)
        (out / "manifest.json").write_text(json.dumps(
            {"schema": "whatif.bench.gpu_harvest/1", "env": env, "jobs": [j.record() for j in jobs]}, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    if opts.pack:
        for path in pack(out, opts.pack):
            print(f"packed {path} ({path.stat().st_size / 2**20:.1f} MiB)")
    failed = [j.name for j in jobs if j.status in ("failed", "timeout")]
    print(f"harvest: {sum(j.status == 'ok' for j in jobs)} ok, {len(failed)} failed, "
          f"{sum(j.status == 'skipped' for j in jobs)} skipped in {time.perf_counter() - start:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
