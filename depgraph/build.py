"""Build the task graph of a trace: Daydream's and Lumos's rules on real Kineto traces.

:func:`~whatif.depgraph.tasks.initial_state` makes the tasks (CPU calls, operator work, step
markers, GPU work, WAIT tasks of blocking copies, one origin per rank); the steps of
:data:`~whatif.depgraph.rules.RULES` then run in their declared order, each rule returning its
edges and each adjustment rewriting, explicitly, what earlier steps made.

Every anomaly is counted in ``graph.report`` rather than dropped silently. The graph is acyclic
by construction; every replay verifies it (and :func:`~whatif.depgraph.graph.check_acyclic` does
on demand), naming a task on the cycle if a transform ever creates one.
"""
from __future__ import annotations

import pandas as pd

from whatif.core.heap import release_freed_memory
from whatif.tracer.trace import Trace

from .graph import TaskGraph
from .rules import RULES, BuildStep, check_order
from .rules.steps import steps_table
from .schema import check_schema
from .state import BuildState
from .tasks import initial_state


def build_graph(trace: Trace, rules: tuple[BuildStep, ...] = RULES) -> TaskGraph:
    """Build the dependency graph of ``trace`` (all ranks) by running ``rules`` in order."""
    if rules is not RULES:
        check_order(rules)
    state = initial_state(trace)
    for step in rules:
        step.run(state)
        release_freed_memory(len(state.tasks))
    graph = assemble(state)
    del state
    release_freed_memory(len(graph.tasks))
    return check_schema(graph)


def split_rules(at: type[BuildStep], rules: tuple[BuildStep, ...] = RULES
                ) -> tuple[tuple[BuildStep, ...], tuple[BuildStep, ...]]:
    """``rules`` before the step of class ``at``, and from it on: a rank-parallel build
    (:mod:`whatif.scale`) runs the first part in every rank group, plans what crosses groups
    (the collectives) from all of them, then runs the second part.

    >>> from whatif.depgraph.rules import ClockAlignment
    >>> before, after = split_rules(ClockAlignment)
    >>> type(after[0]).__name__, len(before) + len(after) == len(RULES)
    ('ClockAlignment', True)
    """
    cut = next((i for i, step in enumerate(rules) if type(step) is at), None)
    if cut is None:
        raise ValueError(f"no {at.__name__} step in the rules")
    return rules[:cut], rules[cut:]


def assemble(state: BuildState) -> TaskGraph:
    """The graph of a built state: its tasks (attribution as categoricals), every rule's edges in
    the order the rules ran, its resources and its steps table. The graph shares the state's
    task columns (no copy of the table): the state is not built further."""
    tasks = pd.DataFrame({k: _present_categories(v) if k in ("phase", "layer", "op") else v
                          for k, v in state.tasks.items()}, copy=False)
    return TaskGraph(tasks=tasks, edges=state.all_edges(), resources=state.resources.frame(),
                     steps=steps_table(state), trace=state.trace, report=dict(state.report))


def _present_categories(column: pd.Series) -> pd.Categorical:
    """``column`` as a categorical of the values present (sorted): what ``pd.Categorical`` makes
    of its values, without an object array of them when it is categorical already."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        return column.array.remove_unused_categories()
    return pd.Categorical(column.to_numpy())
