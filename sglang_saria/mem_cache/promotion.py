"""Lazy partial DRAM promotion (paper 4.4).

After prefill of a request that loaded blocks from SSD, copy SSD-hit blocks (leading
ones first) from GPU to DRAM until DRAM holds a share ``r_eff`` of the reused prefix,
counting blocks already there. ``r_eff = min(r, max(0, 1 - B_gds / B_ingress))``: DRAM
only supplies what GDS cannot. Promotion may displace a DRAM block only if it was not
reused within ``P_tau``. Modes for the paper's comparisons: ``zero`` (GDS path, no
replicas), ``half`` (fixed 50% target), ``full`` (every SSD hit), ``saria``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sglang_saria.config import BandwidthConfig, PromotionConfig


@dataclass(frozen=True)
class PromotionController:
    """Turns (reused prefix, DRAM share, eviction headroom) into a promotion count."""

    mode: str
    ratio: float
    p_tau_s: float
    bandwidth_bound: float  # 1 - B_gds / B_ingress, clipped to [0, 1]

    @classmethod
    def from_config(cls, cfg: PromotionConfig, bw: BandwidthConfig) -> "PromotionController":
        return cls(cfg.mode, cfg.ratio, cfg.p_tau_s, max(0.0, 1.0 - bw.gds_gbps / bw.ingress_gbps))

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
