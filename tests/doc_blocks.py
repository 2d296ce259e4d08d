"""Reading a generated block of a doc: the text between its begin and end markers, for the doc tests
that compare it with the JSON it was rendered from."""

from __future__ import annotations

from pathlib import Path


def marked_block(doc: Path, begin: str, end: str) -> str:
    """The text of ``doc`` between ``begin`` and ``end`` (markers excluded, leading newlines dropped)."""
    text = doc.read_text()
    return text[text.index(begin) + len(begin):text.index(end)].lstrip("\n")
