"""The object digest on the host: the store records it at write time, the device checks it.

The store checks every stripe run with xxh3_64 on read, which needs the bytes on the host.
A reload that reads straight into GPU memory instead checks this digest there: the store
records it at write time (numpy, on its write workers, here) and a Triton kernel recomputes
it over the staging buffer (``kernels/checksum.py``). A leaf module: the store and the
kernels both import it, neither imports the other.

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

import numpy as np

PHI = 0x9E3779B9
MASK32 = 0xFFFFFFFF
_TABLE_WORDS = 1 << 21  # cached index terms cover objects up to 8 MiB (16 MiB of tables)


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


__all__ = ["Lanes", "as_int64", "digest", "lanes"]
