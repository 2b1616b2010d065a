"""Where a command's parallel work runs (docs/scale.md): ``--jobs N`` local worker processes, or
``--ray [ADDRESS]`` (else the ``WHATIF_RAY_ADDRESS`` variable) for Ray; written once for every
command that fans work out."""
from __future__ import annotations

import argparse

from whatif.scale.executor import Execution
from whatif.scale.ray_backend import RAY_ADDRESS_ENV, ray_target, require_ray

from ._dataclass_args import add_dataclass_arguments, from_args


def add_execution_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--jobs N`` (:class:`~whatif.scale.executor.Execution`) and ``--ray [ADDRESS]``."""
    add_dataclass_arguments(parser, Execution, exclude=("ray", "ray_cpus"))
    parser.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                        help=f"run on Ray: a cluster's address (ray.init's), or none for a local cluster; "
                             f"default ${RAY_ADDRESS_ENV} when set (needs pip install 'whatif[ray]')")


def execution(args: argparse.Namespace) -> Execution:
    """The :class:`~whatif.scale.executor.Execution` the options ask for; Ray is imported here, so
    a missing Ray is one line before any work."""
    target = ray_target(args.ray)
    if target is not None:
        require_ray()
    return from_args(Execution, args, exclude=("ray", "ray_cpus"), ray=target)
