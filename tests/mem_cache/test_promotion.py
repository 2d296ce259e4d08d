"""Paper 4.4: lazy partial promotion bounded by r_eff and protected by P_tau."""

import pytest

from sglang_saria.config import BandwidthConfig, PromotionConfig, SariaConfig
from sglang_saria.mem_cache.admission_factory import make_admission_policy
from sglang_saria.mem_cache.metadata import DRAM, SSD, ContextNode
from sglang_saria.mem_cache.promotion import PromotionController
from sglang_saria.mem_cache.sequencer import WriteSequencer
from sglang_saria.replay.core import SariaCore

from tests.mem_cache.helpers import make_core, run_request


def test_r_eff_is_bounded_by_the_bandwidth_dram_must_supply():
    bw = BandwidthConfig(48, 20, 48)
    assert PromotionController.from_config(PromotionConfig("saria", 0.4), bw).r_eff == 0.4
    assert PromotionController.from_config(PromotionConfig("saria", 0.8), bw).r_eff == pytest.approx(1 - 20 / 48)
    assert PromotionController.from_config(PromotionConfig("saria", 0.8), BandwidthConfig(24, 24, 24)).r_eff == 0.0
    assert PromotionController.from_config(PromotionConfig("half", 0.8), bw).r_eff == 0.5
    assert PromotionController.from_config(PromotionConfig("full", 0.1), bw).r_eff == 1.0
    assert PromotionController.from_config(PromotionConfig("zero", 0.9), bw).r_eff == 0.0


def test_lifting_the_bandwidth_cap_promotes_up_to_r_itself():
    """Figure 15 sweeps r to 1: with ``bandwidth_cap`` off, r_eff = r above 1 - B_gds/B_ingress."""
    bw = BandwidthConfig(48, 20, 48)
    uncapped = PromotionConfig("saria", 0.8, bandwidth_cap=False)
    assert PromotionController.from_config(uncapped, bw).r_eff == 0.8
    assert PromotionController.from_config(PromotionConfig("saria", 1.0, bandwidth_cap=False), bw).r_eff == 1.0
    assert PromotionController.from_config(PromotionConfig("saria", 0.3, bandwidth_cap=False), bw).r_eff == 0.3
    assert PromotionController.from_config(PromotionConfig("zero", 0.8, bandwidth_cap=False), bw).r_eff == 0.0


def test_uncapped_promotion_replicates_r_of_the_prefix_in_the_core():
    capped = make_core("full-duplicate", dram_blocks=32, ssd_blocks=32, promotion="saria", ratio=0.8)
    d = capped.cfg.to_dict()
    d["promotion"]["bandwidth_cap"] = False  # as a server's extra-config would say it
    core = SariaCore(SariaConfig.from_dict(d, source="test"), capped.spec)
    keys = _ssd_only_prefix(core, 12)
    _, _, acts = run_request(core, keys, 100.0)
    assert sorted(acts.promotions) == keys[:10]  # ceil(0.8 * 12) = 10, not the capped 7


def _ssd_only_prefix(core, n, t=0.0):
    keys = list(range(1, n + 1))
    run_request(core, keys, t)  # full-duplicate: on SSD and DRAM
    for k in keys:  # drop the DRAM copies, as if evicted long ago
        core.dram.remove(k)
        core.metadata.get(k).fa_loc &= ~DRAM
    return keys


def test_promotion_replicates_leading_ssd_hits_up_to_r_eff():
    core = make_core("full-duplicate", dram_blocks=32, ssd_blocks=32, promotion="saria", ratio=0.8)
    keys = _ssd_only_prefix(core, 12)
    plan, _, acts = run_request(core, keys, 100.0)
    assert plan.ssd_blocks == 12
    assert sorted(acts.promotions) == keys[:7]  # ceil((1 - 20/48) * 12) = 7, the leading ones
    assert all(core.metadata.get(k).fa_loc == DRAM | SSD for k in keys[:7])


def test_half_promotion_counts_blocks_already_in_dram():
    core = make_core("full-duplicate", dram_blocks=32, ssd_blocks=32, promotion="half")
    keys = _ssd_only_prefix(core, 4)
    core.dram.insert(2, 4, core.block_bytes)
    core.metadata.get(2).fa_loc |= DRAM
    _, _, acts = run_request(core, keys, 100.0)
    assert acts.promotions == [1]  # target 2 of 4, one already in DRAM


