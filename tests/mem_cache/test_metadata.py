"""Paper 4.3: unified metadata outlives residency; sliding-window reclamation."""

from sglang_saria.mem_cache.metadata import (DRAM, FA_BLOCK, GDN_CHECKPOINT, NO_CHECKPOINT, SSD, ContextMetadata,
                                             bypassed)

from tests.mem_cache.helpers import make_core, run_request


def test_R_counts_each_request_after_first_computation_hit_or_recompute():
    md = ContextMetadata(4, None, 100.0)
    md.record_use([1, 2], 0.0)
    assert md.get(1).R == 0
    md.record_use([1, 2, 3], 1.0)
    md.record_use([1], 2.0)
    assert (md.get(1).R, md.get(2).R, md.get(3).R) == (2, 1, 0)
    assert md.get(1).t_reuse == 2.0


def test_record_use_reports_keys_reaching_theta_R_once():
    md = ContextMetadata(4, None, 100.0)
    md.record_use([1, 2], 0.0, r_watch=2)
    assert md.record_use([1, 2], 1.0, r_watch=2) == []
    assert md.record_use([1], 2.0, r_watch=2) == [1]
    assert md.record_use([1, 2], 3.0, r_watch=2) == [2]


def test_checkpoint_objects_only_on_boundaries():
    md = ContextMetadata(4, 8, 100.0)  # checkpoint every 2 blocks
    md.record_use([1, 2, 3, 4], 0.0)
    assert [md.get(k).ck_loc for k in (1, 2, 3, 4)] == [NO_CHECKPOINT, 0, NO_CHECKPOINT, 0]
    md.set_location(2, GDN_CHECKPOINT, SSD, True)
    md.set_location(2, FA_BLOCK, DRAM, True)
    assert md.get(2).ck_loc == SSD and md.get(2).fa_loc == DRAM


def test_metadata_reclaimed_only_after_window_without_use_and_no_tier_holding_it():
    core = make_core("none", window_s=100.0)
    run_request(core, [1], 0.0)
    run_request(core, [10, 11, 12, 13], 50.0)  # evicts 1: no tier holds it now
    assert core.metadata.get(1) is not None and core.metadata.get(1).E == 1
    run_request(core, [10, 11, 12, 13], 99.0)
    assert core.metadata.get(1) is not None  # still within the window
    run_request(core, [10, 11, 12, 13], 101.0)
    assert core.metadata.get(1) is None  # a whole window without reuse, no location
    assert core.metadata.get(10) is not None
    # held by DRAM but stale: kept until no tier holds it
    run_request(core, [10, 11, 12, 13], 500.0)
    core.metadata.reclaim(10_000.0)
    assert core.metadata.get(10) is not None


def test_reclaimed_block_returns_as_new_with_fresh_counters():
    core = make_core("none", window_s=10.0)
    run_request(core, [1], 0.0)
    run_request(core, [10, 11, 12, 13], 1.0)
    run_request(core, [20, 21, 22, 23], 20.0)
    assert core.metadata.get(1) is None
    run_request(core, [1], 30.0)
    assert core.metadata.get(1).R == 0 and core.metadata.get(1).E == 0


def test_changed_counters_are_taken_once_and_reclaimed_ones_skipped():
    md = ContextMetadata(4, None, 10.0)
    md.changed = set()
    md.record_use([1, 2], 0.0)
    md.get(2).E += 1
    md.note_changed([2])
    assert sorted(k for k, _ in md.take_changed()) == [1, 2]
    assert md.take_changed() == []
    md.note_changed([1])
    md.reclaim(100.0)  # both unused for a whole window, no tier holds them
    assert md.take_changed() == []


def test_restored_counters_keep_their_history_and_count_as_created_at_first_use():
    md = ContextMetadata(4, None, 100.0)
    md.record_use([9], 50.0)
    assert md.restore([(1, 3, 2, 1, 10.0), (2, 0, 1, 0, 20.0), (9, 7, 7, 7, 0.0)]) == 2  # 9 is known: kept as is
    assert (md.get(1).R, md.get(1).E, md.get(1).e_spent, md.get(1).t_reuse) == (3, 2, 1, 10.0)
    assert md.get(9).R == 0 and md.created == 1
    md.record_use([1], 60.0)
    md.record_use([1], 61.0)
    assert md.get(1).R == 5 and md.created == 2  # counted as created once, at its first use here
    # restored nodes are the least recent: a window later the unused one goes first
    md.reclaim(125.0)
    assert md.get(2) is None and md.get(1) is not None and md.get(9) is not None


def test_a_request_that_rewrites_history_goes_around_the_blocks_it_left_out():
    md = ContextMetadata(block_tokens=16, checkpoint_tokens=None, window_s=3600)
    md.record_use([1, 2, 3, 4], now=0.0)  # turn 1
    md.record_use([1, 2, 3, 4, 5], now=10.0)  # turn 2 appends: nothing left out
    assert not any(bypassed(md.get(k)) for k in (1, 2, 3, 4, 5))
    assert md.get(5).path_first is md.get(1) and md.get(1).path_first is None
    md.record_use([1, 2, 30, 40], now=20.0)  # turn 3 rewrote everything after block 2
    assert [bypassed(md.get(k)) for k in (1, 2, 3, 4, 5, 30, 40)] == [False, False, True, True, True, False, False]
    md.record_use([1, 2, 3, 4, 5, 6], now=30.0)  # the old branch is used again: no longer gone around
    assert not any(bypassed(md.get(k)) for k in (3, 4, 5, 6))


def test_keys_that_do_not_start_at_the_root_link_to_the_first_block_given_or_to_none():
    md = ContextMetadata(block_tokens=16, checkpoint_tokens=None, window_s=3600)
    md.record_use([1, 2], now=0.0)
    md.record_use([3, 4], now=0.0, path_first=md.get(1), from_root=False)  # a later segment of the same path
    md.record_use([9], now=0.0, from_root=False)  # a segment whose path is unknown
    assert md.get(3).path_first is md.get(1) and md.get(9).path_first is None
    md.record_use([1, 7], now=5.0)
    assert bypassed(md.get(4)) and not bypassed(md.get(9))
