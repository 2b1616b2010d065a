"""Figures a person can read: a horizontal legend sits under the x-axis title, not on it (plotly's
default y = -0.1 covered "step" and "phase (steps)" on the Overview and What-if pages), and a
per-step line chart of a one-step run still draws its point (a line of one point draws nothing:
Compare's chart was empty on the Qwen trace)."""
from __future__ import annotations

import pytest

from whatif.figures import (
    PhaseBreakdown,
    _example_prediction,
    breakdown_figure,
    phase_breakdown_figure,
    scenario_breakdown_figure,
    step_compare_figure,
    step_times_figure,
)


@pytest.mark.parametrize("make", [
    lambda p: breakdown_figure(p.baseline.critical_path),
    lambda p: phase_breakdown_figure([PhaseBreakdown("decode", 3, {"cpu": 2e6, "gpu": 1e6})]),
    lambda p: scenario_breakdown_figure(p),
    step_compare_figure,
    lambda p: step_times_figure(p.baseline.steps),
])
def test_horizontal_legends_sit_under_the_axis_title(make) -> None:
    legend = make(_example_prediction()).layout.legend
    assert legend.orientation == "h" and legend.yanchor == "top" and legend.y <= -0.2


def test_a_one_step_comparison_draws_its_points() -> None:
    fig = step_compare_figure(_example_prediction())
    assert all(len(t.x) == 1 and "markers" in t.mode for t in fig.data)


def test_steps_without_phase_marks_are_labelled_as_such(tmp_path) -> None:
    """The Overview's "by phase" bar of a trace without phase annotations read "- (1)"."""
    from _llm_tracegen import llm_trace

    from whatif.api import analyze
    from whatif.dashboard.derive import phase_rows
    from whatif.summary import analysis_document
    a = analyze(llm_trace(tmp_path / "t.json.gz", layers=1, steps=3))
    rows = phase_rows(a.graph, analysis_document(a).critical_path)
    assert [r.phase for r in rows] == ["no phase"]
