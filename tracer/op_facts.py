"""The work of the ops a trace recorded with shapes: name, shapes as text, dtype, FLOPs and bytes
(:func:`whatif.core.kernels.op_flops_bytes`), computed once per distinct (name, shapes, types,
concrete inputs). Read by the per-op table (:mod:`whatif.ops`) and by the op calls two traces
share (:mod:`whatif.predictors.pairs`)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from whatif.core.dtypes import op_dtype
from whatif.core.kernels import op_flops_bytes

from .args import Arg
from .trace import Trace


@dataclass(frozen=True)
class OpFacts:
    """One recorded op call's ``name``, ``shapes`` (:func:`shapes_text`, "" without shapes),
    ``dtype`` ("" when no input type is a compute dtype), ``flops`` and ``nbytes`` (NaN when its
    shapes give none)."""

    name: str
    shapes: str
    dtype: str
    flops: float
    nbytes: float


def op_facts(trace: Trace, op_rows: np.ndarray) -> list[OpFacts]:
    """Facts of each op row (event table rows), memoized by (name, shapes, types, concrete)."""
    ev = trace.events
    names = ev["name"].astype(str).to_numpy()
    dims, types = trace.arg(Arg.INPUT_DIMS), trace.arg(Arg.INPUT_TYPES)
    concrete = trace.arg(Arg.CONCRETE_INPUTS)
    conv_outputs = trace.conv_outputs()
    memo: dict[tuple[str, str, str, str, tuple[int, ...] | None], OpFacts] = {}
    out = []
    for r in np.asarray(op_rows, dtype=np.int64).tolist():
        conv = conv_outputs.get(r)
        key = (names[r], repr(dims[r]), repr(types[r]), repr(concrete[r]), conv)
        got = memo.get(key)
        if got is None:
            fb = op_flops_bytes(names[r], dims[r], types[r], concrete[r], conv) if dims[r] is not None else None
            got = memo[key] = OpFacts(names[r], "" if dims[r] is None else shapes_text(dims[r]), op_dtype(types[r]),
                                      float(fb[0]) if fb else np.nan, float(fb[1]) if fb else np.nan)
        out.append(got)
    return out


def shapes_text(dims: list) -> str:
    """Input Dims as one short string, the empty (scalar) arguments left out.

    >>> shapes_text([[16, 559, 1024], [1024, 1024], [1024], [], []]), shapes_text([[[2, 3], [2, 3]], []])
    ('[16,559,1024] [1024,1024] [1024]', '[[2,3],[2,3]]')
    """
    def one(d: list) -> str:
        return "[" + ",".join(one(x) if isinstance(x, list) else str(x) for x in d) + "]"
    return " ".join(one(d) for d in dims if isinstance(d, list) and d)
