"""Write a bench's measured table into a doc, between two marker comments."""
from __future__ import annotations

from pathlib import Path


def replace_section(doc: Path, begin: str, end: str, section: str) -> None:
    """Put ``section`` between the ``begin`` and ``end`` markers of ``doc`` (appended with the
    markers when they are missing)."""
    text = doc.read_text() if doc.exists() else ""
    if begin in text and end in text:
        text = text[:text.index(begin) + len(begin)] + "\n" + section + text[text.index(end):]
    else:
        text += f"\n{begin}\n{section}{end}\n"
    doc.write_text(text)
