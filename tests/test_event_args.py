"""Event ``args`` held as the Kineto reader and the trace cache hold them: one compact JSON text
per event, in compressed chunks (tracer/args.py). Reading them packed gives what the decoded dicts
give; the reader's texts decode to exactly the file's values."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from whatif.tracer import args as args_module
from whatif.tracer.args import Arg, EventArgs, arg_column, arg_columns
from whatif.tracer.trace import load_trace


def _dicts(n: int) -> list[dict | None]:
    rng = np.random.default_rng(7)
    out: list[dict | None] = []
    for i in range(n):
        pick = int(rng.integers(0, 5))
        if pick == 0:
            out.append(None)
        elif pick == 1:
            out.append({"Collective name": "allreduce", "Group size": int(rng.integers(2, 9)), "dtype": "Float"})
        elif pick == 2:
            out.append({})
        else:
            out.append({"External id": i, "Input Dims": [[i, 3], []], "Input type": ["float", ""], "x": 1.5 * i})
    return out


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(args_module, "PACK_ROWS", 7)  # many chunks, rows on both sides of each boundary


@pytest.mark.usefixtures("small_chunks")
def test_packed_args_read_as_the_dicts() -> None:
    values = _dicts(300)
    decoded = EventArgs.of(values)
    packed = EventArgs.of_json(values).pack()
    assert len(packed) == 300
    assert packed.values().tolist() == values
    rows = np.random.default_rng(1).permutation(300)[:120]
    assert EventArgs.of_json(values).pack().values(rows).tolist() == [values[r] for r in rows.tolist()]
    assert EventArgs.of_json(values).pack().take(rows).values().tolist() == [values[r] for r in rows.tolist()]
    for arg in (Arg.COLLECTIVE_NAME, Arg.GROUP_SIZE, Arg.INPUT_DIMS, Arg.INPUT_TYPES):
        assert arg_column(EventArgs.of_json(values).pack(), arg).tolist() == arg_column(decoded, arg).tolist()
    cols = arg_columns(EventArgs.of_json(values).pack(), [Arg.GROUP_SIZE, Arg.DTYPE], rows)
    assert cols[Arg.GROUP_SIZE].tolist() == arg_column(decoded, Arg.GROUP_SIZE, rows).tolist()
    assert cols[Arg.DTYPE].tolist() == arg_column(decoded, Arg.DTYPE, rows).tolist()


@pytest.mark.usefixtures("small_chunks")
def test_sparse_rows_of_packed_args_find_every_holder() -> None:
    values = [{"Collective name": "x"} if i % 50 == 3 else {"a": i} for i in range(400)]
    found = EventArgs.of_json(values).pack().sparse_rows(("Collective name",))
    assert found is not None and found.tolist() == [i for i in range(400) if i % 50 == 3]
    dense = [{"Collective name": "x"}] * 100
    assert EventArgs.of_json(dense).pack().sparse_rows(("Collective name",)) is None  # decoded whole instead


@pytest.mark.usefixtures("small_chunks")
def test_concat_of_packed_and_decoded_parts() -> None:
    a, b = _dicts(20), _dicts(9)
    joined = EventArgs.concat([EventArgs.of_json(a).pack(), EventArgs.of(b)])
    assert joined.values().tolist() == a + b and joined.exact()
    lossy = EventArgs.concat([EventArgs.of_json(a).pack(), EventArgs.of([{"x": float("nan")}])])
    assert not lossy.exact() and len(lossy) == 21  # kept decoded: JSON cannot spell the NaN


def test_reader_args_are_the_files_values(tmp_path) -> None:
    """Values at the edges of what JSON holds come back from the encoded texts unchanged, and
    events without an ``args`` object have None."""
    odd = [{"External id": 1, "big": 2**70, "below": -(2**63) - 1, "tiny": 5e-324, "exp": 1e5, "neg0": -0.0,
            "text": "π ü \u0000 \"q\"", "nested": [[1, 2], [], {"k": None}], "empty": {}},
           {},
           None,
           ["not", "a", "dict"]]
    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": 10 * i, "dur": 5,
               **({} if a is None else {"args": a})} for i, a in enumerate(odd)]
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"traceEvents": events}))
    got = load_trace(path).raw_args().tolist()
    assert got == [odd[0], {}, None, None]
    assert str(got[0]["neg0"]) == "-0.0" and isinstance(got[0]["big"], int) and isinstance(got[0]["exp"], float)


@pytest.mark.usefixtures("small_chunks")
def test_packed_texts_table_round_trip_and_refusals() -> None:
    values = _dicts(50)
    packed = EventArgs.of_json(values).pack().packed_texts()
    back = args_module.PackedTexts.from_table(packed.table())
    assert EventArgs.from_packed(back).values().tolist() == values
    table = packed.table()
    rows = table.column("rows").to_pylist()
    with pytest.raises(ValueError, match="unequal rows"):
        args_module.PackedTexts.from_table(table.set_column(0, "rows", pa.array([rows[0] + 1, *rows[1:]], pa.int32())))
    starts = table.column("starts").to_pylist()
    with pytest.raises(ValueError, match="offsets"):
        args_module.PackedTexts.from_table(table.set_column(2, "starts", pa.array([starts[0][:-4], *starts[1:]],
                                                                                  pa.large_binary())))


@pytest.mark.usefixtures("small_chunks")
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gather_equals_concat_then_take(seed: int) -> None:
    """The load's join of every file's args in sorted order never holds the joined texts
    uncompressed; it must give what concatenating and taking gives, rows in any order, parts of
    any sizes (chunk boundaries on both sides), decoded parts included."""
    rng = np.random.default_rng(seed)
    values = _dicts(120)
    cuts = np.sort(rng.choice(np.arange(1, 120), size=4, replace=False))
    pieces = np.split(np.arange(120), cuts)
    parts = [EventArgs.of_json([values[i] for i in p]).pack() if k % 2 else EventArgs.of([values[i] for i in p])
             for k, p in enumerate(pieces)]
    rows = rng.permutation(120)[:100]
    gathered = EventArgs.gather(parts, rows)
    assert gathered.values().tolist() == [values[r] for r in rows.tolist()]
    assert gathered.values().tolist() == EventArgs.concat(parts).take(rows).values().tolist()
    assert gathered.exact()


def test_gather_keeps_decoded_args_that_json_would_change() -> None:
    lossy = EventArgs.of([{"x": float("nan")}])
    out = EventArgs.gather([EventArgs.of_json([{"a": 1}]), lossy], np.array([1, 0]))
    assert np.isnan(out.values()[0]["x"]) and out.values()[1] == {"a": 1}


def test_packed_chunks_hold_only_their_compressed_bytes() -> None:
    """The codec's output buffer has the capacity of the worst case (about the input's size): a
    chunk kept in it held ~5x its compressed bytes (137 MiB instead of 25 for a 64-rank job)."""
    pool = pa.system_memory_pool()
    texts = pa.array([b'{"Group size":8,"Collective name":"allreduce"}'] * 50_000, type=pa.large_binary())
    before = pool.bytes_allocated()
    packed = args_module.PackedTexts.of(texts)
    held = pool.bytes_allocated() - before
    compressed = sum(len(c.blob) for c in packed._chunks)
    assert compressed < texts.nbytes / 20
    assert held < texts.nbytes / 20, f"{held} bytes held in Arrow's pool for {compressed} compressed bytes"
