"""Event arguments as typed columns, declared once (HTA's table of event arguments).

Kineto writes what it knows of an event into ``args`` under names that changed over the years
(``Input Dims`` in 2021-2023, ``Input dims`` before; ``External id`` and ``external id``).
:data:`ARGS` lists each argument the analysis reads: the typed column it becomes, every raw
spelling, the type a value must have, and the default for events that lack it. Consumers read
the columns (:meth:`whatif.tracer.trace.Trace.arg`), never the raw ``args`` dict, so a new
spelling or a new argument is one row here.

Correlation ids, external ids, devices and streams are read by the parser itself into the
``correlation``/``external_id``/``device``/``stream`` columns (``tracer/kineto.py``): they are on
every event and its hot loop.

Each event's raw ``args`` dict is held by :class:`EventArgs`, beside the event table (not in it):
as the Kineto reader and the trace cache (:mod:`whatif.tracer.cache`) hold them, one compact JSON
text per event in LZ4 chunks (:class:`PackedTexts`), decoded only for the rows and arguments that
are read; a reader that hands over dicts has them encoded when JSON keeps them exactly.

>>> args = EventArgs.of([{"Input dims": [[2, 3]], "Input type": ["float"]}, None, {"Input Dims": "bad"}])
>>> arg_column(args, Arg.INPUT_DIMS).tolist()
[[[2, 3]], None, None]
>>> arg_column(EventArgs.encode(args.values()), Arg.INPUT_TYPES).tolist()
[['float'], (), ()]
"""
from __future__ import annotations

import contextlib
import gc
import itertools
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_POOL = pa.system_memory_pool()
"""Where the encoded ``args`` live: the C allocator, which reuses and returns what is freed (Arrow's
default mimalloc pool kept 230 MB of a 32-rank job's freed parse buffers, never handed back)."""


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a trace's objects are being built.

    Decoding creates hundreds of thousands of containers (``args`` dicts and their lists) that
    all survive; each collection their allocation triggered would walk all of them (measured:
    a third to a half of the load time). The collector's previous state is restored on leaving;
    nothing else about the program's garbage collection changes.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass(frozen=True)
class ArgSpec:
    """One argument: the column it becomes, its raw spellings (first present wins), the types
    a value must have to be kept, and the default otherwise."""

    column: str
    raw: tuple[str, ...]
    types: tuple[type, ...]
    default: Any = None


class Arg(Enum):
    """The event arguments whatif reads, each a typed column."""

    INPUT_DIMS = ArgSpec("input_dims", ("Input Dims", "Input dims"), (list,))
    INPUT_TYPES = ArgSpec("input_types", ("Input type",), (list,), default=())
    INPUT_STRIDES = ArgSpec("input_strides", ("Input Strides",), (list,), default=())
    CONCRETE_INPUTS = ArgSpec("concrete_inputs", ("Concrete Inputs",), (list,), default=())
    COLLECTIVE_NAME = ArgSpec("collective_name", ("Collective name",), (str,), default="")
    PROCESS_GROUP = ArgSpec("process_group", ("Process Group Name",), (str, int), default="")
    PROCESS_GROUP_RANKS = ArgSpec("process_group_ranks", ("Process Group Ranks",), (str, list), default="")
    GROUP_SIZE = ArgSpec("group_size", ("Group size",), (int, float))
    # a send's receiver and a recv's sender, global ranks (newer profilers: torch/csrc/profiler/util.cpp)
    P2P_SRC = ArgSpec("p2p_src", ("Src Rank",), (int, str), default=-1)
    P2P_DST = ArgSpec("p2p_dst", ("Dst Rank",), (int, str), default=-1)
    IN_MSG_NELEMS = ArgSpec("in_msg_nelems", ("In msg nelems",), (int, float))
    OUT_MSG_NELEMS = ArgSpec("out_msg_nelems", ("Out msg nelems",), (int, float))
    DTYPE = ArgSpec("dtype", ("dtype",), (str,), default="")
    WAIT_ON_STREAM = ArgSpec("wait_on_stream", ("wait_on_stream",), (int,))
    WAIT_ON_EVENT_CORRELATION = ArgSpec("wait_on_event_correlation", ("wait_on_cuda_event_record_corr_id",), (int,))
    SYNC_DEVICE = ArgSpec("sync_device", ("device",), (int,))
    SYNC_STREAM = ArgSpec("sync_stream", ("stream",), (int,))
    # autograd: an op's sequence number (peeked at record time: the number the next node it creates
    # gets) and its thread's id; a backward node carries the forward op's pair (torch/csrc/profiler)
    SEQUENCE_NUMBER = ArgSpec("sequence_number", ("Sequence number",), (int,))
    FWD_THREAD_ID = ArgSpec("fwd_thread_id", ("Fwd thread id",), (int,))

    @property
    def spec(self) -> ArgSpec:
        return self.value


