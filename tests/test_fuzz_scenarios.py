"""Property-based fuzzing of scenarios (issue 20): every transform built from hostile parameter
values (wrong types, extremes, non-finite numbers, odd selections) and applied to a small graph
either works or is refused with a :class:`WhatifError` — never another exception."""
from __future__ import annotations

import types
import typing
from pathlib import Path

import pytest
from _llm_tracegen import llm_trace
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from whatif.api import analyze, make_context
from whatif.core.errors import WhatifError
from whatif.transforms import registry
from whatif.transforms.scenario import scenario_from_dict
from whatif.transforms.select import Selector

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
                    st.sampled_from([0, 1, 2, 3, 8, -1, 2 ** 31, 2 ** 53, 2 ** 62]),
                    st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0.0, 0.5, 1.0, 2.0, 1e308, -1e308, 1e-308]),
                    st.text(max_size=12), st.sampled_from(["gemm", "kernel", "^aten::", "(", "dgx_h100", "H100"]))
SELECTIONS = st.dictionaries(st.sampled_from(["kind", "name", "layer", "op", "phase", "step", "rank", "resource",
                                              "kernel_class", "bogus"]),
                             st.one_of(SCALARS, st.lists(SCALARS, max_size=3)), max_size=3)
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3), SELECTIONS)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    path = llm_trace(tmp_path_factory.mktemp("fz") / "t.json.gz", layers=1, steps=2, batch=4, kv_tokens=256)
    a = analyze(path)
    return a.graph, make_context(a.trace)


INTS = st.one_of(st.integers(min_value=-3, max_value=16), st.sampled_from([2 ** 31, 2 ** 53, -(2 ** 53), 2 ** 62]),
                 st.integers())
FLOATS = st.one_of(st.floats(min_value=0, max_value=10), st.floats(), st.sampled_from([1e308, -1e-308, 1e-12]))


def _typed(p: registry.Parameter) -> st.SearchStrategy:
    """Values of the parameter's own type most of the time (so most examples reach ``apply``),
    any hostile value otherwise."""
    hint = p.type
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    texts = st.one_of(st.sampled_from([str(p.default_value)] if isinstance(p.default_value, str) else ["x"]),
                      st.text(max_size=8), st.sampled_from(p.choices or ["gemm", "kernel", "H100", "dgx_a100"]))
    typed = {float: FLOATS, int: INTS, str: texts, bool: st.booleans(), Selector: SELECTIONS}.get(hint)
    if typed is None:
        typed = st.lists(texts, max_size=3) if typing.get_origin(hint) is list else VALUES
    return st.one_of(typed, typed, typed, VALUES)


def _params(name: str) -> st.SearchStrategy[dict]:
    specs = registry.parameters(name)
    return st.fixed_dictionaries({}, optional={p.name: _typed(p) for p in specs})


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("name", registry.names())
def test_hostile_parameters_are_applied_or_refused(small, name: str) -> None:
    graph, ctx = small

    @settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(_params(name))
    def check(params: dict) -> None:
        try:
            scenario = scenario_from_dict({"name": "fz", "transform": [{"name": name, **params}]}, source="fz.toml")
            scenario.apply(graph, ctx)
        except WhatifError:
            pass

    check()


def test_example_root_causes_are_refused(small, tmp_path: Path) -> None:
    graph, ctx = small
    cases = [({"name": "scale", "factor": 0.5, "select": {"op": 5}}, "selection key 'op' must be text"),
             ({"name": "scale", "factor": 0.5, "select": {"resource": []}}, "'resource' must be text"),
             ({"name": "scale", "factor": float("inf")}, "must be a finite number"),
             ({"name": "scale", "factor": 1e308}, "durations must be finite"),
             ({"name": "set_duration", "dur_us": 1e308}, "durations must be finite"),
             ({"name": "dataloader", "workers": 2, "prefetch_factor": 2 ** 62}, "within ±2**53")]
    for transform, message in cases:
        with pytest.raises(WhatifError, match=message.replace("*", r"\*")):
            scenario_from_dict({"name": "x", "transform": [transform]}, source="x.toml").apply(graph, ctx)
