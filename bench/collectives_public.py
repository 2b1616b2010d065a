"""Collectives, uncalibrated, against public nccl-tests runs on machines that match the presets.

``bench/cost_collectives.py`` scores the model against Vidur's timings, on a cluster whose network
is about 4x slower than a DGX's (docs/cost-models.md). This bench asks the other question: on
machines that *are* what a preset describes (an 8-GPU NVSwitch box, a multi-node InfiniBand job),
how far is NCCL's tuning model (``whatif.hardware.collectives``), with nothing fitted, from what
nccl-tests measured there? (The last column calibrates on half of a run's sizes and scores the
other half, as a user with the cluster's own nccl-tests output would.)

The runs are public nccl-tests outputs found through code search of public GitHub files; each row
below is (message bytes, out-of-place time in µs) typed in from the log named by its source
(repository @ commit : path; one note, the A100 machine measured both ways, could not be traced
past the search index and names its file id there), with the GPUs, ranks and hosts its
``#  Rank`` lines print. Sizes are nccl-tests' ``size``
column: the full buffer, as the model takes it. Errors are (predicted − measured) / measured.
Size classes as ``bench/cost_collectives.py``'s: small < 64 kB ≤ mid < 4 MB ≤ large.

    .venv/bin/python bench/collectives_public.py [--write-docs]
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common.docs import replace_section
from cost_collectives import UNCALIBRATED_GOAL_PCT as GOAL_PCT
from cost_collectives import size_class

from whatif.core.kernels import CollectiveKind
from whatif.hardware.collectives import bus_bytes, calibrate, collective_time_ns, estimate
from whatif.hardware.topology import TopologyName, preset

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- bench/collectives_public.py begin -->", "<!-- bench/collectives_public.py end -->"


class Setup(str, Enum):
    """How a run relates to the preset it is priced on."""

    MATCH = "a process per GPU on the machine the preset describes"
    ONE_THREAD = "one thread drives every GPU (nccl-tests' `-g 8`), not how PyTorch runs"
    OTHER_NETWORK = "across machines on a cloud network no preset describes, priced on the nearest preset"

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", " ")


@dataclass(frozen=True)
class PublicRun:
    """One nccl-tests output: what ran where, and its (bytes, out-of-place µs) rows."""

    slug: str
    source: str
    gpus: str
    topology: TopologyName
    setup: Setup
    kind: CollectiveKind
    ranks: int
    ranks_per_machine: int
    rows: tuple[tuple[int, float], ...]
    note: str = ""

    @property
    def machines(self) -> int:
        return -(-self.ranks // self.ranks_per_machine)


# one machine's five collectives at 4 and 8 GPUs
_H100_LOG = ("xxrjun/nccl-tests-cluster @ 455de4f8dee2fa94cd4044a7109fd8c576f9e6c1 : benchmarks/example-cluster01/"
             "nccl-benchmark-results/single-node/runs/20260128-145017/without-debug/logs/nccl_N1_G{gpus}_cnode3-002.log")
_H100_GPUS = "{gpus}x NVIDIA H100 80GB HBM3 (one machine, srun, NCCL 2.29.2)"

RUNS: tuple[PublicRun, ...] = (
    PublicRun(
        'a100_8_np8',
        source=('public markdown note in the code search index (id 33201577724; repository not '
                'resolvable), host `thanos`, `mpirun -np 8 ... all_reduce_perf -b 8 -e 4G -f 2 -g '
                '1`'),
        gpus='8x NVIDIA A100-SXM4-80GB (12 NVLinks of 25 GB/s per GPU, `nvidia-smi nvlink -s`)',
        topology=TopologyName.DGX_A100, setup=Setup.MATCH, kind=CollectiveKind.ALL_REDUCE,
        ranks=8, ranks_per_machine=8,
        rows=((8, 20.26), (16, 17.9), (32, 20.75), (64, 22.3), (128, 23.91), (256, 23.61), (512, 24.36),
              (1024, 24.43), (2048, 24.32), (4096, 25.29), (8192, 25.84), (16384, 26.15), (32768, 30.25),
              (65536, 31.82), (131072, 31.9), (262144, 27.65), (524288, 28.11), (1048576, 37.89), (2097152,
              55.39), (4194304, 81.66), (8388608, 130.6), (16777216, 213.3), (33554432, 377.6), (67108864,
              615.7), (134217728, 1181.6), (268435456, 2218.2), (536870912, 4248.8), (1073741824, 8244.5),
              (2147483648, 16288), (4294967296, 32285)),
    ),
    PublicRun(
        'a100_8_g8_same_machine',
        source='the same note and machine as `a100_8_np8`, `all_reduce_perf -b 8 -e 4G -f 2 -g 8`',
        gpus='8x NVIDIA A100-SXM4-80GB',
        topology=TopologyName.DGX_A100, setup=Setup.ONE_THREAD, kind=CollectiveKind.ALL_REDUCE,
        ranks=8, ranks_per_machine=8,
        rows=((8, 40.12), (16, 39.64), (32, 39.06), (64, 38.89), (128, 39.53), (256, 39.08), (512, 39.17),
              (1024, 42.05), (2048, 38.39), (4096, 39.12), (8192, 39.39), (16384, 39.47), (32768, 40.93),
              (65536, 40.97), (131072, 42.26), (262144, 43.97), (524288, 48.31), (1048576, 52.61), (2097152,
              59.3), (4194304, 103.8), (8388608, 162.6), (16777216, 260.5), (33554432, 439.2), (67108864,
              695.5), (134217728, 1305), (268435456, 2392.6), (536870912, 4627.5), (1073741824, 8247.6),
              (2147483648, 16330), (4294967296, 32336)),
    ),
    PublicRun(
        'a100_8_superbench_all_reduce',
        source=('microsoft/superbenchmark @ f1f5c72fe909e38710c498a25a7a084f247076fe : '
                'tests/data/nccl_allreduce.log'),
        gpus='8x A100-SXM4-40GB',
        topology=TopologyName.DGX_A100, setup=Setup.ONE_THREAD, kind=CollectiveKind.ALL_REDUCE,
        ranks=8, ranks_per_machine=8,
        rows=((4, 34.73), (8, 34.66), (16, 35), (32, 35.6), (64, 34.83), (128, 34.53), (256, 34.56), (512,
              34.94), (1024, 36.07), (2048, 35.42), (4096, 35.92), (8192, 35.91), (16384, 36.18), (32768,
              36.65), (65536, 37.82), (131072, 41.19), (262144, 47.53), (524288, 60.32), (1048576, 74.78),
              (2097152, 93.48), (4194304, 112), (8388608, 162), (16777216, 226), (33554432, 374.3), (67108864,
              584.5), (134217728, 1162.2), (268435456, 2112.2), (536870912, 4200.3), (1073741824, 8159.5),
              (2147483648, 16215), (4294967296, 32070), (8589934592, 63896)),
    ),
    PublicRun(
        'a100_8_superbench_all_gather',
        source=('microsoft/superbenchmark @ 86e14156453d256ccd03495d1fa42d2672b12475 : '
                'tests/data/nccl_allgather.log'),
        gpus='8x A100-SXM4-40GB',
        topology=TopologyName.DGX_A100, setup=Setup.ONE_THREAD, kind=CollectiveKind.ALL_GATHER,
        ranks=8, ranks_per_machine=8,
        rows=((32, 35.03), (64, 34.36), (128, 33.94), (256, 34.44), (512, 34.84), (1024, 35.38), (2048,
              34.67), (4096, 34.62), (8192, 34.76), (16384, 34.8), (32768, 34.54), (65536, 36.34), (131072,
              40.18), (262144, 46.45), (524288, 58.48), (1048576, 72.95), (2097152, 77.28), (4194304, 100.7),
              (8388608, 123.5), (16777216, 167.7), (33554432, 265.8), (67108864, 379.7), (134217728, 698.6),
              (268435456, 1192.2), (536870912, 2304.1), (1073741824, 4413.4), (2147483648, 8658.8),
              (4294967296, 17016), (8589934592, 33646)),
    ),
    PublicRun(
        'a100_8_superbench_reduce_scatter',
        source=('microsoft/superbenchmark @ 020a63c6c7a2516ed17a0a43e0f61e6dc79cd4f7 : '
                'tests/data/nccl_reducescatter.log'),
        gpus='8x A100-SXM4-40GB',
        topology=TopologyName.DGX_A100, setup=Setup.ONE_THREAD, kind=CollectiveKind.REDUCE_SCATTER,
        ranks=8, ranks_per_machine=8,
        rows=((32, 35.06), (64, 34.82), (128, 34.38), (256, 34.75), (512, 34.71), (1024, 35.16), (2048,
              35.43), (4096, 35.49), (8192, 35.18), (16384, 35.27), (32768, 35), (65536, 36.78), (131072,
              40.71), (262144, 48.12), (524288, 59.81), (1048576, 72.37), (2097152, 80.64), (4194304, 108.9),
              (8388608, 147.3), (16777216, 152.4), (33554432, 240.5), (67108864, 356.1), (134217728, 618.1),
              (268435456, 1108.7), (536870912, 2169), (1073741824, 4203), (2147483648, 8356.9), (4294967296,
              16400), (8589934592, 32464)),
    ),
    PublicRun(
        'a100_8_superbench_all_to_all',
        source=('microsoft/superbenchmark @ f1f5c72fe909e38710c498a25a7a084f247076fe : '
                'tests/data/nccl_alltoall.log'),
        gpus='8x A100-SXM4-40GB',
        topology=TopologyName.DGX_A100, setup=Setup.ONE_THREAD, kind=CollectiveKind.ALL_TO_ALL,
        ranks=8, ranks_per_machine=8,
        rows=((32, 89), (64, 86.83), (128, 86.02), (256, 87.2), (512, 87.33), (1024, 88.17), (2048, 86.44),
              (4096, 86.75), (8192, 88.78), (16384, 87.71), (32768, 86.26), (65536, 87.67), (131072, 87.35),
              (262144, 87.02), (524288, 86.58), (1048576, 87.42), (2097152, 89.61), (4194304, 96.44),
              (8388608, 121.1), (16777216, 160.4), (33554432, 237.5), (67108864, 396.8), (134217728, 633.6),
              (268435456, 1189.1), (536870912, 2236.6), (1073741824, 4335.5), (2147483648, 8510.4),
              (4294967296, 16860), (8589934592, 33508)),
        note='an ~87 us floor up to 2 MB',
    ),
    PublicRun(
        'a100_8_galvatron',
        source=('AFDWang/Hetu-Galvatron @ 6f77a6cb29a6fc165db86b434010e306f76285ad : '
                'tests/profiler/test_hardware_profile.py'),
        gpus='8x NVIDIA A100-SXM4-40GB',
        topology=TopologyName.DGX_A100, setup=Setup.ONE_THREAD, kind=CollectiveKind.ALL_REDUCE,
        ranks=8, ranks_per_machine=8,
        rows=((1048576, 78.77), (2097152, 108.8), (4194304, 131.1), (8388608, 183.4), (16777216, 293.6),
              (33554432, 415.7), (67108864, 657.2), (134217728, 1256.7), (268435456, 2338.9), (536870912,
              4651.2), (1073741824, 8139.9)),
    ),
    PublicRun(
        'a100_2x8_oci_roce',
        source=('oracle-quickstart/oci-hpc-oke @ 001cbb9b5ee7cdd5aff4b37c6b1448618107e55f : '
                'README.md'),
        gpus='2 machines x 8 NVIDIA A100-SXM4-40GB (OCI bare metal, RoCE, 16 RDMA VFs per node)',
        topology=TopologyName.DGX_A100, setup=Setup.OTHER_NETWORK, kind=CollectiveKind.ALL_REDUCE,
        ranks=16, ranks_per_machine=8,
        rows=((8, 36.47), (16, 38.86), (32, 38.53), (64, 39.25), (128, 38.85), (256, 40.68), (512, 39.27),
              (1024, 41.97), (2048, 43.36), (4096, 44.54), (8192, 48.16), (16384, 49.4), (32768, 49.66),
              (65536, 51.69), (131072, 54.86), (262144, 67.95), (524288, 73.94), (1048576, 85.58), (2097152,
              99.19), (4194304, 127), (8388608, 174.3), (16777216, 282.7), (33554432, 452.3), (67108864,
              821.7), (134217728, 1542), (268435456, 3042.7), (536870912, 6436), (1073741824, 9187.8),
              (2147483648, 18289), (4294967296, 34176), (8589934592, 67689)),
    ),
    PublicRun(
        'h100_8_all_reduce',
        source=_H100_LOG.format(gpus=8), gpus=_H100_GPUS.format(gpus=8),
        topology=TopologyName.DGX_H100, setup=Setup.MATCH, kind=CollectiveKind.ALL_REDUCE,
        ranks=8, ranks_per_machine=8,
        rows=((33554432, 182.87), (67108864, 313.66), (134217728, 564.78), (268435456, 1081.14), (536870912,
              2115.28), (1073741824, 4000.82), (2147483648, 7891), (4294967296, 15668.1), (8589934592,
              31226.8), (17179869184, 62340.7)),
        note='32 MiB and up only',
    ),
    PublicRun(
        'h100_8_all_gather',
        source=_H100_LOG.format(gpus=8), gpus=_H100_GPUS.format(gpus=8),
        topology=TopologyName.DGX_H100, setup=Setup.MATCH, kind=CollectiveKind.ALL_GATHER,
        ranks=8, ranks_per_machine=8,
        rows=((33554432, 123.44), (67108864, 205.21), (134217728, 382.2), (268435456, 721.26), (536870912,
              1389.46), (1073741824, 2719.6), (2147483648, 5355.86), (4294967296, 10562.9), (8589934592,
              20928.4), (17179869184, 41542)),
        note='32 MiB and up only',
    ),
    PublicRun(
        'h100_8_reduce_scatter',
        source=_H100_LOG.format(gpus=8), gpus=_H100_GPUS.format(gpus=8),
        topology=TopologyName.DGX_H100, setup=Setup.MATCH, kind=CollectiveKind.REDUCE_SCATTER,
        ranks=8, ranks_per_machine=8,
        rows=((33554432, 111.83), (67108864, 197.37), (134217728, 380.31), (268435456, 719.67), (536870912,
              1399.96), (1073741824, 2741.51), (2147483648, 5380.08), (4294967296, 10561.5), (8589934592,
              20799.7), (17179869184, 41211.4)),
        note='32 MiB and up only',
    ),
    PublicRun(
        'h100_8_all_to_all',
        source=_H100_LOG.format(gpus=8), gpus=_H100_GPUS.format(gpus=8),
        topology=TopologyName.DGX_H100, setup=Setup.MATCH, kind=CollectiveKind.ALL_TO_ALL,
        ranks=8, ranks_per_machine=8,
        rows=((33554432, 124.79), (67108864, 215.51), (134217728, 393.32), (268435456, 777.88), (536870912,
              1511.21), (1073741824, 2830), (2147483648, 5474.24), (4294967296, 10920.9), (8589934592,
              21708.4), (17179869184, 43193.3)),
        note='32 MiB and up only',
    ),
    PublicRun(
        'h100_8_send_recv',
        source=_H100_LOG.format(gpus=8), gpus=_H100_GPUS.format(gpus=8),
        topology=TopologyName.DGX_H100, setup=Setup.MATCH, kind=CollectiveKind.SEND_RECV,
        ranks=8, ranks_per_machine=8,
        rows=((33554432, 422.19), (67108864, 820.17), (134217728, 825.74), (268435456, 896.4), (536870912,
              1509.11), (1073741824, 2974.51), (2147483648, 5904.41), (4294967296, 11746.6), (8589934592,
              23403.1), (17179869184, 46779.2)),
        note='32 MiB and up only',
    ),
    PublicRun(
        'h100_4_all_reduce',
        source=_H100_LOG.format(gpus=4), gpus=_H100_GPUS.format(gpus=4),
        topology=TopologyName.DGX_H100, setup=Setup.MATCH, kind=CollectiveKind.ALL_REDUCE,
        ranks=4, ranks_per_machine=4,
        rows=((33554432, 171.88), (67108864, 325), (134217728, 614.21), (268435456, 1178.37), (536870912,
              2308.64), (1073741824, 4508.42), (2147483648, 8966.22), (4294967296, 17673.1), (8589934592,
              35151.6), (17179869184, 70128.7)),
        note='32 MiB and up only',
    ),
    PublicRun(
        'h100_4_all_gather',
        source=_H100_LOG.format(gpus=4), gpus=_H100_GPUS.format(gpus=4),
        topology=TopologyName.DGX_H100, setup=Setup.MATCH, kind=CollectiveKind.ALL_GATHER,
        ranks=4, ranks_per_machine=4,
        rows=((33554432, 109.62), (67108864, 191.09), (134217728, 348.19), (268435456, 657.73), (536870912,
              1269.28), (1073741824, 2474.09), (2147483648, 4849.65), (4294967296, 9536.49), (8589934592,
              18515), (17179869184, 37051.9)),
        note='32 MiB and up only',
    ),
    PublicRun(
        'h100_4_reduce_scatter',
        source=_H100_LOG.format(gpus=4), gpus=_H100_GPUS.format(gpus=4),
        topology=TopologyName.DGX_H100, setup=Setup.MATCH, kind=CollectiveKind.REDUCE_SCATTER,
        ranks=4, ranks_per_machine=4,
        rows=((33554432, 104.79), (67108864, 192.24), (134217728, 354.1), (268435456, 674.96), (536870912,
              1305.59), (1073741824, 2497.2), (2147483648, 4835.5), (4294967296, 9434.79), (8589934592,
              18519.2), (17179869184, 36407.4)),
        note='32 MiB and up only',
    ),
    PublicRun(
        'h100_4_all_to_all',
        source=_H100_LOG.format(gpus=4), gpus=_H100_GPUS.format(gpus=4),
        topology=TopologyName.DGX_H100, setup=Setup.MATCH, kind=CollectiveKind.ALL_TO_ALL,
        ranks=4, ranks_per_machine=4,
        rows=((33554432, 109.93), (67108864, 189), (134217728, 344.64), (268435456, 632.94), (536870912,
              1270.12), (1073741824, 2386.68), (2147483648, 4590.38), (4294967296, 9083.76), (8589934592,
              18102.1), (17179869184, 36103.7)),
        note='32 MiB and up only',
    ),
    PublicRun(
        'h100_4_send_recv',
        source=_H100_LOG.format(gpus=4), gpus=_H100_GPUS.format(gpus=4),
        topology=TopologyName.DGX_H100, setup=Setup.MATCH, kind=CollectiveKind.SEND_RECV,
        ranks=4, ranks_per_machine=4,
        rows=((33554432, 225.03), (67108864, 426.49), (134217728, 824.26), (268435456, 896.55), (536870912,
              1512.24), (1073741824, 2974.26), (2147483648, 5896.11), (4294967296, 11729.4), (8589934592,
              23415.8), (17179869184, 46755.7)),
        note='32 MiB and up only',
    ),
    PublicRun(
        'mi300x_8',
        source=('hisohara/ai-scripts @ 7b8b1ec290a6af05b685dfb6ce8caae999ea884d : '
                'training/01_rccl-smoketest/README.md (AAC8)'),
        gpus='8x AMD Instinct MI300X (rccl-tests)',
        topology=TopologyName.MI300X_8, setup=Setup.MATCH, kind=CollectiveKind.ALL_REDUCE,
        ranks=8, ranks_per_machine=8,
        rows=((8, 19.28), (16, 16.32), (32, 17.1), (64, 18.59), (128, 23.05), (256, 23.36), (512, 23.21),
              (1024, 13.67), (2048, 13.67), (4096, 13.72), (8192, 13.76), (16384, 15.47), (32768, 13.94),
              (65536, 14.25), (131072, 14.6), (262144, 17.46), (524288, 27.3), (1048576, 28.39), (2097152,
              36.68), (4194304, 52.96), (8388608, 84.78), (16777216, 149.9), (33554432, 246.3), (67108864,
              432.5), (134217728, 800.3), (268435456, 1540.4), (536870912, 3027.1), (1073741824, 5990.7),
              (2147483648, 11940), (4294967296, 23841), (8589934592, 47617)),
    ),
    PublicRun(
        'mi300x_2x8_roce',
        source=('hisohara/ai-scripts @ 7b8b1ec290a6af05b685dfb6ce8caae999ea884d : '
                'training/01_rccl-smoketest/README.md (AAC10)'),
        gpus=('2 machines x 8 AMD Instinct MI300X, RoCE on mlx5 NICs (speed not stated), RCCL '
              '2.22.3'),
        topology=TopologyName.MI300X_8, setup=Setup.OTHER_NETWORK, kind=CollectiveKind.ALL_REDUCE,
        ranks=16, ranks_per_machine=8,
        rows=((8, 256.5), (16, 218.7), (32, 218.6), (64, 218.8), (128, 219.8), (256, 219.9), (512, 220.8),
              (1024, 220.8), (2048, 223.6), (4096, 226.2), (8192, 240.5), (16384, 238.8), (32768, 239.9),
              (65536, 241.1), (131072, 242.9), (262144, 248.8), (524288, 305.6), (1048576, 414.8), (2097152,
              318.6), (4194304, 337.9), (8388608, 402.2), (16777216, 497.3), (33554432, 590.3), (67108864,
              821.9), (134217728, 1448.8), (268435456, 1713.4), (536870912, 3096.3), (1073741824, 5908.3),
              (2147483648, 11574), (4294967296, 22788), (8589934592, 45224), (17179869184, 90115)),
    ),
    PublicRun(
        'h100_2x8_aws_efa',
        source=('KeitaW/p5-nccl-test-2024-07-19 @ 1c78584b9f4c621b1779270e1cf0b8d6f3daec11 : '
                'nccl-test-output-v2.22.3-1.log'),
        gpus='2x AWS p5.48xlarge (8x NVIDIA H100 80GB HBM3, 32 EFA NICs), NCCL 2.22.3',
        topology=TopologyName.DGX_H100, setup=Setup.OTHER_NETWORK, kind=CollectiveKind.ALL_REDUCE,
        ranks=16, ranks_per_machine=8,
        rows=((8, 85.7), (16, 63.44), (32, 64), (64, 66.94), (128, 63.67), (256, 71.01), (512, 66.49), (1024,
              65.74), (2048, 72.54), (4096, 81.02), (8192, 95.51), (16384, 105.5), (32768, 117.6), (65536,
              107.4), (131072, 96.47), (262144, 99.51), (524288, 120.7), (1048576, 138.1), (2097152, 148.5),
              (4194304, 170), (8388608, 203.4), (16777216, 283.1), (33554432, 459.2), (67108864, 600.4),
              (134217728, 874.1), (268435456, 1469.4), (536870912, 2593.9), (1073741824, 4575.2), (2147483648,
              9058.9), (4294967296, 17232), (8589934592, 33594), (17179869184, 66023)),
    ),
    PublicRun(
        'h100_2x8_gcp_tcpxo',
        source=('lessizzmore/create-a3mega-ztan-fork @ 02dd8f455c43ced1cf442ef29334bda97149264b : '
                'ztan-NCCL-test-result'),
        gpus='2x GCP a3-megagpu-8g (8x NVIDIA H100 80GB HBM3, GPUDirect-TCPXO)',
        topology=TopologyName.DGX_H100, setup=Setup.OTHER_NETWORK, kind=CollectiveKind.ALL_REDUCE,
        ranks=16, ranks_per_machine=8,
        rows=((8, 135.8), (16, 123.2), (32, 123.3), (64, 123.4), (128, 123), (256, 123.6), (512, 126.6),
              (1024, 147.1), (2048, 125.8), (4096, 126.9), (8192, 131.6), (16384, 138.6), (32768, 155.2),
              (65536, 159.4), (131072, 159.3), (262144, 167.1), (524288, 174.2), (1048576, 203.2), (2097152,
              254), (4194304, 364.6), (8388608, 571.9), (16777216, 977.6), (33554432, 1059.9), (67108864,
              1261.6), (134217728, 1652.2), (268435456, 2360.9), (536870912, 3817.5), (1073741824, 6759),
              (2147483648, 12646), (4294967296, 24361), (8589934592, 47535)),
    ),
    PublicRun(
        'b200_2x8_gke_roce',
        source=('kubernetes-sigs/dranet @ f258477cbea0551b7ad239e3873a997a7a3d116b : '
                'site/content/docs/user/gke-rdma.md'),
        gpus='2x GKE a4-highgpu-8g (8x NVIDIA B200, RoCE, gIB), NCCL 2.26.6',
        topology=TopologyName.HGX_B200, setup=Setup.OTHER_NETWORK, kind=CollectiveKind.ALL_GATHER,
        ranks=16, ranks_per_machine=8,
        rows=((1024, 280.4), (2048, 268.2), (4096, 317.7), (8192, 320), (16384, 290.3), (32768, 246.2),
              (65536, 245.9), (131072, 287.1), (262144, 379.6), (524288, 549.9), (1048576, 998.2), (2097152,
              1753.7), (4194304, 933.6), (8388608, 981.2), (16777216, 1479), (33554432, 1240.7), (67108864,
              1621.8), (134217728, 1877.8), (268435456, 3160.2), (536870912, 3332.1), (1073741824, 4057.5),
              (2147483648, 7753.4), (4294967296, 15394), (8589934592, 30970)),
    ),
)


def scored(run: PublicRun) -> pd.DataFrame:
    """Per row: measured and predicted µs, the model's (algorithm, protocol), the error %."""
    topo = preset(run.topology, run.machines)
    nbytes = np.array([r[0] for r in run.rows], dtype=float)
    meas = np.array([r[1] for r in run.rows], dtype=float)
    picks = [estimate(run.kind, b, run.ranks, topo, ranks_per_machine=run.ranks_per_machine) for b in nbytes]
    pred = np.array([e.time_ns / 1e3 for e in picks])   # what collective_time_ns returns uncalibrated
    return pd.DataFrame({"bytes": nbytes, "measured_us": meas, "predicted_us": pred,
                         "pick": [f"{e.algorithm.value}/{e.protocol.value}" for e in picks],
                         "error_pct": 100 * (pred / meas - 1), "class": size_class(pd.Series(nbytes)).to_numpy()})


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def calibrated_error_pct(run: PublicRun) -> float:
    """Median |error| on every other size after ``calibrate`` on the sizes between, as a scenario's
    ``collectives_measured`` calibrates on a cluster's own nccl-tests output (its latency and
    transfer scales, no per-size curve)."""
    topo = preset(run.topology, run.machines)
    rows = sorted(run.rows)
    fit = [(run.kind, b, run.ranks, us * 1e3, run.ranks_per_machine) for b, us in rows[0::2]]
    cal = calibrate(fit, topo, residual=False)
    errs = [abs(collective_time_ns(run.kind, b, run.ranks, topo, ranks_per_machine=run.ranks_per_machine,
                                   calibration=cal) / (us * 1e3) - 1) for b, us in rows[1::2]]
    return 100 * float(np.median(errs))


