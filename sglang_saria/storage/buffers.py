"""Caller memory as scatter lists, so reads land in place (zero copy).

An object is a byte string; the caller's memory for it is a list of segments
(host pool pages are not contiguous: K and V, or one chunk per layer). CPU
segments are 1-D uint8 numpy arrays (buffer protocol for preadv/pwritev);
CUDA segments are 1-D uint8 torch tensors (for kvikio). Both slice alike.
"""

from __future__ import annotations

import threading
from typing import Any, List, Sequence

import numpy as np

from sglang_saria.storage.config import ALIGN

Segment = Any  # np.ndarray (uint8, 1-D, CPU) or torch.Tensor (uint8, 1-D, CUDA)


def _torch():
    import torch

    return torch


def as_segment(buf: Any, writable: bool) -> Segment:
    """One caller buffer -> a 1-D uint8 segment sharing its memory."""
    if isinstance(buf, np.ndarray):
        if not buf.flags.c_contiguous:
            raise ValueError("saria store: numpy buffer must be C-contiguous (no hidden copy)")
        if writable and not buf.flags.writeable:
            raise ValueError("saria store: destination numpy buffer is read-only")
        return buf.reshape(-1).view(np.uint8)
    if isinstance(buf, (bytes, bytearray, memoryview)):
        mv = memoryview(buf)
        if writable and mv.readonly:
            raise ValueError("saria store: destination buffer is read-only")
        if not mv.c_contiguous:
            raise ValueError("saria store: memoryview must be contiguous")
        return np.frombuffer(mv.cast("B"), dtype=np.uint8)
    torch = _torch()
    if isinstance(buf, torch.Tensor):
        if not buf.is_contiguous():
            raise ValueError("saria store: tensor must be contiguous (no hidden copy)")
        flat = buf.reshape(-1).view(torch.uint8)
        if flat.device.type == "cpu":
            return flat.numpy()
        return flat
    raise TypeError(f"saria store: unsupported buffer type {type(buf).__name__}")


def as_segments(bufs: Any, writable: bool) -> List[Segment]:
    """A buffer or a list of buffers (scatter list) -> list of segments."""
    if isinstance(bufs, (list, tuple)):
        return [as_segment(b, writable) for b in bufs]
    return [as_segment(bufs, writable)]


def total_bytes(segs: Sequence[Segment]) -> int:
    return sum(int(s.shape[0]) for s in segs)


def is_cuda(seg: Segment) -> bool:
    return not isinstance(seg, np.ndarray)


class ScatterList:
    """Byte-range view over a list of segments (object offset -> pieces)."""

    def __init__(self, segs: Sequence[Segment]):
        self.segs = list(segs)
        self.starts = np.cumsum([0] + [int(s.shape[0]) for s in self.segs])
        self.nbytes = int(self.starts[-1])

    def slice(self, start: int, end: int) -> List[Segment]:
        out: List[Segment] = []
        i = int(np.searchsorted(self.starts, start, side="right")) - 1
        pos = start
        while pos < end:
            seg_start = int(self.starts[i])
            seg = self.segs[i]
            lo = pos - seg_start
            hi = min(int(seg.shape[0]), end - seg_start)
            if hi > lo:
                out.append(seg[lo:hi])
                pos = seg_start + hi
            i += 1
        return out


def address(seg: Segment) -> int:
    if isinstance(seg, np.ndarray):
        return seg.ctypes.data
    return seg.data_ptr()


def aligned(segs: Sequence[Segment], align: int = ALIGN) -> bool:
    """Whether O_DIRECT can use these segments as they are."""
    return all(address(s) % align == 0 and s.shape[0] % align == 0 for s in segs)


def aligned_empty(nbytes: int, align: int = ALIGN) -> np.ndarray:
    raw = np.empty(nbytes + align, dtype=np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off : off + nbytes]


class BounceBuffers:
    """One aligned staging buffer per worker thread, grown on demand.

    Used only when O_DIRECT meets caller memory that is not 4 KiB aligned.
    """

    def __init__(self) -> None:
        self._local = threading.local()

    def get(self, nbytes: int) -> np.ndarray:
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.shape[0] < nbytes:
            buf = aligned_empty(max(nbytes, 1 << 20))
            self._local.buf = buf
        return buf[:nbytes]


def round_up(n: int, align: int = ALIGN) -> int:
    return (n + align - 1) // align * align