def test_zero_promotion_never_replicates():
    core = make_core("full-duplicate", dram_blocks=32, promotion="zero")
    keys = _ssd_only_prefix(core, 4)
    _, _, acts = run_request(core, keys, 100.0)
    assert acts.promotions == [] and core.stats.promoted_blocks == 0


def test_promotion_never_evicts_block_reused_within_P_tau():
    core = make_core("full-duplicate", dram_blocks=4, ssd_blocks=16, promotion="saria", ratio=1.0, p_tau=60.0,
                     bw=(48.0, 1.0, 48.0))
    keys = [1, 2, 3, 4]
    run_request(core, keys, 0.0)
    run_request(core, [10, 11, 12, 13], 100.0)  # DRAM now holds 10..13, reused at t=100
    _, _, acts = run_request(core, keys, 120.0)  # all SSD hits; DRAM full of blocks reused 20 s ago
    assert acts.promotions == [] and acts.dram_evictions == []
    assert all(k in core.dram for k in (10, 11, 12, 13))
    _, _, acts = run_request(core, keys, 200.0)  # 100 s since reuse >= P_tau: they may be displaced
    assert sorted(acts.promotions) == keys and sorted(acts.dram_evictions) == [10, 11, 12, 13]


def test_full_promotion_ignores_recency():
    core = make_core("full-duplicate", dram_blocks=4, ssd_blocks=16, promotion="full")
    run_request(core, [1, 2, 3, 4], 0.0)
    run_request(core, [10, 11, 12, 13], 100.0)
    _, _, acts = run_request(core, [1, 2, 3, 4], 101.0)
    assert sorted(acts.promotions) == [1, 2, 3, 4]
    assert core.metadata.get(10).fa_loc == SSD


def _seq(rule="robust"):
    return WriteSequencer(make_admission_policy("eviction:E2"), rule)


CTRL = PromotionController("full", 1.0, 60.0, 1.0)
SAR = PromotionController("saria", 1.0, 60.0, 1.0)


def _node(t_reuse):
    n = ContextNode(t_reuse, False, -1)
    return n


def test_promotion_set_target_free_space_and_displaceable_head():
    seq = _seq()
    # target ceil(1.0 * 4) - 1 in DRAM = 3 candidates; free space for all
    assert CTRL.promotion_set(100.0, 4, 1, [1, 1, 1], 5, iter(()), seq.robust) == 3
    # no free space: the head's first victim may go (old, on SSD), the second is protected (saria: reused 10 s ago)
    head = [(_node(0.0), True, 2), (_node(90.0), True, 4)]
    assert SAR.promotion_set(100.0, 3, 0, [1, 1, 1], 0, iter(head), seq.robust) == 2
    # robust rule: a victim not on SSD is the only copy, never displaced
    assert SAR.promotion_set(100.0, 3, 0, [1, 1, 1], 0, iter([(_node(0.0), False, 4)]), seq.robust) == 0
    assert SAR.promotion_set(100.0, 3, 0, [1, 1, 1], 0, iter([(_node(0.0), False, 4)]), _seq("paper").robust) == 3
    # unknown counters (a node the policy never saw): displaceable
    assert SAR.promotion_set(100.0, 2, 0, [1, 1], 1, iter([(None, False, 1)]), seq.robust) == 2
    # sizes cut the leading run: the second candidate (a checkpoint node) does not fit
    assert CTRL.promotion_set(100.0, 3, 0, [1, 5, 1], 3, iter(()), seq.robust) == 1


def test_promotion_set_reads_the_head_lazily():
    seq = _seq()
    taken = []

    def head():
        for i in range(100):
            taken.append(i)
            yield _node(0.0), True, 1

    assert SAR.promotion_set(100.0, 3, 0, [1, 1, 1], 1, head(), seq.robust) == 3
    assert taken == [0, 1]  # stops once the need is covered
    taken.clear()
    assert SAR.promotion_set(100.0, 3, 0, [1, 1, 1], 3, head(), seq.robust) == 3
    assert taken == []  # free space is enough: no head read
