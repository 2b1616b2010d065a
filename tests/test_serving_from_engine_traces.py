"""`whatif serve` on third-party engine traces with no serving log: the iterations come from the
engine adapters, the iteration models from the trace alone (skipped without ../shared)."""
from __future__ import annotations

from pathlib import Path

import pytest

from whatif.api import Workload, serve
from whatif.documents import DitServingDocument
from whatif.serving import DitOptions

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "tracelens"
XDIT = SHARED / "xdit_flux1_baseline_mi300x.json.gz"
needs_shared = pytest.mark.skipif(not XDIT.exists(), reason="needs ../shared/traces (third-party traces)")


@needs_shared
def test_a_dit_is_served_from_its_denoising_steps_alone() -> None:
    """One FLUX step (the HIP-graph replay, 35.6 ms) found by the xdit adapter: a request of 28 steps
    served alone takes 28 steps; a scenario that speeds the attention and GEMM kernels serves faster."""
    doc = serve(XDIT, ["scenarios/xdit_aiter_sage_oracle.toml"], Workload(rate=0.01, num_requests=3),
                dit=DitOptions(steps=28))
    assert isinstance(doc, DitServingDocument)
    assert doc.scheduler.tokens == 256 and doc.scheduler.steps == 28
    base, swapped = doc.scenarios
    step_ms = base.service_ms.get("mean") / 28
    assert 33.0 < step_ms < 38.0
    assert any("xdit adapter" in n for n in doc.notes)
    assert swapped.service_ms.get("mean") > base.service_ms.get("mean")   # the oracle: the second trace was slower
