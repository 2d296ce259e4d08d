"""Where a hybrid model's GDN checkpoints are: on a fixed grid (the paper), or one per computed
prefix at its last aligned block (SGLang's `extra_buffer` strategy, which the server runs); and
what they take in DRAM: token equivalents (the paper), or a slot of a state pool of their own
(SGLang's host pool for GDN states)."""

from __future__ import annotations

import pytest

from sglang_saria.config import MetadataConfig
from sglang_saria.mem_cache.metadata import DRAM, GDN_CHECKPOINT, NO_CHECKPOINT, SSD
from sglang_saria.units import ConfigError
from tests.mem_cache.helpers import make_core, run_request


def _checkpoints(core, keys):
    """Indices of ``keys`` whose node ends on a checkpoint."""
    return [i for i, k in enumerate(keys) if core.metadata.nodes[k].ck_loc != NO_CHECKPOINT]


def test_grid_places_a_checkpoint_on_every_grid_block_and_caches_the_tail():
    core = make_core("none", dram_blocks=20, hybrid=True, checkpoint_blocks=2)
    keys = list(range(1, 6))
    run_request(core, keys, 0.0)
    assert _checkpoints(core, keys) == [1, 3]
    assert all(k in core.dram for k in keys)


def test_prefix_end_places_one_checkpoint_at_the_last_aligned_block_and_drops_the_tail():
    core = make_core("none", dram_blocks=20, hybrid=True, checkpoint_blocks=2, checkpoint_placement="prefix-end")
    keys = list(range(1, 6))  # 5 blocks: the last aligned one is index 3
    run_request(core, keys, 0.0)
    assert _checkpoints(core, keys) == [3]
    assert core.metadata.nodes[4].ck_loc == DRAM
    assert [k in core.dram for k in keys] == [True, True, True, True, False]  # SGLang caches up to its state
    assert core.metadata.created_checkpoints == 1


def test_prefix_end_a_follow_up_hits_to_the_checkpoint_and_adds_its_own():
    core = make_core("none", dram_blocks=20, hybrid=True, checkpoint_blocks=2, checkpoint_placement="prefix-end")
    first = list(range(1, 6))
    run_request(core, first, 0.0)
    second = first + [6, 7, 8]  # 8 blocks: ends on a grid block
    plan, _, _ = run_request(core, second, 1.0)
    assert plan.n_blocks == 4 and plan.ckpt_source == DRAM  # up to the first request's state
    assert _checkpoints(core, second) == [3, 7]
    assert all(k in core.dram for k in second)


def test_prefix_end_a_recomputed_span_keeps_only_its_end_state():
    """The first request's state leaves DRAM with its block; the third recomputes the whole
    prefix, and SGLang tracks one state for it: at its end, not where the first one was."""
    core = make_core("none", dram_blocks=6, hybrid=True, checkpoint_blocks=2, checkpoint_placement="prefix-end")
    first = [1, 2, 3, 4]
    run_request(core, first, 0.0)
    run_request(core, list(range(21, 29)), 1.0)  # another session: DRAM evicts the first one's tail (its state)
    assert 4 not in core.dram and all(k in core.dram for k in (1, 2, 3))
    third = first + [5, 6, 7, 8]
    plan, _, _ = run_request(core, third, 2.0)
    assert plan.n_blocks == 0  # blocks 1-3 are resident, but no state ends there
    assert _checkpoints(core, third) == [7]
    assert core.metadata.nodes[4].ck_loc == NO_CHECKPOINT


def test_prefix_end_checkpoint_on_a_resident_block_resizes_it():
    """A block already in DRAM without a state (cached inside an earlier request's span) that a
    shorter request ends on gets the state: it holds both objects' bytes after."""
    core = make_core("none", dram_blocks=40, hybrid=True, checkpoint_blocks=2, checkpoint_placement="prefix-end")
    run_request(core, [1, 2, 3, 4, 5, 6], 0.0)  # the state at index 5; index 1 (key 2) is no boundary
    tokens_before = core.dram.used_tokens
    assert core.metadata.nodes[2].ck_loc == NO_CHECKPOINT and 2 in core.dram
    run_request(core, [1, 2, 9], 1.0)  # a shorter prompt sharing [1, 2]: its last aligned block is key 2
    assert core.metadata.nodes[2].ck_loc & DRAM
    assert core.dram.size_of(2)[0] == core.block_tokens + core.ckpt_tokens
    assert core.dram.used_tokens == tokens_before + core.ckpt_tokens
    assert 9 not in core.dram


