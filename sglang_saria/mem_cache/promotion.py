"""Lazy partial DRAM promotion (paper 4.4): every promotion decision of both drivers.

After prefill of a request that loaded blocks from SSD, copy SSD-hit blocks (leading
ones first) from GPU to DRAM until DRAM holds a share ``r_eff`` of the reused prefix,
counting blocks already there. ``r_eff = min(r, max(0, 1 - B_gds / B_ingress))``: DRAM
only supplies what GDS cannot (``promotion.bandwidth_cap = false`` lifts the bound,
``r_eff = r``: the paper's Figure 15 sweep). Promotion may displace a DRAM block only if it
was not reused within ``P_tau`` and, under the robust admission rule, only if SSD holds it
(``may_displace``). Modes for the paper's comparisons: ``zero`` (GDS path, no replicas),
``half`` (fixed 50% target), ``full`` (every SSD hit), ``saria``.

Both drivers ask ``promotion_set`` with what they see: the replay's ``SariaCore._promote``
(tokens, its DRAM tier) and the server's ``SariaHiCachePolicy.promotion_pages`` (pages, the
radix tree's host leaves).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sglang_saria.config import BandwidthConfig, PromotionConfig
from sglang_saria.mem_cache.metadata import ContextNode


@dataclass(frozen=True)
class PromotionController:
    """Turns (reused prefix, DRAM share, eviction headroom) into a promotion count."""

    mode: str
    ratio: float
    p_tau_s: float
    bandwidth_bound: float  # 1 - B_gds / B_ingress, clipped to [0, 1]; 1 when the config lifts the cap

    @classmethod
    def from_config(cls, cfg: PromotionConfig, bw: BandwidthConfig) -> "PromotionController":
        bound = max(0.0, 1.0 - bw.gds_gbps / bw.ingress_gbps) if cfg.bandwidth_cap else 1.0
        return cls(cfg.mode, cfg.ratio, cfg.p_tau_s, bound)

    @property
    def r_eff(self) -> float:
        """Target DRAM share of the reused prefix."""
        if self.mode == "zero":
            return 0.0
        if self.mode == "half":
            return 0.5
        if self.mode == "full":
            return 1.0
        return min(self.ratio, self.bandwidth_bound)

    @property
    def protects_recent(self) -> bool:
        """Only Saria's mode refuses to evict blocks reused within ``P_tau``."""
        return self.mode == "saria"

    def evictable(self, now: float, t_reuse: float) -> bool:
        """May a DRAM block last reused at ``t_reuse`` be displaced by a promotion?"""
        return not self.protects_recent or now - t_reuse >= self.p_tau_s

    def target_blocks(self, reused_blocks: int, in_dram: int, candidates: int) -> int:
        """How many SSD-hit blocks to replicate, before the DRAM-headroom limit.

        ``ceil(r_eff * reused) - in_dram``, clipped to ``[0, candidates]``.
        """
        want = math.ceil(self.r_eff * reused_blocks - 1e-9) - in_dram
        return max(0, min(want, candidates))

    def may_displace(self, now: float, node: ContextNode, on_ssd: bool, robust: bool) -> bool:
        """Whether a promotion may displace a DRAM node: not reused within ``P_tau``, and under the
        robust rule (``robust``) held by SSD (a replica never displaces the only copy)."""
        return (on_ssd or not robust) and self.evictable(now, node.t_reuse)

    def promotion_set(self, now: float, reused: int, in_dram: int, sizes: Sequence[int], free: int,
                      head: Iterable[tuple[ContextNode | None, bool, int]], robust: bool) -> int:
        """How many leading SSD-hit candidates a promotion copies to DRAM, for both drivers.

        ``reused``: blocks of the reused prefix, ``in_dram`` of them in DRAM; ``sizes``: the SSD-hit
        candidates' sizes, head first, in the driver's unit (replay: tokens, server: pages); ``free``:
        DRAM free space in that unit; ``head``: DRAM's eviction order as (counters or None, on SSD,
        size), read lazily; ``robust``: the admission's robust rule is on (``WriteSequencer.robust``).
        The target is ``target_blocks`` candidates, cut to those that fit in free space plus the
        victims a promotion may displace (``may_displace``), counted from the eviction end up to the
        first it may not (nothing behind it can go before it) and no further than needed. Counters
        None: unknown to the policy, displaceable.
        """
        n = self.target_blocks(reused, in_dram, len(sizes))
        if n == 0:
            return 0
        chosen = sizes[:n]
        budget = free
        need = sum(chosen)
        if budget < need:
            may_displace = self.may_displace
            for counters, on_ssd, size in head:
                if counters is not None and not may_displace(now, counters, on_ssd, robust):
                    break
                budget += size
                if budget >= need:
                    break
        count = 0
        for size in chosen:
            if size > budget:
                break
            budget -= size
            count += 1
        return count
