"""``metadata.dram_residency``: "flat" lets a DRAM block sit behind an SSD-only ancestor (a later request
reads DRAM after SSD); "tree" keeps DRAM as SGLang's host tier is, every DRAM block's ancestors in DRAM."""

import random

import pytest

from sglang_saria.config import ConfigError, MetadataConfig
from sglang_saria.mem_cache.admission import AdmissionEvent
from sglang_saria.mem_cache.metadata import DRAM, ROOT, SSD
from sglang_saria.replay.core import Actions, SariaCore

from tests.mem_cache.helpers import make_core, run_request


def orphans(core: SariaCore) -> list[int]:
    """DRAM blocks whose parent is not in DRAM (the shape SGLang's host tier cannot have)."""
    nodes = core.metadata.nodes
    return [k for k in core.dram.victims() if nodes[k].parent != ROOT and not nodes[nodes[k].parent].fa_loc & DRAM]


def dram_after_ssd(plan) -> bool:
    """The plan reads a block from DRAM after one from SSD."""
    src = plan.sources
    return SSD in src and DRAM in src[src.index(SSD):]


def _ssd_only(core: SariaCore, keys: list[int], t: float = 0.0) -> None:
    """``keys`` computed under full-duplicate (on SSD and DRAM), then their DRAM copies dropped."""
    run_request(core, keys, t)
    for k in keys:
        core.dram.remove(k)
        core.metadata.get(k).fa_loc &= ~DRAM


def _grow_after_ssd_hits(residency: str):
    """Blocks 1-6 on SSD only; a request reuses them and computes 7, 8; a third request asks for 1-8."""
    core = make_core("full-duplicate", dram_blocks=32, ssd_blocks=32, dram_residency=residency)
    _ssd_only(core, [1, 2, 3, 4, 5, 6])
    plan2, _, acts2 = run_request(core, [1, 2, 3, 4, 5, 6, 7, 8], 10.0)
    assert plan2.ssd_blocks == 6
    plan3, _, _ = run_request(core, [1, 2, 3, 4, 5, 6, 7, 8], 20.0)
    return core, acts2, plan3


def test_flat_dram_holds_computed_blocks_behind_ssd_hits():
    core, acts2, plan3 = _grow_after_ssd_hits("flat")
    assert acts2.promotions == []  # promotion "zero": the SSD hits stay out of DRAM
    assert dram_after_ssd(plan3)
    assert plan3.sources == [SSD] * 6 + [DRAM] * 2


def test_tree_dram_copies_ssd_hits_with_the_blocks_computed_after_them():
    core, acts2, plan3 = _grow_after_ssd_hits("tree")
    assert acts2.promotions == [1, 2, 3, 4, 5, 6]  # write-through backs the unbacked ancestors up, head first
    assert acts2.promotion_bytes == 6 * core.block_bytes
    assert core.stats.promoted_blocks == 6
    assert not dram_after_ssd(plan3)
    assert plan3.sources == [DRAM] * 8
    assert orphans(core) == []


def test_tree_dram_leaves_ssd_hits_out_when_nothing_is_computed_after_them():
    """No new block: no write-through, so only the promotion's share (none, "zero") enters DRAM."""
    core = make_core("full-duplicate", dram_blocks=32, ssd_blocks=32, dram_residency="tree")
    _ssd_only(core, [1, 2, 3, 4])
    _, _, acts = run_request(core, [1, 2, 3, 4], 10.0)
    assert acts.promotions == [] and len(core.dram) == 0


def test_tree_promotion_enters_head_first_and_stays_a_prefix():
    core = make_core("full-duplicate", dram_blocks=32, ssd_blocks=32, promotion="saria", ratio=0.5,
                     dram_residency="tree")
    _ssd_only(core, list(range(1, 9)))
    _, _, acts = run_request(core, list(range(1, 9)), 100.0)
    assert acts.promotions == [1, 2, 3, 4]  # the leading half, head first
    assert orphans(core) == []
    assert core.dram.victims().__next__() == 4  # then touched deepest first: the head is the most recent


def test_tree_chain_stops_where_only_the_request_is_left_to_evict():
    """A request longer than DRAM: its head enters, the rest does not (nor is it written: its backup failed)."""
    core = make_core("full-duplicate", dram_blocks=4, ssd_blocks=32, dram_residency="tree")
    _, _, acts = run_request(core, [1, 2, 3, 4, 5, 6], 0.0)
    assert sorted(core.dram.victims()) == [1, 2, 3, 4]
    assert acts.ssd_writes == [1, 2, 3, 4]
    assert orphans(core) == []


def test_tree_never_evicts_the_request_s_own_prefix_for_its_new_blocks():
    """Another request's blocks go first, even when the request's prefix is older."""
    core = make_core("eviction:E2", dram_blocks=6, ssd_blocks=32, dram_residency="tree")
    run_request(core, [1, 2, 3], 0.0)
    plan, _ = core.begin_request([1, 2, 3, 4, 5], 1.0)  # in flight while another request fills DRAM
    run_request(core, [10, 11, 12], 2.0)
    core.finish_request([1, 2, 3, 4, 5], plan, 3.0)
    assert sorted(core.dram.victims()) == [1, 2, 3, 4, 5, 10]  # 12 and 11 evicted (leaves first), not 1-3
    assert orphans(core) == []