def test_prefix_end_threshold_writes_carry_the_state_to_ssd():
    core = make_core("eviction:E1", dram_blocks=3, ssd_blocks=20, hybrid=True, checkpoint_blocks=2,
                     checkpoint_placement="prefix-end")
    run_request(core, [1, 2, 3, 4], 0.0)
    run_request(core, [11, 12, 13, 14], 1.0)  # pushes the first prefix out of DRAM: its state node is written
    node = core.metadata.nodes[4]
    assert node.ck_loc & SSD and node.fa_loc & SSD
    assert all(core.metadata.nodes[k].fa_loc & SSD for k in (1, 2, 3))  # with its prefix (robust rule)


def test_unknown_placement_names_the_field():
    with pytest.raises(ConfigError, match="metadata.checkpoint_placement"):
        MetadataConfig(block_tokens=16, checkpoint_tokens=64, checkpoint_placement="every-block").validate()


def test_a_dram_state_pool_holds_checkpoints_apart_from_fa_blocks():
    """One state slot: FA blocks take only their tokens, and a second checkpoint evicts from the
    LRU end until the first one's slot is free, although tokens are left."""
    core = make_core("none", dram_blocks=20, hybrid=True, checkpoint_blocks=2, checkpoint_placement="prefix-end",
                     dram_checkpoints=1)
    run_request(core, [1, 2, 3, 4], 0.0)
    assert core.dram.used_tokens == 4 * core.block_tokens  # the checkpoint takes a slot, not tokens
    assert core.dram.states_full
    run_request(core, [11, 12, 13, 14], 1.0)  # another session's state: the first one's must go
    assert core.metadata.nodes[14].ck_loc & DRAM and not core.metadata.nodes[4].ck_loc & DRAM
    assert 4 not in core.dram and all(k in core.dram for k in (1, 2, 3))  # its tail went first, as LRU says
    assert core.dram.used_tokens == 7 * core.block_tokens


def test_without_a_state_pool_a_checkpoint_counts_in_dram_tokens():
    core = make_core("none", dram_blocks=20, hybrid=True, checkpoint_blocks=2, checkpoint_placement="prefix-end")
    run_request(core, [1, 2, 3, 4], 0.0)
    assert core.dram.used_tokens == 4 * core.block_tokens + core.ckpt_tokens


# "sglang": SGLang 0.5.23's own placement. Its state grid is lcm(64, block) tokens: 16 of these 4-token blocks.
GRID = 16


def _sglang_core(chunk_blocks: int = 2048, dram_blocks: int = 400):
    return make_core("none", dram_blocks=dram_blocks, hybrid=True, checkpoint_placement="sglang",
                     prefill_chunk_tokens=chunk_blocks * 4)


def test_sglang_one_chunk_leaves_one_state_at_the_last_grid_step_and_drops_the_tail():
    core = _sglang_core()
    keys = list(range(1, 41))  # 40 blocks: the last grid step ends at 32
    run_request(core, keys, 0.0)
    assert _checkpoints(core, keys) == [31]
    assert [k in core.dram for k in keys] == [True] * 32 + [False] * 8


def test_sglang_chunked_prefill_leaves_a_state_at_every_chunk_end():
    """Chunks of 2 grid steps: states at 32 and 64 (chunk ends), 80 (the last chunk's grid step)."""
    core = _sglang_core(chunk_blocks=2 * GRID)
    keys = list(range(1, 81))
    run_request(core, keys, 0.0)
    assert _checkpoints(core, keys) == [31, 63, 79]
    assert all(k in core.dram for k in keys)


def test_sglang_a_last_chunk_shorter_than_a_grid_step_adds_nothing():
    core = _sglang_core(chunk_blocks=2 * GRID)
    keys = list(range(1, 76))  # the last chunk is 11 blocks: no state, its blocks not cached
    run_request(core, keys, 0.0)
    assert _checkpoints(core, keys) == [31, 63]
    assert [k in core.dram for k in keys] == [True] * 64 + [False] * 11


def test_sglang_chunks_count_from_the_hit():
    """A follow-up reuses the state at 32 and prefills from there: its chunks start at 32."""
    core = _sglang_core(chunk_blocks=2 * GRID)
    first = list(range(1, 41))
    run_request(core, first, 0.0)  # one chunk of 40: state at 32
    second = first + list(range(41, 121))  # 120 blocks
    plan, _, _ = run_request(core, second, 1.0)
    assert plan.n_blocks == 32
    assert _checkpoints(core, second) == [31, 63, 95, 111]  # chunks [32, 64), [64, 96), [96, 120)


