"""Trace readers by suffix (whatif.tracer.readers): a reader registered here is used by load_trace,
folder discovery, the dashboard's uploads and the CLI's error messages; the registry is restored
after each test."""
from __future__ import annotations

import base64
import csv
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from tracegen import KinetoTrace

from whatif.api import analyze
from whatif.cli import main
from whatif.dashboard.uploads import UploadError, save_trace
from whatif.tracer import EventKind, TraceError, load_trace, readers
from whatif.tracer.kineto import KinetoReader
from whatif.tracer.readers import FileColumns, FileTrace, TraceReader

KINDS = {"cpu": EventKind.CPU_OP, "annotation": EventKind.ANNOTATION, "runtime": EventKind.RUNTIME,
         "kernel": EventKind.KERNEL}


class EventsCsvReader(TraceReader):
    """A toy format: one event per line, ``kind,name,start_us,dur_us,thread,correlation``
    (GPU events: ``thread`` is the stream)."""

    name = "events-csv"
    suffixes = (".events.csv",)

    def read(self, path: Path) -> FileTrace:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        if not rows:
            raise TraceError(path, "no events")
        bad = next((r["kind"] for r in rows if r["kind"] not in KINDS), None)
        if bad is not None:
            raise TraceError(path, f"unknown kind {bad!r} (kinds: {', '.join(KINDS)})")
        kinds = [KINDS[r["kind"]] for r in rows]
        columns = FileColumns.from_events(
            ts_ns=[round(float(r["start_us"]) * 1000) for r in rows],
            dur_ns=[round(float(r["dur_us"]) * 1000) for r in rows], kind=kinds, name=[r["name"] for r in rows],
            pid=[0 if k.on_gpu else 1 for k in kinds], tid=[int(r["thread"]) for r in rows],
            device=[0 if k.on_gpu else -1 for k in kinds],
            stream=[int(r["thread"]) if k.on_gpu else -1 for r, k in zip(rows, kinds)],
            correlation=[int(r["correlation"] or -1) for r in rows])
        return FileTrace(path=path, columns=columns, flows=[], metadata={}, thread_names={}, process_names={},
                         category_counts=dict(Counter(r["kind"] for r in rows)), skipped={})

    def check_bytes(self, filename: str, data: bytes) -> str | None:
        return None if data.startswith(b"kind,name,") else "not an events CSV (first line: kind,name,...)"


CSV = """kind,name,start_us,dur_us,thread,correlation
annotation,ProfilerStep#0,0,100,1,
cpu,aten::mm,2,20,1,
runtime,cudaLaunchKernel,5,5,1,1
kernel,gemm,12,60,7,1
annotation,ProfilerStep#1,100,100,1,
cpu,aten::mm,102,20,1,
runtime,cudaLaunchKernel,105,5,1,2
kernel,gemm,112,60,7,2
"""


@pytest.fixture
def toy_reader() -> Iterator[EventsCsvReader]:
    reader = readers.register_reader(EventsCsvReader())
    try:
        yield reader
    finally:
        readers.unregister_reader(reader)
    assert readers.suffixes() == KinetoReader.suffixes  # restored


def test_the_kineto_reader_is_built_in() -> None:
    assert readers.suffixes() == (".json", ".json.gz")
    assert readers.accepted() == "*.json, *.json.gz"
    assert isinstance(readers.reader_for("a/rank0.pt.trace.JSON.GZ"), KinetoReader)  # case does not matter
    assert not readers.is_trace_name("meta.json") and not readers.is_trace_name(".json")


def test_a_registered_reader_loads_through_load_trace(tmp_path: Path, toy_reader: EventsCsvReader) -> None:
    path = tmp_path / "run.events.csv"
    path.write_text(CSV)
    assert readers.reader_for(path) is toy_reader and readers.is_trace_file(path)
    trace = load_trace(path)
    ev = trace.events
    assert len(ev) == 8 and trace.count(EventKind.KERNEL) == 2
    kernels = ev[ev["kind"] == EventKind.KERNEL]
    assert kernels["name"].tolist() == ["gemm", "gemm"] and kernels["ts_ns"].tolist() == [12_000, 112_000]
    assert kernels["stream"].tolist() == [7, 7] and kernels["correlation"].tolist() == [1, 2]
    assert trace.ranks[0].category_counts == {"annotation": 2, "cpu": 2, "runtime": 2, "kernel": 2}
    a = analyze(path)  # the whole pipeline runs on it: two steps, replayed as measured
    assert a.steps["measured_ns"].tolist() == [100_000, 100_000]
    assert a.steps["predicted_ns"].tolist() == a.steps["measured_ns"].tolist()


def test_folders_and_errors_follow_the_registry(tmp_path: Path, toy_reader: EventsCsvReader,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for rank in (0, 1):
        (run / f"rank{rank}.events.csv").write_text(CSV)
    (run / "notes.txt").write_text("not a trace")
    assert [r.rank for r in load_trace(run).ranks] == [0, 1]
    assert readers.accepted() == "*.json, *.json.gz, *.events.csv"
    bad = tmp_path / "x.events.csv"
    bad.write_text("kind,name,start_us,dur_us,thread,correlation\nfpga,k,0,1,1,\n")
    assert main(["analyze", str(bad)]) == 2
    assert capsys.readouterr().err == f"whatif: {bad}: unknown kind 'fpga' (kinds: cpu, annotation, runtime, kernel)\n"
    other = tmp_path / "x.nsys-rep"
    other.write_bytes(b"\0")
    assert main(["analyze", str(other)]) == 2
    assert capsys.readouterr().err == \
        f"whatif: {other}: not a trace file (accepted: *.json, *.json.gz, *.events.csv)\n"


def test_an_unregistered_suffix_is_refused_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "run.events.csv"
    path.write_text(CSV)
    with pytest.raises(TraceError, match=r"run.events.csv: not a trace file \(accepted: \*.json, \*.json.gz\)$"):
        load_trace(path)
    assert main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"whatif: {path}: not a trace file (accepted: *.json, *.json.gz)"]
    tr = KinetoTrace()  # a Kineto file beside it: the folder loads only that one
    tr.runtime("cudaLaunchKernel", 0, 5, corr=1)
    tr.gpu("k", 10, 5, corr=1)
    tr.write(tmp_path / "k.json")
    assert [r.path.name for r in load_trace(tmp_path).ranks] == ["k.json"]


def test_uploads_ask_the_reader(tmp_path: Path, toy_reader: EventsCsvReader) -> None:
    def url(data: bytes) -> str:
        return "data:text/csv;base64," + base64.b64encode(data).decode()

    saved = save_trace(tmp_path, "mine.events.csv", url(CSV.encode()), 1 << 20)
    assert saved.read_text() == CSV and saved.name == "mine.events.csv"
    with pytest.raises(UploadError, match=r"^x.events.csv: not an events CSV"):
        save_trace(tmp_path, "x.events.csv", url(b"{}"), 1 << 20)
    with pytest.raises(UploadError, match=r"only trace files \(\*.json, \*.json.gz, \*.events.csv\)"):
        save_trace(tmp_path, "x.csv", url(CSV.encode()), 1 << 20)


def test_the_registry_refuses_clashes_and_bad_suffixes() -> None:
    class Clash(EventsCsvReader):
        suffixes = (".json",)

    class Upper(EventsCsvReader):
        suffixes = (".CSV",)

    with pytest.raises(TypeError, match=r"suffix .json is read by KinetoReader already"):
        readers.register_reader(Clash())
    with pytest.raises(TypeError, match="lower-case"):
        readers.register_reader(Upper())
    assert readers.suffixes() == (".json", ".json.gz")
