"""The direct reload's staging in SGLang's memory plan.

`DeviceReloader` holds two chunks of staging on the KV pool's device for its whole life
(`reload/device.py`), allocated when the radix cache turns direct reload on: after
SGLang has sized the KV pool. Taken then, it would come out of the runtime slack
(``1 - mem_fraction_static``) that activations and CUDA graphs are sized against, and a
long-running server could OOM in a forward pass instead. SGLang has the same problem with
multimodal buffers allocated after sizing and reserves their bytes out of the KV budget
(`mm_runtime_reservation_gb`). The plugin hook on `KVCacheConfigurator.config_from_budget`
(`plugin/cache.py`), which both the pre-capture sizing and the post-capture resize go through,
does the same for saria: :func:`reserve_bytes` is taken off the budget there.

A hybrid (FA + GDN) model's reloader stages FA pages of the full-attention layers only (the
cell SGLang prices its KV pool with counts only those) and one GDN checkpoint page besides:
:func:`checkpoint_bytes` prices it from the mamba state shape SGLang sizes its state pool with.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from sglang_saria.hicache.backend import policy_config_from_extra
from sglang_saria.reload.device import staging_bytes

logger = logging.getLogger(__name__)

_MiB = float(1 << 20)
_reserved: Optional[int] = None  # bytes the last KV sizing in this process reserved; None: no sizing saw the hook


def checkpoint_bytes(mambaish_config: Any, start_layer: int, end_layer: int) -> int:
    """Bytes of the reloader's GDN checkpoint staging: one state page, the temporal and conv
    states of this rank's mamba layers (those in [start_layer, end_layer), as SGLang's device
    state pool holds them). Priced from ``mamba2_cache_params``, the shape SGLang sizes its
    state pool with; ``mamba_cache_per_req`` counts every mamba layer of the model. 0 for a
    model without mamba states (``mambaish_config`` None)."""
    if mambaish_config is None:
        return 0
    params = mambaish_config.mamba2_cache_params
    if not params.layers:
        return 0
    local = sum(1 for layer in params.layers if start_layer <= layer < end_layer)
    return params.mamba_cache_per_req // len(params.layers) * local


def reserve_bytes(memory_args: Any, cell_bytes_per_token: int, page_size: int, state_bytes: int = 0) -> int:
    """Bytes the KV sizing must leave free for the reloader this server will build.

    ``memory_args``: SGLang's memory settings (``get_memory()``: enable_hierarchical_cache,
    hicache_storage_backend, hicache_storage_backend_extra_config). ``state_bytes``: a hybrid
    model's checkpoint staging (:func:`checkpoint_bytes`), 0 otherwise.

    0 unless HiCache runs the saria backend with ``transfer.direct_reload``; 0 too when SGLang
    prices the pool otherwise than one cell per token (``cell_bytes_per_token`` 0, e.g. MLA):
    no reloader is built there. A full-attention page is ``page_size`` cells, so the FA
    staging is two chunks of such pages; the checkpoint staging comes on top.
    """
    global _reserved
    nbytes = 0
    if (
        getattr(memory_args, "enable_hierarchical_cache", False)
        and getattr(memory_args, "hicache_storage_backend", None) == "saria"
        and cell_bytes_per_token > 0
    ):
        from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController

        raw = memory_args.hicache_storage_backend_extra_config
        transfer = policy_config_from_extra(HybridCacheController.parse_storage_backend_extra_config(raw)[0]).transfer
        if transfer.direct_reload:
            nbytes = staging_bytes(transfer.reload_chunk_pages, page_size * cell_bytes_per_token) + state_bytes
            logger.info(
                "saria: %d bytes (%.1f MiB) of the KV budget reserved for the direct reload's staging "
                "(2 x transfer.reload_chunk_pages=%d pages of %d tokens%s)",
                nbytes,
                nbytes / _MiB,
                transfer.reload_chunk_pages,
                page_size,
                f", one GDN checkpoint of {state_bytes} bytes" if state_bytes else "",
            )
    _reserved = nbytes
    return nbytes


def report_staging(nbytes: int, device: str, state_bytes: int = 0) -> None:
    """Log the reloader's staging, FA pages ``nbytes`` plus a hybrid model's checkpoint page
    ``state_bytes``, next to the reservation; warn when the KV sizing reserved less (the rest
    then comes out of the runtime slack)."""
    total = nbytes + state_bytes
    what = f"{total} bytes ({total / _MiB:.1f} MiB)"
    if state_bytes:
        what += f": FA pages {nbytes} + GDN checkpoint {state_bytes}"
    reserved = _reserved
    if reserved is not None and reserved >= total:
        logger.info("saria: direct reload staging %s on %s, reserved at KV sizing", what, device)
        return
    logger.warning(
        "saria: direct reload staging %s on %s, but the KV sizing reserved %s: it comes out of the "
        "runtime slack (1 - mem_fraction_static); is the sglang-saria plugin loaded (SGLANG_PLUGINS)?",
        what,
        device,
        "nothing" if reserved is None else f"{reserved} bytes",
    )
