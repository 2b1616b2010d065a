"""whatif's run folders and exports read by HolisticTraceAnalysis 0.5.0 and TraceLens (issue 16, item 8).

1. A 2-rank ``whatif record`` folder (two gloo processes on this CPU): the ranks HTA loads from it,
   and from the same folder as whatif wrote it before (``meta.json``, compact ``"rank":k``).
2. HTA's critical path (``TraceAnalysis.critical_path_analysis``) on a shared A100 trace and on its
   ``whatif export``: success, graph size, breakdown.
3. TraceLens's perf report (``generate_perf_report_pytorch``) on six shared HuggingFace traces
   (H100, MI300X) and on their ``whatif export``: the GEMM and SDPA op rows (name, parameters,
   shapes, counts) and kernel time.
4. The ranks HTA loads from a ``whatif export`` of a 2-rank trace (one file per rank).

HTA comes from pip into a throw-away venv (bench/common/hta.py); TraceLens from a checkout named by
--tracelens or $WHATIF_TRACELENS (bench/common/tracelens.py). A part whose peer or trace is absent
says so and is skipped.

Run: .venv/bin/python bench/interop.py [--hta-python PATH] [--tracelens DIR]
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import orjson
from common.hta import hta_python
from common.tracelens import tracelens_python, tracelens_source

from whatif.api import analyze

BENCH = Path(__file__).resolve().parent
SHARED = BENCH.parent.parent / "shared" / "traces"
HTA_SCRIPT = BENCH / "hta" / "hta_interop.py"
TRACELENS_SCRIPT = BENCH / "tracelens" / "tracelens_tables.py"
CRITICAL_PATH_TRACE = SHARED / "hta" / "critical_path_alexnet_a100.json.gz"
CRITICAL_PATH_ANNOTATION = ("[param|pytorch.model.alex_net|0|0|0|measure|forward]", 1)
HF_MODELS = ("Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", "gaunernst_bert-small-uncased__1016001.json.gz",
             "Falconsai_nsfw_image_detection__1016002.json.gz")
TRACELENS_TRACES = [f"tracelens/{gpu}/{model}" for gpu in ("hf_h100", "hf_mi300") for model in HF_MODELS]
"""HuggingFace models on an H100 and an MI300X, each with GEMM and SDPA ops."""
TWO_RANK_TRACE = SHARED / "hta" / "sampled_world128"
DDP_SCRIPT = """
    import torch, torch.distributed as dist, whatif
    dist.init_process_group("gloo")
    x = torch.ones(4) * (dist.get_rank() + 1)
    for i in range(3):
        with whatif.phase("allreduce"):
            dist.all_reduce(x)
        whatif.step()
    dist.destroy_process_group()
"""
RECORD_TIMEOUT_S = 300


def record_two_ranks(run: Path) -> Path:
    """Record a 2-rank gloo all-reduce program with ``whatif record`` (two processes, torchrun's
    variables) into ``run``."""
    script = run.parent / "ddp_allreduce.py"
    script.write_text(textwrap.dedent(DDP_SCRIPT))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    whatif = [sys.executable, "-c", "from whatif.cli import main; raise SystemExit(main())"]
    procs = [subprocess.Popen([*whatif, "record", "--no-summary", "-o", str(run), str(script)], cwd=run.parent,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
             for r in range(2)]
    outs = [p.communicate(timeout=RECORD_TIMEOUT_S) for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"whatif record failed: {[o[1].strip().splitlines()[-1:] for o in outs]}")
    return run


def as_before(run: Path, into: Path) -> Path:
    """``run`` as whatif wrote it before: the metadata in ``meta.json``, traces in compact JSON."""
    into.mkdir(parents=True, exist_ok=True)
    for trace in sorted(run.glob("rank*.pt.trace.json.gz")):
        doc = orjson.loads(gzip.decompress(trace.read_bytes()))
        (into / trace.name).write_bytes(gzip.compress(orjson.dumps(doc)))
    (into / "meta.json").write_bytes((run / "meta.jsonc").read_bytes())
    return into


def alone(trace: Path, folder: Path) -> Path:
    """A folder holding only ``trace`` (a link to it; the files of a per-rank folder), what HTA reads."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in sorted(trace.iterdir()) if trace.is_dir() else [trace]:
        (folder / f.name).symlink_to(f.resolve())
    return folder