def _random_requests(seed: int, n: int) -> list[list[int]]:
    """Agent-like sessions: each request extends a previous one's prefix (a cut of it) with new blocks."""
    rng = random.Random(seed)
    made: list[list[int]] = []
    nxt = 1
    for _ in range(n):
        base = rng.choice(made)[: rng.randint(0, 12)] if made and rng.random() < 0.8 else []
        new = list(range(nxt, nxt + rng.randint(1, 6)))
        nxt += len(new)
        made.append(base + new)
    return made


@pytest.mark.parametrize("policy,promotion", [("full-duplicate", "zero"), ("eviction:E2", "saria"),
                                              ("eviction:E1", "full"), ("auto", "saria")])
def test_tree_residency_never_has_the_shape_and_flat_does(policy, promotion):
    """The same requests, DRAM and SSD both tight: "tree" never leaves a DRAM block behind a missing
    ancestor nor plans DRAM after SSD; "flat" does both."""
    seen = {}
    for residency in ("flat", "tree"):
        core = make_core(policy, dram_blocks=10, ssd_blocks=24, promotion=promotion, ratio=0.5,
                         dram_residency=residency)
        shapes = bad = 0
        for i, keys in enumerate(_random_requests(7, 400)):
            plan, _, _ = run_request(core, keys, float(i))
            shapes += dram_after_ssd(plan)
            bad += bool(orphans(core))
        assert core.stats.dram_after_ssd_requests == shapes  # the core's own count of the shape
        assert core.stats.ssd_hit_requests > shapes
        seen[residency] = (shapes, bad)
    assert seen["tree"] == (0, 0)
    assert seen["flat"][0] > 0 and seen["flat"][1] > 0


def test_dram_residency_is_validated():
    with pytest.raises(ConfigError, match="metadata.dram_residency='radix'"):
        MetadataConfig(dram_residency="radix").validate()


@pytest.mark.parametrize("placement", ["grid", "prefix-end"])
def test_tree_residency_holds_on_a_hybrid_model(placement):
    """GDN checkpoints change node sizes (a node re-enters DRAM at its new size, ``_keep_states``) and
    plans end on checkpoints: the tree shape holds all the same, with SSD hits planned."""
    core = make_core("eviction:E2", dram_blocks=6, ssd_blocks=40, hybrid=True, checkpoint_placement=placement,
                     promotion="saria", ratio=0.5, dram_residency="tree")
    for i, keys in enumerate(_random_requests(11, 400)):
        plan, _, _ = run_request(core, keys, float(i))
        assert not dram_after_ssd(plan) and not orphans(core)
    assert core.stats.ssd_hit_requests > 0 and core.stats.dram_after_ssd_requests == 0


def test_tree_promotion_stops_at_a_prefix_block_that_left_dram_while_the_request_ran():
    """Block 1 (DRAM only) is evicted by another request between the request's begin and finish; the
    promotion of the SSD hits 2, 3 after it would leave them behind a missing ancestor: none is copied."""
    core = make_core("eviction:E2", dram_blocks=4, ssd_blocks=32, promotion="full", rule="paper", p_tau=0.5,
                     dram_residency="tree")  # DRAM's head is displaceable once idle for P_tau
    run_request(core, [1, 2, 3], 0.0)
    for k in (2, 3):  # on SSD only
        core._write(k, core.metadata.get(k), Actions(), AdmissionEvent.INSERT)
        core.dram.remove(k)
        core.metadata.get(k).fa_loc &= ~DRAM
    plan, _ = core.begin_request([1, 2, 3], 1.0)
    assert plan.sources == [DRAM, SSD, SSD]
    run_request(core, [10, 11, 12, 13], 2.0)  # fills DRAM: block 1 goes (E2: not written at its first eviction)
    assert core.metadata.get(1).fa_loc == 0
    acts = core.finish_request([1, 2, 3], plan, 3.0)
    assert acts.promotions == [] and orphans(core) == []
    flat = make_core("eviction:E2", dram_blocks=4, ssd_blocks=32, promotion="full", rule="paper", p_tau=0.5)
    run_request(flat, [1, 2, 3], 0.0)
    for k in (2, 3):
        flat._write(k, flat.metadata.get(k), Actions(), AdmissionEvent.INSERT)
        flat.dram.remove(k)
        flat.metadata.get(k).fa_loc &= ~DRAM
    plan, _ = flat.begin_request([1, 2, 3], 1.0)
    run_request(flat, [10, 11, 12, 13], 2.0)
    assert sorted(flat.finish_request([1, 2, 3], plan, 3.0).promotions) == [2, 3]  # flat copies them behind the gap
    assert sorted(orphans(flat)) == [2]
