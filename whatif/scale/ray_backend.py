"""Ray, an optional extra (``pip install 'whatif[ray]'``): importing it, where to connect, and
the one line a user gets without it. Every ``--ray`` of the CLI goes through this module.

* :data:`RAY_ADDRESS_ENV`: the environment variable that asks for Ray when ``--ray`` is not given;
* :func:`ray_target`: from the ``--ray [ADDRESS]`` option and that variable, whether to use Ray
  and where (``None``: not asked; a :class:`RayTarget` whose ``address`` is None: a local cluster
  started for the command);
* :func:`require_ray`: the ``ray`` module, or :class:`RayUnavailable` (a
  :class:`~whatif.core.errors.WhatifError`: ``whatif: --ray needs Ray: pip install 'whatif[ray]'``,
  exit 2);
* :func:`connect`: ``ray.init`` for a target (an existing session is reused), and
  :func:`connected`, the same as a context that shuts down only what it started.

>>> ray_target(None, env={})                                # neither --ray nor the variable
>>> ray_target("", env={})                                  # --ray alone: a local cluster
RayTarget(address=None)
>>> ray_target(None, env={RAY_ADDRESS_ENV: "ray://head:10001"})
RayTarget(address='ray://head:10001')
>>> ray_target("auto", env={RAY_ADDRESS_ENV: "ray://head:10001"})   # the option wins
RayTarget(address='auto')
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType

from whatif.core.errors import WhatifError

RAY_ADDRESS_ENV = "WHATIF_RAY_ADDRESS"
INSTALL_HINT = "--ray needs Ray: pip install 'whatif[ray]'"


class RayUnavailable(WhatifError):
    """Ray was asked for (``--ray`` or :data:`RAY_ADDRESS_ENV`) but cannot be imported."""


@dataclass(frozen=True)
class RayTarget:
    """Where Ray runs: ``address`` as ``ray.init`` takes it (``"auto"``, ``"ray://host:10001"``,
    ``"host:6379"``), or None for a local cluster started by the command and stopped after it."""

    address: str | None = None


def ray_target(option: str | None, env: Mapping[str, str] | None = None) -> RayTarget | None:
    """The Ray target of a command: ``option`` is the ``--ray`` value (None: not given, ``""``:
    given without an address), else :data:`RAY_ADDRESS_ENV` in ``env`` (default ``os.environ``;
    empty counts as unset). None when neither asks for Ray."""
    if option is None:
        option = (os.environ if env is None else env).get(RAY_ADDRESS_ENV) or None
        if option is None:
            return None
    return RayTarget(address=option or None)


def require_ray() -> ModuleType:
    """The ``ray`` module; :class:`RayUnavailable` with :data:`INSTALL_HINT` when it cannot be imported."""
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise RayUnavailable(INSTALL_HINT) from None


def connect(target: RayTarget, *, num_cpus: int | None = None) -> tuple[ModuleType, bool]:
    """``(ray, started)``: Ray connected to ``target`` (``ray.init(address=...)``, or a local
    cluster of ``num_cpus`` CPUs, default all, without the dashboard); ``started`` is False when a
    session was already up in this process (it is reused as it is). A cluster that cannot be
    reached is a :class:`~whatif.core.errors.WhatifError` naming the address."""
    ray = require_ray()
    if ray.is_initialized():
        return ray, False
    kwargs: dict[str, object] = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.ERROR}
    if target.address is None:
        kwargs["num_cpus"] = num_cpus
    try:
        ray.init(address=target.address, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = target.address or "a local cluster"
        raise WhatifError(f"--ray {where}: cannot connect ({str(exc).splitlines()[0] if str(exc) else exc!r})") \
            from None
    return ray, True


@contextlib.contextmanager
def connected(target: RayTarget, *, num_cpus: int | None = None) -> Iterator[ModuleType]:
    """:func:`connect` for the ``with`` block; ``ray.shutdown()`` after it when the block started
    the session (a local cluster is then stopped; a remote one only disconnected)."""
    ray, started = connect(target, num_cpus=num_cpus)
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()
