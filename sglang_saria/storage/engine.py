"""I/O engines: move bytes between slab files and caller segments.

`posix` uses preadv/pwritev straight into caller memory, with O_DIRECT where
the file system allows it (an aligned bounce buffer only when caller memory
is not 4 KiB aligned). `kvikio` (kvikio_engine.py) uses GPUDirect Storage so
reads land in CUDA tensors; its writes go through posix (split_engine.py), on the
store's own write pool. `select_engine` picks kvikio when CUDA and kvikio are both
present, else posix. All implement `IOEngine` (io_engine.py).
"""

from __future__ import annotations

import errno
import logging
import os
from typing import Callable, List, Sequence

import numpy as np

from sglang_saria.storage.buffers import (
    BounceBuffers,
    Segment,
    aligned,
    aligned_empty,
    is_cuda,
    round_up,
    total_bytes,
)
from sglang_saria.storage.config import ALIGN
from sglang_saria.storage.io_engine import IOEngine
from sglang_saria.storage.kvikio_engine import KvikioEngine
from sglang_saria.storage.split_engine import SplitEngine

logger = logging.getLogger(__name__)

IOV_MAX = 1024


def _vectored(fn: Callable, fd: int, segs: Sequence[np.ndarray], offset: int, what: str) -> None:
    """Run preadv/pwritev to completion (short transfers and IOV_MAX handled)."""
    pending: List[memoryview] = [memoryview(s) for s in segs if s.shape[0]]
    while pending:
        batch = pending[:IOV_MAX]
        n = fn(fd, batch, offset)
        if n <= 0:
            raise OSError(errno.EIO, f"saria store: short {what} at offset {offset}")
        offset += n
        while n and pending:
            head = pending[0]
            if n >= len(head):
                n -= len(head)
                pending.pop(0)
            else:
                pending[0] = head[n:]
                n = 0


def _probe_direct(fd: int) -> None:
    buf = aligned_empty(ALIGN)
    os.preadv(fd, [memoryview(buf)], 0)


class PosixEngine(IOEngine):
    name = "posix"

    def __init__(self) -> None:
        self._fds: List[int] = []
        self._direct: List[bool] = []
        self._bounce = BounceBuffers()

    def open(self, paths: Sequence[str], o_direct: str) -> None:
        for path in paths:
            fd, direct = self._open_one(path, o_direct)
            self._fds.append(fd)
            self._direct.append(direct)

    @staticmethod
    def _open_one(path: str, mode: str):
        if mode != "off":
            try:
                fd = os.open(path, os.O_RDWR | os.O_DIRECT)
                try:
                    _probe_direct(fd)
                except OSError:
                    os.close(fd)
                    raise
                return fd, True
            except OSError as e:
                if mode == "on":
                    raise ValueError(
                        f"saria store: o_direct=on but {path!r} does not support O_DIRECT ({e.strerror})"
                    ) from e
                logger.warning(
                    "saria store: %s: file system refuses O_DIRECT (%s); using buffered I/O "
                    "(reads may be served from the page cache)",
                    path,
                    e.strerror,
                )
        return os.open(path, os.O_RDWR), False

    def direct(self, dir_idx: int) -> bool:
        return self._direct[dir_idx]

    def read(self, dir_idx: int, offset: int, segs: Sequence[Segment]) -> int:
        fd, n = self._fds[dir_idx], total_bytes(segs)
        host = [s for s in segs if not is_cuda(s)]
        if len(host) == len(segs) and (not self._direct[dir_idx] or aligned(segs)):
            _vectored(os.preadv, fd, segs, offset, "read")
            return n
        # Unaligned caller memory under O_DIRECT, or CUDA memory without kvikio.
        length = round_up(n) if self._direct[dir_idx] else n
        bounce = self._bounce.get(length)
        _vectored(os.preadv, fd, [bounce], offset, "read")
        pos = 0
        for s in segs:
            k = int(s.shape[0])
            if is_cuda(s):
                import torch

                s.copy_(torch.from_numpy(bounce[pos : pos + k]), non_blocking=False)
            else:
                s[:] = bounce[pos : pos + k]
            pos += k
        return length

    def write(self, dir_idx: int, offset: int, segs: Sequence[Segment]) -> int:
        fd, n = self._fds[dir_idx], total_bytes(segs)
        if not any(is_cuda(s) for s in segs) and (not self._direct[dir_idx] or aligned(segs)):
            _vectored(os.pwritev, fd, segs, offset, "write")
            return n
        length = round_up(n) if self._direct[dir_idx] else n
        bounce = self._bounce.get(length)
        pos = 0
        for s in segs:
            k = int(s.shape[0])
            bounce[pos : pos + k] = s.cpu().numpy() if is_cuda(s) else s
            pos += k
        bounce[n:length] = 0
        _vectored(os.pwritev, fd, [bounce], offset, "write")
        return length

    def sync(self, dir_idx: int) -> None:
        os.fdatasync(self._fds[dir_idx])

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds = []


def cuda_and_kvikio_available() -> bool:
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        import kvikio  # noqa: F401
    except Exception:
        return False
    return True


def select_engine(name: str) -> IOEngine:
    """'auto' -> kvikio when CUDA + kvikio are present, else posix. kvikio reads, posix writes:
    a write stream never queues in kvikio's thread pool ahead of reads (split_engine.py)."""
    if name == "auto":
        name = "kvikio" if cuda_and_kvikio_available() else "posix"
        logger.info("saria store: engine=auto selected %s", name)
    if name == "posix":
        return PosixEngine()
    if name == "kvikio":
        if not cuda_and_kvikio_available():
            raise ValueError("saria store: engine=kvikio needs a CUDA GPU and the kvikio package")
        return SplitEngine(reads=KvikioEngine(), writes=PosixEngine())
    raise ValueError(f"saria store: unknown engine {name!r}")
