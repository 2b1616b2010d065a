import itertools
from pathlib import Path

import pytest
from _cost_data import VIDUR, bench_module, need

from whatif.hardware.collectives import (
    Algorithm,
    Protocol,
    bus_bytes,
    calibrate,
    collective_time_ns,
    estimate,
    estimates,
)
from whatif.hardware.topology import LinkKind, TopologyName, preset, presets

DGX = preset("dgx_a100")


def test_bus_bytes_follow_nccl_tests_factors():
    for p in (2, 4, 8):
        assert bus_bytes("all_reduce", 800, p) == pytest.approx(2 * (p - 1) / p * 800)
        assert bus_bytes("all_gather", 800, p) == pytest.approx((p - 1) / p * 800)
        assert bus_bytes("send_recv", 800, p) == 800


def test_ring_simple_by_hand():
    # NCCL's tuning model, ring/Simple all-reduce of 1 GB on 8 A100s over NVSwitch:
    # latency 8.4 us + 14 hops x 3.4 us; bus bandwidth 12 NVLinks x 20 GB/s, algbw x 8/14
    e = estimate("all_reduce", 1e9, 8, DGX, algorithm="ring", protocol="simple")
    assert e.latency_ns == pytest.approx((8.4 + 14 * 3.4) * 1e3)
    assert e.transfer_ns == pytest.approx(1e9 / (240e9 * 8 / 14) * 1e9)
    assert collective_time_ns("all_reduce", 1e9, 1, DGX) == 0.0


def test_small_messages_pick_ll_large_pick_simple():
    for topo in (DGX, preset("dgx_h100"), preset("pcie_a100_8")):
        assert estimate("all_reduce", 4096, 8, topo).protocol is Protocol.LL
        assert estimate("all_reduce", 1 << 30, 8, topo).protocol in (Protocol.SIMPLE,)
    # in between, LL128 on NVLink (NCCL enables it there only)
    assert estimate("all_reduce", 8e6, 8, DGX).protocol is Protocol.LL128
    assert all(e.protocol is not Protocol.LL128 for e in estimates("all_reduce", 8e6, 8,
                                                                   preset("pcie_a100_8")))


def test_nvls_only_where_the_switch_has_it_and_wins_large():
    assert not any(e.algorithm is Algorithm.NVLS for e in estimates("all_reduce", 1e9, 8, DGX))
    h100 = preset("dgx_h100")
    assert estimate("all_reduce", 1 << 30, 8, h100).algorithm is Algorithm.NVLS
    assert estimate("all_reduce", 4096, 8, h100).algorithm is not Algorithm.NVLS
    two = preset("dgx_h100", machines=2)
    assert any(e.algorithm is Algorithm.NVLS_TREE for e in estimates("all_reduce", 1e9, 16, two))


def test_nvls_bandwidth_as_nvidia_states_it():
    # NVIDIA/nccl-tests#212 (NCCL's maintainer): 8 H100s reach ~480 GB/s of all-reduce bus
    # bandwidth with NVLS, ~370 GB/s over a ring; NCCL's model: 8 channels x 40 GB/s (its speed
    # list's step under 370.8/8) x 0.85 x 7/8 x 2 = 476 GB/s
    h100 = preset("dgx_h100")
    e = estimate("all_reduce", 1 << 34, 8, h100)
    assert e.algorithm is Algorithm.NVLS
    assert bus_bytes("all_reduce", 1 << 34, 8) / e.time_ns == pytest.approx(476, rel=0.01)
    ring = estimate("all_reduce", 1 << 34, 8, h100, algorithm="ring", protocol="simple")
    assert bus_bytes("all_reduce", 1 << 34, 8) / ring.time_ns == pytest.approx(18 * 20.6, rel=0.01)


def test_pairwise_nvlink_ring_crosses_pcie():
    for name in (TopologyName.A100_PAIRWISE_NVLINK, TopologyName.H100_PAIRWISE_NVLINK,
                 TopologyName.A40_PAIRWISE_NVLINK):
        t = preset(name)
        assert t.ring_link(2).kind is LinkKind.NVLINK and t.ring_link(4).kind is LinkKind.PCIE
    t = preset("a100_pairwise_nvlink")
    pair = estimate("all_reduce", 256e6, 2, t)
    four = estimate("all_reduce", 256e6, 4, t)
    # 2 GPUs: NVLink (12 x 20 GB/s); 4 GPUs: the ring's bottleneck is PCIe Gen4 (24 GB/s credited)
    assert pair.transfer_ns == pytest.approx(256e6 / 240e9 * 1e9, rel=1e-6)
    assert four.transfer_ns == pytest.approx(256e6 / (24e9 * 4 / 6) * 1e9, rel=1e-6)
    assert four.protocol is Protocol.SIMPLE
    assert all(e.protocol is not Protocol.LL128 for e in estimates("all_reduce", 8e6, 4, t))


