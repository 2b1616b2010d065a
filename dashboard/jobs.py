"""Heavy work off the request threads: parsing and analysing a trace, a breakdown, suggestions.

A callback that needs such a result asks :meth:`Jobs.result` for it: the first ask starts the work on
a small pool of threads and answers :data:`PENDING` at once, so the request returns in
milliseconds with a "working" message; the page polls (a ``dcc.Interval``, :func:`poller`) and asks
again until the result is there. The work runs in this process, where the runs, their analyses and
caches live (Dash's background callbacks run in other processes, which would analyse each trace
again per process and keep nothing), and each job runs once: its result or its error is kept for
every later ask.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final, TypeVar

from dash import dcc, html

T = TypeVar("T")

POLL_MS = 250
"""How often a page asks again while its work runs."""


class Pending:
    """The type of :data:`PENDING`."""

    def __repr__(self) -> str:
        return "PENDING"


PENDING: Final = Pending()
"""What :meth:`Jobs.result` answers while the work runs."""


class Jobs:
    """Work keyed by what it computes (``("analysis", run_id)``, …), each key run once on a pool
    of ``workers`` threads.

    >>> jobs = Jobs(workers=1)
    >>> first = jobs.result("sum", lambda: sum(range(10)))
    >>> jobs.wait("sum"), jobs.result("sum", lambda: -1)
    (45, 45)
    """

    def __init__(self, workers: int = 2) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="whatif-job")
        self._futures: dict[Hashable, Future[Any]] = {}
        self._lock = threading.Lock()

    def start(self, key: Hashable, work: Callable[[], Any]) -> Future[Any]:
        """The job of ``key``, started with ``work`` unless it already was."""
        with self._lock:
            if key not in self._futures:
                self._futures[key] = self._pool.submit(work)
            return self._futures[key]

    def result(self, key: Hashable, work: Callable[[], T]) -> T | Pending:
        """The result of ``key``'s job (raises its error), or :data:`PENDING` while it runs."""
        future = self.start(key, work)
        return future.result() if future.done() else PENDING

    def running(self, key: Hashable) -> bool:
        with self._lock:
            future = self._futures.get(key)
        return future is not None and not future.done()

    def wait(self, key: Hashable, timeout_s: float | None = None) -> Any:
        """Block until ``key``'s job is done (tests, notebooks); its result."""
        with self._lock:
            future = self._futures[key]
        return future.result(timeout=timeout_s)

    def close(self) -> None:
        """Start no more jobs; the running ones finish in their threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def poller(id: str) -> dcc.Interval:
    """The interval a page polls its jobs with (enabled by its callback while work runs)."""
    return dcc.Interval(id=id, interval=POLL_MS, disabled=True)


def working(what: str) -> html.Div:
    """The "working" state a page shows while its job runs."""
    return html.Div([html.Span(className="spinner"), f"working: {what}…"], className="working", role="status")

