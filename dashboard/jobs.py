"""Heavy work off the request threads: parsing and analysing a trace, a breakdown, suggestions.

A callback that needs such a result asks :meth:`Jobs.result` for it: the first ask starts the work
on a small pool of threads and answers :class:`Pending` at once, so the request returns in
milliseconds with a "working" message; a small callback polls the job (:func:`poller`,
:func:`watch`) and triggers the page's callback again once, when the result is there. The work
runs in this process, where the runs, their analyses and caches live (Dash's background callbacks
run in other processes, which would analyse each trace again per process and keep nothing), and
each job runs once: its result or its error is kept for every later ask. A kept error is raised
again with the frames of that ask only (its traceback in the job's thread is logged once): raised as
kept, it gained the frames of every ask, and a page asking 4 times a second logged ever longer
tracebacks.
"""
from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate

T = TypeVar("T")
log = logging.getLogger("whatif.dashboard")

POLL_MS = 250
"""How often a page asks again while its work runs."""


@dataclass(frozen=True)
class Pending:
    """What :meth:`Jobs.result` answers while the work runs: ``token`` names the job
    (:meth:`Jobs.done`)."""

    token: str


class Jobs:
    """Work keyed by what it computes (``("analysis", run_id)``, …), each key run once on a pool
    of ``workers`` threads.

    >>> jobs = Jobs(workers=1)
    >>> first = jobs.result("sum", lambda: sum(range(10)))  # 45, or Pending("'sum'") while it runs
    >>> jobs.wait("sum"), jobs.result("sum", lambda: -1)
    (45, 45)
    """

    def __init__(self, workers: int = 2) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="whatif-job")
        self._futures: dict[str, Future[Any]] = {}  # by token
        self._lock = threading.Lock()

    @staticmethod
    def token(key: Hashable) -> str:
        """The name of ``key``'s job (its repr: keys are tuples of ids, names and small frozen
        dataclasses), short enough for a ``dcc.Store``."""
        return repr(key)

    def start(self, key: Hashable, work: Callable[[], Any]) -> Future[Any]:
        """The job of ``key``, started with ``work`` unless it already was."""
        with self._lock:
            token = self.token(key)
            if token not in self._futures:
                self._futures[token] = future = self._pool.submit(work)
                future.add_done_callback(lambda f: _log_failure(token, f))
            return self._futures[token]

    def result(self, key: Hashable, work: Callable[[], T]) -> T | Pending:
        """The result of ``key``'s job (raises its error), or :class:`Pending` while it runs."""
        future = self.start(key, work)
        return _outcome(future) if future.done() else Pending(self.token(key))

    def done(self, token: str) -> bool:
        """Whether the job named ``token`` has finished (or there is none: nothing to wait for)."""
        with self._lock:
            future = self._futures.get(token)
        return future is None or future.done()

    def running(self, key: Hashable) -> bool:
        return not self.done(self.token(key))

    def wait(self, key: Hashable, timeout_s: float | None = None) -> Any:
        """Block until ``key``'s job is done (tests, notebooks); its result."""
        with self._lock:
            future = self._futures[self.token(key)]
        future.exception(timeout=timeout_s)  # waits (TimeoutError past timeout_s), raises nothing else
        return _outcome(future)

    def close(self) -> None:
        """Start no more jobs; the running ones finish in their threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _outcome(future: Future[Any]) -> Any:
    """The result of a finished job, or its error raised afresh: the same exception, its traceback
    emptied first, so it holds the frames of this raise only (``future.result()`` re-raises the
    kept exception, whose traceback grows by the frames of each raise)."""
    exc = future.exception()
    if exc is not None:
        raise exc.with_traceback(None)
    return future.result()


def _log_failure(token: str, future: Future[Any]) -> None:
    """Log a failed job's error with the traceback of the thread it ran in, once."""
    exc = None if future.cancelled() else future.exception()
    if exc is not None:
        log.warning("job %s failed:\n%s", token, "".join(traceback.format_exception(exc)).rstrip())


def poller(prefix: str) -> html.Div:
    """What a page waits for its job with: ``<prefix>-poll``, an interval its callback enables
    while the job runs, ``<prefix>-waiting``, the job's token, and ``<prefix>-ready``, which
    :func:`watch` changes once when the job is done (an input of the page's callback)."""
    return html.Div([dcc.Interval(id=f"{prefix}-poll", interval=POLL_MS, disabled=True),
                     dcc.Store(id=f"{prefix}-waiting"), dcc.Store(id=f"{prefix}-ready")])


def watch(app: Any, prefix: str, jobs: Callable[[], Jobs]) -> None:
    """Register the small callback of :func:`poller` ``prefix``: each tick asks whether the job is
    done and, once it is, changes ``<prefix>-ready`` and stops the ticks. The page's own (slow)
    callback runs once then, not on every tick: a tick arriving while it ran would supersede it."""

    @app.callback(Output(f"{prefix}-ready", "data"), Output(f"{prefix}-poll", "disabled", allow_duplicate=True),
                  Input(f"{prefix}-poll", "n_intervals"), State(f"{prefix}-waiting", "data"),
                  prevent_initial_call=True)
    def ready(ticks: int | None, token: str | None) -> tuple[str, bool]:
        if token is None or not jobs().done(token):
            raise PreventUpdate
        return f"{token} after {ticks} polls", True


def working(what: str) -> html.Div:
    """The "working" state a page shows while its job runs."""
    return html.Div([html.Span(className="spinner"), f"working: {what}…"], className="working", role="status")

