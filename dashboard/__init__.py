"""whatif.dashboard: the web UI (Dash) on traces and run folders.

``create_app(paths)`` builds the app; ``whatif dashboard PATH …`` serves it on 127.0.0.1.
State lives in this process (:mod:`.state`), pages in :mod:`.pages`, shared figures in
:mod:`whatif.figures`.
"""
from __future__ import annotations


def create_app(*args, **kwargs):  # noqa: ANN002, ANN003, ANN201 - lazy: dash is an optional extra
    """See :func:`whatif.dashboard.app.create_app`."""
    from .app import create_app as _create

    return _create(*args, **kwargs)


__all__ = ["create_app"]
