"""What a published direct reload leaves behind besides the tree: the KV audit of its pages,
its metrics and its log lines (`SariaRadixCache.publish_reload` calls these)."""

from __future__ import annotations

import logging
import time

import torch
from sglang.srt.mem_cache.hicache_storage import PoolName

from sglang_saria.hicache.audit.kv import KVAudit
from sglang_saria.hicache.metrics import SariaServingMetrics
from sglang_saria.reload.pending import PendingReload, job_reason

logger = logging.getLogger("sglang_saria.hicache.radix_cache")  # a reload's lines under the radix cache's logger


def audit_reload(audit: KVAudit, pending: PendingReload, hashes: list[str], published: torch.Tensor,
                 dram_tokens: int) -> None:
    """SGLANG_SARIA_AUDIT_KV=1: the reloaded pages' bytes against what left the device."""
    audit.store_to_device(PoolName.KV.value, hashes, published[dram_tokens:])
    if dram_tokens:
        audit.host_to_device(PoolName.KV.value, pending.job.host_slots, published[:dram_tokens])
    if pending.state_slot is not None and PoolName.MAMBA.value in audit.pools:
        audit.store_to_device(PoolName.MAMBA.value, [pending.state_key], pending.state_slot)


def report_reload(metrics: SariaServingMetrics, pending: PendingReload, dram_tokens: int, ssd_tokens: int) -> None:
    """Metrics and log lines of a published reload (a partial one: the rest is recomputed)."""
    rid, job = pending.request.rid, pending.job
    metrics.reloaded("dram", pending.host_tokens + dram_tokens)
    metrics.reloaded("ssd", ssd_tokens)
    if job.pages < len(job.page_hashes):
        # The rest of the prefix is recomputed; what landed is kept.
        metrics.reload_fallback(job_reason(job))
        logger.warning(
            "saria reload %s: %d of %d SSD pages loaded (%s); recomputing the rest",
            rid, job.pages, len(job.page_hashes), job.reason,
        )
    logger.debug(
        "saria reload %s: %d device + %d dram + %d ssd tokens (plan %d/%d blocks), read in %.2f ms "
        "off the scheduler thread, %.2f ms from arrival to admission",
        rid, pending.start - pending.host_tokens, pending.host_tokens + dram_tokens, ssd_tokens,
        pending.plan.dram_blocks, pending.plan.ssd_blocks, job.seconds * 1e3, (time.monotonic() - job.submitted) * 1e3,
    )
