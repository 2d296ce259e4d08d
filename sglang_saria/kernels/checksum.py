"""Device-side object digest: verify a GDS read where it landed, without a host copy.

The digest is defined in ``sglang_saria/digest.py`` (the store records it at write time, on the
host); a Triton kernel here recomputes it over a staging buffer on the GPU, so only one boolean
per object crosses to the host. The kernel adds the lanes of its blocks; sums are order-free,
so the reduction needs no atomics and is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from sglang_saria.digest import MASK32, as_int64, lanes

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs without triton use the numpy definition
    triton = None
    tl = None

_MAX_BLOCK_WORDS = 4096

Backend = Literal["auto", "triton", "numpy"]


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


__all__ = ["kernel_runs_on", "row_digests", "triton_interpreted", "verify_rows"]
