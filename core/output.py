"""Writing an output file: one place that makes the folder, writes atomically (a temp file beside
it, then a rename, so a reader never sees half a file and a failed write leaves the old one; a
device or pipe such as ``/dev/stdout`` is written in place) and turns every ``OSError`` into one
line naming the path.

>>> import tempfile, pathlib
>>> out = pathlib.Path(tempfile.mkdtemp()) / "sub" / "x.json"
>>> write_output(out, b"{}") == out and out.read_bytes()
b'{}'
>>> write_output(out.parent, b"{}")  # doctest: +ELLIPSIS
Traceback (most recent call last):
whatif.core.output.OutputError: ...: is a folder, not a file to write
"""
from __future__ import annotations

import contextlib
import gzip
import io
import os
import sys
from pathlib import Path

import pandas as pd

from whatif.core.errors import WhatifError


class OutputError(WhatifError):
    """An output that cannot be written where it was asked for."""


def write_output(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` (folders made as needed; ``-``: standard output);
    :class:`OutputError` on any failure."""
    path = Path(path)
    if str(path) == "-":
        try:
            sys.stdout.buffer.write(data if data.endswith(b"\n") else data + b"\n")
            sys.stdout.flush()
        except OSError as exc:
            raise OutputError(f"standard output: cannot be written ({exc.strerror or type(exc).__name__})") from None
        return path
    if path.is_dir():
        raise OutputError(f"{path}: is a folder, not a file to write")
    special = path.exists() and not path.is_file()   # a device or pipe (/dev/stdout): written in place
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path if special else tmp, "wb") as f:
            f.write(data)
        if not special:
            os.replace(tmp, path)
    except OSError as exc:
        with_reason = exc.strerror or type(exc).__name__
        raise OutputError(f"{path}: cannot be written ({with_reason})") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return path


def refuse_overwrite(paths: list[Path], force: bool) -> None:
    """The one overwrite rule of every command's main output (``-o``): an existing file is
    replaced only with ``--force``; :class:`OutputError` naming the first existing path otherwise.

    >>> import tempfile, pathlib
    >>> taken = pathlib.Path(tempfile.mkdtemp()) / "t.json"; _ = taken.write_text("{}")
    >>> refuse_overwrite([taken], force=True)
    >>> refuse_overwrite([taken], force=False)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    whatif.core.output.OutputError: .../t.json: exists; --force overwrites it
    """
    if force:
        return
    for path in paths:
        if path.is_file():
            raise OutputError(f"{path}: exists; --force overwrites it")


def gzip_bytes(data: bytes, level: int = 6) -> bytes:
    """Gzip with a zero header time, so the same input gives the same bytes."""
    return gzip.compress(data, compresslevel=level, mtime=0)


TABLE_SUFFIXES = (".csv", ".parquet")
"""The table formats a command's ``-o`` writes, by suffix."""


def check_table_path(path: str | Path) -> str:
    """The table format of ``path`` (its suffix, lower-case), or :class:`OutputError` when it is
    not one of :data:`TABLE_SUFFIXES`: checked before the work that makes the table."""
    suffix = Path(path).suffix.lower()
    if suffix not in TABLE_SUFFIXES:
        raise OutputError(f"{path}: unknown table format (write {' or '.join(TABLE_SUFFIXES)})")
    return suffix


def write_table(path: str | Path, frame: pd.DataFrame) -> Path:
    """Write ``frame`` as CSV or Parquet (pyarrow), by ``path``'s suffix, through
    :func:`write_output`; :class:`OutputError` for another suffix.

    >>> import tempfile, pathlib
    >>> out = write_table(pathlib.Path(tempfile.mkdtemp()) / "t.csv", pd.DataFrame({"a_ns": [1, 2]}))
    >>> out.read_text().splitlines()
    ['a_ns', '1', '2']
    >>> write_table("t.xlsx", pd.DataFrame())
    Traceback (most recent call last):
    whatif.core.output.OutputError: t.xlsx: unknown table format (write .csv or .parquet)
    """
    if check_table_path(path) == ".csv":
        return write_output(path, frame.to_csv(index=False).encode())
    buffer = io.BytesIO()
    frame.to_parquet(buffer, index=False, engine="pyarrow")
    return write_output(path, buffer.getvalue())