def test_more_bytes_never_faster():
    sizes = [2 ** k for k in range(8, 33)] + [3 * 2 ** k for k in range(8, 31)]
    sizes.sort()
    for topo, ranks, per in ((DGX, 8, None), (preset("dgx_h100", 2), 16, None),
                             (preset("a100_pairwise_nvlink"), 4, None),
                             (preset("dgx_a100", 2), 4, 2)):
        for kind in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"):
            t = [collective_time_ns(kind, s, ranks, topo, ranks_per_machine=per) for s in sizes]
            assert all(b >= a * (1 - 1e-9) for a, b in itertools.pairwise(t)), (topo.name, kind)


def test_more_ranks_on_one_machine_never_faster():
    # all-reduce of a fixed message over ring and tree on one machine's fabric, 2 to 8 ranks.
    # Not NVLS: there every GPU adds a channel pulling through the switch, so 8 GPUs reduce a
    # message faster than 4 (H100: 476 vs 306 GB/s of bus bandwidth), as on the real machine.
    for topo in (DGX, preset("pcie_a100_8"), preset("mi300x_8"), preset("a40_pairwise_nvlink")):
        for size in (4e3, 1e6, 64e6, 1e9):
            t = [collective_time_ns("all_reduce", size, p, topo) for p in range(2, 9)]
            assert all(b >= a * (1 - 1e-9) for a, b in itertools.pairwise(t)), (topo.name, size)


def test_eight_h100s_reduce_large_messages_faster_than_four_as_measured():
    """Not a physics violation: one DGX H100 measured with nccl-tests (NCCL 2.29.2, the same machine
    at 4 and 8 GPUs, bench/collectives_public.py) reduces 64 MiB and more faster on 8 GPUs (NVLS)
    than on 4 (ring), and the model orders those sizes the same way. At 32 MiB the measured 4 GPUs
    are still 6 % faster (171.9 against 182.9 us) where the model already has 8 ahead."""
    runs = {r.slug: dict(r.rows) for r in bench_module("collectives_public").RUNS}
    four, eight = runs["h100_4_all_reduce"], runs["h100_8_all_reduce"]
    h100 = preset("dgx_h100")
    for size in sorted(s for s in set(four) & set(eight) if s >= 1 << 26):
        measured = eight[size] < four[size]
        modelled = collective_time_ns("all_reduce", size, 8, h100) < collective_time_ns("all_reduce", size, 4, h100)
        assert measured and modelled, size


def test_network_bounds_rings_across_machines():
    two = preset("dgx_h100", machines=2)
    inside = estimate("all_reduce", 1e9, 8, two)
    across = estimate("all_reduce", 1e9, 8, two, ranks_per_machine=4)
    # NVLS inside the machine: 8 channels x 40 GB/s x 0.85 x 7/8 x 2; across, NVLS-tree: 4
    # channels, each the least of 60 x 0.85 x 3/4 x 2, two NICs' worth (100) and Hopper's 57.7
    assert inside.algorithm is Algorithm.NVLS and across.algorithm is Algorithm.NVLS_TREE
    assert inside.transfer_ns == pytest.approx(1e9 / (8 * 40e9 * 0.85 * 7 / 8 * 2 * 8 / 14) * 1e9)
    assert across.transfer_ns == pytest.approx(1e9 / (4 * 57.7e9 * 8 / 14) * 1e9)
    ring = estimate("all_reduce", 1e9, 8, two, ranks_per_machine=4, algorithm="ring")
    assert ring.transfer_ns == pytest.approx(1e9 / (4 * 50e9 * 8 / 14) * 1e9)   # 4 NICs bound it
    # all-to-all across machines is bound by the NIC share that leaves the machine
    a2a = estimate("all_to_all", 1.6e9, 16, two)
    assert a2a.transfer_ns == pytest.approx(0.5 * 1.6e9 / 50e9 * 1e9)


def test_collnet_only_with_sharp():
    two = preset("dgx_h100", machines=2)
    assert not any(e.algorithm is Algorithm.COLLNET_DIRECT
                   for e in estimates("all_reduce", 1e9, 16, two))
    sharp = two.__class__(**{**two.__dict__, "collnet": True})
    assert any(e.algorithm is Algorithm.COLLNET_DIRECT
               for e in estimates("all_reduce", 1e9, 16, sharp))


