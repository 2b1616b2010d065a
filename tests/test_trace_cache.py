"""The columnar trace cache (tracer/cache.py): a trace read back from the cache is the parsed one,
field by field; a corrupt, stale or foreign entry is rebuilt, never trusted; ``--no-cache`` and
``WHATIF_NO_CACHE`` leave the cache alone. conftest.py turns the cache off for every other test;
here it is on, in a temporary folder."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd
import pytest

import whatif.tracer.trace as trace_module
from whatif.cli import main
from whatif.tracer import cache
from whatif.tracer.args import Arg, EventArgs
from whatif.tracer.trace import Trace, load_trace

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "llm_serve"  # a run folder
SHARED_CASES = [
    "hta/nccl_data_a100_rank0of2.json.gz",               # collective args, fwdbwd flows, float ts
    "hta/sampled_world128",                              # a folder of two ranks
    "hta/critical_path_alexnet_a100.json.gz",            # cuda_sync records (read through raw args)
    pytest.param("hta/df_index_resolver_v100_rank1of2.json.gz", marks=pytest.mark.slow),  # 123k events, memory
    pytest.param("kineto/resnet50_num_workers_0__worker0.1623143089861.pt.trace.json.gz",  # 2021 schema
                 marks=pytest.mark.slow),
    pytest.param("tracelens/xdit_flux1_aiter_sage_mi300x.json.gz", marks=pytest.mark.slow),  # 200k events, AMD
]


@pytest.fixture
def cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(root))
    monkeypatch.delenv(cache.NO_CACHE_ENV, raising=False)
    return root


@pytest.fixture
def parse_refused(monkeypatch: pytest.MonkeyPatch):
    """Call it to make any further parse fail: what loads then came from the cache."""
    def refuse() -> None:
        def no_parse(path: Path) -> None:
            raise AssertionError(f"{path} was parsed, not read from the cache")
        monkeypatch.setattr(trace_module, "read_file", no_parse)
    return refuse


def assert_same_trace(parsed: Trace, cached: Trace) -> None:
    pd.testing.assert_frame_equal(cached.events, parsed.events, check_exact=True, check_categorical=True)
    assert list(cached.events.dtypes) == list(parsed.events.dtypes)
    assert list(cached.events["name"].cat.categories) == list(parsed.events["name"].cat.categories)
    assert cached.ranks == parsed.ranks
    assert cached.flows == parsed.flows
    pd.testing.assert_frame_equal(cached.memory, parsed.memory, check_exact=True)
    for arg in Arg:
        assert cached.arg(arg).tolist() == parsed.arg(arg).tolist(), arg
    rows = np.arange(0, len(parsed.events), 7)
    assert cached.raw_args(rows).tolist() == parsed.raw_args(rows).tolist()
    assert cached.raw_args().tolist() == parsed.raw_args().tolist()


def test_a_run_folder_reads_back_from_the_cache_field_by_field(cache_root, parse_refused):
    with cache.bypassed():
        parsed = load_trace(SAMPLE)
    assert not cache_root.exists()  # bypassed: nothing written
    assert_same_trace(parsed, load_trace(SAMPLE))  # parsed, then stored
    assert len([p for p in cache_root.iterdir() if not p.name.startswith(".")]) == 1
    parse_refused()
    assert_same_trace(parsed, load_trace(SAMPLE))


@pytest.mark.shared
@pytest.mark.parametrize("name", SHARED_CASES)
def test_shared_traces_read_back_from_the_cache_field_by_field(shared_traces, cache_root, parse_refused, name):
    path = shared_traces / name
    with cache.bypassed():
        parsed = load_trace(path)
    load_trace(path)
    parse_refused()
    assert_same_trace(parsed, load_trace(path))


@pytest.mark.shared
def test_a_generated_multi_rank_job_reads_back_from_the_cache(shared_traces, cache_root, parse_refused, tmp_path):
    from whatif.jobgen import JobOptions, generate_job
    job = tmp_path / "job"
    generate_job(shared_traces / "hta" / "nccl_data_a100_rank0of2.json.gz", job, JobOptions(ranks=4, seed=3),
                 stragglers={2: 100_000})
    with cache.bypassed():
        parsed = load_trace(job)
    load_trace(job)
    parse_refused()
    cached = load_trace(job)
    assert_same_trace(parsed, cached)
    assert sorted({r.rank for r in cached.ranks}) == [0, 1, 2, 3]


def test_analyze_json_is_byte_identical_with_and_without_the_cache(cache_root, tmp_path):
    outs = [tmp_path / f"{n}.json" for n in ("parsed", "stored", "cached")]
    assert main(["analyze", str(SAMPLE), "--json", str(outs[0]), "-q", "--no-cache"]) == 0
    assert not cache_root.exists()  # --no-cache neither reads nor writes
    assert main(["analyze", str(SAMPLE), "--json", str(outs[1]), "-q"]) == 0
    assert cache_root.exists()
    assert main(["analyze", str(SAMPLE), "--json", str(outs[2]), "-q"]) == 0
    assert outs[0].read_bytes() == outs[1].read_bytes() == outs[2].read_bytes()


def test_the_environment_variable_turns_the_cache_off(cache_root, monkeypatch):
    monkeypatch.setenv(cache.NO_CACHE_ENV, "1")
    load_trace(SAMPLE)
    assert not cache_root.exists()


def _entry(root: Path) -> Path:
    (entry,) = [p for p in root.iterdir() if not p.name.startswith(".")]
    return entry


def _truncate(entry: Path) -> None:
    data = (entry / "events.parquet").read_bytes()
    (entry / "events.parquet").write_bytes(data[: len(data) // 2])


def _flip_a_byte(entry: Path) -> None:
    data = bytearray((entry / "events.parquet").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (entry / "events.parquet").write_bytes(bytes(data))


def _drop_memory(entry: Path) -> None:
    (entry / "memory.parquet").unlink()


def _garble_manifest(entry: Path) -> None:
    (entry / "manifest.json").write_bytes(b'{"schema_version": 1, "key": ')


def _rewrite_manifest(entry: Path, change) -> None:
    """The manifest changed and its digest recomputed: an entry that is whole but wrong (written by
    an older whatif, or for other files), caught by what the manifest says, not by its digest."""
    doc = msgspec.json.decode((entry / "manifest.json").read_bytes())
    change(doc)
    text = msgspec.json.encode(doc)
    (entry / "manifest.json").write_bytes(text)
    (entry / "manifest.blake2b").write_text(hashlib.blake2b(text, digest_size=20).hexdigest())


def _edited_manifest(entry: Path) -> None:
    text = (entry / "manifest.json").read_bytes()
    (entry / "manifest.json").write_bytes(text.replace(b'"rank":0', b'"rank":5'))


def _old_schema(entry: Path) -> None:
    _rewrite_manifest(entry, lambda doc: doc.update(schema_version=cache.SCHEMA_VERSION - 1))


def _other_key(entry: Path) -> None:
    _rewrite_manifest(entry, lambda doc: doc.update(key="0" * len(doc["key"])))


def _wrong_rows(entry: Path) -> None:
    _rewrite_manifest(entry, lambda doc: doc["rows"].update({"events.parquet": doc["rows"]["events.parquet"] + 1}))


def _file_out_of_range(entry: Path) -> None:
    _rewrite_manifest(entry, lambda doc: doc["ranks"][0].update(files=[1]))


def _foreign_parquet(entry: Path) -> None:
    """A whole Parquet file of another layout, its digest recorded."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"ts_ns": [1, 2]}), entry / "events.parquet")
    digest = hashlib.blake2b((entry / "events.parquet").read_bytes(), digest_size=20).hexdigest()
    _rewrite_manifest(entry, lambda doc: doc["digests"].update({"events.parquet": digest}))


