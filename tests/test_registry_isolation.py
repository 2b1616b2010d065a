"""The transform registry is process-wide; conftest.py guards it. These tests show that the
guard fails a test that leaks a registration, and that ``transform_registry`` prevents it."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ("pytester",)

CONFTEST = Path(__file__).with_name("conftest.py")
LEAKY = '''
from dataclasses import dataclass

import numpy as np

from whatif.transforms.base import Transform
from whatif.transforms.registry import register


def make():
    @register
    @dataclass
    class Leak(Transform):
        name = "leaked_by_a_test"
        description = "registered and never removed"

        def match(self, graph, ctx):
            return np.empty(0, dtype=np.int64)

        def apply(self, graph, ctx):
            return graph.copy()


def test_leaks():
    make()


def test_cleans_up(transform_registry):
    make()
    assert "leaked_by_a_test" in transform_registry.names()


def test_sees_no_leak():
    from whatif.transforms import registry
    assert "leaked_by_a_test" not in registry.names()
'''


def test_a_leaked_registration_fails_its_test_and_is_undone(pytester: pytest.Pytester) -> None:
    from whatif.transforms import registry

    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_leaky=LEAKY)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:randomly", "--import-mode=importlib")
    result.assert_outcomes(passed=3, errors=1)  # test_leaks passes, then errors at teardown
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_leaks*",
                                 "*changed the transform registry (leaked_by_a_test)*"])
    assert "leaked_by_a_test" not in registry.names()
