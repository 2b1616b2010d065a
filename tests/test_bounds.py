"""predictors/bounds.py: the per-step bounds the physics relations compare predictions with,
computed from measured times on small hand-written traces."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from tracegen import KinetoTrace

from whatif.api import analyze
from whatif.predictors.bounds import _covered_ns, _union, step_bounds

US = 1000


def test_union_and_window_coverage() -> None:
    u_start, u_end = _union(np.array([0, 5, 20, 22]), np.array([10, 8, 25, 30]))
    assert u_start.tolist() == [0, 20] and u_end.tolist() == [10, 30]
    lo, hi = np.array([0, 9, 15, 24, 0]), np.array([10, 21, 21, 40, 100])
    assert _covered_ns(u_start, u_end, lo, hi).tolist() == [10, 2, 1, 6, 20]


def test_sync_wait_is_not_cpu_own_work(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.step(0, 0, 100)
    tr.runtime("cudaLaunchKernel", 0, 5, corr=1)
    tr.gpu("a", 10, 50, corr=1, stream=7)
    tr.runtime("cudaLaunchKernel", 6, 5, corr=2)
    tr.gpu("b", 15, 80, corr=2, stream=20)
    tr.runtime("cudaDeviceSynchronize", 12, 85, corr=3)   # waits until b ends at 95
    b = step_bounds(analyze(tr.write(tmp_path / "t.json.gz")).graph).iloc[0]
    assert b["cpu_own_ns"] == 100 * US - 85 * US           # the step marker's span less the sync
    assert b["gpu_stream_own_ns"] == 80 * US               # the busier stream (20)
    assert b["gpu_busy_ns"] == 85 * US                     # a and b overlap: 10..95


def test_launch_held_behind_a_busy_stream_is_waiting(tmp_path: Path) -> None:
    tr = KinetoTrace()
    tr.step(0, 0, 400)
    for i in range(4):   # typical copy calls: 5 us, stream idle
        tr.runtime("cudaMemcpyAsync", 10 * i, 5, corr=10 + i)
        tr.gpu("Memcpy HtoD (Pageable -> Device)", 10 * i + 6, 2, corr=10 + i, kind="memcpy")
    tr.runtime("cudaLaunchKernel", 50, 5, corr=1)
    tr.gpu("long", 60, 200, corr=1)                         # busy until 260
    tr.runtime("cudaMemcpyAsync", 70, 195, corr=2)          # held until the stream frees at 260
    tr.gpu("Memcpy DtoH (Device -> Pageable)", 260, 3, corr=2, kind="memcpy")
    b = step_bounds(analyze(tr.write(tmp_path / "t.json.gz")).graph).iloc[0]
    held = (260 - 70 - 5) * US                              # until the stream was free, less its typical 5 us
    assert b["cpu_own_ns"] == 400 * US - held


def test_cap_names_the_waits_the_trace_leaves_unexplained() -> None:
    import pandas as pd

    from whatif.predictors.bounds import FixedPart, speedup_cap

    bounds = pd.DataFrame({"cpu_own_ns": [4_000_000, 4_000_000], "gpu_stream_own_ns": [1_000_000, 1_000_000]})
    base_ns = pd.Series([8_000_000, 8_000_000])
    plain = speedup_cap(bounds, base_ns, [FixedPart.CPU_OWN])
    held = speedup_cap(bounds, base_ns, [FixedPart.CPU_OWN], held_ns=2_000_000)
    assert plain is not None and held is not None and plain.speedup_cap == held.speedup_cap == 2.0
    assert plain.line(1.95) == "capped at 2.00x: 4.000 ms of CPU own work per step (unchanged)"
    assert held.line(1.2).endswith("; 2.000 ms per step of waits the trace does not explain are held as measured")