def busbw_gbps(run: PublicRun, nbytes: float, us: float) -> float:
    return bus_bytes(run.kind, nbytes, run.ranks) / (us * 1e3)


def summary(runs: tuple[PublicRun, ...]) -> pd.DataFrame:
    rows = []
    for run in runs:
        df = scored(run)
        ab = df["error_pct"].abs()
        by = df.groupby("class")["error_pct"].apply(lambda s: s.abs().median())
        last = df.iloc[df["bytes"].idxmax()]
        rows.append({
            "run": run.slug, "setup": run.setup.label, "preset": run.topology.value,
            "collective": run.kind.value, "ranks": f"{run.ranks} ({run.ranks_per_machine} per machine)", "n": len(df),
            "median abs err %": round(float(ab.median()), 1), "bias %": round(float(df["error_pct"].median()), 1),
            "small / mid / large %": " / ".join(f"{by[c]:.1f}" if c in by else "–" for c in ("small", "mid", "large")),
            "sizes": f"{_size(df['bytes'].min())} – {_size(last['bytes'])}",
            "busbw at the largest, meas / pred GB/s": f"{busbw_gbps(run, last['bytes'], last['measured_us']):.0f} / "
                                      f"{busbw_gbps(run, last['bytes'], last['predicted_us']):.0f}",
            "pick (largest)": last["pick"],
            "calibrated %": round(calibrated_error_pct(run), 1),
        })
    return pd.DataFrame(rows)


def render(runs: tuple[PublicRun, ...]) -> str:
    table = summary(runs)
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in table.itertuples(index=False)]
    lines.append("")
    for setup in Setup:
        part = table[[r.setup is setup for r in runs]]
        if len(part):
            met = int((part["median abs err %"] <= GOAL_PCT).sum())
            lines.append(f"{setup.label} ({setup.value}): median |error| <= {GOAL_PCT:.0f} % "
                         f"in {met} of {len(part)} runs, median over them {part['median abs err %'].median():.1f} %")
    lines.append("")
    lines.append("Sources:")
    lines += [f"* `{r.slug}`: {r.source}; {r.gpus}, {r.ranks} ranks on {r.machines} machine(s)"
              + (f"; {r.note}" if r.note else "") for r in runs]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-docs", action="store_true", help="write the table into docs/cost-models.md")
    parser.add_argument("--rows", action="store_true", help="print every row of every run")
    args = parser.parse_args()
    text = render(RUNS)
    print(text)
    if args.rows:
        for run in RUNS:
            print(f"## {run.slug}")
            print(scored(run).to_string(index=False, float_format=lambda v: f"{v:,.1f}"))
    if args.write_docs:
        replace_section(ROOT / "docs" / "cost-models.md", BEGIN, END, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
