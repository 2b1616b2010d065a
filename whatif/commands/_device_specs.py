"""``--device-spec FILE``: GPUs described by TOML files (docs/device-specs.md), known by name to
every device lookup of the command that reads them."""
from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from whatif.hardware.device_spec import load_device_spec
from whatif.hardware.devices import registered

DEST = "device_spec"


def add_device_spec_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device-spec", dest=DEST, type=Path, action="append", default=[], metavar="FILE",
                        help="a GPU described by a TOML file (docs/device-specs.md), usable by its name "
                             "wherever a catalog name is (repeatable)")


@contextmanager
def device_specs(args: argparse.Namespace) -> Iterator[None]:
    """Run the block with the ``--device-spec`` files of ``args`` registered (each is read and
    checked first: a bad one is a DeviceSpecError naming it)."""
    specs = vars(args).get(DEST) or []
    with registered(*(load_device_spec(p) for p in specs)):
        yield
