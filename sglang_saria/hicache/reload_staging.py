"""The direct reload's staging in SGLang's memory plan (issue 12, item 6).

`DeviceReloader` holds two chunks of staging on the KV pool's device for its whole life
(`hicache/device_reload.py`), allocated when the radix cache turns direct reload on: after
SGLang has sized the KV pool. Taken then, it would come out of the runtime slack
(``1 - mem_fraction_static``) that activations and CUDA graphs are sized against, and a
long-running server could OOM in a forward pass instead. SGLang has the same problem with
multimodal buffers allocated after sizing and reserves their bytes out of the KV budget
(`mm_runtime_reservation_gb`). Patch 009 does the same for saria in
`KVCacheConfigurator.config_from_budget`, which both the pre-capture sizing and the
post-capture resize go through: :func:`reserve_bytes` is taken off the budget there.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from sglang_saria.hicache.backend import policy_config_from_extra
from sglang_saria.hicache.device_reload import staging_bytes

logger = logging.getLogger(__name__)

_MiB = float(1 << 20)
_reserved: Optional[int] = None  # bytes the last KV sizing in this process reserved; None: no sizing saw the hook


def reserve_bytes(memory_args: Any, cell_bytes_per_token: int, page_size: int) -> int:
    """Bytes the KV sizing must leave free for the reloader this server will build.

    ``memory_args``: SGLang's memory settings (``get_memory()``: enable_hierarchical_cache,
    hicache_storage_backend, hicache_storage_backend_extra_config).

    0 unless HiCache runs the saria backend with ``transfer.direct_reload``; 0 too when SGLang
    prices the pool otherwise than one cell per token (``cell_bytes_per_token`` 0). A
    full-attention page is ``page_size`` cells, so the staging is two chunks of such pages.
    A hybrid model's checkpoint staging (one GDN state page) is not counted here: this
    sizing does not know the mamba state size (`report_staging` says so at startup).
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
            nbytes = staging_bytes(transfer.reload_chunk_pages, page_size * cell_bytes_per_token)
            logger.info(
                "saria: %.1f MiB of the KV budget reserved for the direct reload's staging "
                "(2 x transfer.reload_chunk_pages=%d pages of %d tokens)",
                nbytes / _MiB,
                transfer.reload_chunk_pages,
                page_size,
            )
    _reserved = nbytes
    return nbytes


def report_staging(nbytes: int, device: str, state_bytes: int = 0) -> None:
    """Log the reloader's staging next to the reservation; warn when the KV sizing did not
    reserve it (then it comes out of the runtime slack). ``state_bytes``: a hybrid model's
    checkpoint staging (one MAMBA sidecar page), which patch 009 does not reserve yet: the
    KV sizing there does not know the mamba state size."""
    if state_bytes:
        logger.warning(
            "saria: GDN checkpoint staging %.2f MiB on %s is not reserved at KV sizing; it comes out "
            "of the runtime slack (1 - mem_fraction_static)",
            state_bytes / _MiB,
            device,
        )
    reserved = _reserved
    if reserved is not None and reserved >= nbytes:
        logger.info("saria: direct reload staging %.1f MiB on %s, reserved at KV sizing", nbytes / _MiB, device)
        return
    logger.warning(
        "saria: direct reload staging %.1f MiB on %s, but the KV sizing reserved %s: it comes out of the "
        "runtime slack (1 - mem_fraction_static); is patch 009 applied?",
        nbytes / _MiB,
        device,
        "nothing" if reserved is None else f"{reserved / _MiB:.1f} MiB",
    )
