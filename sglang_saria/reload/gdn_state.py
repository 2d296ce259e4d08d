"""GDN checkpoints as gather rows (paper 4.3, 5.1): a stored MAMBA sidecar page, SGLang's
host `MambaPoolHost` and the device `MambaPool`, addressed row by row so one gather moves a
node's GDN state next to its FA pages.

A checkpoint has parts: the recurrent (temporal) state and one or more conv states, each
``[layer, *shape]`` in its own dtype (fp32 temporal next to fp16 conv is normal). Their
byte order in a stored sidecar page is the host pool's page (`get_data_page(flat=True)`,
which HiCache's host -> store backup wrote): every layer of the temporal state, then every
layer of each conv state. So a staged page is, per part, a ``[layers, *shape]`` tensor at
a byte offset: its rows are layers. The device pool's part ``p`` of layer ``l`` is
``buffer_info.<p>[l]`` (rows: mamba slots); the host pool's is ``<p>_buffer[:, l, 0]``
(rows: host slots; page-first layouts, the only ones MambaPoolHost takes). A move of one
checkpoint is one row per (part, layer), so a node's state is a handful of segments in
the same launch as its FA rows, whatever the source.

Pools with per-slot side states (`slot_state_device_tensors`) or MTP draft layers keep
HiCache's own load-back: their pages hold more than these parts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from sglang_saria.kernels.gather import RowMoves


class UnsupportedStatePool(ValueError):
    """A mamba pool whose checkpoint pages hold more than the temporal and conv parts."""


@dataclass(frozen=True)
class StatePart:
    """One part of a checkpoint: ``layers`` rows of ``shape`` in ``dtype``, at ``offset`` bytes in a page."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    layers: int
    offset: int

    @property
    def row_bytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.layers * self.row_bytes


class StateRows:
    """Row views of one model's GDN checkpoints on the device, in the host pool and in staged pages."""

    def __init__(self, device_temporal: torch.Tensor, device_conv: list[torch.Tensor], host_pool: Any = None) -> None:
        """``device_temporal`` / ``device_conv``: the device pool's ``[layer, slot, *shape]``
        tensors (`MambaStateBufferInfo`); ``host_pool``: SGLang's `MambaPoolHost` whose
        pages the store holds (None: no host rows, states only from staged pages)."""
        tensors = [("temporal", device_temporal)] + [(f"conv{i}", t) for i, t in enumerate(device_conv)]
        layers = device_temporal.shape[0]
        parts, offset = [], 0
        for name, t in tensors:
            if t.dim() < 2 or t.shape[0] != layers:
                raise UnsupportedStatePool(f"mamba {name} state {tuple(t.shape)} is not [layer={layers}, slot, ...]")
            if offset % t.element_size():
                raise UnsupportedStatePool(f"mamba {name} state starts at byte {offset}, not a multiple of {t.element_size()}")
            part = StatePart(name, t.dtype, tuple(t.shape[2:]), layers, offset)
            parts.append(part)
            offset += part.nbytes
        self.parts: tuple[StatePart, ...] = tuple(parts)
        self.page_bytes = offset
        self.device = device_temporal.device
        # Destinations: part p, layer l at index p * layers + l; rows are device mamba slots.
        self.destinations = [t[l] for _, t in tensors for l in range(layers)]
        self.host_sources: list[torch.Tensor] = []
        if host_pool is not None:
            self.host_sources = self._host_views(host_pool, [t for _, t in tensors])

    @classmethod
    def of_pools(cls, host_pool: Any) -> "StateRows":
        """From SGLang's `MambaPoolHost` (its ``buffer_info`` holds the device tensors)."""
        if getattr(host_pool, "slot_state_device_tensors", ()) or getattr(host_pool, "mtp_draft_buffer_infos", ()):
            raise UnsupportedStatePool("mamba pool with per-slot side states or MTP draft layers")
        info = host_pool.buffer_info
        rows = cls(info.temporal, list(info.conv), host_pool)
        if rows.page_bytes != int(host_pool.get_size_per_token()) * int(host_pool.page_size):
            raise UnsupportedStatePool(
                f"a stored checkpoint is {int(host_pool.get_size_per_token())} bytes, the parts add up to {rows.page_bytes}"
            )
        return rows

    @property
    def layers(self) -> int:
        return self.parts[0].layers

    def _host_views(self, host_pool: Any, device: list[torch.Tensor]) -> list[torch.Tensor]:
        if getattr(host_pool, "layout", None) not in ("page_first", "page_first_direct"):
            raise UnsupportedStatePool(f"mamba host pool layout {getattr(host_pool, 'layout', None)!r}")
        buffers = [host_pool.temporal_buffer, *host_pool.conv_buffer]
        views = []
        for buf, dev, part in zip(buffers, device, self.parts):
            if buf.dtype != dev.dtype or tuple(buf.shape[1:]) != (part.layers, 1, *part.shape):
                raise UnsupportedStatePool(f"mamba host {part.name} buffer {tuple(buf.shape)} {buf.dtype} vs device {tuple(dev.shape)} {dev.dtype}")
            views += [buf[:, l, 0] for l in range(part.layers)]
        return views

    def staged_sources(self, page: torch.Tensor) -> list[torch.Tensor]:
        """Per part, a ``[layers, *shape]`` view of a staged checkpoint page (uint8, ``page_bytes``)."""
        if page.dtype != torch.uint8 or page.numel() != self.page_bytes:
            raise ValueError(f"a staged checkpoint is {self.page_bytes} uint8 bytes, got {page.numel()} {page.dtype}")
        return [
            page[p.offset : p.offset + p.nbytes].view(p.dtype).view(p.layers, *p.shape) for p in self.parts
        ]

    def staged_moves(self, src_base: int, dst_base: int, slot: int) -> list[RowMoves]:
        """Moves of the checkpoint staged in ``sources[src_base + part]`` into device ``slot``."""
        return [
            RowMoves(src_base + p, [l], dst_base + p * self.layers + l, [slot])
            for p in range(len(self.parts))
            for l in range(self.layers)
        ]

    def host_moves(self, src_base: int, dst_base: int, host_slot: int, slot: int) -> list[RowMoves]:
        """Moves of the checkpoint in host slot ``host_slot`` (``sources[src_base:]`` =
        `host_sources`) into device ``slot``."""
        if not self.host_sources:
            raise ValueError("these state rows have no host pool views")
        n = len(self.parts) * self.layers
        return [RowMoves(src_base + i, [host_slot], dst_base + i, [slot]) for i in range(n)]

    def device_state(self, slot: int) -> list[torch.Tensor]:
        """The device rows of ``slot`` in part/layer order (tests, audits)."""
        return [d[slot] for d in self.destinations]


def staging_page(rows: Optional[StateRows]) -> Optional[torch.Tensor]:
    """A staging buffer of one checkpoint page on the state pool's device (None without states)."""
    if rows is None:
        return None
    return torch.empty(rows.page_bytes, dtype=torch.uint8, device=rows.device)


__all__ = ["StatePart", "StateRows", "UnsupportedStatePool", "staging_page"]
