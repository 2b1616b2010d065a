"""The columnar trace cache: a loaded trace's tables as Parquet, read back instead of parsing.

The first :func:`~whatif.tracer.trace.load_trace` of some trace files writes what it built (the
event table, each event's ``args`` as one JSON text in LZ4 chunks, the allocator records, the
flows and the per-rank facts) into an entry of the cache folder; later loads of the same files
read the entry back (memory-mapped), the ``args`` still packed, decoded only where they are read.

Where: ``$WHATIF_CACHE_DIR``, else ``$XDG_CACHE_HOME/whatif``, else ``~/.cache/whatif``; never
beside the traces. ``WHATIF_NO_CACHE=1`` (or ``--no-cache``, :func:`bypassed`) turns it off.

Key (:func:`trace_key`): BLAKE2b over :data:`SCHEMA_VERSION`, and for each file in load order its
reader, its name (ranks may come from file names) and its bytes. Any change to a file, to the
files of a folder, or to what the reader produces (bump :data:`SCHEMA_VERSION`) is a new entry.

An entry is a folder named by the key: ``events.parquet``, ``memory.parquet``, ``args.parquet``
(:class:`~whatif.tracer.args.PackedTexts`' chunks), ``manifest.json``
(the key, the schema version, the number of files, each Parquet file's BLAKE2b digest and row
count, the names, flows and per-rank facts) and ``manifest.blake2b`` (the manifest's digest). It
is written into a temporary folder and renamed into place in one step, so concurrent writers
never leave half an entry. It is trusted only when the manifest has its recorded digest, decodes
with the expected fields and names the same key, version and file count, and each Parquet file
has its recorded digest, schema and rows; anything else (a truncated file, a flipped bit, an old
layout) is removed and the trace is parsed and stored again. A trace whose values JSON cannot
keep exactly (a NaN) is not stored.

>>> with bypassed():
...     enabled()
False
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from whatif.core.heap import release_freed_memory

from .args import PACKED_SCHEMA, EventArgs, PackedTexts
from .memory import MEMORY_COLUMNS
from .readers import Flow, reader_for

SCHEMA_VERSION = 7
"""What an entry holds and how the readers fill it: bump it whenever either changes."""

CACHE_DIR_ENV = "WHATIF_CACHE_DIR"
NO_CACHE_ENV = "WHATIF_NO_CACHE"
_EVENTS, _MEMORY, _ARGS = "events.parquet", "memory.parquet", "args.parquet"
_MANIFEST, _CHECK = "manifest.json", "manifest.blake2b"
_CHUNK_BYTES = 1 << 20
_DICTIONARY = ["rank", "kind", "name_code", "pid", "tid", "device", "stream", "device_type", "device_id"]

EVENT_SCHEMA = pa.schema([("rank", pa.int32()), ("ts_ns", pa.int64()), ("dur_ns", pa.int64()), ("kind", pa.int8()),
                          ("name_code", pa.int32()), ("pid", pa.int64()), ("tid", pa.int64()),
                          ("device", pa.int32()), ("stream", pa.int64()), ("correlation", pa.int64()),
                          ("external_id", pa.int64())])
MEMORY_SCHEMA = pa.schema([("rank", pa.int32()), ("ts_ns", pa.int64()), ("pid", pa.int64()), ("tid", pa.int64()),
                           ("device_type", pa.int16()), ("device_id", pa.int32()), ("bytes", pa.int64()),
                           ("total_allocated_bytes", pa.int64()), ("total_reserved_bytes", pa.int64()),
                           ("addr", pa.int64())])

_bypass_depth = 0  # process-wide, not per thread: the dashboard loads traces in its server's threads


class CachedRank(msgspec.Struct):
    """One rank's facts (:class:`~whatif.tracer.trace.RankInfo` without its paths: ``files`` are
    the positions of its files in the load order)."""

    files: list[int]
    rank: int
    world_size: int | None
    device_names: list[str]
    metadata: dict[str, Any]
    thread_names: list[tuple[int, int, str]]
    process_names: dict[int, str]
    category_counts: dict[str, int]
    skipped: dict[str, int]


class _Manifest(msgspec.Struct, forbid_unknown_fields=True):
    schema_version: int
    key: str
    files: int
    digests: dict[str, str]
    rows: dict[str, int]
    names: list[str]
    flows: list[tuple[int, Flow]]
    ranks: list[CachedRank]


@dataclass
class Cached:
    """What an entry holds: the event table's columns (``name`` as ``codes`` into the sorted
    ``names``), the events' ``args``, the allocator records, the flows and the per-rank facts."""

    columns: dict[str, np.ndarray]
    codes: np.ndarray
    names: list[str]
    args: EventArgs
    memory: pd.DataFrame
    flows: list[tuple[int, Flow]]
    ranks: list[CachedRank]


