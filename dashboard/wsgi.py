"""The dashboard for a production WSGI server (gunicorn, uwsgi), which imports ``server``:

    WHATIF_DASHBOARD_PATHS=runs/a:runs/b gunicorn -w 1 --threads 8 -b 127.0.0.1:8050 whatif.dashboard.wsgi:server

``WHATIF_DASHBOARD_PATHS``: the traces and run folders to open (``os.pathsep``-separated; an
empty value opens none: add them on the Runs page); ``WHATIF_DASHBOARD_MAX_UPLOAD_MB`` the upload
limit (default 200). One worker process: the runs and their analyses live in its memory.
"""
from __future__ import annotations

import os

from whatif.core.errors import WhatifError

from .app import create_app


def _paths() -> list[str]:
    return [p for p in os.environ.get("WHATIF_DASHBOARD_PATHS", "").split(os.pathsep) if p]


def _max_upload_mb() -> int:
    text = os.environ.get("WHATIF_DASHBOARD_MAX_UPLOAD_MB", "200")
    if not text.isdigit() or int(text) < 1:
        raise WhatifError(f"WHATIF_DASHBOARD_MAX_UPLOAD_MB={text!r}: must be an integer >= 1")
    return int(text)


app = create_app(_paths(), max_upload_mb=_max_upload_mb())
server = app.server
