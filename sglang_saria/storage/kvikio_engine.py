"""GPUDirect Storage reads (kvikio.CuFile): SSD -> CUDA tensor without host staging.

Only usable with CUDA and kvikio (every kvikio call needs libcuda, even in
compat mode). kvikio opens files O_DIRECT itself and handles alignment; host
(numpy) segments work too, via kvikio's own bounce buffers.

Reads only: the store's writes come from host memory and go through a POSIX engine on its
own write pool, so they never queue in kvikio's thread pool ahead of reads
(``split_engine.SplitEngine``, which ``engine.select_engine`` builds for ``kvikio``).
"""

from __future__ import annotations

from typing import List, Sequence

from sglang_saria.storage.buffers import Segment, total_bytes
from sglang_saria.storage.io_engine import IOEngine


class KvikioEngine(IOEngine):
    name = "kvikio"

    def __init__(self) -> None:
        import kvikio

        self._kvikio = kvikio
        self._files: List = []

    def open(self, paths: Sequence[str], o_direct: str) -> None:
        for path in paths:
            self._files.append(self._kvikio.CuFile(path, "r"))

    def direct(self, dir_idx: int) -> bool:
        return True

    def read(self, dir_idx: int, offset: int, segs: Sequence[Segment]) -> int:
        f = self._files[dir_idx]
        futures, pos = [], offset
        for s in segs:
            n = int(s.shape[0])
            if n:
                futures.append((f.pread(s, n, pos), n))
            pos += n
        for fut, n in futures:
            got = fut.get()
            if got != n:
                raise OSError(5, f"saria store: kvikio short read ({got} of {n} bytes)")
        return total_bytes(segs)

    def write(self, dir_idx: int, offset: int, segs: Sequence[Segment]) -> int:
        raise NotImplementedError("saria store: the kvikio engine reads only; writes go through SplitEngine's POSIX engine")

    def sync(self, dir_idx: int) -> None:
        """Nothing to sync: nothing is written through this engine."""

    def close(self) -> None:
        for f in self._files:
            f.close()
        self._files = []
