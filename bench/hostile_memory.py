"""Peak memory under hostile load (issue 20): ``whatif analyze`` on a 6 GiB gzip bomb, and a
dashboard hit by 200 concurrent requests with the bomb among them (tests/_hostile.py; the same
load is asserted by tests/test_hostile_server.py). Prints each process's peak resident memory,
as the child reports it (VmHWM).

Run: .venv/bin/python bench/hostile_memory.py
"""
from __future__ import annotations

import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import _hostile  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as d:
        cli = _hostile.cli_bomb(Path(d))
        burst = _hostile.dashboard_burst(Path(d), uploads=50)
    print(f"whatif analyze, 6 GiB bomb ({cli.compressed_bytes / 1e6:.1f} MB gzip): exit {cli.status}, "
          f"peak {cli.peak_bytes / 2**20:.0f} MiB, {cli.seconds:.1f} s")
    print(f"  {cli.stderr.strip()[:160]}")
    codes = Counter(s for s, _ in burst.answers.values())
    bomb_status, bomb_body = burst.answers["bomb"]
    print(f"whatif dashboard, 200 concurrent requests (bomb, 50 uploads, pages, layouts, Overview callbacks), "
          f"then 50 Overviews of the uploads at once: statuses {dict(sorted(codes.items()))}, "
          f"views {Counter(s for s, _ in burst.views)}")
    print(f"  bomb: HTTP {bomb_status}: {json.loads(bomb_body).get('error', '')[:120]}")
    print(f"  server peak {burst.peak_bytes / 2**20:.0f} MiB, exit {burst.status} on SIGTERM, upload folder "
          f"{'removed' if burst.upload_dir and not burst.upload_dir.exists() else 'LEFT BEHIND'}, "
          f"{burst.seconds:.1f} s in all")


if __name__ == "__main__":
    main()