def test_presets_and_placement():
    assert set(presets()) == set(TopologyName)
    t = preset("mi300x_8", machines=2)
    assert t.intra.kind is LinkKind.INFINITY_FABRIC and t.world_size == 16
    assert t.placement(2, ranks_per_machine=1) == (2, 1)
    with pytest.raises(ValueError):
        t.placement(32)
    assert preset("gb200_nvl72").gpus_per_machine == 72
    with pytest.raises(ValueError, match="no inter-machine network"):
        collective_time_ns("all_reduce", 1e6, 16, t.__class__(**{**t.__dict__, "inter": None}))


def test_calibrate_recovers_latency_and_bandwidth_scales():
    # measured: 1.5x the model's latency, 1/0.8 of its transfer time (ring/Simple sizes)
    sizes = (64e6, 128e6, 256e6, 512e6, 1e9)
    model = {s: estimate("all_reduce", s, 8, DGX) for s in sizes}
    pts = [("all_reduce", s, 8, 1.5 * e.latency_ns + e.transfer_ns / 0.8) for s, e in model.items()]
    cal = calibrate(pts, DGX, residual=False)
    fit = cal.entries[next(iter(cal.entries))]
    assert fit.latency_scale == pytest.approx(1.5, rel=1e-6)
    assert fit.efficiency == pytest.approx(0.8, rel=1e-6)
    e = estimate("all_reduce", 300e6, 8, DGX)
    assert collective_time_ns("all_reduce", 300e6, 8, DGX, calibration=cal) == \
        pytest.approx(1.5 * e.latency_ns + e.transfer_ns / 0.8)


@pytest.mark.shared
def test_vidur_collectives_calibrated_within_goal(capsys):
    need(VIDUR)
    bench = bench_module("cost_collectives")
    assert bench.main() == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("calibrated (held-out sizes)"))
    groups_met, groups = (int(x) for x in line.split(" groups")[0].split("in ")[-1].split(" of "))
    # 14 of 15 groups within 5 % held out; the noisy inter-node pairwise send/recv is the miss
    assert groups == 15 and groups_met >= 14
    overall = float(line.split("overall median ")[1].split(" %")[0])
    assert overall <= 2.0


NCCL_TESTS_OUT = """# nThread 1 nGpus 1 minBytes 8 maxBytes 134217728 step: 4(factor) warmup iters: 5 iters: 20
# Collective test starting: all_reduce_perf
#
# Using devices
#  Rank  0 Group  0 Pid  101 on     node-a device  0 [0x07] NVIDIA A100-SXM4-80GB
#  Rank  1 Group  0 Pid  102 on     node-a device  1 [0x0b] NVIDIA A100-SXM4-80GB
#  Rank  2 Group  0 Pid  201 on     node-b device  0 [0x07] NVIDIA A100-SXM4-80GB
#  Rank  3 Group  0 Pid  202 on     node-b device  1 [0x0b] NVIDIA A100-SXM4-80GB
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           8             2     float     sum      -1    30.12    0.00    0.00      0    29.80    0.00    0.00      0
     1048576        262144     float     sum      -1    95.40   10.99   16.49      0    96.10   10.91   16.37    N/A
   134217728      33554432     float     sum      -1   7500.0   17.90   26.84      0   7490.0   17.92   26.88      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 14.5
"""


def test_read_nccl_tests(tmp_path):
    from whatif.core.errors import TraceError
    from whatif.tracer.measured_collectives import read_nccl_tests
    p = tmp_path / "out.txt"
    p.write_text(NCCL_TESTS_OUT)
    run = read_nccl_tests(p)
    assert (run.kind.value, run.ranks, run.ranks_per_node) == ("all_reduce", 4, 2)
    assert run.sizes_bytes == (8.0, 1048576.0, 134217728.0)
    assert run.times_ns == pytest.approx((30_120.0, 95_400.0, 7_500_000.0))
    assert run.points()[1] == ("all_reduce", 1048576.0, 4, pytest.approx(95_400.0), 2)
    (tmp_path / "plain.txt").write_text(NCCL_TESTS_OUT.replace("all_reduce_perf", "a test"))
    with pytest.raises(TraceError, match="names no nccl-tests program"):
        read_nccl_tests(tmp_path / "plain.txt")
    assert read_nccl_tests(tmp_path / "plain.txt", kind="all_gather").kind.value == "all_gather"
    (tmp_path / "empty.txt").write_text("# all_reduce_perf\n#  Rank  0 Group 0 Pid 1 on a device 0\n")
    with pytest.raises(TraceError, match="no nccl-tests result row"):
        read_nccl_tests(tmp_path / "empty.txt")