def test_sglang_a_full_attention_hit_past_the_last_state_leaves_a_branching_state():
    """B shares 40 blocks with A, whose state is at 48 (off B's path): B hits no state, but its
    full-attention hit sets a branching point at 32, which B's prefill tracks instead of its end
    (48): B caches up to 32. B again then resumes at 32 and leaves its own state at 48."""
    core = _sglang_core()
    a = list(range(1, 49))
    run_request(core, a, 0.0)
    b = a[:40] + list(range(100, 120))  # 60 blocks
    plan, _, _ = run_request(core, b, 1.0)
    assert (plan.n_blocks, plan.fa_blocks) == (0, 40)
    assert _checkpoints(core, b) == [31]
    assert not any(k in core.dram for k in b[40:])  # B's own tail is not cached
    plan, _, _ = run_request(core, b, 2.0)
    assert (plan.n_blocks, plan.fa_blocks) == (32, 40)
    assert _checkpoints(core, b) == [31, 47]


def test_sglang_a_branching_point_in_a_later_chunk_replaces_that_chunk_end():
    """Chunks of 3 grid steps. A's states (48, 96) leave DRAM, its FA blocks stay; B shares 90
    blocks with A: no state on its path, a branching point at 80, in B's second chunk [48, 96),
    which tracks 80 instead of 96."""
    core = _sglang_core(chunk_blocks=3 * GRID)
    a = list(range(1, 101))
    run_request(core, a, 0.0)
    assert _checkpoints(core, a) == [47, 95]
    for i in (47, 95):
        core.metadata.set_location(a[i], GDN_CHECKPOINT, DRAM, False)  # SGLang's state pool dropped it
    b = a[:90] + list(range(200, 230))  # 120 blocks
    plan, _, _ = run_request(core, b, 1.0)
    assert (plan.n_blocks, plan.fa_blocks) == (0, 90)
    assert _checkpoints(core, b) == [47, 79, 111]


def test_sglang_a_branching_state_on_a_stored_block_is_written_when_the_block_leaves_dram():
    """Full duplicate stores A's blocks, only block 32 with a state. B's branching point puts a state
    on block 16, which SSD holds without one. When block 16 leaves DRAM, its state alone is written
    (its bytes counted, no admission asked), so a later hit can end on it from SSD."""
    core = make_core("full-duplicate", dram_blocks=40, ssd_blocks=200, hybrid=True, checkpoint_placement="sglang")
    a = list(range(1, 41))
    run_request(core, a, 0.0)
    run_request(core, list(range(1000, 1040)), 1.0)  # A leaves DRAM: on SSD only
    b = a[:24] + list(range(100, 121))
    plan, _, _ = run_request(core, b, 2.0)
    node = core.metadata.nodes[16]
    assert (plan.n_blocks, plan.fa_blocks) == (0, 24) and (node.fa_loc, node.ck_loc) == (DRAM | SSD, DRAM)
    assert core.ssd.size_of(16) == core._sizes[False]  # SSD's copy has no state
    written = core.ssd.bytes_written
    acts = [a for t, first in ((3.0, 2000), (4.0, 3000)) for a in run_request(core, list(range(first, first + 40)), t)[1:]]
    assert [k for a in acts for k in a.state_writes] == [16] and core.stats.state_writes == 1
    assert (node.fa_loc, node.ck_loc) == (SSD, SSD) and core.ssd.size_of(16) == core._sizes[True]
    blocks = sum(core.ssd.size_of(k)[1] for a in acts for k in a.ssd_writes)  # the fillers' blocks, all held
    assert core.ssd.bytes_written - written == sum(a.ssd_write_bytes for a in acts) == blocks + core.ckpt_bytes
    plan, _, _ = run_request(core, a[:16] + list(range(200, 240)), 5.0)
    assert plan.n_blocks == 16 and plan.uses_ssd


def test_placement_prefill_chunk_must_hold_a_grid_step():
    with pytest.raises(ConfigError, match="metadata.prefill_chunk_tokens"):
        MetadataConfig(block_tokens=16, prefill_chunk_tokens=32).validate()
    with pytest.raises(ConfigError, match="metadata.prefill_chunk_tokens"):
        MetadataConfig(block_tokens=512, prefill_chunk_tokens=8000).validate()
