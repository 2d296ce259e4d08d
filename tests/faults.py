"""Fault injection shared by the store and server tests."""

from __future__ import annotations

import os


def flip_byte(path: str | os.PathLike, offset: int) -> None:
    """Invert one byte of a file in place (a bit-rot stand-in that any checksum must catch)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))
