"""Bytes stock HiCache's `file` backend writes, counted as it writes them (Linux inotify).

Why: a bounded `file` store (SGLang's ``max_size``) deletes its least recently used pages, so
the bytes left on disk undercount what it wrote, and a page evicted and stored again is
written twice. SGLang's `HiCacheFile.set` writes each page to a temporary file and renames
it to ``<key>.bin``; every rename into the folder is one page written, of that file's size.
Nothing in SGLang is changed: this watches the folder from outside the server.
"""

from __future__ import annotations

import ctypes
import os
import select
import struct
import threading
from pathlib import Path

IN_MOVED_TO = 0x00000080
IN_CLOSE_WRITE = 0x00000008
IN_Q_OVERFLOW = 0x00004000
_EVENT = struct.Struct("iIII")


class FileWriteCounter:
    """Counts the ``.bin`` pages written into ``folder`` (which must exist) while open.

    ``bytes_written``: the sum of each written page's size (a page deleted before it could be
    measured counts as the last page size seen of its kind: KV pages, and a hybrid's
    ``.mamba`` states). ``pages_written``: how many. An inotify queue overflow (events lost)
    is an error, not a silent undercount."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.bytes_written = 0
        self.pages_written = 0
        self._last_size: dict[bool, int] = {}
        self._error: str | None = None
        self._stop = threading.Event()
        libc = ctypes.CDLL(None, use_errno=True)
        self._fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), f"inotify_init1 for {self.folder}")
        if libc.inotify_add_watch(self._fd, str(self.folder).encode(), IN_MOVED_TO | IN_CLOSE_WRITE) < 0:
            os.close(self._fd)
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {self.folder}")
        self._thread = threading.Thread(target=self._run, name="file-write-counter", daemon=True)
        self._thread.start()

    def _count(self, name: str) -> None:
        if not name.endswith(".bin") or name.startswith("."):
            return
        state = ".mamba" in name
        try:
            size = (self.folder / name).stat().st_size
            self._last_size[state] = size
        except FileNotFoundError:
            size = self._last_size.get(state, 0)
        self.bytes_written += size
        self.pages_written += 1

    def _drain(self) -> None:
        while True:
            try:
                buf = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return
            offset = 0
            while offset < len(buf):
                _, mask, _, length = _EVENT.unpack_from(buf, offset)
                name = buf[offset + _EVENT.size: offset + _EVENT.size + length].rstrip(b"\0").decode()
                offset += _EVENT.size + length
                if mask & IN_Q_OVERFLOW:
                    self._error = f"{self.folder}: inotify queue overflowed; page writes were lost from the count"
                elif mask & (IN_MOVED_TO | IN_CLOSE_WRITE):
                    self._count(name)

    def _run(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self._fd], [], [], 0.1)
            if ready:
                self._drain()

    def close(self) -> int:
        """Stop counting (after a last read of pending events); the bytes written."""
        self._stop.set()
        self._thread.join()
        self._drain()
        os.close(self._fd)
        if self._error:
            raise RuntimeError(self._error)
        return self.bytes_written
