"""A 6 GiB gzip bomb through the CLI and the dashboard, and 200 concurrent dashboard requests
(issue 20): the peak resident memory of each whatif process stays under 1 GiB, every request is
answered, the bomb is refused in one line, and SIGTERM stops the dashboard and removes its upload
folder. The load itself is tests/_hostile.py (bench/hostile_memory.py prints its figures)."""
from __future__ import annotations

import json
from pathlib import Path

import _hostile
import pytest

pytest.importorskip("dash", reason="the dashboard needs the ui extra (pip install -e '.[ui]')")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not _hostile.has_peak(), reason="a process's peak memory needs /proc (Linux)")]
GIB = 1 << 30


def test_the_cli_refuses_a_6_gib_bomb_under_1_gib(tmp_path: Path) -> None:
    run = _hostile.cli_bomb(tmp_path)
    assert run.status == 2 and run.stderr.count("\n") == 1
    assert run.stderr.startswith(f"whatif: {run.path}: inflates to more than")
    assert run.peak_bytes < GIB, f"peak {run.peak_bytes / 2**20:.0f} MiB"


def test_the_dashboard_survives_200_concurrent_requests_and_a_6_gib_bomb_under_1_gib(tmp_path: Path) -> None:
    burst = _hostile.dashboard_burst(tmp_path, uploads=50)
    answers = dict(burst.answers)
    assert len(answers) == 200
    status, body = answers.pop("bomb")
    assert status == 413 and "inflates to more than" in json.loads(body)["error"]
    assert not {k: (s, b[:200]) for k, (s, b) in answers.items() if s != 200}
    assert len(burst.views) == 50 and all(s == 200 and b"ov-body" in b for s, b in burst.views)
    assert burst.uploads_stored == 50                       # one folder per upload, none for the bomb
    assert burst.status == 0, burst.stderr
    assert burst.peak_bytes < GIB, f"peak {burst.peak_bytes / 2**20:.0f} MiB"
    assert burst.upload_dir is not None and not burst.upload_dir.exists()   # removed on SIGTERM
