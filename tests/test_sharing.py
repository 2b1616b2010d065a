"""The replay re-prices compute kernels by the time they share the GPU with collectives
(transforms/sharing.py): unchanged graphs replay exactly, a kernel beside a collective that shrinks
gets faster (never below its time alone), one a longer collective now covers gets slower."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tracegen import KinetoTrace

from whatif.api import analyze, predict
from whatif.cli import main
from whatif.depgraph.build import build_graph
from whatif.depgraph.graph import TaskKind
from whatif.depgraph.schema import validate
from whatif.predictors.replay import replay
from whatif.transforms import edit
from whatif.transforms.base import TransformContext, TransformError
from whatif.transforms.generic import Interference, Scale
from whatif.transforms.scenario import Scenario
from whatif.transforms.select import Selector
from whatif.transforms.sharing import (
    DEFAULT_INTERFERENCE,
    SHARE_REF,
    calibrated_interference,
    priced_by_transform,
)

ALONE_US, BESIDE_US = 100, 120
NCCL = "ncclKernel_AllReduce_RING_LL_Sum_half(ncclDevComm*, unsigned long, ncclWork*)"


def overlapped_trace(path: Path, beside: int = 3, extra: int = 0) -> Path:
    """One step: three GEMMs alone (100 us), then an all-reduce on its own stream beside the next
    ``beside`` GEMMs (120 us each: measured 1.2x slower beside it), then alone ones up to six in
    all, then ``extra`` more alone, launched ahead (GPU-bound)."""
    tr = KinetoTrace()
    t_gpu = 20.0
    for i in range(6 + extra):
        tr.runtime("cudaLaunchKernel", 2 + i * 2, 1, corr=i + 1)
        dur = BESIDE_US if 3 <= i < 3 + beside else ALONE_US
        tr.gpu("sm80_xmma_gemm_f16f16_f16f32", t_gpu, dur, corr=i + 1)
        if i == 3:
            tr.runtime("cudaLaunchKernel", 13, 1, corr=50)
            tr.gpu(NCCL, t_gpu, beside * (BESIDE_US + 1) - 1, corr=50, stream=20)
        t_gpu += dur + 1
    sync = 4 + (6 + extra) * 2
    tr.runtime("cudaDeviceSynchronize", sync, t_gpu - sync + 2, corr=99_999)
    tr.step(0, 0, t_gpu + 5)
    return tr.write(path)


def gemm_durations_us(graph) -> np.ndarray:  # noqa: ANN001
    t = graph.tasks
    return t.loc[t["name"].astype(str).str.startswith("sm80"), "dur_ns"].to_numpy() / 1000


def comm(factor: float) -> Scale:
    return Scale(select=Selector(kernel_class="collective"), factor=factor)


def test_calibration_and_reference(tmp_path: Path) -> None:
    a = analyze(overlapped_trace(tmp_path / "t.json.gz"))
    assert (a.steps["predicted_ns"] == a.steps["measured_ns"]).all()
    phi, names = calibrated_interference(a.graph)
    assert names == 1 and phi == pytest.approx(BESIDE_US / ALONE_US)
    ref = a.graph.tasks[SHARE_REF].to_numpy(float)
    gemms = a.graph.tasks["name"].astype(str).str.startswith("sm80").to_numpy()
    assert ref[gemms].round(3).tolist() == [0, 0, 0, 1, 1, 1]
    assert np.isnan(ref[~gemms]).all()      # only compute kernels are re-priced


def test_unchanged_scenarios_replay_exactly(tmp_path: Path) -> None:
    a = analyze(overlapped_trace(tmp_path / "t.json.gz"))
    p = predict(a, [comm(1.0), Scale(select=Selector(kind="cpu"), factor=1.0)])
    for s in p.scenarios:
        assert s.steps["predicted_ns"].tolist() == a.steps["predicted_ns"].tolist()
        assert gemm_durations_us(s.replay.graph).tolist() == [100, 100, 100, 120, 120, 120]


def test_a_shorter_collective_speeds_up_the_kernels_beside_it(tmp_path: Path) -> None:
    a = analyze(overlapped_trace(tmp_path / "t.json.gz"))
    base = int(a.steps["predicted_ns"].iat[0])
    p = predict(a, [comm(0.0), comm(0.5)])
    gone, half = p.scenarios
    assert gemm_durations_us(gone.replay.graph).tolist() == [100] * 6   # their time alone
    assert int(gone.steps["predicted_ns"].iat[0]) == base - 3 * (BESIDE_US - ALONE_US) * 1000
    d = gemm_durations_us(half.replay.graph)
    assert (d[3:] >= ALONE_US).all() and (d[3:] <= BESIDE_US).all() and d[3:].sum() < 3 * BESIDE_US
    assert int(gone.steps["predicted_ns"].iat[0]) <= int(half.steps["predicted_ns"].iat[0]) < base
    assert any(c.transform == "replay" for c in half.replay.graph.changes)   # the change log says why


def test_a_longer_collective_slows_the_kernels_it_now_covers(tmp_path: Path) -> None:
    a = analyze(overlapped_trace(tmp_path / "t.json.gz", beside=1))
    assert calibrated_interference(a.graph) == (None, 0)     # one sample beside: the default
    d = gemm_durations_us(predict(a, [comm(3.0)]).scenarios[0].replay.graph)
    assert d.tolist() == pytest.approx([100, 100, 100, 120, DEFAULT_INTERFERENCE * 100, DEFAULT_INTERFERENCE * 100])


def test_transforms_that_price_interference_opt_out(tmp_path: Path) -> None:
    a = analyze(overlapped_trace(tmp_path / "t.json.gz"))
    gemms = np.flatnonzero(a.graph.tasks["name"].astype(str).str.startswith("sm80").to_numpy())
    g = priced_by_transform(a.graph, gemms[3:], reason="test")
    assert gemm_durations_us(g).tolist() == [100] * 6              # their time alone, for the transform to price
    for factor in (0.0, 2.0):                                        # and the replay leaves them there
        h = Scale(select=Selector(kernel_class="collective"), factor=factor).apply(g, TransformContext())
        assert gemm_durations_us(replay(h).graph).tolist() == [100] * 6


def test_a_scenario_graph_replays_to_itself(tmp_path: Path) -> None:
    a = analyze(overlapped_trace(tmp_path / "t.json.gz"))
    for s in predict(a, [comm(0.0), comm(0.5), comm(3.0)]).scenarios:
        again = replay(s.graph)
        assert again.graph is s.graph                                 # nothing left to re-price
        assert again.end_ns.tolist() == s.replay.end_ns.tolist()


def test_fused_and_inserted_tasks_keep_the_annotations_numeric(tmp_path: Path) -> None:
    a = analyze(overlapped_trace(tmp_path / "t.json.gz"))
    gemms = np.flatnonzero(a.graph.tasks["name"].astype(str).str.startswith("sm80").to_numpy())
    fused = edit.fuse(a.graph, gemms[2:4], 200_000, reason="test")   # 100 us alone + 120 us beside
    head = fused.tasks["dur_ns"].to_numpy() == 200_000                # ids after the head moved (launch dropped)
    assert fused.tasks[SHARE_REF].dtype == float
    assert fused.tasks[SHARE_REF].to_numpy()[head].tolist() == pytest.approx([120 / 220])   # by duration
    res = int(a.graph.tasks["resource"].to_numpy()[gemms[0]])
    added, new = edit.insert(a.graph, name="extra", kind=TaskKind.KERNEL, resource=res, dur_ns=1000, reason="t")
    assert added.tasks[SHARE_REF].dtype == float and np.isnan(added.tasks[SHARE_REF].to_numpy()[new])
    validate(fused)
    validate(added)


def test_the_interference_transform_sets_phi(tmp_path: Path) -> None:
    a = analyze(overlapped_trace(tmp_path / "t.json.gz"))
    off, more = predict(a, [Scenario("off", [Interference(factor=1.0), comm(0.0)]),
                            Scenario("more", [Interference(factor=1.5), comm(0.0)])]).scenarios
    assert gemm_durations_us(off.replay.graph).tolist() == [100, 100, 100, 120, 120, 120]   # kept as measured
    assert gemm_durations_us(more.replay.graph).tolist() == pytest.approx([100] * 3 + [80] * 3)   # 120 / 1.5
    calibrated = predict(a, [Scenario("calibrated", [Interference(factor=1.5), Interference(), comm(0.0)])])
    assert gemm_durations_us(calibrated.scenarios[0].replay.graph).tolist() == [100] * 6   # back to 1.2
    with pytest.raises(TransformError, match=r"factor must be 0 \(calibrated\) or in \[1, 3\]"):
        Interference(factor=0.5).apply(a.graph, TransformContext())
    with pytest.raises(TransformError, match="no compute kernel the replay re-prices"):
        Interference(factor=1.2).apply(build_graph(a.trace), TransformContext())


def test_a_small_change_is_priced_too(tmp_path: Path) -> None:
    """The replay's convergence tolerance (0.1 % of the re-priced time) never drops a first change."""
    a = analyze(overlapped_trace(tmp_path / "t.json.gz", beside=1, extra=300))   # 20 us of 30.6 ms
    gone = predict(a, [comm(0.0)]).scenarios[0]
    d = gemm_durations_us(gone.replay.graph)
    assert d[3] == pytest.approx(120 / DEFAULT_INTERFERENCE, abs=0.001) and (np.delete(d, 3) == 100).all()


def test_whatif_predict_says_what_the_replay_re_priced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = overlapped_trace(tmp_path / "t.json.gz")
    scenario = tmp_path / "no_comm.toml"
    scenario.write_text('name = "no collectives"\n[[transform]]\nname = "scale"\nfactor = 0.0\n'
                        'select = { kernel_class = "collective" }\n')
    assert main(["predict", str(trace), "-s", str(scenario)]) == 0
    out = capsys.readouterr().out
    assert "replay: set duration of 3 tasks, task time -0.060 ms" in out   # three GEMMs back to 100 us
    assert "replay: set share_ref of 3 tasks" in out                       # only the fractions that moved
