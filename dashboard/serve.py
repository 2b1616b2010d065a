"""Serve a dashboard app in a background thread (tests, benchmarks, notebooks)."""
from __future__ import annotations

import threading
from dataclasses import dataclass

import dash
from werkzeug.serving import BaseWSGIServer, make_server


@dataclass
class Background:
    """A running server: ``url``; ``stop()`` shuts it down."""

    server: BaseWSGIServer
    thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=5)


def serve_in_background(app: dash.Dash, port: int = 0) -> Background:
    """Start ``app`` on 127.0.0.1 (``port`` 0: a free one), threaded, in a daemon thread."""
    server = make_server("127.0.0.1", port, app.server, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="whatif-dashboard", daemon=True)
    thread.start()
    return Background(server=server, thread=thread)
