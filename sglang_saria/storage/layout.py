"""Slab layout: fixed-size aligned slots striped across the data dirs.

Logical slot i is `slot_bytes` long and is cut into one stripe unit per data
dir (`unit = slot_bytes / N`, a multiple of 4 KiB): stripe j of slot i lives at
offset `i * unit` of dir j's slab file. Every object of at least N x 4 KiB therefore
touches every drive, so one reload uses the bandwidth of all SSDs (the paper's dual-SSD
setup), and slots of one object that are adjacent on disk are read with one
vectored call per drive. A smaller object (a tiny test model's page) cannot be cut below
the 4 KiB alignment: it sits on the first dirs and the rest of its slot stays unused.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from dataclasses import dataclass
from typing import List, Sequence, Tuple

import numpy as np

from sglang_saria.storage.config import ALIGN
from sglang_saria.storage.private import open_private, writable_error

logger = logging.getLogger(__name__)

SLAB_NAME = "saria-slab.dat"


@dataclass(frozen=True)
class SubIO:
    """One contiguous file range on one drive and the object bytes it holds."""

    dir_idx: int
    file_offset: int
    ranges: Tuple[Tuple[int, int], ...]  # object byte ranges, in file order

    @property
    def nbytes(self) -> int:
        return sum(e - s for s, e in self.ranges)


@dataclass(frozen=True)
class SlabLayout:
    data_dirs: Tuple[str, ...]
    slot_bytes: int
    nslots: int

    def __post_init__(self) -> None:
        step = ALIGN * len(self.data_dirs)
        if self.slot_bytes % step:
            raise ValueError(
                f"saria store: slot_bytes={self.slot_bytes} must be a multiple of "
                f"{step} (4 KiB x {len(self.data_dirs)} data dirs)"
            )
        if self.nslots < 1:
            raise ValueError(
                f"saria store: capacity holds no slot of {self.slot_bytes} bytes; raise capacity"
            )

    @staticmethod
    def round_slot_bytes(nbytes: int, ndirs: int) -> int:
        step = ALIGN * ndirs
        return max(step, (nbytes + step - 1) // step * step)

    @property
    def unit(self) -> int:
        return self.slot_bytes // len(self.data_dirs)

    @property
    def slab_bytes(self) -> int:
        return self.nslots * self.unit

    def slab_path(self, dir_idx: int) -> str:
        return os.path.join(self.data_dirs[dir_idx], SLAB_NAME)

    def slots_for(self, size: int) -> int:
        return max(1, (size + self.slot_bytes - 1) // self.slot_bytes)

    def plan(self, slots: Sequence[int], size: int) -> List[SubIO]:
        """Split an object (held in `slots`, in order) into per-drive file runs."""
        unit, slot_bytes = self.unit, self.slot_bytes
        out: List[SubIO] = []
        for j in range(len(self.data_dirs)):
            run_start = -1
            prev_slot = -2
            ranges: List[Tuple[int, int]] = []
            for ordinal, slot in enumerate(slots):
                lo = ordinal * slot_bytes + j * unit
                hi = min(lo + unit, size)
                if hi <= lo:
                    break
                # Adjacent on disk only if the slot follows and the last piece was full.
                if ranges and slot == prev_slot + 1 and ranges[-1][1] - ranges[-1][0] == unit:
                    ranges.append((lo, hi))
                else:
                    if ranges:
                        out.append(SubIO(j, run_start * unit, tuple(ranges)))
                    run_start, ranges = slot, [(lo, hi)]
                prev_slot = slot
            if ranges:
                out.append(SubIO(j, run_start * unit, tuple(ranges)))
        return out


def prepare_slab(path: str, nbytes: int, preallocate: bool) -> None:
    """Create or grow a slab file (0600); preallocation finds a full disk now, not mid-write.

    The file system's free space is checked first: ``posix_fallocate`` of more than is free may
    fill the disk (other users' files included) before it fails."""
    if preallocate:
        have = os.path.getsize(path) if os.path.exists(path) else 0
        vfs = os.statvfs(os.path.dirname(path))
        free, total = vfs.f_bavail * vfs.f_frsize, vfs.f_blocks * vfs.f_frsize
        if nbytes - have > free:
            raise ValueError(
                f"saria store: data dir {os.path.dirname(path)!r}: capacity needs {nbytes - have} more bytes "
                f"for {path!r} (a slab of {nbytes}) but its file system has {free} bytes free; "
                f"lower capacity or free space"
            )
        if free - (nbytes - have) < total // 10:
            logger.warning(
                "saria store: preallocating %d bytes for %s leaves its file system under 10%% free",
                nbytes - have,
                path,
            )
    try:
        fd = open_private(path, os.O_RDWR)
    except OSError as e:  # a slab made read-only (mode, or a read-only file system): name it and its mode
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        raise ValueError(writable_error(path, "slab", is_dir=False) or f"saria store: slab {path!r}: {e}") from e
    try:
        have = os.fstat(fd).st_size
        if have >= nbytes:
            return
        if preallocate:
            try:
                os.posix_fallocate(fd, have, nbytes - have)
                return
            except OSError as e:
                if e.errno == errno.ENOSPC:
                    free = shutil.disk_usage(os.path.dirname(path)).free
                    os.ftruncate(fd, have)
                    raise ValueError(
                        f"saria store: {path!r} needs {nbytes - have} more bytes but its "
                        f"file system has {free} free; lower capacity or free space"
                    ) from e
                if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    raise
                logger.warning(
                    "saria store: %s does not support fallocate (%s); slab is sparse, "
                    "a full disk will show up as ENOSPC on writes",
                    path,
                    e.strerror,
                )
        os.ftruncate(fd, nbytes)
    finally:
        os.close(fd)


def block_device_name(path: str) -> str:
    """Kernel block device behind a path (e.g. 'nvme0n1'), for endurance reports."""
    st = os.stat(path)
    uevent = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/uevent"
    try:
        with open(uevent) as f:
            for line in f:
                if line.startswith("DEVNAME="):
                    return line.strip().split("=", 1)[1]
    except OSError:
        pass
    return f"dev{os.major(st.st_dev)}:{os.minor(st.st_dev)}"


def slots_to_blob(slots: Sequence[int]) -> bytes:
    return np.asarray(slots, dtype=np.int64).tobytes()


def blob_to_slots(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype=np.int64)
