"""Outputs never destroy inputs: a command's written file (``--json``, ``-o``, ``--html``) is
refused when it is one of the input traces, or a trace-named file inside an input folder (the
folder would no longer load: readers take every such file there for a rank)."""
from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path

from whatif.core.output import OutputError
from whatif.tracer.readers import is_trace_name

OUTPUT_ARGS = ("json", "output", "html", "out")
"""Argument names that hold what a command writes: a file, or ``report``'s folder (``record -o`` is
a folder it creates: not checked)."""
INPUT_ARGS = ("path", "before", "after")
"""Argument names that hold a trace file, a folder of per-rank traces or a run folder read."""


def refuse_inside_input(output: str | Path, input_path: str | Path) -> None:
    """Refuse ``output`` when it is the input itself (a trace file, or a run folder as ``report``'s
    output folder), or a file a trace reader would take for a trace inside the input folder.

    >>> refuse_inside_input("/runs/a/predicted.json", "/runs/a")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    whatif.core.output.OutputError: /runs/a/predicted.json: inside the input folder /runs/a, ...
    >>> refuse_inside_input("/runs/t.json.gz", "/runs/t.json.gz")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    whatif.core.output.OutputError: /runs/t.json.gz: is the input itself; ...
    >>> refuse_inside_input("/runs/predicted.json", "/runs/a")
    """
    out, src = Path(output).absolute().resolve(), Path(input_path).absolute().resolve()
    if out == src:
        raise OutputError(f"{output}: is the input itself; writing there would replace what was read, write it "
                          f"elsewhere")
    if is_trace_name(out.name) and src in out.parents:
        raise OutputError(f"{output}: inside the input folder {input_path}, where a trace file would become part "
                          "of it; write it elsewhere")


def _paths(value: object) -> Iterable[Path]:
    if isinstance(value, (str, Path)):
        yield Path(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _paths(v)


def refuse_clobbering(args: argparse.Namespace) -> None:
    """:func:`refuse_inside_input` for every output argument of ``args`` against every input one,
    before any work (``record`` writes a new run folder and reads a script: not checked)."""
    if getattr(args, "command", None) == "record":
        return
    given = vars(args)
    inputs = [p for name in INPUT_ARGS for p in _paths(given.get(name))]
    for name in OUTPUT_ARGS:
        for out in _paths(given.get(name)):
            if str(out) in ("", "-"):
                continue
            for src in inputs:
                refuse_inside_input(out, src)


def settle_quiet(args: argparse.Namespace) -> None:
    """``--json -`` writes the document to stdout, so the text tables stay off it (as with ``-q``).
    ``-q`` alone prints nothing and leaves the exit status (like ``grep -q``: does it load?)."""
    given = vars(args)
    if "quiet" in given and str(given.get("json")) == "-":
        args.quiet = True