def read_arg(args: dict[str, Any] | None, arg: Arg) -> Any:
    """One event's value of ``arg`` (its default when absent or of the wrong type).

    >>> read_arg({"Input Dims": [[4]]}, Arg.INPUT_DIMS), read_arg({"Group size": "x"}, Arg.GROUP_SIZE)
    ([[4]], None)
    """
    return _read(args, arg.spec)


def rank_list(value: object) -> tuple[int, ...]:
    """The ranks of a rank-list argument (PyTorch's ``Process Group Ranks``: ``"[0, 1]"``, or a
    list); () when absent or not a list of integers.

    >>> rank_list("[0, 1, 2, 3]"), rank_list([4, 5]), rank_list("[]"), rank_list("n/a")
    ((0, 1, 2, 3), (4, 5), (), ())
    """
    if isinstance(value, list):
        items = value
    elif isinstance(value, str) and value.startswith("[") and value.endswith("]"):
        items = [s.strip() for s in value[1:-1].split(",") if s.strip()]
    else:
        return ()
    try:
        return tuple(int(x) for x in items)
    except (TypeError, ValueError):
        return ()


def rank_value(value: object) -> int:
    """A rank argument (``Src Rank``/``Dst Rank``: an integer, or its text) as an int; -1 when
    absent or not a rank.

    >>> rank_value(3), rank_value("12"), rank_value(-1), rank_value("x")
    (3, 12, -1, -1)
    """
    try:
        rank = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return -1
    return rank if rank >= 0 else -1


def _read(args: dict[str, Any] | None, spec: ArgSpec) -> Any:
    if args.__class__ is not dict:
        return spec.default
    for key in spec.raw:
        if key in args:
            value = args[key]
            # bool is an int to Python, never to Kineto
            return value if isinstance(value, spec.types) and value.__class__ is not bool else spec.default
    return spec.default


SPARSE = 8
"""An argument held by fewer than one event in ``SPARSE`` is read from its events alone; a denser
one makes every event's encoded ``args`` decoded once (and kept) instead."""
PACK_ROWS = 1 << 16
"""Rows per compressed chunk of :class:`PackedTexts` (about 5 MB of Kineto ``args`` text)."""
_CODEC = pa.Codec("lz4")
PACKED_SCHEMA = pa.schema([("rows", pa.int32()), ("size", pa.int64()), ("starts", pa.large_binary()),
                           ("valid", pa.large_binary()), ("blob", pa.large_binary())])
""":meth:`PackedTexts.table`: per chunk its rows, text bytes, row starts (int32, little-endian),
which rows have a text (a bitmap, null when all) and the LZ4 text."""


