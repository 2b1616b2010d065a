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
decoded when the trace was parsed, or one JSON text per event when it came from the trace cache
(:mod:`whatif.tracer.cache`), decoded only for the rows and arguments that are read.

>>> args = EventArgs.of([{"Input dims": [[2, 3]], "Input type": ["float"]}, None, {"Input Dims": "bad"}])
>>> arg_column(args, Arg.INPUT_DIMS).tolist()
[[[2, 3]], None, None]
>>> arg_column(EventArgs.encode(args.values()), Arg.INPUT_TYPES).tolist()
[['float'], (), ()]
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from .kineto import gc_paused


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
    CONCRETE_INPUTS = ArgSpec("concrete_inputs", ("Concrete Inputs",), (list,), default=())
    COLLECTIVE_NAME = ArgSpec("collective_name", ("Collective name",), (str,), default="")
    PROCESS_GROUP = ArgSpec("process_group", ("Process Group Name",), (str, int), default="")
    PROCESS_GROUP_RANKS = ArgSpec("process_group_ranks", ("Process Group Ranks",), (str, list), default="")
    GROUP_SIZE = ArgSpec("group_size", ("Group size",), (int, float))
    IN_MSG_NELEMS = ArgSpec("in_msg_nelems", ("In msg nelems",), (int, float))
    OUT_MSG_NELEMS = ArgSpec("out_msg_nelems", ("Out msg nelems",), (int, float))
    DTYPE = ArgSpec("dtype", ("dtype",), (str,), default="")
    WAIT_ON_STREAM = ArgSpec("wait_on_stream", ("wait_on_stream",), (int,))
    WAIT_ON_EVENT_CORRELATION = ArgSpec("wait_on_event_correlation", ("wait_on_cuda_event_record_corr_id",), (int,))
    SYNC_DEVICE = ArgSpec("sync_device", ("device",), (int,))
    SYNC_STREAM = ArgSpec("sync_stream", ("stream",), (int,))

    @property
    def spec(self) -> ArgSpec:
        return self.value


def read_arg(args: dict[str, Any] | None, arg: Arg) -> Any:
    """One event's value of ``arg`` (its default when absent or of the wrong type).

    >>> read_arg({"Input Dims": [[4]]}, Arg.INPUT_DIMS), read_arg({"Group size": "x"}, Arg.GROUP_SIZE)
    ([[4]], None)
    """
    return _read(args, arg.spec)


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


class EventArgs:
    """Every event's ``args`` dict (or None), in the event table's row order.

    Held either decoded (an object array, as the reader made it) or encoded: one compact JSON
    text per event (a binary Arrow array, None where the event had no ``args``), as the trace
    cache stores it. Encoded values are decoded on reading, only for the rows asked for; JSON
    keeps every value the reader can produce exactly (integers of any size, floats, strings,
    lists, dicts in their key order), which :func:`exact_json` checks before the cache stores them.

    >>> enc = EventArgs.encode([{"Group size": 8}, None])
    >>> enc.values().tolist(), enc.values(np.array([0])).tolist(), len(enc)
    ([{'Group size': 8}, None], [{'Group size': 8}], 2)
    """

    __slots__ = ("_decoded", "_encoded", "_text")

    def __init__(self, decoded: np.ndarray | None, encoded: pa.BinaryArray | None) -> None:
        self._decoded = decoded
        self._encoded = encoded
        self._text: tuple[np.ndarray, bytes] | None = None  # each row's start in one text, the text

    @classmethod
    def of(cls, values: Sequence[dict[str, Any] | None] | np.ndarray) -> EventArgs:
        """Decoded ``args``, one per event."""
        out = np.empty(len(values), dtype=object)
        out[:] = values if isinstance(values, np.ndarray) else list(values)
        return cls(out, None)

    @classmethod
    def encode(cls, values: Sequence[dict[str, Any] | None] | np.ndarray) -> EventArgs:
        """The same ``args``, held encoded (what the trace cache writes)."""
        encoder = msgspec.json.Encoder()
        return cls(None, pa.array([None if v is None else encoder.encode(v) for v in values], type=pa.binary()))

    @classmethod
    def from_arrow(cls, encoded: pa.BinaryArray) -> EventArgs:
        """``args`` held encoded in ``encoded`` (read from the trace cache)."""
        return cls(None, encoded)

    def __len__(self) -> int:
        if self._decoded is not None:
            return len(self._decoded)
        return 0 if self._encoded is None else len(self._encoded)

    @property
    def arrow(self) -> pa.BinaryArray:
        """The encoded form (encoding decoded values first)."""
        if self._encoded is None:
            self._encoded = EventArgs.encode(self.values()).arrow
        return self._encoded

    def values(self, rows: np.ndarray | None = None) -> np.ndarray:
        """The ``args`` of every event (or of ``rows``), as an object array; once every event's
        are decoded they are kept (and the encoded texts too, for :meth:`sparse_rows`)."""
        if self._decoded is not None:
            return self._decoded if rows is None else self._decoded[rows]
        assert self._encoded is not None
        if rows is None:
            self._decoded = _decode(self._encoded)
            return self._decoded
        return _decode(self._encoded.take(pa.array(np.asarray(rows, dtype=np.int64))))

    def sparse_rows(self, keys: tuple[str, ...]) -> np.ndarray | None:
        """The rows whose encoded ``args`` may hold one of ``keys`` (a superset: every row that
        holds one is among them), when they are fewer than one in :data:`SPARSE`; None when they
        are not, or there are no encoded texts (then every row is read)."""
        if self._encoded is None:
            return None
        if self._text is None:
            self._text = _text(self._encoded)
        starts, data = self._text
        pattern = re.compile(b"|".join(re.escape(msgspec.json.encode(key) + b":") for key in keys))
        most = len(starts) // SPARSE
        found: list[int] = []
        for match in pattern.finditer(data):
            if len(found) >= most:  # dense: stop scanning
                return None
            found.append(match.start())
        return np.unique(np.searchsorted(starts, np.asarray(found, dtype=np.int64), side="right") - 1)


def _text(encoded: pa.BinaryArray) -> tuple[np.ndarray, bytes]:
    """Every row's encoded ``args`` as one text, and where each row starts in it."""
    _, offsets, data = encoded.buffers()
    starts = np.frombuffer(offsets, dtype=np.int32)[encoded.offset:encoded.offset + len(encoded) + 1]
    return starts[:-1].astype(np.int64) - int(starts[0]), bytes(data)[int(starts[0]):int(starts[-1])] if data else b""


def _decode(encoded: pa.BinaryArray) -> np.ndarray:
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


def _typed(raw: np.ndarray, spec: ArgSpec) -> np.ndarray:
    out = np.empty(len(raw), dtype=object)
    out[:] = [_read(a, spec) for a in raw]
    return out