def cache_dir() -> Path:
    """The cache folder (``$WHATIF_CACHE_DIR``, else ``$XDG_CACHE_HOME/whatif``, else
    ``~/.cache/whatif``)."""
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "whatif"


def enabled() -> bool:
    """Whether loads use the cache: not inside :func:`bypassed`, and ``WHATIF_NO_CACHE`` unset (or 0)."""
    return _bypass_depth == 0 and os.environ.get(NO_CACHE_ENV, "0") in ("", "0")


@contextlib.contextmanager
def bypassed(bypass: bool = True) -> Iterator[None]:
    """Load traces without the cache (neither read nor written) inside the block, when ``bypass``."""
    global _bypass_depth
    _bypass_depth += bypass
    try:
        yield
    finally:
        _bypass_depth -= bypass


def trace_key(paths: list[Path], salt: str = "") -> str | None:
    """The key of the trace made of ``paths`` (in load order): hex BLAKE2b of the schema version,
    ``salt`` (what else decides the trace: a rank group's place in its job) and each file's
    reader, name and bytes; None when a file cannot be read (the reader says why)."""
    h = hashlib.blake2b(f"whatif trace cache {SCHEMA_VERSION}".encode(), digest_size=20)
    if salt:
        h.update(f"\0salt {salt}".encode())
    try:
        for path in paths:
            h.update(f"\0{reader_for(path).name}\0{path.name}\0{path.stat().st_size}\0".encode())
            with path.open("rb") as f:
                while chunk := f.read(_CHUNK_BYTES):
                    h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def _digest(data: pa.Buffer | bytes) -> str:
    return hashlib.blake2b(memoryview(data), digest_size=20).hexdigest()


def fetch(key: str, files: int) -> Cached | None:
    """The entry of ``key`` (a trace of ``files`` files), or None when there is none or it cannot be trusted (then it is
    removed, so that the caller's :func:`store` replaces it)."""
    try:
        return _fetch(key, files)
    finally:
        release_freed_memory()  # Arrow's pool kept what Parquet freed (160 MB after a 32-rank reload)


def _fetch(key: str, files: int) -> Cached | None:
    entry = cache_dir() / key
    if not entry.is_dir():
        return None
    try:
        text = (entry / _MANIFEST).read_bytes()
        if (entry / _CHECK).read_text() != _digest(text):
            raise ValueError("manifest digest differs")
        manifest = msgspec.json.decode(text, type=_Manifest)
        if manifest.schema_version != SCHEMA_VERSION or manifest.key != key or manifest.files != files \
                or any(not r.files or not all(0 <= f < files for f in r.files) for r in manifest.ranks):
            raise ValueError("another key, schema version or file count")
        events = _table(entry, _EVENTS, EVENT_SCHEMA, manifest)
        memory = _table(entry, _MEMORY, MEMORY_SCHEMA, manifest)
        args = PackedTexts.from_table(_table(entry, _ARGS, PACKED_SCHEMA, manifest))
        found = _unpack(events, memory, args, manifest)
    except (OSError, ValueError, KeyError, msgspec.DecodeError, pa.ArrowException):
        _remove(entry)
        return None
    return found


