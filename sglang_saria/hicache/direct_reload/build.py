"""The direct reload's parts for one radix cache, built once when HiCache is initialised.

Direct SSD -> device reload runs with a saria backend whose policy has
`transfer.direct_reload`, a FULL or FULL + MAMBA (hybrid) non-EAGLE tree and pools the
reloader can address row by row; otherwise `build_direct_reload` returns None and the radix
cache leaves storage hits to HiCache's prefetch into host memory.
"""

from __future__ import annotations

import logging
from pathlib import Path
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from sglang.srt.mem_cache.hicache_storage import PoolName
from sglang.srt.mem_cache.unified_cache.components import ComponentType

from sglang_saria.config import SariaConfig, TransferConfig
from sglang_saria.hicache.direct_reload.probe import ReloadProbe
from sglang_saria.hicache.direct_reload.staging import report_staging
from sglang_saria.mem_cache.coordinator import RealTimePacer
from sglang_saria.mem_cache.promotion import PromotionController
from sglang_saria.reload.device import DeviceReloader, UnsupportedPoolLayout
from sglang_saria.reload.gdn_state import StateRows, UnsupportedStatePool
from sglang_saria.reload.pacing_trace import PacingTrace
from sglang_saria.reload.worker import ReloadWorker

logger = logging.getLogger(__name__)


@dataclass
class DirectReload:
    """What a radix cache with direct reload uses: the reloader and the worker running it,
    the coordinator's pacer, the promotion controller, the probe of its tree, and the
    transfer settings (`max_inflight_reload_tokens`, the benchmark-only `blocking_reload`)."""

    reloader: DeviceReloader
    worker: ReloadWorker
    pacer: RealTimePacer
    promotion: PromotionController
    probe: ReloadProbe
    max_inflight_tokens: int
    blocking: bool
    hold_s: float  # a published reload's hold on its device pages, at most (`transfer.reload_hold_s`)

    @property
    def hybrid(self) -> bool:
        return self.probe.hybrid

    def close(self) -> None:
        """Its backend is detached (the scheduler is idle: no job runs): the worker thread ends."""
        self.worker.close()


@dataclass(frozen=True)
class WorkerHooks:
    """The worker's calls back into the cache: the ranks' MIN (built once the reloader is),
    and the store-index drops of pages and checkpoints whose read failed."""

    agreement: Callable[[], Callable[[int], int]]
    drop_pages: Callable[[Sequence[str]], Any]
    drop_state: Callable[[str], Any]


def _tree_kind(cache: Any) -> Optional[bool]:
    """Whether the tree is hybrid (FULL + MAMBA); None when direct reload cannot serve it."""
    components = set(cache.tree_components)
    hybrid = components == {ComponentType.FULL, ComponentType.MAMBA}
    if (components != {ComponentType.FULL} and not hybrid) or cache.tree_core.is_eagle:
        logger.info("saria: direct reload needs a full-attention or GDN hybrid, non-EAGLE tree; using HiCache prefetch")
        return None
    return hybrid


def _reloader(cache: Any, backend: Any, cfg: SariaConfig, hybrid: bool) -> Optional[DeviceReloader]:
    """The reloader over the cache's pools; None (logged) for pools it cannot address."""
    host_pool = cache.cache_controller.mem_pool_host
    try:
        state_rows = StateRows.of_pools(host_pool.entry_map[PoolName.MAMBA].host_pool) if hybrid else None
        return DeviceReloader(
            backend.read_page_async,
            cache.cache_controller.mem_pool_device,
            host_pool.layout,
            cache.page_size,
            backend.page_bytes,
            chunk_pages=cfg.transfer.reload_chunk_pages,
            page_digest=backend.page_digest,
            state_rows=state_rows,
            read_state=backend.read_state_async if hybrid else None,
            # A plan's DRAM part (the host-only run of the match; hybrid: FA pages the tree
            # holds in host memory past its last checkpoint) goes host -> device in the
            # gathers of its SSD pages, paced (`ReloadProbe.tail_host_pages`).
            host_pool=host_pool.entry_map[PoolName.KV].host_pool if hybrid else host_pool,
        )
    except (UnsupportedPoolLayout, UnsupportedStatePool) as e:
        logger.warning("saria: direct reload disabled (%s); using HiCache prefetch into host memory", e)
        return None


def _pacing_trace(transfer: TransferConfig) -> Optional[PacingTrace]:
    if not transfer.pacing_trace:
        return None
    logger.info("saria: pacing trace of every direct reload to %s", transfer.pacing_trace)
    return PacingTrace(Path(transfer.pacing_trace), transfer.mode)


def build_direct_reload(cache: Any, backend: Any, cfg: SariaConfig, hooks: WorkerHooks) -> Optional[DirectReload]:
    """The direct reload of ``cache`` (a `SariaRadixCache` with HiCache initialised) over the
    saria ``backend`` whose policy config is ``cfg``; None where it cannot run."""
    hybrid = _tree_kind(cache)
    if hybrid is None:
        return None
    reloader = _reloader(cache, backend, cfg, hybrid)
    if reloader is None:
        return None
    grid = cache.components[ComponentType.MAMBA].mamba_checkpoint_grid if hybrid else 0
    report_staging(reloader.staging_bytes, str(reloader.device), reloader.state_staging_bytes)
    pacer = RealTimePacer(cfg.bandwidth, cfg.transfer.mode)
    direct = DirectReload(
        reloader=reloader,
        pacer=pacer,
        promotion=PromotionController.from_config(cfg.promotion, cfg.bandwidth),
        worker=ReloadWorker(
            reloader, pacer, hooks.agreement(), hooks.drop_pages, hooks.drop_state, _pacing_trace(cfg.transfer)
        ),
        probe=ReloadProbe(
            cache.tree_core, backend, cache.page_size, cfg.transfer.planner, hybrid, grid, reloader.moves_host_pages
        ),
        max_inflight_tokens=cfg.transfer.max_inflight_reload_tokens,
        blocking=cfg.transfer.blocking_reload,
        hold_s=cfg.transfer.reload_hold_s,
    )
    if direct.blocking:
        logger.warning("saria: transfer.blocking_reload: the scheduler waits for every reload (benchmark-only)")
    logger.info(
        "saria: direct SSD -> device reload on%s, off the scheduler thread (transfer.mode=%s, "
        "max_inflight_reload_tokens=%d, prefetch policy %s, promotion=%s r_eff=%.2f)",
        f" for FA pages and GDN states (checkpoints every {grid} tokens)" if hybrid else "",
        cfg.transfer.mode,
        cfg.transfer.max_inflight_reload_tokens,
        cache.prefetch_stop_policy,
        cfg.promotion.mode,
        direct.promotion.r_eff,
    )
    return direct
