"""GPUDirect Storage engine (kvikio.CuFile): SSD -> CUDA tensor without host staging.

Only usable with CUDA and kvikio (every kvikio call needs libcuda, even in
compat mode). kvikio opens files O_DIRECT itself and handles alignment; host
(numpy) segments work too, via kvikio's own bounce buffers.
"""

from __future__ import annotations

import os
from typing import List, Sequence

from sglang_saria.storage.buffers import Segment, total_bytes
from sglang_saria.storage.io_engine import IOEngine


class KvikioEngine(IOEngine):
    name = "kvikio"

    def __init__(self) -> None:
        import kvikio

        self._kvikio = kvikio
        self._files: List = []
        self._sync_fds: List[int] = []

    def open(self, paths: Sequence[str], o_direct: str) -> None:
        for path in paths:
            self._files.append(self._kvikio.CuFile(path, "r+"))
            self._sync_fds.append(os.open(path, os.O_RDWR))

    def direct(self, dir_idx: int) -> bool:
        return True

    def _run(self, op: str, dir_idx: int, offset: int, segs: Sequence[Segment]) -> int:
        f = getattr(self._files[dir_idx], op)
        futures, pos = [], offset
        for s in segs:
            n = int(s.shape[0])
            if n:
                futures.append((f(s, n, pos), n))
            pos += n
        for fut, n in futures:
            got = fut.get()
            if got != n:
                raise OSError(5, f"saria store: kvikio short {op} ({got} of {n} bytes)")
        return total_bytes(segs)

    def read(self, dir_idx: int, offset: int, segs: Sequence[Segment]) -> int:
        return self._run("pread", dir_idx, offset, segs)

    def write(self, dir_idx: int, offset: int, segs: Sequence[Segment]) -> int:
        return self._run("pwrite", dir_idx, offset, segs)

    def sync(self, dir_idx: int) -> None:
        os.fdatasync(self._sync_fds[dir_idx])

    def close(self) -> None:
        for f in self._files:
            f.close()
        for fd in self._sync_fds:
            os.close(fd)
        self._files, self._sync_fds = [], []
