"""Pure-torch host<->device KV copies for HiCache's `direct` io backend on `--device cpu`.

SGLang 0.5.23 binds these names to `sgl_kernel.kvcacheio` CUDA ops; on a CPU-only
install they are undefined and the first write-through raises NameError. The patch
`003-hicache-cpu-transfers` imports these instead when no accelerator runtime is present.
Semantics follow the CUDA ops: indices are token slots, pages are `page_size` slots,
and the page_first_direct host layout is `[page, layer, slot_in_page, head, dim]`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _page_coords(indices: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    indices = indices.to(torch.int64)
    return indices // page_size, indices % page_size


def transfer_kv_direct(
    src_layers: Sequence[torch.Tensor],
    dst_layers: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    page_size: int,
) -> None:
    """Copy token rows between token-major buffers, layer by layer (layer_first layout)."""
    if len(src_layers) != len(dst_layers):
        raise ValueError(f"transfer_kv_direct: {len(src_layers)} source vs {len(dst_layers)} destination layers")
    src_idx = src_indices.to(torch.int64)
    dst_idx = dst_indices.to(torch.int64)
    for src, dst in zip(src_layers, dst_layers):
        dst[dst_idx] = src[src_idx].to(dst.device)


def transfer_kv_per_layer_direct_pf_lf(
    src_ptrs: Sequence[torch.Tensor],
    dst_ptrs: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    layer_id: int,
    page_size: int,
) -> None:
    """Load one layer from page_first_direct host buffers (K and V) into token-major device layers."""
    pages, slots = _page_coords(src_indices, page_size)
    dst_idx = dst_indices.to(torch.int64)
    for src, dst in zip(src_ptrs, dst_ptrs):
        dst[dst_idx] = src[pages, layer_id, slots].to(dst.device)


def transfer_kv_all_layer_direct_lf_pf(
    src_ptrs: Sequence[torch.Tensor],
    dst_ptrs: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    page_size: int,
) -> None:
    """Back up every layer from token-major device layers (all K, then all V) into page_first_direct host buffers."""
    layers_per_buffer, remainder = divmod(len(src_ptrs), len(dst_ptrs))
    if remainder:
        raise ValueError(
            f"transfer_kv_all_layer_direct_lf_pf: {len(src_ptrs)} device layers do not split over {len(dst_ptrs)} host buffers"
        )
    pages, slots = _page_coords(dst_indices, page_size)
    src_idx = src_indices.to(torch.int64)
    for buffer_id, dst in enumerate(dst_ptrs):
        for layer_id in range(layers_per_buffer):
            src = src_ptrs[buffer_id * layers_per_buffer + layer_id]
            dst[pages, layer_id, slots] = src[src_idx].to(dst.device)