def test_read_nccl_tests_older_output(tmp_path):
    """nccl-tests before 2.10 printed no ``Group`` on its rank lines and no ``root`` column (and
    all_to_all no ``redop``): the out-of-place time is still the 8th field from the end."""
    from whatif.tracer.measured_collectives import read_nccl_tests
    ranks = "".join(f"#   Rank  {r} Pid  4242 on localhost device  {r} [0x00] A100-SXM4-40GB\n" for r in range(8))
    rows = ("       0         0   float     sum    35.20    0.00    0.00    N/A    34.05    0.00    0.00    N/A\n"
            " 1048576    262144   float     sum    74.10   14.15   24.77    N/A    74.90   14.00   24.50    N/A\n")
    (tmp_path / "all_reduce_perf.log").write_text(ranks + rows)
    run = read_nccl_tests(tmp_path / "all_reduce_perf.log")
    assert (run.kind.value, run.ranks, run.ranks_per_node) == ("all_reduce", 8, 8)
    assert run.sizes_bytes == (0.0, 1048576.0)
    assert run.times_ns == pytest.approx((35_200.0, 74_100.0))
    a2a = ("     8388608        262144   float   1234.5    6.80    5.95    N/A   1240.0    6.77    5.92    N/A\n")
    (tmp_path / "alltoall_perf.log").write_text(ranks + a2a)
    run = read_nccl_tests(tmp_path / "alltoall_perf.log")
    assert (run.kind.value, run.times_ns) == ("all_to_all", pytest.approx((1_234_500.0,)))

def _slow_cluster_log(tmp_path: Path) -> Path:
    """An nccl-tests log of a 2 x 2 A100 cluster whose all-reduces take 3x the model's time."""
    topo = preset("dgx_a100", machines=2)
    rows = "".join(f"{int(b)} {int(b) // 4} float sum -1 "
                   f"{3 * collective_time_ns('all_reduce', b, 4, topo, ranks_per_machine=2) / 1e3:.3f}"
                   " 0 0 0 0 0 0 0\n" for b in (1e6, 4e6, 16e6, 128e6, 512e6))
    p = tmp_path / "all_reduce_perf.log"
    p.write_text(NCCL_TESTS_OUT.split("#       size")[0] + rows)
    return p


def test_trace_cost_model_calibrates_on_a_measurement_file(tmp_path):
    from whatif.api import analyze, make_context
    from whatif.tracer.measured_collectives import read_nccl_tests
    cost = make_context(analyze(Path(__file__).resolve().parents[1] / "sample_traces" / "llm_serve").trace).cost
    before = cost.collective_time_ns("all_reduce", 64e6, 4, "dgx_a100", 2)
    cost.measure_collectives(read_nccl_tests(_slow_cluster_log(tmp_path)).points())
    after = cost.collective_time_ns("all_reduce", 64e6, 4, "dgx_a100", 2)
    assert after == pytest.approx(3 * before, rel=0.05)


def test_a_scenario_calibrates_collectives_on_its_measurement_files(tmp_path):
    """``collectives_measured`` (relative to the scenario file) reaches the cost model of the
    contexts that price that scenario, and only those."""
    from whatif.api import analyze, make_context
    from whatif.transforms.scenario import ScenarioError, load_scenario
    _slow_cluster_log(tmp_path)
    toml = tmp_path / "tp.toml"
    toml.write_text('collectives_measured = "all_reduce_perf.log"\n[[transform]]\nname = "scale"\nfactor = 0.5\n')
    scenario = load_scenario(toml)
    assert len(scenario.collective_points) == 5 and scenario.collective_points[0][:3] == ("all_reduce", 1e6, 4)
    trace = analyze(Path(__file__).resolve().parents[1] / "sample_traces" / "llm_serve").trace
    plain = make_context(trace).cost.collective_time_ns("all_reduce", 64e6, 4, "dgx_a100", 2)
    measured = make_context(trace, "trace", scenario.collective_points).cost
    assert measured.collective_time_ns("all_reduce", 64e6, 4, "dgx_a100", 2) == pytest.approx(3 * plain, rel=0.05)
    assert make_context(trace).cost.collective_time_ns("all_reduce", 64e6, 4, "dgx_a100", 2) == plain
    toml.write_text('collectives_measured = ["missing.log"]\n[[transform]]\nname = "scale"\nfactor = 0.5\n')
    with pytest.raises(ScenarioError, match=r"tp.toml: collectives_measured: .*missing.log"):
        load_scenario(toml)
    toml.write_text('collectives_measured = 3\n[[transform]]\nname = "scale"\nfactor = 0.5\n')
    with pytest.raises(ScenarioError, match="must be a path or a list of paths"):
        load_scenario(toml)
