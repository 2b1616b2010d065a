"""Issue 19's Done-when for the cupti backend: its trace of a program analyzes with the same kernels
and steps as the Kineto (torch) backend's. The recordings are the first GPU harvest's, on an
NVIDIA H200 (not the H100 the issue names), committed under ``sample_traces/gpu/backends``; the
comparison is ``bench/gpu_backends.py``'s (figures in docs/recording.md)."""
from __future__ import annotations

from collections import Counter

import pytest
from _cost_data import bench_module

backends = bench_module("gpu_backends")


@pytest.fixture(scope="module", params=backends.PROGRAMS)
def pair(request: pytest.FixtureRequest) -> tuple[str, object, object]:
    program = request.param
    return program, *(backends.read_recording(backends.BACKENDS / f"{program}-{side}") for side in backends.SIDES)


def test_same_kernels_in_every_step(pair) -> None:
    program, torch_rec, cupti_rec = pair
    assert backends.differing_steps(torch_rec, cupti_rec) == [], program
    assert torch_rec.total_kernels == cupti_rec.total_kernels
    assert not any(name.startswith("_Z") for name in cupti_rec.total_kernels)  # demangled when read


def test_same_steps_and_the_same_ones_count(pair) -> None:
    _, torch_rec, cupti_rec = pair
    assert torch_rec.steps == cupti_rec.steps
    assert torch_rec.counted == cupti_rec.counted
    assert torch_rec.steps[0] not in torch_rec.counted  # the warm-up step (start-up) is left out of both


def test_every_kernel_keeps_its_launch_call(pair) -> None:
    _, torch_rec, cupti_rec = pair
    assert torch_rec.launched_fraction == cupti_rec.launched_fraction == 1.0


def test_the_recordings_made_before_the_converter_fix_carry_the_calls_kineto_drops(pair) -> None:
    """Documented difference (docs/recording.md): the committed cupti traces were converted before
    the converter left out Kineto's blocklisted runtime calls and untracked driver calls, so they
    hold several times the calls of the Kineto trace; the reader keeps them (it drops nothing)."""
    _, torch_rec, cupti_rec = pair
    assert cupti_rec.runtime_calls > 4 * torch_rec.runtime_calls
    assert cupti_rec.driver_calls > torch_rec.driver_calls
    assert torch_rec.noise_calls == 0  # what the converter now leaves out, Kineto never wrote
    kept = cupti_rec.runtime_calls + cupti_rec.driver_calls - cupti_rec.noise_calls
    assert kept < 1.5 * (torch_rec.runtime_calls + torch_rec.driver_calls)


def recording(per_step: dict[int, Counter[str]]) -> object:
    kernels = sum(sum(c.values()) for c in per_step.values())
    return backends.Recording(kernels_per_step=per_step, kernel_ns_per_name={}, kernels=kernels,
                              kernels_launched=kernels, kernels_with_external_id=0, steps=tuple(per_step),
                              counted=tuple(per_step)[1:], step_ms={}, runtime_calls=0, driver_calls=0, noise_calls=0)


def test_comparison_finds_a_differing_step() -> None:
    a = recording({1: Counter({"k": 2}), 2: Counter({"k": 1})})
    b = recording({1: Counter({"k": 2}), 2: Counter({"k": 1, "m": 1})})
    assert backends.differing_steps(a, b) == [2]
    assert backends.differing_steps(a, a) == []