class EventArgs:
    """Every event's ``args`` dict (or None), in the event table's row order.

    Held either decoded (an object array, as a reader made it) or encoded: one compact JSON
    text per event (a large-binary Arrow array, None where the event had no ``args``), as the
    Kineto reader and the trace cache keep them (a decoded dict costs about 7x its text).
    Encoded values are decoded on reading, only for the rows asked for; JSON keeps every value
    decoded from JSON exactly (integers of any size, floats, strings, lists, dicts in their key
    order). Texts encoded from another reader's dicts are exact only when :func:`exact_json`
    says so, which :meth:`exact` checks before the cache stores them.

    >>> enc = EventArgs.encode([{"Group size": 8}, None])
    >>> enc.values().tolist(), enc.values(np.array([0])).tolist(), len(enc)
    ([{'Group size': 8}, None], [{'Group size': 8}], 2)
    >>> EventArgs.concat([enc, EventArgs.of([{"x": 1}])]).take(np.array([2, 0])).values().tolist()
    [{'x': 1}, {'Group size': 8}]
    """

    __slots__ = ("_decoded", "_encoded", "_exact", "_packed", "_text")

    def __init__(self, decoded: np.ndarray | None, encoded: pa.LargeBinaryArray | None, exact: bool = False) -> None:
        self._decoded = decoded
        self._encoded = encoded
        self._packed: PackedTexts | None = None
        self._exact = exact  # the texts are the source: they decode to exactly the values
        self._text: tuple[np.ndarray, memoryview | bytes] | None = None  # each row's start in one text, the text

    @classmethod
    def of(cls, values: Sequence[dict[str, Any] | None] | np.ndarray) -> EventArgs:
        """Decoded ``args``, one per event."""
        out = np.empty(len(values), dtype=object)
        out[:] = values if isinstance(values, np.ndarray) else list(values)
        return cls(out, None)

    @classmethod
    def encode(cls, values: Sequence[dict[str, Any] | None] | np.ndarray) -> EventArgs:
        """The same ``args``, held encoded (:meth:`exact` says whether the texts keep them exactly)."""
        return cls(None, _encode(values), exact=exact_json(list(values)))

    @classmethod
    def of_json(cls, values: Sequence[dict[str, Any] | None]) -> EventArgs:
        """``args`` just decoded from JSON text (a reader's), held encoded: exact by construction."""
        return cls(None, _encode(values), exact=True)

    @classmethod
    def concat(cls, parts: Sequence[EventArgs]) -> EventArgs:
        """The ``args`` of ``parts`` one after the other: encoded when every part is, or when the
        decoded ones encode exactly; decoded otherwise."""
        if all(p._held_encoded() for p in parts) or all(p.exact() for p in parts):
            arrays = [p.arrow for p in parts]
            joined = pa.concat_arrays(arrays, memory_pool=_POOL) if arrays else _encode([])
            return cls(None, joined, all(p.exact() for p in parts))
        out = np.empty(sum(len(p) for p in parts), dtype=object)
        out[:] = [a for p in parts for a in p.values()]
        return cls(out, None)

    @classmethod
    def gather(cls, parts: Sequence[EventArgs], rows: np.ndarray) -> EventArgs:
        """The ``args`` of ``rows`` of ``parts`` one after the other (as ``concat(parts).take(rows)``),
        packed, without the joined texts ever held uncompressed: each part is packed, then one
        output chunk's texts are decompressed at a time (:meth:`PackedTexts.gather`). Decoded
        ``args`` that JSON would not keep exactly are concatenated decoded instead.

        >>> parts = [EventArgs.of_json([{"a": 1}, None]), EventArgs.of([{"b": [2]}])]
        >>> EventArgs.gather(parts, np.array([2, 0, 1])).values().tolist()
        [{'b': [2]}, {'a': 1}, None]
        """
        if not (all(p._held_encoded() for p in parts) or all(p.exact() for p in parts)):
            return cls.concat(parts).take(rows)
        exact = all(p.exact() for p in parts)
        out = cls.from_packed(PackedTexts.gather([p.packed_texts() for p in parts], rows))
        out._exact = exact
        return out

    def __len__(self) -> int:
        if self._decoded is not None:
            return len(self._decoded)
        if self._packed is not None:
            return len(self._packed)
        return 0 if self._encoded is None else len(self._encoded)

    def _held_encoded(self) -> bool:
        return self._encoded is not None or self._packed is not None

    def pack(self) -> EventArgs:
        """Hold the encoded texts compressed (:class:`PackedTexts`) from now on; decoded ``args``
        stay as they are. Returns ``self``."""
        if self._encoded is not None:
            self._packed = PackedTexts.of(self._encoded, PACK_ROWS)
            self._encoded = None
            self._text = None
        return self

    def packed_texts(self) -> PackedTexts:
        """The texts, packed (encoding decoded values first)."""
        if self._packed is not None:
            return self._packed
        return PackedTexts.of(self.arrow, PACK_ROWS)

    @classmethod
    def from_packed(cls, packed: PackedTexts) -> EventArgs:
        """``args`` held as :meth:`packed_texts` gave them (read from the trace cache)."""
        out = cls(None, None, exact=True)
        out._packed = packed
        return out

    def take(self, rows: np.ndarray) -> EventArgs:
        """The ``args`` of ``rows``, in their order (encoded when these are)."""
        if self._packed is not None:
            return EventArgs(None, self._packed.take(rows), self._exact)
        if self._encoded is not None:
            return EventArgs(None, _take(self._encoded, rows), self._exact)
        assert self._decoded is not None
        return EventArgs(self._decoded[rows], None)

    def exact(self) -> bool:
        """Whether the encoded texts decode to exactly these values (always when they came from
        JSON; otherwise checked, and remembered, by :func:`exact_json`)."""
        if not self._held_encoded() and not self._exact:
            self._exact = exact_json(self.values().tolist())
        return self._exact

    @property
    def arrow(self) -> pa.LargeBinaryArray:
        """The encoded form (encoding decoded values first, decompressing packed ones)."""
        if self._packed is not None:
            return self._packed.arrow()
        if self._encoded is None:
            self.exact()
            self._encoded = _encode(self.values())
        return self._encoded

    def values(self, rows: np.ndarray | None = None) -> np.ndarray:
        """The ``args`` of every event (or of ``rows``), as an object array; once every event's
        are decoded they are kept (and the encoded texts too, for :meth:`sparse_rows`)."""
        if self._decoded is not None:
            return self._decoded if rows is None else self._decoded[rows]
        if rows is None:
            self._decoded = _decode(self.arrow)
            return self._decoded
        return _decode(self.take(rows).arrow)

    def sparse_rows(self, keys: tuple[str, ...]) -> np.ndarray | None:
        """The rows whose encoded ``args`` may hold one of ``keys`` (a superset: every row that
        holds one is among them), when they are fewer than one in :data:`SPARSE`; None when they
        are not, or there are no encoded texts (then every row is read)."""
        pattern = re.compile(b"|".join(re.escape(msgspec.json.encode(key) + b":") for key in keys))
        if self._packed is not None:
            rows = self._packed.find(pattern, len(self._packed) // SPARSE)
            return None if rows is None else np.unique(np.asarray(rows, dtype=np.int64))
        if self._encoded is None:
            return None
        if self._text is None:
            self._text = _text(self._encoded)
        starts, data = self._text
        most = len(starts) // SPARSE
        found: list[int] = []
        for match in pattern.finditer(data):
            if len(found) >= most:  # dense: stop scanning
                return None
            found.append(match.start())
        return np.unique(np.searchsorted(starts, np.asarray(found, dtype=np.int64), side="right") - 1)


class PackedTexts:
    """Byte strings (or None) held compressed, :data:`PACK_ROWS` to a chunk (LZ4): the encoded
    ``args`` of a big trace at about a fifth of their size, each chunk decompressed only when one
    of its rows is read or the texts are scanned.

    >>> texts = pa.array([b'{"a":1}', None, b"{}"] * 3, type=pa.large_binary())
    >>> packed = PackedTexts.of(texts, rows_per_chunk=2)
    >>> packed.arrow().equals(texts), packed.take(np.array([7, 1, 0])).to_pylist()
    (True, [None, None, b'{"a":1}'])
    """

    __slots__ = ("_chunks", "_rows", "_size")

    def __init__(self, chunks: list[_Chunk], rows: int, rows_per_chunk: int) -> None:
        self._chunks = chunks
        self._rows = rows
        self._size = rows_per_chunk

    @classmethod
    def of(cls, texts: pa.Array, rows_per_chunk: int = PACK_ROWS) -> PackedTexts:
        chunks = []
        for base in range(0, len(texts), rows_per_chunk):
            part = texts.slice(base, rows_per_chunk)
            valid, offsets, data = part.buffers()
            starts = np.frombuffer(offsets, dtype=np.int64)[part.offset:part.offset + len(part) + 1]
            first, last = int(starts[0]), int(starts[-1])
            chunks.append(_Chunk(starts=(starts - first).astype(np.int32),
                                 valid=None if valid is None or part.null_count == 0 else part.is_valid().to_numpy(
                                     zero_copy_only=False),
                                 blob=_compressed(data.slice(first, last - first) if data else pa.py_buffer(b"")),
                                 size=last - first))
        return cls(chunks, len(texts), rows_per_chunk)

    def __len__(self) -> int:
        return self._rows

    def table(self) -> pa.Table:
        """The chunks as a table of :data:`PACKED_SCHEMA`, one row per chunk (what the trace cache
        writes: the texts stay compressed on disk and come back without being packed again)."""
        return pa.Table.from_pydict({
            "rows": [len(c.starts) - 1 for c in self._chunks], "size": [c.size for c in self._chunks],
            "starts": [c.starts.astype("<i4").tobytes() for c in self._chunks],
            "valid": [None if c.valid is None else np.packbits(c.valid, bitorder="little").tobytes()
                      for c in self._chunks],
            "blob": [c.blob.to_pybytes() for c in self._chunks]}, schema=PACKED_SCHEMA)

    @classmethod
    def from_table(cls, table: pa.Table) -> PackedTexts:
        """The chunks of :meth:`table`; ValueError when they do not fit together."""
        rows, sizes = table.column("rows").to_pylist(), table.column("size").to_pylist()
        starts, valid, blobs = (table.column(k).to_pylist() for k in ("starts", "valid", "blob"))
        per_chunk = rows[0] if rows else PACK_ROWS
        if any(r != per_chunk for r in rows[:-1]) or (rows and not 0 < rows[-1] <= per_chunk):
            raise ValueError("packed args: chunks of unequal rows")
        chunks = []
        for n, size, s, v, blob in zip(rows, sizes, starts, valid, blobs):
            offsets = np.frombuffer(s, dtype="<i4").astype(np.int32)
            if len(offsets) != n + 1 or offsets[0] != 0 or offsets[-1] != size or (np.diff(offsets) < 0).any():
                raise ValueError("packed args: offsets do not fit their chunk")
            chunks.append(_Chunk(starts=offsets, blob=pa.py_buffer(blob), size=size,
                                 valid=None if v is None else np.unpackbits(
                                     np.frombuffer(v, dtype=np.uint8), count=n, bitorder="little").astype(bool)))
        return cls(chunks, sum(rows), per_chunk)

    @classmethod
    def gather(cls, parts: Sequence[PackedTexts], rows: np.ndarray, rows_per_chunk: int = PACK_ROWS) -> PackedTexts:
        """The texts of ``rows`` of ``parts`` one after the other, packed ``rows_per_chunk`` to a
        chunk; only the input chunks one output chunk draws from are held decompressed (kept
        while the next output chunk draws from them too).

        >>> a = PackedTexts.of(pa.array([b"0", b"1", b"2"], type=pa.large_binary()), rows_per_chunk=2)
        >>> b = PackedTexts.of(pa.array([None, b"4"], type=pa.large_binary()))
        >>> PackedTexts.gather([a, b], np.array([4, 0, 3, 2]), rows_per_chunk=3).arrow().to_pylist()
        [b'4', b'0', None, b'2']
        """
        chunks = [c for p in parts for c in p._chunks]
        bases = np.concatenate([[0], np.cumsum([len(c.starts) - 1 for c in chunks], dtype=np.int64)])
        rows = np.asarray(rows, dtype=np.int64)
        out: list[_Chunk] = []
        held: dict[int, pa.LargeBinaryArray] = {}
        for a in range(0, len(rows), rows_per_chunk):
            want = rows[a:a + rows_per_chunk]
            of = np.searchsorted(bases, want, side="right") - 1
            needed = np.unique(of)
            held = {i: held[i] if i in held else _unpacked(chunks[i]) for i in needed.tolist()}
            arrays = [held[i] for i in needed.tolist()]
            at = np.zeros(int(needed.max(initial=-1)) + 1, dtype=np.int64)
            at[needed] = np.concatenate([[0], np.cumsum([len(x) for x in arrays[:-1]], dtype=np.int64)])
            joined = pa.concat_arrays(arrays, memory_pool=_POOL) if len(arrays) > 1 else arrays[0]
            out.extend(cls.of(_take(joined, at[of] + want - bases[of]), rows_per_chunk)._chunks)
        return cls(out, len(rows), rows_per_chunk)

    def arrow(self) -> pa.LargeBinaryArray:
        """Every text, decompressed into one array."""
        arrays = [_unpacked(c) for c in self._chunks]
        return pa.concat_arrays(arrays, memory_pool=_POOL) if arrays else pa.array([], type=pa.large_binary())

    def take(self, rows: np.ndarray) -> pa.LargeBinaryArray:
        """The texts of ``rows``, in their order (only the chunks holding them are decompressed)."""
        rows = np.asarray(rows, dtype=np.int64)
        order = np.argsort(rows, kind="stable")
        chunk_of = rows[order] // self._size
        bounds = np.flatnonzero(np.diff(chunk_of)) + 1
        pieces = [_take(_unpacked(self._chunks[int(chunk_of[a])]), rows[order[a:b]] - int(chunk_of[a]) * self._size)
                  for a, b in itertools.pairwise([0, *bounds.tolist(), len(rows)]) if b > a]
        joined = pa.concat_arrays(pieces, memory_pool=_POOL) if pieces else pa.array([], type=pa.large_binary())
        back = np.empty(len(rows), dtype=np.int64)
        back[order] = np.arange(len(rows))
        return _take(joined, back)

    def find(self, pattern: re.Pattern[bytes], most: int) -> list[int] | None:
        """The row of every match of ``pattern``, chunk by chunk; None past ``most`` matches."""
        found: list[int] = []
        for i, chunk in enumerate(self._chunks):
            if not chunk.size:
                continue
            data = memoryview(_CODEC.decompress(chunk.blob, decompressed_size=chunk.size, memory_pool=_POOL))
            at = [m.start() for m in pattern.finditer(data)]
            if len(found) + len(at) > most:
                return None
            found.extend((np.searchsorted(chunk.starts[:-1], np.asarray(at, dtype=np.int64), side="right") - 1
                          + i * self._size).tolist())
        return found


@dataclass(frozen=True)
class _Chunk:
    starts: np.ndarray      # int32: each row's start in the chunk's text, and the text's end
    valid: np.ndarray | None  # which rows have a text (None: all)
    blob: pa.Buffer         # the chunk's texts, compressed
    size: int               # their uncompressed bytes


def _unpacked(chunk: _Chunk) -> pa.LargeBinaryArray:
    data = _CODEC.decompress(chunk.blob, decompressed_size=chunk.size, memory_pool=_POOL) if chunk.size \
        else pa.py_buffer(b"")
    valid = None if chunk.valid is None else pa.py_buffer(np.packbits(chunk.valid, bitorder="little"))
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(chunk.starts) - 1,
                                            [valid, pa.py_buffer(chunk.starts.astype(np.int64)), data])


