"""Zero-copy views of SGLang host-pool pages as scatter lists.

A host page is not contiguous (K and V halves, or one chunk per layer in
layer_first; several state tensors for Mamba). We describe it as the list of
contiguous byte chunks of the pool's own tensors, in the row-major order of
`get_data_page(index, flat=True)`, so an object read this way lands in place
and equals what SGLang's flat-page path would store. Pools whose pages are not
views of pool memory fall back to SGLang's flat-page copy path.
"""

from __future__ import annotations

import ctypes
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch


def contiguous_chunks(t: torch.Tensor) -> List[Tuple[int, int]]:
    """(byte offset in its storage, byte length) of each contiguous run of `t`, in order."""
    item = t.element_size()
    dims = [(n, s) for n, s in zip(t.shape, t.stride()) if n != 1]
    expected, k = 1, len(dims)
    while k > 0 and dims[k - 1][1] == expected:
        expected *= dims[k - 1][0]
        k -= 1
    block = expected * item
    offsets = [t.storage_offset() * item]
    for n, s in dims[:k]:
        offsets = [o + i * s * item for o in offsets for i in range(n)]
    runs: List[Tuple[int, int]] = []
    for o in offsets:
        if runs and runs[-1][0] + runs[-1][1] == o:
            runs[-1] = (runs[-1][0], runs[-1][1] + block)
        else:
            runs.append((o, block))
    return runs


class HostPageView:
    """Page index -> list of numpy segments aliasing one host pool's memory."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.page_size = int(getattr(pool, "page_size", 1) or 1)
        self.page_bytes = self.page_size * int(pool.get_size_per_token())
        self._storages: Dict[int, np.ndarray] = {}
        try:
            buffers = list(pool.get_hybrid_pool_buffer())
        except (AttributeError, NotImplementedError):
            buffers = [pool.kv_buffer]
        self._pool_storages = {b.untyped_storage().data_ptr() for b in buffers if b.numel()}
        self.zero_copy = self._probe()

    def _page_tensors(self, index: int) -> Sequence[torch.Tensor]:
        iter_tensors = getattr(self.pool, "_iter_page_tensors", None)
        if iter_tensors is not None:
            return list(iter_tensors(index))
        return [self.pool.get_data_page(index, flat=False)]

    def _probe(self) -> bool:
        try:
            tensors = self._page_tensors(0)
        except Exception:
            return False
        return (
            all(
                t.device.type == "cpu" and t.untyped_storage().data_ptr() in self._pool_storages
                for t in tensors
            )
            and sum(t.numel() * t.element_size() for t in tensors) == self.page_bytes
        )

    def _storage_array(self, t: torch.Tensor) -> np.ndarray:
        st = t.untyped_storage()
        ptr = st.data_ptr()
        arr = self._storages.get(ptr)
        if arr is None:
            raw = (ctypes.c_uint8 * st.nbytes()).from_address(ptr)
            arr = np.ctypeslib.as_array(raw)
            self._storages[ptr] = arr
        return arr

    def segments(self, index: int) -> Optional[List[np.ndarray]]:
        """Segments of page `index`, or None when this pool needs the copy path."""
        if not self.zero_copy:
            return None
        out: List[np.ndarray] = []
        for t in self._page_tensors(index):
            arr = self._storage_array(t)
            out.extend(arr[o : o + n] for o, n in contiguous_chunks(t))
        return out
