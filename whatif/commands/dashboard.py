"""Open the web dashboard on trace files, run folders or folders of them.

Serves on 127.0.0.1:8050 by default (only this machine can connect) and opens a browser tab.
The app reads files only inside the given paths, their parent folders and its upload folder.
"""
from __future__ import annotations

import argparse
import errno
import signal
import socket
import threading
import webbrowser
from types import FrameType

from whatif.core.errors import WhatifError

from ._values import port, positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="*", metavar="PATH", help="trace files, run folders, or folders of them")
    p.add_argument("--port", type=port, default=8050, help="port (default 8050)")
    p.add_argument("--host", default="127.0.0.1",
                   help="interface to bind (default 127.0.0.1; anything else exposes your traces to the network)")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser tab")
    p.add_argument("--max-upload-mb", type=positive_int, default=200,
                   help="largest trace upload accepted (default 200 MiB)")


def run(args: argparse.Namespace) -> int:
    try:
        from whatif.dashboard.app import create_app
    except ModuleNotFoundError as exc:
        raise WhatifError(f"the dashboard needs the ui extra ({exc.name} is missing): "
                          f"pip install 'whatif[ui]'") from None
    from pathlib import Path

    for p in args.paths:
        if not Path(p).exists():
            raise WhatifError(f"{p}: no such file or folder")
    from whatif.dashboard.state import get_store

    _check_port_free(args.host, args.port)
    try:
        app = create_app(args.paths, max_upload_mb=args.max_upload_mb)
    except (OSError, ValueError) as exc:   # a path with no runs, outside the guard, unreadable
        raise WhatifError(str(exc)) from None
    store = get_store()
    url = f"http://{'127.0.0.1' if args.host in ('0.0.0.0', '::') else args.host}:{args.port}/"
    print(f"whatif dashboard on {url} (Ctrl+C to stop); uploads go to {store.upload_dir}, removed on exit",
          flush=True)
    if not args.no_browser:
        threading.Timer(1.0, webbrowser.open, args=(url,)).start()
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        app.run(host=args.host, port=args.port, debug=False)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        store.close()
    return 0


def _check_port_free(host: str, port: int) -> None:
    """Refuse a port another program listens on, before anything starts (werkzeug would exit 1)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            reason = "in use by another program" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
            raise WhatifError(f"--port {port} on {host}: {reason} (pick another with --port)") from None


def _terminate(signum: int, frame: FrameType | None) -> None:
    """SIGTERM ends the server like Ctrl+C does, so the upload folder is removed."""
    raise KeyboardInterrupt
