"""A live status line on stderr for commands that can take more than a second (parse, build,
replay, predict, simulate): a spinner, what is being done and the seconds elapsed, redrawn in
place; nothing at all when stderr is not a terminal (CI logs, pipes) or with ``-q``.

>>> with working("analyzing t.json", quiet=True) as status:
...     status("replaying")
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


@contextlib.contextmanager
def working(label: str, quiet: bool = False) -> Iterator[Callable[[str], None]]:
    """Show ``label`` until the block ends; the yielded function replaces the label."""
    err = Console(stderr=True)
    if quiet or not err.is_terminal or not sys.stderr.isatty():
        yield lambda _text: None
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task(label, total=None)
        yield lambda text: progress.update(task, description=text)