def _compressed(data: pa.Buffer) -> pa.Buffer:
    """``data`` compressed, in a buffer of its own size: the codec's output buffer keeps the
    capacity of the worst case (about the input's size; 137 MiB instead of 25 for a 64-rank
    job's texts)."""
    return pa.py_buffer(_CODEC.compress(data, memory_pool=_POOL).to_pybytes())


def _encode(values: Sequence[dict[str, Any] | None] | np.ndarray) -> pa.LargeBinaryArray:
    encode = msgspec.json.Encoder().encode
    return pa.array([None if v is None else encode(v) for v in values], type=pa.large_binary(), memory_pool=_POOL)


def _take(encoded: pa.Array, rows: np.ndarray) -> pa.Array:
    return pc.take(encoded, pa.array(np.asarray(rows, dtype=np.int64)), memory_pool=_POOL)


def _text(encoded: pa.Array) -> tuple[np.ndarray, memoryview | bytes]:
    """Every row's encoded ``args`` as one text (a view of the array's data, not a copy), and
    where each row starts in it."""
    _, offsets, data = encoded.buffers()
    kind = np.int64 if encoded.type == pa.large_binary() else np.int32
    starts = np.frombuffer(offsets, dtype=kind)[encoded.offset:encoded.offset + len(encoded) + 1]
    first, last = int(starts[0]), int(starts[-1])
    text = memoryview(data)[first:last] if data else b""
    return starts[:-1] - first if first or kind is np.int32 else starts[:-1], text


