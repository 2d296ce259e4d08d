"""What the store's calls return, and the bookkeeping its read and write paths share.

Store failures are results, not exceptions: a put resolves to a ``PutResult`` (``ok=False``
with the reason), a get to a ``GetStatus``.
"""

from __future__ import annotations

import errno
import sqlite3
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import xxhash

from sglang_saria.storage.buffers import Segment, is_cuda
from sglang_saria.storage.endurance import DeviceEndurance


class GetStatus(str, Enum):
    HIT = "hit"
    MISS = "miss"
    CORRUPT = "corrupt"  # checksum mismatch: dropped from the store
    SIZE_MISMATCH = "size_mismatch"  # destination size differs from the object
    IO_ERROR = "io_error"

    @property
    def ok(self) -> bool:
        return self is GetStatus.HIT


@dataclass
class PutResult:
    key: str
    ok: bool
    error: Optional[str] = None  # "ENOSPC: ...", "store full: ...", ...
    evicted: List[str] = field(default_factory=list)  # keys evicted to make room
    already_present: bool = False


@dataclass
class StoreStats:
    objects: int
    stored_bytes: int
    used_bytes: int  # whole slots
    capacity_bytes: int
    slot_bytes: int
    engine: str
    o_direct: List[bool]
    counts: Dict[str, int]
    devices: List[DeviceEndurance]


class StoreOffline(OSError):
    """The store's data dir was removed while serving; no more I/O goes to it."""


class ObjectOp:
    """Sub-I/Os of one object in flight; the last one to finish completes the object."""

    __slots__ = ("remaining", "lock", "results", "error", "t0")

    def __init__(self, n: int) -> None:
        self.remaining = n
        self.lock = threading.Lock()
        self.results: List[Any] = [None] * n
        self.error: Optional[BaseException] = None
        self.t0 = time.perf_counter()

    def done(self, i: int, result: Any = None, error: Optional[BaseException] = None) -> bool:
        with self.lock:
            self.results[i] = result
            if error is not None and self.error is None:
                self.error = error
            self.remaining -= 1
            return self.remaining == 0


def host_pieces(pieces: Sequence[Segment]) -> List[np.ndarray]:
    """The pieces in host memory (a CUDA piece is copied)."""
    return [p.cpu().numpy() if is_cuda(p) else p for p in pieces]


def xxh3(pieces: Sequence[Segment]) -> int:
    """The xxh3_64 checksum of consecutive pieces, as one stripe run's index row records it."""
    h = xxhash.xxh3_64()
    for p in host_pieces(pieces):
        h.update(p)
    return h.intdigest()


def is_enospc(err: BaseException) -> bool:
    """A full file system: ENOSPC from a slab write, or SQLITE_FULL ("database or disk is full")
    from an index commit."""
    if isinstance(err, OSError) and err.errno == errno.ENOSPC:
        return True
    return isinstance(err, sqlite3.Error) and getattr(err, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL


def describe(err: BaseException) -> str:
    """A failure as the text of a result; a full device or index starts with ``ENOSPC:``."""
    if is_enospc(err):
        return f"ENOSPC: {err}" if isinstance(err, OSError) else f"ENOSPC: index: {err}"
    return f"{type(err).__name__}: {err}"


def resolved(result: Any) -> Future:
    """A future already holding ``result`` (a call answered without I/O)."""
    f: Future = Future()
    f.set_result(result)
    return f