@pytest.mark.parametrize("damage", [_truncate, _flip_a_byte, _drop_memory, _garble_manifest, _edited_manifest,
                                    _old_schema, _other_key, _wrong_rows, _file_out_of_range, _foreign_parquet])
def test_a_damaged_entry_is_rebuilt_never_trusted(cache_root, damage, monkeypatch):
    with cache.bypassed():
        parsed = load_trace(SAMPLE)
    load_trace(SAMPLE)
    entry = _entry(cache_root)
    damage(entry)
    parses: list[Path] = []
    real = trace_module.read_file
    monkeypatch.setattr(trace_module, "read_file", lambda p: parses.append(p) or real(p))
    assert_same_trace(parsed, load_trace(SAMPLE))
    assert len(parses) == 1  # the damaged entry was not used: the file was parsed again
    load_trace(SAMPLE)
    assert len(parses) == 1  # and the rebuilt entry is used
    assert cache.fetch(entry.name, 1) is not None


def test_a_changed_file_is_a_new_entry(cache_root, tmp_path):
    src = SAMPLE / "rank0.pt.trace.json.gz"
    copy = tmp_path / "t" / "rank0.pt.trace.json.gz"
    copy.parent.mkdir()
    copy.write_bytes(src.read_bytes())
    first = load_trace(copy)
    key = cache.trace_key([copy])
    assert key is not None
    copy.write_bytes(src.read_bytes() + b"\n")
    assert cache.trace_key([copy]) != key
    other = tmp_path / "t" / "rank1.pt.trace.json.gz"  # same bytes, another name: ranks come from names
    other.write_bytes(src.read_bytes())
    assert cache.trace_key([other]) != key
    assert load_trace(other).ranks[0].path == other  # paths are the caller's, not the cached ones
    assert first.ranks[0].path == copy


def test_a_concurrent_writer_keeps_the_first_entry(cache_root):
    load_trace(SAMPLE)
    entry = _entry(cache_root)
    found = cache.fetch(entry.name, 1)
    assert found is not None
    assert cache.store(entry.name, 1, found) is False  # the rename finds the entry in place
    assert [p.name for p in cache_root.iterdir()] == [entry.name]  # no temporary folder left
    assert cache.fetch(entry.name, 1) is not None


def test_values_json_cannot_keep_are_not_stored(cache_root):
    found = cache.Cached(columns={}, codes=np.zeros(0, dtype=np.int32), names=[],
                         args=EventArgs.of([{"x": float("nan")}]), memory=pd.DataFrame(), flows=[], ranks=[])
    assert cache.store("k", 1, found) is False
    assert not cache_root.exists()


def test_an_unwritable_cache_folder_only_skips_the_cache(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(cache.CACHE_DIR_ENV, str(blocker / "cache"))
    monkeypatch.delenv(cache.NO_CACHE_ENV, raising=False)
    assert len(load_trace(SAMPLE).events) > 0
    assert blocker.read_text() == "not a folder"


def test_the_default_folder_is_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(cache.CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.cache_dir() == tmp_path / "whatif"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache.cache_dir() == Path(os.path.expanduser("~")) / ".cache" / "whatif"
