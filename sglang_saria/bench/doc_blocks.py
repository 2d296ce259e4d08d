"""Generated blocks of a Markdown doc, rendered from a benchmark's committed JSON.

A block is ``<!-- PREFIX:NAME -->`` ... ``<!-- /PREFIX -->``; a benchmark's ``--update-doc``
rewrites the blocks of its own prefix, each from the JSON it wrote (or ``--render-only`` from a
JSON committed earlier), so a doc's figures are never pasted by hand and a test can recompute
each from that JSON's raw records.
"""

from __future__ import annotations

import re
from pathlib import Path

BLOCK = re.compile(r"(<!-- ([\w.-]+):([\w.-]+) -->\n)(.*?)(<!-- /\2 -->)", re.S)


def blocks(text: str, prefix: str) -> dict[str, str]:
    """The generated blocks of ``prefix`` in ``text``, by name."""
    return {m.group(3): m.group(4).rstrip("\n") for m in BLOCK.finditer(text) if m.group(2) == prefix}


def fill(text: str, prefix: str, rendered: dict[str, str], where: str = "the doc") -> str:
    """``text`` with each block of ``prefix`` named in ``rendered`` replaced by its rendering.

    Raises ValueError naming ``where`` and the block when a rendered block has no place in the
    text: a doc that lost its markers must not silently keep stale figures."""
    missing = sorted(set(rendered) - set(blocks(text, prefix)))
    if missing:
        raise ValueError(f"{where}: no generated block <!-- {prefix}:{missing[0]} --> ... <!-- /{prefix} -->")

    def one(m: re.Match) -> str:
        if m.group(2) != prefix or m.group(3) not in rendered:
            return m.group(0)
        return f"{m.group(1)}{rendered[m.group(3)].rstrip()}\n{m.group(5)}"

    return BLOCK.sub(one, text)


def update_file(path: Path, prefix: str, rendered: dict[str, str]) -> None:
    """Rewrite ``path``'s blocks of ``prefix`` (see ``fill``)."""
    path.write_text(fill(path.read_text(), prefix, rendered, str(path)))
