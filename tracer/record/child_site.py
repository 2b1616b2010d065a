"""The bootstrap of a child process: ``whatif record`` copies this file as ``sitecustomize.py``
into a temporary folder that it puts first on the children's ``PYTHONPATH`` (docs/recording.md,
"Child processes").

Python imports ``sitecustomize`` at start-up, so every Python process started below the recorded
program (``multiprocessing`` spawn and forkserver, ``subprocess`` of ``python``, torchrun workers)
runs :func:`install`. It uses the standard library only, and loads nothing of whatif (which
imports torch) until the process imports torch itself: a child that never imports torch pays one
environment lookup and writes nothing. Once torch is imported, it calls the function that
:data:`START_ENV` names (``module:function``; the recorder names
:func:`whatif.tracer.record.children.start_child`), which starts the child's recording. Then the
``sitecustomize`` this file hides (one later on ``sys.path``, e.g. the distribution's) is run.
"""
from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType

CHILD_ENV = "WHATIF_RECORD_CHILD"  # the child configuration (JSON); set only while a recording follows children
SITE_DIR_ENV = "WHATIF_RECORD_SITE_DIR"  # the folder holding this bootstrap as sitecustomize.py
START_ENV = "WHATIF_RECORD_START"  # module:function to call once torch is imported
_TRIGGER = "torch"


def on_torch_imported() -> None:
    """Start this process's recording (whatif is importable in the recorded program's Python; a
    process of another Python that cannot import it stays untraced)."""
    module_name, _, function = os.environ.get(START_ENV, "").partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return
    try:
        vars(module)[function]()
    except Exception as exc:  # the program runs on untraced rather than fail in its `import torch`
        print(f"whatif: process {os.getpid()} not traced: {exc}", file=sys.stderr)


class TorchImportHook:
    """A ``sys.meta_path`` finder that calls :func:`on_torch_imported` once ``import torch`` has
    finished (it then leaves ``sys.meta_path``). Not an ``importlib.abc.MetaPathFinder``: importing
    ``importlib.abc`` would cost every child 13 ms (``bench/record_children.py``)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TRIGGER:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        loader = spec.loader if spec is not None else None
        if not isinstance(loader, importlib.machinery.SourceFileLoader):
            return spec
        execute = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            on_torch_imported()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Arm this process: start now if torch is already imported, else at its import."""
    if not os.environ.get(START_ENV):
        return
    if _TRIGGER in sys.modules:
        on_torch_imported()
    elif not any(isinstance(f, TorchImportHook) for f in sys.meta_path):
        sys.meta_path.insert(0, TorchImportHook())


def run_hidden_sitecustomize() -> None:
    """Run the ``sitecustomize`` module that this bootstrap shadows, if there is one."""
    here = os.environ.get(SITE_DIR_ENV, "")
    rest = [p for p in sys.path if os.path.abspath(p or ".") != os.path.abspath(here or ".")]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    from importlib.util import module_from_spec
    module = module_from_spec(spec)
    spec.loader.exec_module(module)


if __name__ == "sitecustomize":
    install()
    run_hidden_sitecustomize()