def _decode(encoded: pa.Array) -> np.ndarray:
    texts = encoded.to_pylist()
    out = np.empty(len(texts), dtype=object)
    with gc_paused():  # as when parsing: the decoded dicts all survive
        out[:] = msgspec.json.decode(b"[" + b",".join(b"null" if t is None else t for t in texts) + b"]")
    return out


def exact_json(value: Any) -> bool:
    """Whether ``value`` comes back equal from JSON (a NaN or infinity does not: JSON spells
    neither; a tuple comes back a list).

    >>> exact_json([{"a": [1, 2.5, "x"]}, None]), exact_json({"a": float("nan")}), exact_json((1,))
    (True, False, False)
    """
    try:
        return bool(msgspec.json.decode(msgspec.json.encode(value)) == value)
    except (msgspec.EncodeError, msgspec.DecodeError, TypeError, ValueError):
        return False


def arg_column(args: EventArgs, arg: Arg, rows: np.ndarray | None = None) -> np.ndarray:
    """The typed values of ``arg`` for every event (or the given rows), as an object array.
    Encoded ``args`` of a sparse argument are decoded only where their text names one of its
    spellings."""
    spec = arg.spec  # resolved once, not per event
    if rows is None:
        holding = args.sparse_rows(spec.raw)
        if holding is not None:
            out = np.empty(len(args), dtype=object)
            out.fill(spec.default)
            out[holding] = _typed(args.values(holding), spec)
            return out
    return _typed(args.values(rows), spec)


