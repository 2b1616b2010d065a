"""The physics relations (whatif.physics) on every shared trace and bundled sample.

A relation that fails on a trace must be listed, with its cause, in the table of
docs/accuracy.md's "Known exceptions" section; a listed exception that no longer fails must be
taken out of it. The table is read from the doc, so the doc and this test cannot drift apart."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from _cost_data import REPO, TRACES

from whatif.api import analyze
from whatif.physics import Relation, check
from whatif.tracer import TraceError
from whatif.tracer.readers import is_trace_name, run_folders

pytestmark = [pytest.mark.slow, pytest.mark.shared]

ACCURACY = REPO / "docs" / "accuracy.md"
SECTION = "### Known exceptions"
MULTI_RANK_DIRS = ("hta/sampled_world128",)


def known_exceptions() -> dict[tuple[str, Relation], str]:
    """(trace, relation) -> cause, from the table under SECTION in docs/accuracy.md."""
    text = ACCURACY.read_text()
    assert SECTION in text, f"{ACCURACY} has no '{SECTION}' section"
    table = text.split(SECTION, 1)[1].split("\n#", 1)[0]
    out = {}
    for m in re.finditer(r"^\| `([^`]+)` \| (\w+) \| (.+?) \|$", table, re.M):
        out[(m.group(1), Relation(m.group(2)))] = m.group(3)
    return out


def _inputs() -> list[str]:
    names = [str(p.relative_to(REPO)) for p in run_folders(REPO / "sample_traces")]
    if TRACES.is_dir():
        multi = [TRACES / d for d in MULTI_RANK_DIRS]
        names += [str(p.relative_to(TRACES)) for p in sorted(TRACES.rglob("*"))
                  if is_trace_name(p.name) and not any(m in p.parents for m in multi)]
        names += [d for d in MULTI_RANK_DIRS if (TRACES / d).is_dir()]
    return names


def _path(name: str) -> Path:
    return REPO / name if name.startswith("sample_traces/") else TRACES / name


def test_known_exceptions_table_parses() -> None:
    known = known_exceptions()
    assert all(cause.strip() for cause in known.values())


@pytest.mark.parametrize("name", _inputs())
def test_relations_hold_or_are_listed(name: str) -> None:
    try:
        analysis = analyze(_path(name))
    except TraceError:
        pytest.skip(f"{name} is refused by the reader (see docs/traces.md)")
    known = known_exceptions()
    failing = {r.relation: r.detail for r in check(analysis) if r.applies and not r.holds}
    unlisted = {rel.value: detail for rel, detail in failing.items() if (name, rel) not in known}
    fixed = [rel.value for (trace, rel) in known if trace == name and rel not in failing]
    assert not unlisted, f"{name}: relations fail and are not listed in {ACCURACY.name}: {unlisted}"
    assert not fixed, f"{name}: listed in {ACCURACY.name} but now hold (take them out): {fixed}"
