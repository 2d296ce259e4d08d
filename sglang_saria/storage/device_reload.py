"""Direct SSD -> device-pool reload (paper 4.3, 5.1): no host-pool staging.

SSD hits of a request are read into a staging buffer on the KV pool's own device
(kvikio/GDS when the pool is on a GPU, POSIX reads on CPU), then ONE mixed-source
gather (`sglang_saria.hybrid.gather`, the Triton kernel on GPU) scatters every
layer's K and V rows into the request's pool slots. The host pool is never touched,
so an SSD hit costs no DRAM capacity and no second copy.

A stored page has the byte order of SGLang's host pool page (`get_data_page(flat=True)`),
since HiCache's host->storage backup wrote it: `page_first` is token-major
`[K|V][token][layer]`, `layer_first` and `page_first_direct` are layer-major
`[K|V][layer][token]`; each innermost row is one token of one layer
(`head_num * head_dim` elements), the row width of the device pool's `k_buffer[l]`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch

from sglang_saria.hybrid.gather import GatherPlan, RowMoves, gather_mixed

logger = logging.getLogger(__name__)

# Host-pool layouts whose pages are [K|V] x (token, layer) rows, and their row order.
TOKEN_MAJOR_LAYOUTS = frozenset({"page_first"})
LAYER_MAJOR_LAYOUTS = frozenset({"layer_first", "page_first_direct"})
SUPPORTED_LAYOUTS = TOKEN_MAJOR_LAYOUTS | LAYER_MAJOR_LAYOUTS
DEFAULT_CHUNK_PAGES = 16  # pages per read + gather step (and per pacing step)


class UnsupportedPoolLayout(ValueError):
    """The device or host pool has a layout the direct path cannot address row by row."""


@dataclass(frozen=True)
class PageGeometry:
    """Where row (kv, token, layer) of stored page n sits in a staging buffer of such pages."""

    layers: int
    page_size: int
    token_major: bool

    @property
    def rows_per_page(self) -> int:
        return 2 * self.page_size * self.layers

    def staging_rows(self, n_pages: int, kv: int, layer: int) -> torch.Tensor:
        """Staging rows of (kv, layer) for every token of ``n_pages`` pages, in slot order."""
        page = torch.arange(n_pages, dtype=torch.int64)[:, None]
        token = torch.arange(self.page_size, dtype=torch.int64)[None, :]
        if self.token_major:
            rows = ((page * 2 + kv) * self.page_size + token) * self.layers + layer
        else:
            rows = ((page * 2 + kv) * self.layers + layer) * self.page_size + token
        return rows.reshape(-1)


@dataclass
class ReloadOutcome:
    ok: bool
    pages: int = 0
    nbytes: int = 0
    reason: str = ""  # why it failed: the store's status ("miss", "corrupt", "io_error", ...)


class DeviceReloader:
    """Reads stored KV pages straight into device-pool slots."""

    def __init__(
        self,
        read_page: Callable[[str, torch.Tensor], Any],
        device_pool: Any,
        host_layout: str,
        page_size: int,
        page_bytes: int,
        chunk_pages: int = DEFAULT_CHUNK_PAGES,
    ) -> None:
        """``read_page(page_hash, dest)`` starts one store read and returns a Future of its status."""
        k_bufs = getattr(device_pool, "k_buffer", None)
        v_bufs = getattr(device_pool, "v_buffer", None)
        if not isinstance(k_bufs, list) or not isinstance(v_bufs, list) or not k_bufs:
            raise UnsupportedPoolLayout(
                f"device pool {type(device_pool).__name__} has no per-layer k_buffer/v_buffer lists"
            )
        if host_layout not in SUPPORTED_LAYOUTS:
            raise UnsupportedPoolLayout(
                f"--hicache-mem-layout {host_layout}: direct reload supports {sorted(SUPPORTED_LAYOUTS)}"
            )
        shapes = {tuple(t.shape[1:]) for t in k_bufs + v_bufs}
        if any(t.dim() != 3 for t in k_bufs + v_bufs) or len(shapes) != 1:
            raise UnsupportedPoolLayout(
                "direct reload needs [slots, head_num, head_dim] K and V buffers of one shape; "
                f"got {sorted({tuple(t.shape) for t in k_bufs + v_bufs})}"
            )
        self.geometry = PageGeometry(len(k_bufs), page_size, host_layout in TOKEN_MAJOR_LAYOUTS)
        self.row_shape = next(iter(shapes))
        self.dtype = k_bufs[0].dtype
        self.device = k_bufs[0].device
        self.destinations = k_bufs + v_bufs
        row_bytes = k_bufs[0][0].numel() * k_bufs[0].element_size()
        if self.geometry.rows_per_page * row_bytes != page_bytes:
            raise UnsupportedPoolLayout(
                f"a stored page is {page_bytes} bytes but 2 x {page_size} tokens x {len(k_bufs)} layers x "
                f"{row_bytes} bytes per row = {self.geometry.rows_per_page * row_bytes}"
            )
        self.page_bytes = page_bytes
        self.read_page = read_page
        self.chunk_pages = chunk_pages

    def load(
        self,
        page_hashes: Sequence[str],
        slots: torch.Tensor,
        on_chunk: Optional[Callable[[int], None]] = None,
    ) -> ReloadOutcome:
        """Read ``page_hashes`` into token slots ``slots`` (``page_size`` per page).

        Pages move ``chunk_pages`` at a time through one staging buffer of that size (so a
        long prefix needs no prefix-sized buffer): read, then one gather into the chunk's
        slots; ``on_chunk(bytes_so_far)`` paces the reads. A failed read stops the load
        before its chunk is scattered; the slots are fresh, so the caller just frees them.
        """
        n = len(page_hashes)
        g = self.geometry
        if slots.numel() != n * g.page_size:
            raise ValueError(f"{n} pages need {n * g.page_size} slots, got {slots.numel()}")
        if n == 0:
            return ReloadOutcome(True)
        chunk = min(n, self.chunk_pages)
        staging = torch.empty((chunk * g.rows_per_page, *self.row_shape), dtype=self.dtype, device=self.device)
        pages = staging.view(chunk, -1)
        slot_rows = slots.to("cpu", torch.int64).view(n, g.page_size)
        for start in range(0, n, chunk):
            count = min(chunk, n - start)
            futures = [self.read_page(page_hashes[start + i], pages[i]) for i in range(count)]
            statuses = [f.result() for f in futures]
            bad = next((s for s in statuses if not s.ok), None)
            if bad is not None:
                return ReloadOutcome(False, start, start * self.page_bytes, reason=bad.value)
            dst_rows = slot_rows[start : start + count].reshape(-1)
            moves = [
                RowMoves(0, g.staging_rows(count, kv, layer), kv * g.layers + layer, dst_rows)
                for kv in (0, 1)
                for layer in range(g.layers)
            ]
            gather_mixed(GatherPlan.from_rows([staging], self.destinations, moves), [staging], self.destinations)
            if self.device.type == "cuda":
                # The next chunk's reads overwrite the staging buffer.
                torch.cuda.current_stream(self.device).synchronize()
            if on_chunk is not None:
                on_chunk((start + count) * self.page_bytes)
        return ReloadOutcome(True, n, n * self.page_bytes)
