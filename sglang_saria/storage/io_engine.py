"""The I/O engine interface the store drives; `engine.py` (posix) and `kvikio_engine.py` (GDS)
implement it, and `engine.select_engine` picks one."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

from sglang_saria.storage.buffers import Segment


class IOEngine(ABC):
    """Reads/writes one contiguous file range of one slab from/to a scatter list."""

    name: str = ""

    @abstractmethod
    def open(self, paths: Sequence[str], o_direct: str) -> None: ...

    @abstractmethod
    def read(self, dir_idx: int, offset: int, segs: Sequence[Segment]) -> int:
        """Fill `segs` from the file; returns bytes transferred from the device."""

    @abstractmethod
    def write(self, dir_idx: int, offset: int, segs: Sequence[Segment]) -> int:
        """Write `segs` to the file; returns bytes written to the device (with padding)."""

    @abstractmethod
    def sync(self, dir_idx: int) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    def direct(self, dir_idx: int) -> bool:
        return False
