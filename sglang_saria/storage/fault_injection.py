"""Test-only faults, configured by the test, never by the environment.

As SGLang's ``HiCacheStorageFailureInjector`` wraps a storage backend, an injector here wraps
the store's I/O engine, so the store's own code holds no test hook. A test names one in the
extra config (``StoreConfig.fault_injector``), with its arguments::

    "fault_injector": {"class": "sglang_saria.storage.fault_injection:ReadDelay", "read_delay_s": 1.0}

or passes an instance in ``StoreConfig(fault_injector=ReadDelay(1.0))``. Never set one in production.

``ReadDelay``: every read sleeps first. ``FullDisk``: every write fails with ENOSPC until freed
(or while a file the test names exists). ``HeldWrites``: while a file exists, every write stops
half-way (half its bytes on disk) until the file is gone, so a test kills a server mid-put.
"""

from __future__ import annotations

import errno
import math
import os
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

from sglang_saria.storage.buffers import Segment, total_bytes
from sglang_saria.storage.config import ALIGN
from sglang_saria.storage.io_engine import IOEngine
from sglang_saria.units import ConfigError


class FaultInjector(ABC):
    """A fault the store's engine runs; the store applies ``wrap`` to its engine when it opens."""

    @abstractmethod
    def wrap(self, engine: IOEngine) -> IOEngine:
        """The engine with the fault in it."""


@dataclass(frozen=True)
class ReadDelay(FaultInjector):
    """Every read the engine does sleeps ``read_delay_s`` first, on the store's read thread (one
    read per object and data dir it is striped over), so a test can hold a reload in flight
    (tests/e2e/test_async_reload.py) or stand for a slow drive (scripts/bench_serving.py)."""

    read_delay_s: float

    def __post_init__(self) -> None:
        v = self.read_delay_s
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v >= 0 and math.isfinite(v)):
            raise ConfigError(f"saria store config: fault_injector.read_delay_s={v!r}: must be a non-negative "
                              "number of seconds (test-only)")

    def wrap(self, engine: IOEngine) -> IOEngine:
        return DelayedReads(engine, float(self.read_delay_s))


class WrappedEngine(IOEngine):
    """``engine`` itself; an injector's engine overrides the calls its fault is in."""

    def __init__(self, engine: IOEngine) -> None:
        self.inner = engine
        self.name = engine.name

    def open(self, paths: Sequence[str], o_direct: str) -> None:
        self.inner.open(paths, o_direct)

    def read(self, dir_idx: int, offset: int, segs: Sequence[Segment]) -> int:
        return self.inner.read(dir_idx, offset, segs)

    def write(self, dir_idx: int, offset: int, segs: Sequence[Segment]) -> int:
        return self.inner.write(dir_idx, offset, segs)

    def sync(self, dir_idx: int) -> None:
        self.inner.sync(dir_idx)

    def close(self) -> None:
        self.inner.close()

    def direct(self, dir_idx: int) -> bool:
        return self.inner.direct(dir_idx)


class DelayedReads(WrappedEngine):
    """``engine`` whose reads start ``delay_s`` late (``ReadDelay``)."""

    def __init__(self, engine: IOEngine, delay_s: float) -> None:
        super().__init__(engine)
        self.delay_s = delay_s

    def read(self, dir_idx: int, offset: int, segs: Sequence[Segment]) -> int:
        time.sleep(self.delay_s)
        return self.inner.read(dir_idx, offset, segs)


class FullDisk(FaultInjector):
    """Every slab write fails with ENOSPC, as on a full file system, until ``free()``; counts the
    writes the store tried while full (``refused``) and those that went through (``written``), so a
    test sees whether the store kept writing into a full disk.

    ``while_file``: full exactly while that file exists, so a test fills and frees the disk of a
    store in a server process by creating and removing the file (`tests/faults/`)::

        "fault_injector": {"class": "sglang_saria.storage.fault_injection:FullDisk", "while_file": "/tmp/x/full"}
    """

    def __init__(self, full: bool = True, while_file: str | None = None) -> None:
        if while_file is not None and not (isinstance(while_file, str) and os.path.isabs(while_file)):
            raise ConfigError(f"saria store config: fault_injector.while_file={while_file!r}: must be an absolute path (test-only)")
        self.while_file = while_file
        self._full = threading.Event()
        if full:
            self._full.set()
        self._count_lock = threading.Lock()  # the store's write threads count concurrently
        self.refused = 0
        self.written = 0

    def fill(self) -> None:
        self._full.set()

    def free(self) -> None:
        self._full.clear()

    @property
    def full(self) -> bool:
        if self.while_file is not None:
            return os.path.exists(self.while_file)
        return self._full.is_set()

    def wrap(self, engine: IOEngine) -> IOEngine:
        return _FullDiskWrites(engine, self)


class _FullDiskWrites(WrappedEngine):
    def __init__(self, engine: IOEngine, disk: FullDisk) -> None:
        super().__init__(engine)
        self.disk = disk

    def write(self, dir_idx: int, offset: int, segs: Sequence[Segment]) -> int:
        full = self.disk.full
        with self.disk._count_lock:
            if full:
                self.disk.refused += 1
            else:
                self.disk.written += 1
        if full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.inner.write(dir_idx, offset, segs)


HOLD_POLL_S = 0.05


class HeldWrites(FaultInjector):
    """While ``hold_file`` exists, every slab write writes the first half of its bytes (rounded
    down to ``ALIGN``), then creates ``held_file`` (its text: ``<dir_idx> <file offset>`` of the
    first held write) and waits until ``hold_file`` is removed before writing the whole run. A
    test kills the server while a write waits there: the object is half on disk and its index row
    was never committed (``tests/faults/test_kill_mid_write.py``)::

        "fault_injector": {"class": "sglang_saria.storage.fault_injection:HeldWrites",
                           "hold_file": "/tmp/x/hold", "held_file": "/tmp/x/held"}
    """

    def __init__(self, hold_file: str, held_file: str) -> None:
        for name, path in (("hold_file", hold_file), ("held_file", held_file)):
            if not (isinstance(path, str) and os.path.isabs(path)):
                raise ConfigError(f"saria store config: fault_injector.{name}={path!r}: must be an absolute path "
                                  "(test-only)")
        self.hold_file = hold_file
        self.held_file = held_file

    def wrap(self, engine: IOEngine) -> IOEngine:
        return _HeldWrites(engine, self)


class _HeldWrites(WrappedEngine):
    def __init__(self, engine: IOEngine, held: HeldWrites) -> None:
        super().__init__(engine)
        self.held = held

    def write(self, dir_idx: int, offset: int, segs: Sequence[Segment]) -> int:
        if os.path.exists(self.held.hold_file):
            half = first_bytes(segs, total_bytes(segs) // 2 // ALIGN * ALIGN)
            if half:
                self.inner.write(dir_idx, offset, half)
                self.inner.sync(dir_idx)
            try:
                with open(self.held.held_file, "x") as f:  # the first held write names itself
                    f.write(f"{dir_idx} {offset}\n")
            except FileExistsError:
                pass
            while os.path.exists(self.held.hold_file):
                time.sleep(HOLD_POLL_S)
        return self.inner.write(dir_idx, offset, segs)


def first_bytes(segs: Sequence[Segment], n: int) -> list[Segment]:
    """The scatter list of the first ``n`` bytes of ``segs`` (views, no copy)."""
    out: list[Segment] = []
    for s in segs:
        if n <= 0:
            break
        k = min(int(s.shape[0]), n)
        out.append(s[:k])
        n -= k
    return out
