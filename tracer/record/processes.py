"""The processes of one recording: who each one is (:class:`ProcessRecord`), what its trace file is
called, and the small per-process record each traced child leaves for the main process.

The main process writes ``rank<k>.pt.trace.json.gz``; every traced child writes
``rank<k>.<role>.<pid>.pt.trace.json.gz`` (:func:`process_trace_name`), so the reader loads the
children of a rank as more processes of that rank. A child also writes
``.whatif-process-<pid>.jsonc`` (:func:`record_name`: hidden, and not a trace suffix, so no reader
takes it for a trace); the main process lists these in ``meta.jsonc`` and deletes them
(:func:`write_meta`). A child that ends after ``meta.jsonc`` was written adds itself to it
(:func:`add_process`); a lock on the folder serializes the two.
"""
from __future__ import annotations

import contextlib
import enum
import fcntl
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import orjson

from whatif.core.output import write_output

from ..readers import RUN_META_NAME
from .trace_file import TRACE_SUFFIX, trace_file_name

RECORD_PREFIX = ".whatif-process-"
RECORD_SUFFIX = ".jsonc"
_ENGINE_CORE = re.compile(r"engine[\s_-]*core", re.IGNORECASE)


class ProcessRole(enum.Enum):
    """What a process of the recording is."""

    MAIN = "main"                    # the program ``whatif record`` ran
    CHILD = "child"                  # any other Python process below it that imported torch
    TORCHRUN_RANK = "torchrun_rank"  # a worker that torchrun (or a launcher like it) started
    ENGINE_CORE = "engine_core"      # a serving engine's model process (vLLM V1's EngineCore)


def child_role(name: str, rank_from_launcher: bool) -> ProcessRole:
    """The role of a traced child from its process name (``multiprocessing`` name or process title)
    and whether a launcher gave it a rank the parent did not have.

    >>> child_role("EngineCore_0", False), child_role("VLLM::EngineCore", False)
    (<ProcessRole.ENGINE_CORE: 'engine_core'>, <ProcessRole.ENGINE_CORE: 'engine_core'>)
    >>> child_role("SpawnProcess-1", True), child_role("SpawnProcess-1", False)
    (<ProcessRole.TORCHRUN_RANK: 'torchrun_rank'>, <ProcessRole.CHILD: 'child'>)
    """
    if _ENGINE_CORE.search(name):
        return ProcessRole.ENGINE_CORE
    return ProcessRole.TORCHRUN_RANK if rank_from_launcher else ProcessRole.CHILD


class ProcessEnd(msgspec.Struct, frozen=True):
    """How a process ended: ``signal`` (SIGINT/SIGTERM caught by whatif, ``None``: none) and
    ``during`` (``program`` or ``write``), as :class:`~.signals.RunEnd` says."""

    signal: str | None = None
    during: str | None = None


class ProcessRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One process of a recording, as ``meta.jsonc`` lists it under ``processes``.

    ``exit_status`` is None where whatif cannot see it (a plain script child that ended by
    ``sys.exit``); ``file`` is None when the process wrote no trace.
    """

    role: ProcessRole
    name: str
    pid: int
    parent_pid: int
    rank: int
    file: str | None
    exit_status: int | None
    end: ProcessEnd = ProcessEnd()


def process_trace_name(rank: int, role: ProcessRole, pid: int) -> str:
    """The trace file of one process: the main process keeps the per-rank name.

    >>> process_trace_name(0, ProcessRole.MAIN, 41)
    'rank0.pt.trace.json.gz'
    >>> process_trace_name(0, ProcessRole.ENGINE_CORE, 4242)
    'rank0.engine_core.4242.pt.trace.json.gz'
    """
    if role is ProcessRole.MAIN:
        return trace_file_name(rank)
    return f"rank{rank}.{role.value}.{pid}{TRACE_SUFFIX}"


def record_name(pid: int) -> str:
    """The file a child leaves for the main process.

    >>> record_name(4242)
    '.whatif-process-4242.jsonc'
    """
    return f"{RECORD_PREFIX}{pid}{RECORD_SUFFIX}"


def is_record_name(name: str) -> bool:
    """Whether a run folder's file is a child's record."""
    return name.startswith(RECORD_PREFIX) and name.endswith(RECORD_SUFFIX)


@contextlib.contextmanager
def _meta_lock(folder: Path) -> Iterator[None]:
    """Serializes ``meta.jsonc``'s writers (the main process, children ending after it) with a lock
    on the run folder itself, so that no lock file is left in it."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _listed(meta: dict[str, Any], records: list[ProcessRecord]) -> dict[str, Any]:
    """``meta`` with ``records`` added to its ``processes`` and their files to ``trace_files``."""
    processes = [*meta.get("processes", []), *(msgspec.to_builtins(r) for r in records)]
    processes.sort(key=lambda p: (p["role"] != ProcessRole.MAIN.value, p["rank"], p["pid"]))
    files = [*meta.get("trace_files", []), *(r.file for r in records if r.file is not None)]
    return {**meta, "processes": processes, "trace_files": sorted(set(files), key=files.index)}


def add_process(folder: Path, record: ProcessRecord) -> None:
    """A child's entry: added to ``meta.jsonc`` when the main process has written it already,
    else left as a record for the main process to list."""
    with _meta_lock(folder):
        meta_path = folder / RUN_META_NAME
        if meta_path.is_file():
            meta = orjson.loads(meta_path.read_bytes())
            write_output(meta_path, orjson.dumps(_listed(meta, [record]), option=orjson.OPT_INDENT_2))
        else:
            write_output(folder / record_name(record.pid), msgspec.json.encode(record))


def count_descendants(processes: list[dict[str, Any]], pid: int) -> int:
    """How many of ``meta.jsonc``'s ``processes`` descend from process ``pid`` (its children, their
    children...): under torchrun the list also holds the other ranks' processes, which do not.

    >>> procs = [{"pid": 10, "parent_pid": 1}, {"pid": 11, "parent_pid": 1}, {"pid": 12, "parent_pid": 10},
    ...          {"pid": 13, "parent_pid": 12}, {"pid": 14, "parent_pid": 11}]
    >>> count_descendants(procs, 10), count_descendants(procs, 11), count_descendants(procs, 14)
    (2, 1, 0)
    """
    children: dict[int, list[int]] = {}
    for p in processes:
        children.setdefault(int(p["parent_pid"]), []).append(int(p["pid"]))
    seen: set[int] = set()
    todo = list(children.get(pid, []))
    while todo:
        child = todo.pop()
        if child not in seen and child != pid:
            seen.add(child)
            todo.extend(children.get(child, []))
    return len(seen)


def write_meta(folder: Path, meta: dict[str, Any], main: ProcessRecord) -> dict[str, Any]:
    """Write ``meta.jsonc`` listing the main process and every child that has ended so far (their
    records are deleted); returns what was written."""
    with _meta_lock(folder):
        meta = _listed({**meta, "processes": []}, [main, *_collect_records(folder)])
        write_output(folder / RUN_META_NAME, orjson.dumps(meta, option=orjson.OPT_INDENT_2))
    return meta


def _collect_records(folder: Path) -> list[ProcessRecord]:
    """Read and delete the records the children left in ``folder``; a record that cannot be read
    is skipped (it is written atomically, so only a foreign file can be unreadable)."""
    found: list[ProcessRecord] = []
    for path in sorted(folder.iterdir()):
        if not is_record_name(path.name):
            continue
        try:
            found.append(msgspec.json.decode(path.read_bytes(), type=ProcessRecord))
        except (OSError, msgspec.DecodeError, msgspec.ValidationError):
            continue
        path.unlink(missing_ok=True)
    return found
