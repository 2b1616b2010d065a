"""Hostile and corrupt trace files, each the minimal input of a root cause the fuzzing campaign
found (issue 20): refused with one line naming the file, never a traceback, never unbounded
memory or a hang."""
from __future__ import annotations

import gzip
import json
import os
import zlib
from pathlib import Path

import pytest
from test_tracer import BASE_US, minimal, one_line_error, write, x

from whatif.core import limits
from whatif.core.errors import WhatifError
from whatif.tracer import load_trace


def _raw(path: Path, doc: dict, tail: bytes) -> Path:
    """``doc`` as JSON with ``tail`` spliced in as one more top-level key (raw bytes)."""
    text = json.dumps(doc).encode()
    path.write_bytes(text[:-1] + b"," + tail + b"}")
    return path


def test_deep_nesting_anywhere_is_refused(tmp_path: Path) -> None:
    deep = b'"unused": ' + b"[" * 5000 + b"]" * 5000
    assert "nested deeper" in one_line_error(_raw(tmp_path / "deep.json", minimal(), deep))


@pytest.mark.parametrize("bad", [b'"x": "a\xffb"', b'"x": "\xed\xa0\x80"'])   # 0xFF; a raw lone surrogate
def test_invalid_utf8_in_a_string_is_refused(tmp_path: Path, bad: bytes) -> None:
    assert "not valid JSON" in one_line_error(_raw(tmp_path / "utf8.json", minimal(), bad))


def test_step_number_beyond_the_step_columns_is_refused(tmp_path: Path) -> None:
    doc = minimal(x("user_annotation", f"ProfilerStep#{2 ** 63}", BASE_US, 100))
    assert f"step number beyond {limits.MAX_STEP}" in one_line_error(write(tmp_path / "s.json", doc))
    ok = minimal(x("user_annotation", f"ProfilerStep#{limits.MAX_STEP}", BASE_US, 100))
    assert load_trace(write(tmp_path / "ok.json", ok)).events["name"].isin([f"ProfilerStep#{limits.MAX_STEP}"]).any()


def test_times_whose_sum_would_overflow_are_refused(tmp_path: Path) -> None:
    near = limits.MAX_TIME_NS // 1000   # in range alone, out of range with a base added
    doc = minimal(x("cpu_op", "aten::add", near, 1), baseTimeNanoseconds=limits.MAX_TIME_NS)
    assert "timestamp + baseTimeNanoseconds out of range" in one_line_error(write(tmp_path / "b.json", doc))
    doc = minimal(x("cpu_op", "aten::add", BASE_US, limits.MAX_DURATION_NS // 1000 + 1))
    assert "duration out of range" in one_line_error(write(tmp_path / "d.json", doc))
    doc = minimal(baseTimeNanoseconds=1e300)
    assert "baseTimeNanoseconds out of range" in one_line_error(write(tmp_path / "big.json", doc))
    flow = {"ph": "s", "cat": "fwdbwd", "id": 1, "pid": 100, "tid": 1, "ts": 1e300}
    trace = load_trace(write(tmp_path / "f.json", minimal(flow)))   # a flow beyond the bound is skipped
    assert trace.flows == []


def test_times_at_the_bounds_load_and_stay_in_int64(tmp_path: Path) -> None:
    doc = minimal(x("cpu_op", "aten::add", BASE_US, limits.MAX_DURATION_NS // 1000))
    ev = load_trace(write(tmp_path / "t.json", doc)).events
    ends = ev["ts_ns"].to_numpy() + ev["dur_ns"].to_numpy()
    assert (ends > 0).all() and ends.max() == BASE_US * 1000 + limits.MAX_DURATION_NS // 1000 * 1000


@pytest.mark.parametrize(("info", "problem"), [({"rank": 2 ** 40}, "rank 1099511627776 out of range"),
                                                ({"rank": 0, "world_size": 2 ** 40}, "world size")])
def test_rank_and_world_size_beyond_int32_are_refused(tmp_path: Path, info: dict, problem: str) -> None:
    assert problem in one_line_error(write(tmp_path / "r.json", minimal(distributedInfo=info)))


def test_rank_in_the_file_name_beyond_int32_is_refused(tmp_path: Path) -> None:
    assert "out of range" in one_line_error(write(tmp_path / f"rank{2 ** 40}.json", minimal()))


def test_a_gzip_bomb_is_refused_before_it_inflates_past_the_cap(tmp_path: Path, monkeypatch) -> None:
    """64 MiB of spaces compress to ~64 KiB (~1000x): refused at 100x its size, without ever
    holding more than the cap; raising the ratio by environment lets it through."""
    path = tmp_path / "bomb.json.gz"
    body = json.dumps(minimal()).encode()
    with gzip.open(path, "wb") as f:
        f.write(body[:-1] + b', "pad": "' + b" " * (64 << 20) + b'"}')
    message = one_line_error(path)
    assert "inflates to more than" in message and "WHATIF_MAX_INFLATE_RATIO" in message
    monkeypatch.setenv("WHATIF_MAX_INFLATE_RATIO", "5000")
    assert len(load_trace(path).events) == 3
    monkeypatch.setenv("WHATIF_MAX_TRACE_GB", "0.01")
    assert "inflates to more than" in one_line_error(path)
    monkeypatch.setenv("WHATIF_MAX_TRACE_GB", "lots")
    with pytest.raises(WhatifError, match="WHATIF_MAX_TRACE_GB='lots': not a number"):
        load_trace(path)


def test_a_multi_member_gzip_counts_every_member_against_the_cap(tmp_path: Path) -> None:
    body = json.dumps(minimal()).encode()
    half = len(body) // 2
    path = tmp_path / "two.json.gz"
    path.write_bytes(gzip.compress(body[:half]) + gzip.compress(body[half:]))
    assert len(load_trace(path).events) == 3
    packed = zlib.compress(b" " * (8 << 20))   # not gzip framing: the reader says so
    (tmp_path / "z.json.gz").write_bytes(b"\x1f\x8b" + packed)
    assert "gzip" in one_line_error(tmp_path / "z.json.gz")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes need POSIX")
def test_a_named_pipe_is_refused_not_read(tmp_path: Path) -> None:
    pipe = tmp_path / "trace.json"
    os.mkfifo(pipe)
    assert "not a regular file" in one_line_error(pipe)


def test_export_leaves_out_metadata_it_cannot_write(tmp_path: Path) -> None:
    from whatif.api import analyze

    doc = minimal(distributedInfo={"rank": {}, "world_size": -(2 ** 63) - 1},
                  deviceProperties=[{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}])
    out = analyze(write(tmp_path / "t.json", doc)).export(tmp_path / "out.json")
    exported = json.loads(out.read_text())
    assert "distributedInfo" not in exported
    assert exported["deviceProperties"] == [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}]
