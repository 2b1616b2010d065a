"""What the trace-analysis commands (memory, collectives, ops) share: their output flags, their
text tables and their two outputs, a versioned JSON document (``--json``) and a table (``-o``,
.csv or .parquet)."""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from whatif.core.output import check_table_path, refuse_overwrite, write_table
from whatif.documents import Entry, write_json


def print_table(out: Console, title: str, columns: list[str], rows: list[list[str]], text: set[int]) -> None:
    """A rich table: the columns in ``text`` left-aligned, numbers right-aligned."""
    t = Table(title=title, title_justify="left", show_edge=False)
    for i, col in enumerate(columns):
        t.add_column(col, justify="left" if i in text else "right")
    for row in rows:
        t.add_row(*row)
    out.print(t)


def add_output_arguments(parser: argparse.ArgumentParser, table: str, schema: str) -> None:
    """The outputs these commands share (docs/cli.md): ``-o TABLE`` (``table`` says what its rows
    are), ``-f``, ``--json OUT`` (the ``schema`` document) and ``-q``."""
    parser.add_argument("-o", "--output", type=Path, metavar="TABLE", help=f"write {table} (.csv or .parquet)")
    parser.add_argument("-f", "--force", action="store_true", help="overwrite the -o table if it exists")
    parser.add_argument("--json", type=Path, metavar="OUT", help=f"also write the {schema} JSON document here")
    parser.add_argument("-q", "--quiet", action="store_true", help="print nothing (with --json or -o)")


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse a bad or existing ``-o`` table before any work (one line, exit 2)."""
    if args.output:
        check_table_path(args.output)
        refuse_overwrite([args.output], args.force)


def write_outputs(args: argparse.Namespace, doc: Entry, table: pd.DataFrame | None) -> list[Path]:
    """Write ``--json`` and ``-o`` when asked; the paths written."""
    written = []
    if args.json:
        written.append(write_json(args.json, doc))
    if args.output and table is not None:
        written.append(write_table(args.output, table))
    return written
