"""The serving path's reload plans for hybrid trees come from the core's planner with real
checkpoints: a reusable prefix ends on a track-interval boundary whose GDN state a tier
holds (host `MambaPoolHost` copy or store sidecar); FA pages before it keep their own
sources, DRAM and SSD interleaved."""

from __future__ import annotations

from sglang_saria.reload.plan import PageObjects, checkpoint_loc, on_boundary, plan_pages
from sglang_saria.mem_cache.metadata import DRAM, NO_CHECKPOINT, SSD

PAGE = 16
TRACK = 64  # a checkpoint boundary every 4 pages


def pages(fa: list[int], states: dict[int, int]) -> list[PageObjects]:
    """Pages 0..n-1 with FA locations ``fa`` and states ``{page index: loc}`` (boundaries only)."""
    out = []
    for i, loc in enumerate(fa):
        end = (i + 1) * PAGE
        ck = states.get(i, 0)
        out.append(PageObjects(i, loc, checkpoint_loc(end, TRACK, bool(ck & DRAM), bool(ck & SSD))))
    return out


def test_only_pages_on_a_track_interval_boundary_carry_a_checkpoint():
    assert [on_boundary(e, TRACK) for e in (16, 48, 64, 96, 128)] == [False, False, True, False, True]
    assert checkpoint_loc(48, TRACK, True, True) == NO_CHECKPOINT
    assert checkpoint_loc(64, TRACK, False, False) == 0
    assert checkpoint_loc(64, TRACK, False, True) == SSD
    assert checkpoint_loc(128, TRACK, True, True) == DRAM | SSD
    assert checkpoint_loc(64, 0, True, True) == NO_CHECKPOINT  # FA-only model


def test_hybrid_prefix_ends_on_the_last_checkpoint_a_tier_holds():
    # 10 SSD pages; sidecars at pages 3 (64 tokens) and 7 (128); pages 8-9 run past the last one.
    plan = plan_pages(pages([SSD] * 10, {3: SSD, 7: SSD}), "saria", hybrid=True)
    assert (plan.n_blocks, plan.ssd_blocks, plan.dram_blocks, plan.ckpt_source) == (8, 8, 0, SSD)


def test_fa_only_plan_ignores_checkpoints():
    plan = plan_pages(pages([SSD] * 10, {3: SSD}), "saria", hybrid=False)
    assert (plan.n_blocks, plan.ssd_blocks, plan.ckpt_source) == (10, 10, 0)


def test_boundary_without_a_stored_state_is_not_reusable():
    # The store holds page 7's FA block but not its state: the prefix stops at page 3.
    plan = plan_pages(pages([SSD] * 8, {3: SSD, 7: 0}), "saria", hybrid=True)
    assert (plan.n_blocks, plan.ckpt_source) == (4, SSD)


def test_no_checkpoint_no_hybrid_reload():
    plan = plan_pages(pages([SSD] * 3, {}), "saria", hybrid=True)
    assert (plan.n_blocks, plan.uses_ssd) == (0, False)


def test_dram_ssd_dram_fa_pages_interleave_before_the_checkpoint():
    fa = [DRAM, DRAM, SSD, SSD, DRAM | SSD, SSD, DRAM, SSD]
    plan = plan_pages(pages(fa, {7: SSD}), "saria", hybrid=True)
    assert plan.sources == [DRAM, DRAM, SSD, SSD, DRAM, SSD, DRAM, SSD]
    assert (plan.n_blocks, plan.dram_blocks, plan.ssd_blocks, plan.ckpt_source) == (8, 4, 4, SSD)


def test_state_from_ssd_with_every_fa_page_from_dram():
    # The host pool holds the FA pages; the state at their end is only in the store.
    plan = plan_pages(pages([DRAM] * 8, {3: DRAM, 7: SSD}), "saria", hybrid=True)
    assert (plan.n_blocks, plan.dram_blocks, plan.ssd_blocks, plan.ckpt_source) == (8, 8, 0, SSD)
    assert plan.uses_ssd


def test_a_state_in_both_tiers_comes_from_dram():
    plan = plan_pages(pages([SSD] * 4, {3: DRAM | SSD}), "saria", hybrid=True)
    assert plan.ckpt_source == DRAM


def test_lmcache_baseline_applies_the_same_checkpoint_rule():
    fa = [DRAM, SSD, DRAM, SSD, SSD, SSD, SSD, SSD]
    plan = plan_pages(pages(fa, {3: SSD, 7: SSD}), "lmcache", hybrid=True)
    # The tier-prefix lookup never returns to DRAM after page 1: page 2 (DRAM only) ends it.
    assert plan.n_blocks == 0
