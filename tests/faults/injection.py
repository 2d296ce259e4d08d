"""Fault injection shared by the store and server tests."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def flip_byte(path: str | os.PathLike, offset: int) -> None:
    """Invert one byte of a file in place (a bit-rot stand-in that any checksum must catch)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


@contextmanager
def read_only(path: Path) -> Iterator[None]:
    """``path`` (a file or a directory) read-only to this process until the block ends. For a
    user its mode loses the write bits; root writes whatever the mode says, so for root it is
    a read-only bind mount of itself (a read-only file system there)."""
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(mode & ~0o222)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    mount = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True, text=True)
    if mount.returncode != 0:
        pytest.skip(f"root without a working `mount --bind` (CAP_SYS_ADMIN): {mount.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(path)], check=True, capture_output=True)
        yield
    finally:
        subprocess.run(["umount", str(path)], check=True, capture_output=True)
