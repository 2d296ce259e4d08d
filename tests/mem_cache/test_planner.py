"""Paper 4.3: reload plans over interleaved tiers; the hybrid checkpoint rule; baselines."""

from sglang_saria.mem_cache.metadata import DRAM, SSD, ContextMetadata
from sglang_saria.mem_cache.planner import plan_reload

from tests.mem_cache.helpers import make_core, run_request


def _nodes(locs, ckpt_every=None, ck_locs=None):
    md = ContextMetadata(4, 4 * ckpt_every if ckpt_every else None, 100.0)
    keys = list(range(1, len(locs) + 1))
    md.record_use(keys, 0.0)
    for k, loc in zip(keys, locs):
        md.get(k).fa_loc = loc
    for k, ck in (ck_locs or {}).items():
        md.get(k).ck_loc = ck
    return keys, md.nodes


def test_interleaved_dram_ssd_dram_prefix_is_planned_object_by_object():
    keys, nodes = _nodes([DRAM, SSD, DRAM | SSD, DRAM, 0, DRAM])
    plan = plan_reload(keys, nodes, "saria")
    assert plan.n_blocks == 4 and plan.sources == [DRAM, SSD, DRAM, DRAM]  # DRAM preferred when both
    assert (plan.dram_blocks, plan.ssd_blocks) == (3, 1)


def test_lmcache_tier_prefix_lookup_stops_after_switching_to_ssd():
    keys, nodes = _nodes([DRAM, SSD, DRAM | SSD, DRAM, 0, DRAM])
    plan = plan_reload(keys, nodes, "lmcache")
    assert plan.n_blocks == 3 and plan.sources == [DRAM, SSD, SSD]  # the DRAM-only 4th block is recomputed


def test_gds_only_reads_only_ssd():
    keys, nodes = _nodes([SSD, DRAM | SSD, DRAM])
    plan = plan_reload(keys, nodes, "gds-only")
    assert plan.n_blocks == 2 and plan.sources == [SSD, SSD]


def test_block_on_no_tier_is_never_planned():
    keys, nodes = _nodes([DRAM, 0, DRAM])
    assert plan_reload(keys, nodes).n_blocks == 1
    assert plan_reload([99] + keys, nodes).n_blocks == 0  # unknown key ends the prefix


def test_hybrid_boundary_without_checkpoint_is_not_reusable():
    # checkpoint every 2 blocks: nodes 2 and 4 carry one; node 4's checkpoint was dropped
    keys, nodes = _nodes([DRAM] * 5, ckpt_every=2, ck_locs={2: SSD, 4: 0})
    plan = plan_reload(keys, nodes, "saria", hybrid=True)
    assert plan.n_blocks == 2 and plan.ckpt_source == SSD and plan.sources == [DRAM, DRAM]
    keys, nodes = _nodes([DRAM] * 4, ckpt_every=2, ck_locs={2: 0, 4: 0})
    assert plan_reload(keys, nodes, "saria", hybrid=True).n_blocks == 0
    keys, nodes = _nodes([DRAM] * 4, ckpt_every=2, ck_locs={2: DRAM, 4: DRAM | SSD})
    plan = plan_reload(keys, nodes, "saria", hybrid=True)
    assert plan.n_blocks == 4 and plan.ckpt_source == DRAM


def test_hybrid_prefix_shorter_than_first_checkpoint_is_not_reusable():
    keys, nodes = _nodes([DRAM], ckpt_every=2)
    assert plan_reload(keys, nodes, "saria", hybrid=True).n_blocks == 0


def test_hybrid_core_loads_checkpoint_bytes_with_the_prefix():
    core = make_core("full-duplicate", hybrid=True, dram_blocks=8)
    run_request(core, [1, 2, 3], 0.0)
    plan = core.lookup([1, 2, 3, 4])
    assert plan.n_blocks == 2 and plan.ckpt_source == DRAM
    d, s = core.plan_bytes(plan)
    assert d == 2 * core.block_bytes + core.spec.checkpoint_bytes and s == 0
