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

>>> import pandas as pd
>>> events = pd.DataFrame({"args": [{"Input dims": [[2, 3]], "Input type": ["float"]}, None, {"Input Dims": "bad"}]})
>>> arg_column(events, Arg.INPUT_DIMS).tolist()
[[[2, 3]], None, None]
>>> arg_column(events, Arg.INPUT_TYPES).tolist()
[['float'], (), ()]
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
import pandas as pd


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


def arg_column(events: pd.DataFrame, arg: Arg, rows: np.ndarray | None = None) -> np.ndarray:
    """The typed values of ``arg`` for every event (or the given rows), as an object array."""
    raw = events["args"].to_numpy()
    if rows is not None:
        raw = raw[rows]
    spec = arg.spec  # resolved once, not per event
    out = np.empty(len(raw), dtype=object)
    out[:] = [_read(a, spec) for a in raw]
    return out
