"""Reading traces: Kineto/Chrome JSON into one normalized event table (and, later, recording)."""
from whatif.core.errors import TraceError, WhatifError

from .kinds import EventKind
from .trace import RankInfo, Trace, load_trace

__all__ = ["EventKind", "RankInfo", "Trace", "TraceError", "WhatifError", "load_trace"]
