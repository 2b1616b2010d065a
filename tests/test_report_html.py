"""The HTML report opened in headless Chromium with the network cut: every figure renders."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_report import gpu_trace

from whatif.api import predict
from whatif.report import write_report
from whatif.transforms.generic import Scale
from whatif.transforms.select import Selector

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")
def test_html_report_renders_offline(tmp_path: Path) -> None:
    pred = predict(gpu_trace(tmp_path / "t.json.gz"), [Scale(select=Selector(name="gemm"), factor=0.5)])
    html = write_report(pred, tmp_path / "out", ["html"], step_summary=False).files["html"]
    profile = tmp_path / "profile"
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9",  # no network at all
         "--virtual-time-budget=10000", "--dump-dom", html.resolve().as_uri()],
        capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-500:]
    dom = proc.stdout
    ids = re.findall(r'<div id="(fig-[\w-]+)"', html.read_text())
    assert ids == ["fig-scenarios", "fig-steps", "fig-baseline-path", "fig-waterfall-0", "fig-path-0",
                   "fig-top-kernels"]
    for i, fig in enumerate(ids):  # each figure div now holds plotly's rendered SVG
        start = dom.index(f'id="{fig}"')
        end = dom.index(f'id="{ids[i + 1]}"') if i + 1 < len(ids) else len(dom)
        assert 'class="main-svg"' in dom[start:end], f"{fig} did not render"
    assert "1.556x" in dom  # the scenario bar's label (steps 1-2: step 0 is warm-up), drawn by plotly.js
