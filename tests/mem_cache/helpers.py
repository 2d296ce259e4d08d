"""Small hand-built cores: 4-token blocks so capacities are counted in blocks by hand."""

from __future__ import annotations

from sglang_saria.config import SariaConfig
from sglang_saria.mem_cache.metadata import DRAM, SSD
from sglang_saria.replay.core import SariaCore
from sglang_saria.model_specs import ModelSpec

BT = 4
FA_SPEC = ModelSpec("tiny-fa", fa_layers=1, kv_heads=1, head_dim=4)  # 16 bytes/token
HYBRID_SPEC = ModelSpec(
    "tiny-hybrid", fa_layers=1, kv_heads=1, head_dim=4, gdn_layers=1,
    gdn_key_heads=1, gdn_value_heads=1, gdn_key_head_dim=2, gdn_value_head_dim=2,
)


def make_core(policy: str = "eviction:E2", dram_blocks: int = 4, ssd_blocks: int = 8, *, hybrid: bool = False,
              checkpoint_blocks: int = 2, prewrite: bool = False, promotion: str = "zero", ratio: float = 0.4,
              p_tau: float = 60.0, planner: str = "saria", window_s: float = 1000.0, bw=(48.0, 20.0, 48.0),
              rule: str = "robust", checkpoint_placement: str = "grid", dram_checkpoints: int = 0,
              prefill_chunk_tokens: int = 8192, dram_residency: str = "flat") -> SariaCore:
    spec = HYBRID_SPEC if hybrid else FA_SPEC
    per_block = BT + (spec.checkpoint_token_equiv if hybrid else 0)  # capacity in "blocks" for hand counting
    cfg = SariaConfig.from_dict(
        {
            "admission": {"policy": policy, "prewrite": prewrite, "prewrite_depth_blocks": 2, "rule": rule},
            "metadata": {"block_tokens": BT, "checkpoint_tokens": BT * checkpoint_blocks, "metadata_window_s": window_s,
                         "checkpoint_placement": checkpoint_placement, "prefill_chunk_tokens": prefill_chunk_tokens,
                         "dram_residency": dram_residency},
            "promotion": {"mode": promotion, "ratio": ratio, "p_tau_s": p_tau},
            "bandwidth": {"ingress_gbps": bw[0], "gds_gbps": bw[1], "dram_gbps": bw[2]},
            "transfer": {"planner": planner},
            "capacity": {"dram_tokens": dram_blocks * (BT if not hybrid else per_block),
                         "ssd_tokens": ssd_blocks * (BT if not hybrid else per_block), "dram_checkpoints": dram_checkpoints},
        },
        source="test",
    )
    return SariaCore(cfg, spec)


def run_request(core: SariaCore, keys: list[int], now: float):
    """begin + finish at the same instant; returns (plan, begin actions, finish actions)."""
    plan, a1 = core.begin_request(keys, now)
    a2 = core.finish_request(keys, plan, now)
    return plan, a1, a2


class FlatView:
    """A tier view for the write sequencer: every key a root child in DRAM, one token, one byte."""

    hybrid = False
    ssd_capacity_tokens = 1_000

    def parent(self, key):
        return None

    def location(self, key):
        return DRAM

    def has_checkpoint(self, key):
        return False

    def size(self, key):
        return 1, 1

    def computed_bytes(self):
        return 1_000


class ChainView(FlatView):
    """Blocks 1 <- 2 <- 3 (a chain from the root), in DRAM unless put in ``on_ssd``."""

    def __init__(self) -> None:
        self.on_ssd: set[int] = set()

    def parent(self, key):
        return key - 1 if key > 1 else None

    def location(self, key):
        return DRAM | (SSD if key in self.on_ssd else 0)

    def ssd_victim(self, tokens):
        return None

    def block_key(self, key):
        return key
