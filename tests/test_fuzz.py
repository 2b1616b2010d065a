"""The short fuzzing campaign (issue 20): seeded structure-aware mutations of small traces through
``whatif analyze``, ``predict``, ``export``, ``report``, ``memory`` and ``collectives``, and of
serving logs through ``serve``, every mutation class and command represented; a crash (traceback,
or an exit that is not 0 or ``whatif:`` lines with exit 2) fails the test with the input's class
and seed. The long campaign is bench/fuzz.py."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import _fuzz


def test_fuzz_campaign_has_no_crash(tmp_path: Path) -> None:
    docs = _fuzz.seed_documents(tmp_path)
    outcomes = _fuzz.campaign(docs, 12 * (len(_fuzz.MUTATIONS) + 1), seed=20, tmp=tmp_path)
    crashes = [f"{o.mutation} {o.command} #{o.seed}: {o.detail}" for o in outcomes if o.result == "crash"]
    assert not crashes, "\n".join(crashes[:10])
    by_class = Counter(o.mutation for o in outcomes)
    assert set(by_class) == {*_fuzz.MUTATIONS, "servinglog"} and min(by_class.values()) == 12
    by_command = Counter(o.command for o in outcomes)
    assert set(by_command) == set(_fuzz.COMMANDS) and min(by_command.values()) >= 12
    results = Counter(o.result for o in outcomes)
    assert results["analyzed"] > 0 and results["refused"] > 0


def test_classify_counts_a_traceback_or_a_stray_line_as_a_crash() -> None:
    assert _fuzz.classify(0, "") == "analyzed"
    assert _fuzz.classify(2, "whatif: t.json: not valid JSON\n") == "refused"
    assert _fuzz.classify(2, "whatif: scenario a: refused\nwhatif: scenario b: refused\n") == "refused"
    assert _fuzz.classify(2, "whatif: a\n  File x, line 3\n") == "crash"
    assert _fuzz.classify(2, "") == "crash"
    assert _fuzz.classify(1, "Traceback (most recent call last):\n") == "crash"
