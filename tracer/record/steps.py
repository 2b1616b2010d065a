"""Finding step boundaries in a program that may or may not mark them.

Sources, strongest first: the program's own marks (``whatif.step()``), a function named with
``--step-on module:function`` (a step ends when each call returns), each ``optimizer.step()``
(training), each call of the outermost model's ``forward`` (serving). A stronger source that
shows up takes over for the rest of the run, and the weaker hooks are removed (marks) so that
they cost nothing. Boundaries that a weaker source placed before the ruling one showed up are
counted in :attr:`StepDetector.tentative_steps`; the recorder folds them into the first step
when it writes the trace. Automatic boundaries are placed so that a program which marks its own steps right
after ``optimizer.step()`` never gets an extra, empty step:

* forward: a step starts at each top-level call of the *model* (the first module with
  children that is called outside any other module's forward), the first call excepted;
* optimizer: the boundary after ``optimizer.step()`` is held back and placed at the next
  top-level model call (or the next ``optimizer.step()`` when no module is called), and
  dropped if the program marks a step first.
"""
from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable, Sequence
from enum import IntEnum
from typing import Any

import torch

from .errors import OptionError


class StepSource(IntEnum):
    NONE = 0
    FORWARD = 1
    OPTIMIZER = 2
    FUNCTION = 3
    MARK = 4
    PROGRAM_PROFILER = 5  # the program drives its own torch.profiler: whatif only watches


def resolve_function(spec: str, search_dirs: Sequence[str] = ()) -> tuple[Any, str, Callable[..., Any]]:
    """Resolve ``module:function`` or ``module:Class.method`` to (owner, attribute, function).

    Raises :class:`OptionError` with one line when the module or the attribute is missing.
    """
    module_name, _, attr_path = spec.partition(":")
    if module_name == "__main__":
        raise OptionError(f"--step-on {spec}: functions of the recorded script itself cannot be "
                          "wrapped before it runs; call whatif.step() there, or name an importable module")
    added = [d for d in search_dirs if d not in sys.path]
    sys.path[:0] = added
    try:
        owner: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise OptionError(f"--step-on {spec}: cannot import module {module_name!r} ({exc})") from None
    finally:
        for d in added:
            sys.path.remove(d)
    parts = attr_path.split(".")
    for part in parts[:-1]:
        if part not in vars(owner):
            raise OptionError(f"--step-on {spec}: {owner.__name__!s} has no attribute {part!r}")
        owner = vars(owner)[part]
    name = parts[-1]
    func = getattr(owner, name, None)
    if func is None or not callable(func):
        raise OptionError(f"--step-on {spec}: {name!r} is not a function of {module_name}")
    return owner, name, func


class StepDetector:
    """Calls ``on_step()`` at each step boundary of the running program.

    ``on_step`` is the recorder's profiler ``step()``; :attr:`steps` counts the boundaries.
    """

    def __init__(self, on_step: Callable[[], None], step_on: str | None = None,
                 search_dirs: Sequence[str] = ()) -> None:
        self._on_step = on_step
        self._step_on = step_on
        self._search_dirs = tuple(search_dirs)
        self.source = StepSource.NONE
        self.steps = 0
        self.tentative_steps = 0  # boundaries of weaker sources before the ruling source showed up
        self._pending = False
        self._depth = 0
        self._model: torch.nn.Module | None = None
        self._model_calls = 0
        self._handles: list[Any] = []
        self._wrapped: tuple[Any, str, Any] | None = None

    # -- installing ---------------------------------------------------------------------------
    def install(self) -> None:
        """Arm the automatic sources (or the ``--step-on`` function)."""
        if self._step_on is not None:
            owner, name, func = resolve_function(self._step_on, self._search_dirs)
            self._wrapped = (owner, name, vars(owner).get(name, func))
            setattr(owner, name, self._wrap(func))
            return
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )
        from torch.optim.optimizer import register_optimizer_step_post_hook
        self._handles = [
            register_optimizer_step_post_hook(self._after_optimizer_step),
            register_module_forward_pre_hook(self._before_forward),
            register_module_forward_hook(self._after_forward, always_call=True),
        ]

    def uninstall(self) -> None:
        """Remove every hook and restore a wrapped function."""
        self._remove_hooks()
        if self._wrapped is not None:
            owner, name, original = self._wrapped
            setattr(owner, name, original)
            self._wrapped = None

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # -- sources ------------------------------------------------------------------------------
    def on_mark(self) -> None:
        """``whatif.step()`` in the program: marks rule from now on."""
        if self.source < StepSource.MARK:
            self.tentative_steps = self.steps
            self.source = StepSource.MARK
            self._pending = False
            self._remove_hooks()
        if self.source == StepSource.MARK:
            self._boundary()

    def yield_to_program(self) -> None:
        """The program started its own profiler: stop producing boundaries."""
        self.source = StepSource.PROGRAM_PROFILER
        self._pending = False
        self._remove_hooks()

    def _wrap(self, func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def stepping(*args: Any, **kwargs: Any) -> Any:
            try:
                return func(*args, **kwargs)
            finally:
                if self.source <= StepSource.FUNCTION:
                    self.source = StepSource.FUNCTION
                    self._boundary()
        return stepping

    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.source > StepSource.OPTIMIZER:
            return
        if self.source < StepSource.OPTIMIZER:
            self.tentative_steps = self.steps
            self.source = StepSource.OPTIMIZER
        if self._pending:
            self._boundary()
        self._pending = True

    def _before_forward(self, module: torch.nn.Module, args: Any) -> None:
        self._depth += 1
        if self._depth != 1:
            return
        if self._model is None:
            if next(module.children(), None) is None:
                return
            self._model = module
        elif module is not self._model:
            return
        if self.source == StepSource.OPTIMIZER:
            if self._pending:
                self._pending = False
                self._boundary()
        elif self.source <= StepSource.FORWARD:
            self.source = StepSource.FORWARD
            if self._model_calls > 0:
                self._boundary()
        self._model_calls += 1

    def _after_forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self._depth = max(0, self._depth - 1)

    def _boundary(self) -> None:
        self.steps += 1
        self._on_step()
