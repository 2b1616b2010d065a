"""The GPU harvest rehearsed on CPU (bench/gpu_harvest/run.py --device cpu), and the manifest of
the harvest that ran on the H200 (sample_traces/gpu/manifest.json)."""
from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HARVEST = REPO / "bench" / "gpu_harvest"
GPU = REPO / "sample_traces" / "gpu"
sys.path.insert(0, str(HARVEST))
import run as harvest  # noqa: E402


def test_shrink_keeps_the_change_and_the_ratios() -> None:
    assert harvest.shrink(("--d-model", "1024", "--batch", "32", "--cuda-graph")) == ("--d-model", "64", "--batch",
                                                                                      "8", "--cuda-graph")
    before, after = (harvest.shrink(p.args) for p in (harvest.PAIRS[5].before, harvest.PAIRS[5].after))
    assert int(after[after.index("--batch") + 1]) == 4 * int(before[before.index("--batch") + 1])


def test_every_pair_differs_in_its_change_only() -> None:
    for p in harvest.PAIRS:
        assert p.before.script == p.after.script
        assert p.before.args != p.after.args
    assert len(harvest.PAIRS) == 9
    names = [j.name for j in harvest.plan(set(harvest.GROUPS))]
    assert len(names) == len(set(names))


def test_pack_splits_groups_into_bounded_tars(tmp_path: Path) -> None:
    out = tmp_path / "out"
    for i in range(3):
        run = out / "pairs" / f"run{i}"
        run.mkdir(parents=True)
        (run / "rank0.pt.trace.json.gz").write_bytes(bytes(600))
    (out / "manifest.json").write_text("{}")
    written = harvest.pack(out, tmp_path / "packed", part_bytes=1000)
    names = sorted(p.name for p in written)
    assert names == ["manifest.json", "pairs-1.tar", "pairs-2.tar", "pairs-3.tar"]
    members = [m for p in written if p.suffix == ".tar" for m in tarfile.open(p).getnames()]
    assert sorted(m for m in members if m.endswith(".gz")) == [f"pairs/run{i}/rank0.pt.trace.json.gz"
                                                                for i in range(3)]


@pytest.mark.slow
def test_cpu_rehearsal_records_and_skips_cuda_only_jobs(tmp_path: Path) -> None:
    out = tmp_path / "h"
    proc = subprocess.run([sys.executable, str(HARVEST / "run.py"), "--device", "cpu", "--out", str(out),
                           "--jobs", "train-torch,train-cupti,p2_cuda_graph-after-r1"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    jobs = {j["name"]: j for j in json.loads((out / "manifest.json").read_text())["jobs"]}
    assert jobs["train-torch"]["status"] == "ok"
    assert (out / jobs["train-torch"]["run_dir"] / "rank0.pt.trace.json.gz").is_file()
    assert json.loads((out / jobs["train-torch"]["log"]).read_text())["summary"]["steps"] == 4
    assert jobs["train-cupti"]["status"] == jobs["p2_cuda_graph-after-r1"]["status"] == "skipped"


def test_the_h200_harvest_manifest() -> None:
    doc = json.loads((GPU / "manifest.json").read_text())
    assert doc["env"]["gpu"]["name"] == "NVIDIA H200"
    jobs = {j["name"]: j for j in doc["jobs"]}
    for p in harvest.PAIRS:
        for side in ("before", "after"):
            for rnd in (1, 2):
                assert jobs[f"{p.name}-{side}-r{rnd}"]["status"] == "ok"
            assert (GPU / "pairs" / f"{p.name}-{side}-r1" / "rank0.pt.trace.json.gz").is_file()
    for name in harvest.BACKEND_PROGRAMS:
        for mode in ("torch", "cupti"):
            assert jobs[f"{name}-{mode}"]["status"] == "ok"
    skipped = [j for j in doc["jobs"] if j["status"] != "ok"]
    assert skipped and all(j["status"] == "skipped" and "budget" in j["reason"] for j in skipped)
