"""Following the recorded program's child processes (docs/recording.md, "Child processes").

Main process: :class:`FollowChildren` puts the bootstrap (:mod:`.child_site`, copied as
``sitecustomize.py`` into a temporary folder first on ``PYTHONPATH``) and the child
configuration (:class:`ChildConfig`, JSON in :data:`~.child_site.CHILD_ENV`) into the environment
that the program's children inherit, and arms a fork hook.

Child: once it imports torch, :func:`start_child` starts a :class:`ChildRecording` with the
main process's backend and options. It stops and writes ``rank<k>.<role>.<pid>.pt.trace.json.gz``
when the process ends: at the end of a ``multiprocessing`` process's ``_bootstrap`` (fork children
leave by ``os._exit``, so ``atexit`` would never run) or at ``atexit``. SIGINT/SIGTERM are handled
as in the main process (:class:`~.signals.SignalGuard`), except that SIGTERM while the program runs
ends the child at once, as without whatif (:meth:`ChildRecording._terminated`): the trace is
written, then the process ends by the same signal, so its parent sees what it would have seen
without whatif.

A child forked (``os.fork``, ``multiprocessing``'s fork start method) from a process that is
recording inherits that process's profiler, which cannot be used there: the fork hook forgets it
and starts a fresh recording.
"""
from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.process
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from ..markers import add_step_hook, remove_step_hook
from . import child_site
from .distributed import DistributedWatcher
from .errors import OptionError
from .options import RecordOptions, Schedule
from .processes import ProcessEnd, ProcessRecord, add_process, child_role, process_trace_name
from .session import make_session, record_info, trace_document
from .signals import RecordingAborted, SignalGuard, exit_status
from .steps import StepDetector
from .trace_file import write_trace

CHILD_ENV = child_site.CHILD_ENV
FOLLOWED_ENV = (CHILD_ENV, child_site.SITE_DIR_ENV, child_site.START_ENV, "PYTHONPATH")


class ChildConfig(msgspec.Struct, frozen=True, kw_only=True):
    """What a child needs to record as the main process does, and who its parent is."""

    run_dir: str
    wait: int
    warmup: int
    active: int | None
    repeat: int
    record_shapes: bool
    with_stack: bool
    profile_memory: bool
    backend: str
    step_on: str | None
    parent_pid: int
    parent_env_rank: bool  # whether the parent had RANK in its environment (a launcher sets it for its workers)

    @classmethod
    def of(cls, options: RecordOptions) -> ChildConfig:
        """The configuration this process passes to its children."""
        s = options.schedule
        return cls(run_dir=str(options.output.resolve()), wait=s.wait, warmup=s.warmup, active=s.active,
                   repeat=s.repeat, record_shapes=options.record_shapes, with_stack=options.with_stack,
                   profile_memory=options.profile_memory, backend=options.backend, step_on=options.step_on,
                   parent_pid=os.getpid(), parent_env_rank="RANK" in os.environ)

    def options(self) -> RecordOptions:
        """The recording options of the child (no ``--duration``, no progress line or summary)."""
        return RecordOptions(output=Path(self.run_dir), schedule=Schedule(self.wait, self.warmup, self.active,
                                                                          self.repeat),
                             record_shapes=self.record_shapes, with_stack=self.with_stack,
                             profile_memory=self.profile_memory, backend=self.backend, step_on=self.step_on,
                             progress=False, summary=False)

    def as_parent(self) -> ChildConfig:
        """The same configuration with this process as the parent."""
        return msgspec.structs.replace(self, parent_pid=os.getpid(), parent_env_rank="RANK" in os.environ)


def read_config() -> ChildConfig | None:
    """The configuration in this process's environment; None when no recording follows it."""
    raw = os.environ.get(CHILD_ENV)
    if not raw:
        return None
    try:
        return msgspec.json.decode(raw, type=ChildConfig)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _export(config: ChildConfig) -> None:
    os.environ[CHILD_ENV] = msgspec.json.encode(config).decode()