def int_values(values: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """An integer argument of ``rows`` (``values``: its column, ``Trace.arg``) as int64, -1 where
    an event does not carry it (sequence numbers, forward thread ids).

    >>> int_values(np.array([None, 7, 3], dtype=object), np.array([0, 1, 2])).tolist()
    [-1, 7, 3]
    """
    out = np.full(len(rows), -1, dtype=np.int64)
    for i, v in enumerate(values[rows]):
        if v is not None:
            out[i] = int(v)
    return out


def arg_columns(args: EventArgs, wanted: Sequence[Arg], rows: np.ndarray) -> dict[Arg, np.ndarray]:
    """The typed values of each argument in ``wanted`` for ``rows``, their ``args`` decoded once.

    >>> cols = arg_columns(EventArgs.of([{"Group size": 2, "dtype": "Float"}, None]), [Arg.GROUP_SIZE, Arg.DTYPE],
    ...                    np.array([0, 1]))
    >>> cols[Arg.GROUP_SIZE].tolist(), cols[Arg.DTYPE].tolist()
    ([2, None], ['Float', ''])
    """
    raw = args.values(rows)
    return {arg: _typed(raw, arg.spec) for arg in wanted}


def _typed(raw: np.ndarray, spec: ArgSpec) -> np.ndarray:
    out = np.empty(len(raw), dtype=object)
    out[:] = [_read(a, spec) for a in raw]
    return out
