"""List the registered transforms (built-in and from the whatif.transforms entry-point group)
with their parameters."""
from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from whatif.transforms import registry


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="show one transform's parameters in full")


def run(args: argparse.Namespace) -> int:
    console = Console()
    names = [registry.get(args.name).name] if args.name else registry.names()
    table = Table(title="whatif transforms", title_justify="left", show_lines=bool(args.name))
    table.add_column("name", no_wrap=True)
    table.add_column("description")
    table.add_column("parameters")
    for name in names:
        cls = registry.get(name)
        params = "\n".join(f"{p.name}: {p.type_name}; "
                           + ("required" if p.required else f"default: {p.default_value!r}")
                           + (f"  ({p.help})" if p.help and args.name else "") for p in registry.parameters(name))
        table.add_row(name, cls.description, params)
    console.print(table)
    return 0