def _table(entry: Path, name: str, schema: pa.Schema, manifest: _Manifest) -> pa.Table:
    with pa.memory_map(str(entry / name)) as source:
        data = source.read_buffer()
    if _digest(data) != manifest.digests[name]:
        raise ValueError(f"{name}: digest differs")
    table = pq.ParquetFile(pa.BufferReader(data)).read(use_threads=False)  # not read_table: it imports pyarrow.dataset
    if not table.schema.equals(schema, check_metadata=False) or table.num_rows != manifest.rows[name]:
        raise ValueError(f"{name}: unexpected schema or rows")
    return table.combine_chunks()


def _numpy(table: pa.Table, name: str) -> np.ndarray:
    column = table.column(name)
    return column.chunk(0).to_numpy() if column.num_chunks else np.zeros(0, dtype=column.type.to_pandas_dtype())


def _unpack(events: pa.Table, memory: pa.Table, args: PackedTexts, manifest: _Manifest) -> Cached:
    codes = _numpy(events, "name_code")
    if codes.size and (codes.min() < 0 or codes.max() >= len(manifest.names)):
        raise ValueError("name codes out of range")
    if len(args) != events.num_rows:
        raise ValueError("args for another number of events")
    return Cached(columns={k: _numpy(events, k) for k in EVENT_SCHEMA.names if k != "name_code"},
                  codes=codes, names=manifest.names,
                  args=EventArgs.from_packed(args),
                  memory=pd.DataFrame({k: _numpy(memory, k) for k in MEMORY_COLUMNS}, copy=False),
                  flows=manifest.flows, ranks=manifest.ranks)


def store(key: str, files: int, cached: Cached) -> bool:
    """Write the entry of ``key``, a trace of ``files`` files (atomically: a temporary folder renamed into place). False
    when it was not written: JSON cannot keep a value exactly, or the folder cannot be written
    (the load goes on without the cache either way)."""
    try:
        return _store(key, files, cached)
    finally:
        release_freed_memory()  # what the Parquet writer freed


def _store(key: str, files: int, cached: Cached) -> bool:
    manifest = _Manifest(schema_version=SCHEMA_VERSION, key=key, files=files, digests={}, rows={}, names=cached.names,
                         flows=cached.flows, ranks=cached.ranks)
    if not cached.args.exact() or not _exact(manifest):
        return False
    columns = {"name_code": cached.codes, **cached.columns}
    tables = {_EVENTS: pa.Table.from_arrays([pa.array(columns[n], type=EVENT_SCHEMA.field(n).type)
                                             for n in EVENT_SCHEMA.names], schema=EVENT_SCHEMA),
              _MEMORY: pa.Table.from_pandas(cached.memory, schema=MEMORY_SCHEMA, preserve_index=False),
              _ARGS: cached.args.packed_texts().table()}
    root = cache_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
    except OSError:
        return False
    try:
        for name, table in tables.items():
            sink = pa.BufferOutputStream()
            packed = name == _ARGS  # LZ4 chunks already
            pq.write_table(table, sink, compression="none" if packed else "lz4",
                           use_dictionary=False if packed else _DICTIONARY)
            data = sink.getvalue()
            (tmp / name).write_bytes(memoryview(data))
            manifest.digests[name], manifest.rows[name] = _digest(data), table.num_rows
        text = msgspec.json.encode(manifest)
        (tmp / _MANIFEST).write_bytes(text)
        (tmp / _CHECK).write_text(_digest(text))
        os.rename(tmp, root / key)  # fails when another writer got there first: theirs is kept
    except OSError:
        _remove(tmp)
        return False
    return True


def _exact(manifest: _Manifest) -> bool:
    try:
        return msgspec.json.decode(msgspec.json.encode(manifest), type=_Manifest) == manifest
    except (msgspec.EncodeError, msgspec.DecodeError, TypeError, ValueError):
        return False


def _remove(entry: Path) -> None:
    shutil.rmtree(entry, ignore_errors=True)