def run_peer(cmd: list[str | Path], env: dict[str, str] | None = None) -> dict:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise RuntimeError((done.stderr.strip().splitlines() or ["(no output)"])[-1])
    return json.loads(done.stdout.strip().splitlines()[-1])


def hta(py: Path, *args: str | Path) -> dict:
    return run_peer([py, HTA_SCRIPT, *args])


def tracelens(py: Path, source: Path, trace: Path) -> dict:
    return run_peer([py, TRACELENS_SCRIPT, trace], env={"PYTHONPATH": str(source)})


def export(trace: Path, out: Path) -> Path:
    return analyze(trace).export(out)


def compare_tracelens(py: Path, source: Path, trace: Path, out: Path) -> None:
    """Print TraceLens's GEMM and SDPA tables of ``trace`` against those of its export."""
    if not trace.exists():
        print(f"3. {trace}: absent, skipped")
        return
    original = tracelens(py, source, trace)
    exported = tracelens(py, source, export(trace, out))
    print(f"3. TraceLens perf report, {trace.parent.name}/{trace.name}: same sheets: "
          f"{original['sheets'] == exported['sheets']} ({len(original['sheets'])})")
    for sheet in ("GEMM", "SDPA_fwd"):
        a, b = original.get(sheet), exported.get(sheet)
        if a is None or b is None:
            print(f"   {sheet}: original {'present' if a else 'absent'}, export {'present' if b else 'absent'}")
            continue
        print(f"   {sheet}: {len(a['rows'])} op rows on the original, {len(b['rows'])} on the export, "
              f"same rows: {a['rows'] == b['rows']}; kernel time {a['kernel_us']} us vs {b['kernel_us']} us")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hta-python", default=os.environ.get("HTA_PYTHON"))
    parser.add_argument("--tracelens", help="TraceLens checkout (default: $WHATIF_TRACELENS)")
    args = parser.parse_args()
    py = hta_python(args.hta_python)
    source = tracelens_source(args.tracelens)
    tl_py = tracelens_python(source) if source else None
    with tempfile.TemporaryDirectory(prefix="whatif-interop-") as tmp:
        work = Path(tmp)
        if py is None:
            print("1, 2, 4: HolisticTraceAnalysis could not be installed here: skipped")
        else:
            run = record_two_ranks(work / "run")
            before = hta(py, "ranks", as_before(run, work / "before"))["ranks"]
            print(f"1. whatif record, 2 gloo ranks ({sorted(p.name for p in run.iterdir())}): "
                  f"HTA loads ranks {hta(py, 'ranks', run)['ranks']}; as whatif wrote it before: {before}")
            if CRITICAL_PATH_TRACE.exists():
                ann, inst = CRITICAL_PATH_ANNOTATION
                original = hta(py, "critical-path", alone(CRITICAL_PATH_TRACE, work / "cp_in"), ann, str(inst))
                out = export(CRITICAL_PATH_TRACE, work / "cp_out" / "exported.pt.trace.json.gz")
                exported = hta(py, "critical-path", out.parent, ann, str(inst))
                print(f"2. HTA critical path, {CRITICAL_PATH_TRACE.name} {ann} #{inst}:\n"
                      f"   original: {original}\n   export:   {exported}\n   same: {original == exported}")
            else:
                print(f"2. {CRITICAL_PATH_TRACE}: absent, skipped")
            if TWO_RANK_TRACE.exists():
                out = export(TWO_RANK_TRACE, work / "two_rank_export")
                print(f"4. whatif export of {TWO_RANK_TRACE.name} ({sorted(p.name for p in out.iterdir())}): "
                      f"HTA loads ranks {hta(py, 'ranks', out)['ranks']}")
        if tl_py is None or source is None:
            print("3. TraceLens: no checkout (--tracelens DIR or $WHATIF_TRACELENS) or its dependencies "
                  "could not be installed: skipped")
        else:
            for i, name in enumerate(TRACELENS_TRACES):
                compare_tracelens(tl_py, source, SHARED / name, work / f"tl{i}" / "exported.json.gz")
    return 0


if __name__ == "__main__":
    sys.exit(main())
