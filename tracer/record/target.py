"""The program to record: a script path or a module, run in this process as ``__main__``.

:func:`run_target` returns the exit status the program would have had when run by ``python``:
0 on normal end, ``n`` for ``sys.exit(n)``, 1 for an uncaught exception (traceback printed),
130 for Ctrl-C (``KeyboardInterrupt``), 143 for SIGTERM (:class:`ProgramTerminated`, raised by the
recorder's signal guard).
"""
from __future__ import annotations

import importlib.util
import io
import os
import pkgutil
import runpy
import sys
import tokenize
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any

from .errors import NoScriptError, NotAScriptError, ScriptNotFoundError
from .signals import ProgramTerminated, exit_status

EXIT_INTERRUPTED = 130


@dataclass(frozen=True)
class Target:
    """A script (``path``) or a module (``module``) with the arguments it receives."""

    args: tuple[str, ...]
    path: Path | None = None
    module: str | None = None

    @property
    def name(self) -> str:
        """Short name for folders and messages: the script's file name or the module name."""
        return self.path.name if self.path is not None else str(self.module)

    @property
    def argv(self) -> list[str]:
        """``sys.argv`` as the program sees it."""
        first = str(self.path) if self.path is not None else str(self.module)
        return [first, *self.args]

    @property
    def source_dir(self) -> Path:
        """Folder of the program's source (for the git commit in ``meta.jsonc``)."""
        if self.path is not None:
            return self.path.resolve().parent
        spec = importlib.util.find_spec(str(self.module))
        origin = spec.origin if spec is not None else None
        return Path(origin).resolve().parent if origin else Path.cwd()


def resolve_target(script: str | None, module: str | None, args: list[str]) -> Target:
    """Check that the script exists and compiles (or the module can be found) and build a
    :class:`Target`; raises a :class:`~.errors.RecordError` (one line) before anything runs."""
    if module is not None:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError) as exc:
            raise ScriptNotFoundError(module, f"cannot find module ({exc})") from None
        if spec is None:
            raise ScriptNotFoundError(module, "no such module")
        if spec.submodule_search_locations is None and spec.origin and spec.origin.endswith(".py"):
            check_compiles(Path(spec.origin))  # a package runs its __main__: not imported here
        return Target(args=tuple(args), module=module)
    if script is None:
        raise NoScriptError()
    path = Path(script)
    if not path.exists():
        raise ScriptNotFoundError(path)
    if not path.is_file():
        raise ScriptNotFoundError(path, "is not a file")
    archive = pkgutil.get_importer(str(path))  # a zip archive, which runpy runs as a folder, or None
    if archive is None:
        check_compiles(path)
    elif archive.find_spec("__main__") is None:
        raise NotAScriptError(path, "a zip archive without __main__.py")
    return Target(args=tuple(args), path=path)


def check_compiles(path: Path) -> None:
    """Raise :class:`NotAScriptError` when ``path`` is neither Python source that compiles nor
    compiled Python (what ``runpy`` would run), so that a text or binary file is refused before
    the profiler starts, not reported as the program's ``SyntaxError``."""
    try:
        with io.open_code(str(path)) as f:
            if pkgutil.read_code(f) is not None:  # a .pyc file
                return
            f.seek(0)
            source = f.read()
    except OSError as exc:
        raise ScriptNotFoundError(path, f"cannot be read ({exc.strerror or exc})") from None
    if b"\0" in source:
        raise NotAScriptError(path, "a binary file: it holds null bytes")
    try:
        encoding = tokenize.detect_encoding(io.BytesIO(source).readline)[0]
    except SyntaxError:  # no valid coding declaration: what compile() says about it below
        encoding = "utf-8"
    try:
        source.decode(encoding)
    except UnicodeDecodeError as exc:
        raise NotAScriptError(path, f"not {encoding} text: byte {source[exc.start]:#04x} at offset "
                                    f"{exc.start}") from None
    try:
        with warnings.catch_warnings():  # SyntaxWarnings show once, when the program itself is compiled
            warnings.simplefilter("ignore")
            compile(source, str(path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        where = f", line {exc.lineno}" if isinstance(exc, SyntaxError) and exc.lineno else ""
        problem = exc.msg if isinstance(exc, SyntaxError) else str(exc)
        raise NotAScriptError(path, f"{type(exc).__name__}: {problem}{where}") from None


def _exit_status(code: object) -> int:
    """Exit status of ``sys.exit(code)``, printing a message code as Python does."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF if code >= 0 else (256 + code) & 0xFF
    print(code, file=sys.stderr)
    return 1


def _print_user_traceback(exc: BaseException, origin: str | None) -> None:
    """Print the traceback without whatif's own frames (those before the program's file)."""
    tb: TracebackType | None = exc.__traceback__
    if origin is not None:
        cursor = tb
        while cursor is not None and os.path.abspath(cursor.tb_frame.f_code.co_filename) != origin:
            cursor = cursor.tb_next
        tb = cursor or tb
    traceback.print_exception(type(exc), exc, tb, file=sys.stderr)


class MainAlias(ModuleType):
    """``sys.modules["__mp_main__"]`` while the program runs. A ``multiprocessing`` child started
    by spawn runs the script as ``__mp_main__``, so the objects it sends back name their classes
    there; ``multiprocessing`` made that name an alias of whatif's own ``__main__`` when torch
    imported it, where the program's classes are not. This alias finds them in the program's
    ``__main__``."""

    def __getattr__(self, name: str) -> Any:
        main = sys.modules["__main__"]
        if main is self:
            raise AttributeError(name)
        return getattr(main, name)


def run_target(target: Target) -> int:
    """Run the program as ``__main__`` with its own ``sys.argv`` and return its exit status."""
    saved_argv = sys.argv[:]
    saved_mp_main = sys.modules.get("__mp_main__")
    sys.modules["__mp_main__"] = MainAlias("__mp_main__")
    sys.argv = target.argv
    origin: str | None = None
    if target.path is not None:
        origin = os.path.abspath(target.path)
        search_dir = os.path.dirname(origin)
    else:
        search_dir = os.getcwd()
    sys.path.insert(0, search_dir)
    try:
        if target.path is not None:
            runpy.run_path(str(target.path), run_name="__main__")
        else:
            spec = importlib.util.find_spec(str(target.module))
            origin = os.path.abspath(spec.origin) if spec is not None and spec.origin else None
            runpy.run_module(str(target.module), run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as exc:
        return _exit_status(exc.code)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ProgramTerminated as exc:
        print(f"Terminated ({exc})", file=sys.stderr)
        return exit_status(exc.signum)
    except BaseException as exc:  # the program's own failure: report it like python would
        _print_user_traceback(exc, origin)
        return 1
    finally:
        sys.argv = saved_argv
        if saved_mp_main is not None:
            sys.modules["__mp_main__"] = saved_mp_main
        else:
            sys.modules.pop("__mp_main__", None)
        if sys.path and sys.path[0] == search_dir:
            sys.path.pop(0)
