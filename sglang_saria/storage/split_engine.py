"""Reads through one engine, writes through another: separate SSD read and write queues with
GDS too (paper 5.1).

kvikio runs every ``pread``/``pwrite`` on its one thread pool, so a stream of puts would queue
there ahead of a reload's reads. Writes come from host memory (HiCache's host pool), where GDS
gains nothing, so ``select_engine`` pairs kvikio reads with a POSIX engine for writes: pwritev
runs on the store's own write pool ("saria-write" threads) and kvikio's pool serves reads only.
"""

from __future__ import annotations

from typing import Sequence

from sglang_saria.storage.buffers import Segment
from sglang_saria.storage.io_engine import IOEngine


class SplitEngine(IOEngine):
    """``reads`` serves reads, ``writes`` writes and syncs; both open the same slab files. Named
    after its read engine (``kvikio``): that is what a reload runs on."""

    def __init__(self, reads: IOEngine, writes: IOEngine) -> None:
        self.reads = reads
        self.writes = writes
        self.name = reads.name

    def open(self, paths: Sequence[str], o_direct: str) -> None:
        self.reads.open(paths, o_direct)
        self.writes.open(paths, o_direct)

    def read(self, dir_idx: int, offset: int, segs: Sequence[Segment]) -> int:
        return self.reads.read(dir_idx, offset, segs)

    def write(self, dir_idx: int, offset: int, segs: Sequence[Segment]) -> int:
        return self.writes.write(dir_idx, offset, segs)

    def sync(self, dir_idx: int) -> None:
        self.writes.sync(dir_idx)

    def close(self) -> None:
        self.reads.close()
        self.writes.close()

    def direct(self, dir_idx: int) -> bool:
        """Both sides bypass the page cache (a buffered write side would not)."""
        return self.reads.direct(dir_idx) and self.writes.direct(dir_idx)
