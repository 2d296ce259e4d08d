"""Device-friendly object digest: verify a GDS read where it landed, without a host copy.

The store checks every stripe run with xxh3_64 on read, which needs the bytes on the host.
A reload that reads straight into GPU memory instead checks this digest there: the store
records it at write time (numpy, on the write workers) and a Triton kernel recomputes it
over the staging buffer. Only one boolean per object crosses to the host.

Definition, over the object's little-endian 32-bit words ``w_i`` (the bytes zero-padded to
a multiple of 4; ``i`` is the word's index in the object; all arithmetic mod 2**32)::

    A = sum_i  w_i * (2i + 1)
    B = sum_i  w_i * ((i * PHI) | 1)
    digest = A | B << 32

Both weights are odd, so any one changed word changes both lanes; the second lane's weights
are scattered (golden-ratio hashing of i), so errors that cancel in A (two words swapped, a
block of stale data) show in B, except by a 2**-32 chance. Two multiply-and-sum passes keep
the host side at several GB/s per thread (a nonlinear mixing lane cost 10x that in numpy).

Both lanes are sums of per-word terms, so a digest splits over word-aligned byte ranges:
the store adds the lanes of its stripe runs (written by different threads), the kernel
adds the lanes of its blocks. Sums are order-free, so the GPU reduction needs no atomics
and is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs without triton use the numpy definition
    triton = None
    tl = None

PHI = 0x9E3779B9
MASK32 = 0xFFFFFFFF
_TABLE_WORDS = 1 << 21  # cached index terms cover objects up to 8 MiB (16 MiB of tables)
_MAX_BLOCK_WORDS = 4096

Backend = Literal["auto", "triton", "numpy"]


@dataclass(frozen=True)
class Lanes:
    """Partial sums (mod 2**32) of a digest over some word-aligned ranges of an object."""

    a: int = 0
    b: int = 0

    def __add__(self, other: Lanes) -> Lanes:
        return Lanes((self.a + other.a) & MASK32, (self.b + other.b) & MASK32)

    @property
    def digest(self) -> int:
        return self.a | self.b << 32


class _IndexTerms:
    """The lane weights ``2i + 1`` and ``(i * PHI) | 1`` (uint32) for i < _TABLE_WORDS, built once:
    slices are free views."""

    def __init__(self) -> None:
        self._tables: tuple[np.ndarray, np.ndarray] | None = None  # one attribute: set atomically

    @staticmethod
    def _build(start: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        i = np.arange(start, start + n, dtype=np.uint64).astype(np.uint32)
        return i * np.uint32(2) + np.uint32(1), i * np.uint32(PHI) | np.uint32(1)

    def get(self, start: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        if start + n > _TABLE_WORDS:
            return self._build(start, n)
        if self._tables is None:  # write workers may race here: each builds the same tables
            self._tables = self._build(0, _TABLE_WORDS)
        odd, phi = self._tables
        return odd[start : start + n], phi[start : start + n]


_TERMS = _IndexTerms()


def _words(buf: np.ndarray) -> np.ndarray:
    """A 1-D uint8 array as little-endian uint32 words, zero-padded at the end."""
    pad = (-buf.size) % 4
    if pad:
        buf = np.concatenate([buf, np.zeros(pad, dtype=np.uint8)])
    return np.ascontiguousarray(buf).view("<u4")


def _word_lanes(words: np.ndarray, word_offset: int) -> Lanes:
    odd, phi = _TERMS.get(word_offset, words.size)
    x = np.multiply(words, odd)
    a = int(x.sum(dtype=np.uint32))  # uint32 sums wrap: exactly mod 2**32, and vectorised
    np.multiply(words, phi, out=x)
    return Lanes(a, int(x.sum(dtype=np.uint32)))


def lanes(pieces: Sequence[np.ndarray], byte_offset: int = 0) -> Lanes:
    """Lanes of consecutive object bytes ``pieces`` (1-D uint8) starting at ``byte_offset``.

    ``byte_offset`` must be a multiple of 4; only the object's last piece may end off a word.
    """
    if byte_offset % 4:
        raise ValueError(f"digest lanes: byte_offset {byte_offset} is not a multiple of 4 bytes")
    if any(p.size % 4 for p in pieces[:-1]):  # a word straddles two pieces: join them (rare)
        pieces = [np.concatenate(pieces)]
    total, word = Lanes(), byte_offset // 4
    for p in pieces:
        words = _words(p)
        total = total + _word_lanes(words, word)
        word += words.size
    return total


def digest(data: np.ndarray | bytes) -> int:
    """Digest of a whole object held in host memory (the store's and the tests' reference)."""
    buf = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray)) else data.reshape(-1).view(np.uint8)
    return lanes([buf]).digest


def as_int64(value: int) -> int:
    """An unsigned 64-bit digest as the int64 with the same bits (torch has no uint64 compare)."""
    return value - (1 << 64) if value >= 1 << 63 else value


if triton is not None:

    @triton.jit
    def _digest_kernel(words_ptr, partial_ptr, words_per_row, row_stride, BLOCK: tl.constexpr):
        """Program (row, block): lanes of BLOCK words of one object, stored as two int64 partials."""
        row = tl.program_id(0).to(tl.int64)
        blk = tl.program_id(1).to(tl.int64)
        i = blk * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
        mask = i < words_per_row
        w = tl.load(words_ptr + row * row_stride + i, mask=mask, other=0).to(tl.uint32, bitcast=True)
        i32 = i.to(tl.uint32)
        a = w * (i32 * 2 + 1)
        x = w * ((i32 * 0x9E3779B9) | 1)
        a = tl.where(mask, a, 0).to(tl.int64)
        x = tl.where(mask, x, 0).to(tl.int64)
        out = partial_ptr + (row * tl.num_programs(1) + blk) * 2
        tl.store(out, tl.sum(a, axis=0))
        tl.store(out + 1, tl.sum(x, axis=0))


def triton_interpreted() -> bool:
    """True when the kernel was defined under TRITON_INTERPRET=1 (runs on CPU tensors)."""
    if triton is None:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_digest_kernel, InterpretedFunction)


def kernel_runs_on(device_type: str) -> bool:
    """Whether ``backend='auto'`` digests tensors on ``device_type`` with the Triton kernel
    (compiled on CUDA; on CPU only under TRITON_INTERPRET=1)."""
    if triton is None or device_type not in ("cpu", "cuda"):
        return False
    return (device_type == "cuda") != triton_interpreted()


def _select(device_type: str, backend: Backend) -> Literal["triton", "numpy"]:
    if backend == "auto":
        backend = "triton" if kernel_runs_on(device_type) else "numpy"
    if backend == "triton" and device_type == "cuda" and triton_interpreted():
        raise RuntimeError("TRITON_INTERPRET=1 is set: the interpreted digest kernel cannot read CUDA memory")
    if backend == "numpy" and device_type != "cpu":
        raise ValueError(f"the numpy digest reads host memory; rows are on {device_type} (use backend='triton')")
    return backend


def row_digests(rows, backend: Backend = "auto"):
    """Digests (int64 bits, see :func:`as_int64`) of each row of a 2-D tensor, on its device.

    A row is one object's bytes (any dtype; rows dense). On CUDA one kernel launch covers
    all rows; the result stays on the GPU.
    """
    import torch

    if rows.dim() != 2 or (rows.shape[0] > 1 and not rows[0].is_contiguous()):
        raise ValueError(f"row_digests: expected a 2-D tensor of dense rows, got shape {tuple(rows.shape)}")
    flat = rows.view(torch.uint8) if rows.element_size() == 1 else rows.contiguous().view(torch.uint8)
    chosen = _select(flat.device.type, backend)
    if chosen == "numpy":
        return torch.tensor([as_int64(lanes([r.numpy()]).digest) for r in flat], dtype=torch.int64)
    if flat.shape[1] % 4 or flat.stride(0) % 4 or flat.data_ptr() % 4:
        flat = torch.nn.functional.pad(flat, (0, (-flat.shape[1]) % 4))  # contiguous copy, word-aligned
    words = flat.view(torch.int32)
    n_words = words.shape[1]
    block = min(_MAX_BLOCK_WORDS, max(16, triton.next_power_of_2(max(n_words, 1))))
    blocks = max(1, -(-n_words // block))
    partial = torch.empty((words.shape[0], blocks, 2), dtype=torch.int64, device=words.device)
    if words.shape[0]:
        _digest_kernel[(words.shape[0], blocks)](words, partial, n_words, words.stride(0), BLOCK=block)
    sums = partial.sum(dim=1) & MASK32
    a, b = sums[:, 0], sums[:, 1]
    return torch.where(b >= 1 << 31, b - (1 << 32), b) * (1 << 32) + a  # the uint64 bits, no overflow


def verify_rows(rows, expected: Sequence[int], backend: Backend = "auto"):
    """Per-row bool tensor (on the rows' device): does each row's digest equal ``expected``?"""
    import torch

    if len(expected) != rows.shape[0]:
        raise ValueError(f"verify_rows: {rows.shape[0]} rows but {len(expected)} expected digests")
    want = torch.tensor([as_int64(d) for d in expected], dtype=torch.int64, device=rows.device)
    return row_digests(rows, backend) == want


__all__ = ["Lanes", "as_int64", "digest", "kernel_runs_on", "lanes", "row_digests", "triton_interpreted", "verify_rows"]
