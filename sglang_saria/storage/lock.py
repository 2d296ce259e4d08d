"""One process per store: an exclusive lock on a file in each rank directory.

Two servers on one store both recover its index, both allocate slots from it and write into
the same slab: each overwrites the other's objects and the index keeps whichever row came last,
so a later start recovers a mix (or one server's prefix only). The lock makes the second
opener refuse, naming the process that holds the store.

``flock`` on ``LOCK_NAME``: the kernel drops the lock when its holder dies (kill -9 included),
so a lock file a dead process left never blocks a restart; the PID written in the file is only
there for the message. The lock is per open file description, so a second opener in the same
process is refused too (a store opened twice in one process has the same problem).
"""

from __future__ import annotations

import errno
import fcntl
import os
from typing import Optional

from sglang_saria.storage.private import FILE_MODE, prepare_private_dir

LOCK_NAME = "saria.lock"


class StoreLocked(RuntimeError):
    """Another process holds the store."""


class StoreLock:
    """The exclusive lock of one rank directory, held from ``acquire`` to ``release``."""

    def __init__(self, directory: str, fd: int) -> None:
        self.directory = directory
        self.path = os.path.join(directory, LOCK_NAME)
        self._fd: Optional[int] = fd

    @classmethod
    def acquire(cls, directory: str) -> "StoreLock":
        """Lock ``directory`` (created private if missing) for this process, or raise
        ``StoreLocked`` naming the holder's PID."""
        prepare_private_dir(directory)
        path = os.path.join(directory, LOCK_NAME)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _read_pid(fd)
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            who = f"process {holder}" if holder else "another process"
            if holder == os.getpid():
                who = f"this process ({holder}) already"
            raise StoreLocked(
                f"saria store {directory!r} is in use: {who} holds its lock {path!r}. One server per store: "
                "stop that server, or give this one other data_dirs (replicas started with --dp-size share "
                "a rank directory: give each its own data_dirs)"
            ) from None
        os.fchmod(fd, FILE_MODE)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(directory, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Unlock (closing the file drops the lock); safe to call twice."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _read_pid(fd: int) -> Optional[int]:
    try:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