def process_name() -> str:
    """This process's name: its ``multiprocessing`` name, else its title as ``ps`` shows it (vLLM
    and SGLang set one with ``setproctitle``), else the script it runs."""
    name = multiprocessing.current_process().name
    if name != "MainProcess":
        return name
    try:
        title = Path("/proc/self/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        title = ""
    script = sys.argv[0] if sys.argv and sys.argv[0] else ""
    return title if title and not title.startswith("python") and "/" not in title else (script or title)


# -- the main process ---------------------------------------------------------------------------
_main_disown: Callable[[], None] | None = None  # forgets the main recording in a forked child


class FollowChildren:
    """Make the program's Python children trace themselves (:meth:`install` before the program
    starts, :meth:`uninstall` after it ended). ``disown`` is called in a child forked from this
    process: it must forget the main recording there without stopping it."""

    def __init__(self, options: RecordOptions, disown: Callable[[], None]) -> None:
        self._config = ChildConfig.of(options)
        self._disown = disown
        self._site_dir: str | None = None
        self._saved: dict[str, str | None] = {}

    def install(self) -> None:
        global _main_disown
        self._site_dir = tempfile.mkdtemp(prefix="whatif-children-")
        shutil.copyfile(child_site.__file__, os.path.join(self._site_dir, "sitecustomize.py"))
        self._saved = {k: os.environ.get(k) for k in FOLLOWED_ENV}
        path = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = self._site_dir + (os.pathsep + path if path else "")
        os.environ[child_site.SITE_DIR_ENV] = self._site_dir
        os.environ[child_site.START_ENV] = f"{__name__}:{start_child.__name__}"
        _export(self._config)
        _main_disown = self._disown
        _register_fork_hook()

    def uninstall(self) -> None:
        global _main_disown
        _main_disown = None
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if self._site_dir is not None:
            shutil.rmtree(self._site_dir, ignore_errors=True)
            self._site_dir = None


# -- a child ------------------------------------------------------------------------------------
class ChildRecording:
    """The recording of one child process, from ``import torch`` (or the fork) to its end."""

    def __init__(self, config: ChildConfig) -> None:
        self.config = config
        self.pid = os.getpid()
        self.options = config.options()
        self.run_dir = Path(config.run_dir)
        self.session = make_session(self.options, self.run_dir)
        self.guard = SignalGuard(terminate=self._terminated)
        step = self.guard.shielded(self.session.step)
        try:
            self.detector = StepDetector(step, self.options.step_on, [os.getcwd()])
            self.detector.install()
        except OptionError:  # --step-on names a module this process cannot import
            self.detector = StepDetector(step)
            self.detector.install()
        self.watcher = DistributedWatcher()
        self.finished = False

    def start(self) -> None:
        add_step_hook(self.detector.on_mark)
        self.watcher.install()
        self.guard.install()
        atexit.register(self._at_exit)
        # a signal while the profiler starts is raised once it has started (as in the main process)
        self.guard.shielded(self._start_session)()

    def _start_session(self) -> None:
        self.session.start(on_yield=self.detector.yield_to_program)
        _export(self.config.as_parent())

    def disown(self) -> None:
        """In a child forked from this process: forget this recording, stopping nothing."""
        self.finished = True
        remove_step_hook(self.detector.on_mark)
        self.detector.uninstall()
        self.watcher.uninstall()
        self.session.disown()

    def signalled(self) -> int | None:
        """The signal that ended the program (SIGINT/SIGTERM caught while it ran), if any."""
        first = self.guard.first
        return first[0] if first is not None and first[1] == "program" else None

    def finish(self, status: int | None) -> None:
        """Stop and write this process's trace and its entry of ``meta.jsonc`` (once)."""
        if self.finished or os.getpid() != self.pid:
            return
        self.finished = True
        self.guard.defer()
        try:
            remove_step_hook(self.detector.on_mark)
            self.detector.uninstall()
            self.watcher.uninstall()
            try:
                self.session.stop()
            except Exception as exc:  # listed in meta.jsonc all the same, with no file
                print(f"whatif: process {self.pid}: the profiler did not stop ({exc}); no trace", file=sys.stderr)
                self.session.cycles = []
            signum = self.signalled()
            self._write(exit_status(signum) if signum is not None else status)
        except RecordingAborted:
            pass
        except Exception as exc:  # the child's own exit must not turn into a whatif traceback
            print(f"whatif: process {self.pid}: trace not written ({exc})", file=sys.stderr)
        finally:
            self.guard.restore()

    def _write(self, status: int | None) -> None:
        rank = self.watcher.current()
        name = process_name()
        role = child_role(name, "RANK" in os.environ and not self.config.parent_env_rank)
        path = self.run_dir / process_trace_name(rank.rank, role, self.pid)
        info = record_info(list(sys.argv), status, self.session, self.detector, self.options)
        doc = trace_document(self.session, self.detector, self.options, rank, path, info)
        if doc is not None:
            write_trace(path, doc)
        end = self.guard.end()
        add_process(self.run_dir, ProcessRecord(
            role=role, name=name, pid=self.pid, parent_pid=self.config.parent_pid, rank=rank.rank,
            file=path.name if doc is not None else None, exit_status=status,
            end=ProcessEnd(signal=end.signal, during=end.during)))

    def end_by_signal(self) -> None:
        """After :meth:`finish`: end the process by the signal that ended its program, so that its
        parent sees the exit it would have seen without whatif (``Process.exitcode`` -15)."""
        signum = self.signalled()
        if signum is not None and os.getpid() == self.pid:
            _die(signum)

    def _terminated(self, signum: int) -> None:
        """SIGTERM while the program runs: the process ends at once, as without whatif, once its
        trace is written. None of the program's ``finally`` blocks, ``atexit`` handlers or
        ``multiprocessing`` finalizers runs: unwinding the program would run them, and one can
        wait forever for a lock that the interrupted code held (a queue's ``put`` cut between
        acquiring its lock and entering its ``with`` block leaves the queue's finalizer waiting)."""
        self.finish(None)
        _die(signum)

    def _at_exit(self) -> None:
        self.finish(1 if hasattr(sys, "last_value") else None)
        self.end_by_signal()


def _die(signum: int) -> None:
    """End this process by ``signum`` with its default action (its parent sees the signal)."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(exit_status(signum))  # not reached: Linux ends the process before kill() returns


_current: ChildRecording | None = None


def start_child() -> None:
    """Start this process's recording when a recording follows it (called once torch is imported)."""
    global _current
    config = read_config()
    if config is None or _current is not None:
        return
    recording = _current = ChildRecording(config)
    _register_fork_hook()
    _patch_multiprocessing()
    recording.start()  # last: a signal held while it starts is raised when it returns


def _after_fork_in_child() -> None:
    """A forked child of a recording process: forget the inherited recording, start a fresh one."""
    global _current, _main_disown
    inherited, main_disown = _current, _main_disown
    if inherited is None and main_disown is None:
        return  # the parent records nothing yet; its torch import hook is inherited
    _current = _main_disown = None
    if inherited is not None:
        inherited.disown()
    if main_disown is not None:
        main_disown()
    config = read_config()
    if config is not None and config.backend == "torch":  # CUPTI cannot work in a forked child
        start_child()


_fork_hook_registered = False


def _register_fork_hook() -> None:
    global _fork_hook_registered
    if not _fork_hook_registered:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _fork_hook_registered = True


_original_bootstrap: Callable[..., int] | None = None


def _patch_multiprocessing() -> None:
    """Write a ``multiprocessing`` child's trace at the end of its ``_bootstrap`` (before the
    ``os._exit`` of a fork child)."""
    global _original_bootstrap
    if _original_bootstrap is not None:
        return
    original = _original_bootstrap = multiprocessing.process.BaseProcess._bootstrap  # type: ignore[attr-defined]

    def _bootstrap(self: multiprocessing.process.BaseProcess, *args: Any, **kwargs: Any) -> int:
        code = original(self, *args, **kwargs)
        recording = _current
        if recording is not None:
            recording.finish(code)
            recording.end_by_signal()
        return code

    multiprocessing.process.BaseProcess._bootstrap = _bootstrap  # type: ignore[attr-defined]
