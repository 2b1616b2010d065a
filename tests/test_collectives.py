import pytest
from _cost_data import VIDUR, bench_module, need

from whatif.hardware.collectives import (
    Algorithm,
    bus_bytes,
    calibrate,
    collective_time_ns,
    phases,
)
from whatif.hardware.topology import LinkKind, TopologyName, preset, presets

DGX = preset("dgx_a100")


def test_ring_all_reduce_moves_2_p_minus_1_over_p():
    for p in (2, 4, 8):
        assert bus_bytes("all_reduce", 800, p) == pytest.approx(2 * (p - 1) / p * 800)
        assert bus_bytes("all_gather", 800, p) == pytest.approx((p - 1) / p * 800)
    ph = phases("all_reduce", 1e9, 8, DGX, "ring")
    assert len(ph) == 1 and ph[0].steps == 14 and ph[0].nbytes == pytest.approx(1.75e9)


def test_alpha_beta_by_hand():
    # ring all-reduce of 1 GB on 8 GPUs, 300 GB/s, 1 us per step, efficiency 1:
    t = collective_time_ns("all_reduce", 1e9, 8, DGX, algorithm="ring", efficiency=1.0)
    assert t == pytest.approx(14 * 1000 + 1.75e9 / 300e9 * 1e9)
    t = collective_time_ns("send_recv", 3e8, 2, DGX, efficiency=1.0)
    assert t == pytest.approx(1000 + 1e6)
    assert collective_time_ns("all_reduce", 1e9, 1, DGX) == 0.0


def test_tree_beats_ring_on_small_messages_and_hierarchical_across_machines():
    assert choose(1e3, 8, preset("dgx_a100")) is Algorithm.TREE
    two = preset("dgx_h100", machines=2)
    ring = collective_time_ns("all_reduce", 1e9, 16, two, algorithm="ring")
    hier = collective_time_ns("all_reduce", 1e9, 16, two, algorithm="hierarchical")
    assert hier < ring
    # all-to-all across machines is bound by the NIC share that leaves the machine
    a2a = collective_time_ns("all_to_all", 1.6e9, 16, two, efficiency=1.0)
    assert a2a >= 0.5 * 1.6e9 / 50e9 * 1e9


def choose(nbytes, ranks, topo):
    from whatif.hardware.collectives import choose_algorithm
    return choose_algorithm("all_reduce", nbytes, ranks, topo)


def test_presets_and_placement():
    assert set(presets()) == set(TopologyName)
    t = preset("mi300x_8", machines=2)
    assert t.intra.kind is LinkKind.INFINITY_FABRIC and t.world_size == 16
    assert t.placement(2, ranks_per_machine=1) == (2, 1)
    with pytest.raises(ValueError):
        t.placement(32)


def test_calibrate_recovers_alpha_beta():
    # measured t = 20 us + bytes / 100 GB/s on 8 ranks: latency 14 steps of 1 us -> scale 20/14
    pts = [("all_reduce", b, 8, 20_000 + 1.75 * b / 100e9 * 1e9) for b in (1e5, 1e6, 1e7, 1e8)]
    cal = calibrate(pts, DGX, residual=False)
    fit = cal.entries[next(iter(cal.entries))]
    assert fit.latency_scale == pytest.approx(20 / 14, rel=1e-6)
    assert fit.efficiency == pytest.approx(100 / 300, rel=1e-6)
    assert collective_time_ns("all_reduce", 5e7, 8, DGX, calibration=cal) == \
        pytest.approx(20_000 + 1.75 * 5e7 / 100e9 * 1e9)


@pytest.mark.shared
def test_vidur_collectives_held_out_sizes_within_goal(capsys):
    need(VIDUR)
    bench = bench_module("cost_collectives")
    assert bench.main() == 0
    out = capsys.readouterr().out
    assert "-> MET" in out.splitlines()[-1]
