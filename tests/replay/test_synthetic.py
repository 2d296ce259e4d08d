"""Synthetic agent sessions: deterministic per seed and calibrated to the paper's TraceLab stats."""

import numpy as np
import pytest

from sglang_saria.replay.synthetic import SyntheticConfig, generate
from sglang_saria.replay.loaders import load_trace
from sglang_saria.replay.trace import describe

# Paper section 3 / 5.1: TraceLab sessions average 18.4 requests, 83.7K prompt tokens per
# request, and 112.1 s between requests of a session.
TARGET_REQUESTS, TARGET_INPUT, TARGET_GAP_S = 18.4, 83_700, 112.1


def _same(a, b):
    return [(s.session_id, [(r.t, r.idle_before_s, r.input_tokens, r.output_tokens, r.block_keys.tolist())
                            for r in s.requests]) for s in a] == \
           [(s.session_id, [(r.t, r.idle_before_s, r.input_tokens, r.output_tokens, r.block_keys.tolist())
                            for r in s.requests]) for s in b]


def test_same_seed_same_sessions_other_seed_differs():
    assert _same(load_trace("synthetic:7", 512), load_trace("synthetic:7", 512))
    assert not _same(load_trace("synthetic:7", 512), load_trace("synthetic:8", 512))
    assert _same(load_trace("synthetic", 512), generate(0, 512))


def test_default_is_demo_sized_and_max_sessions_overrides():
    assert len(load_trace("synthetic", 512)) == SyntheticConfig().n_sessions == 40
    first = load_trace("synthetic:3", 512, max_sessions=7)
    assert len(first) == 7
    assert _same(first, load_trace("synthetic:3", 512, max_sessions=60)[:7])  # first N in dataset order


def test_large_sample_matches_tracelab_targets():
    stats = describe(generate(1, 512, max_sessions=2000))
    assert stats.requests_per_session == pytest.approx(TARGET_REQUESTS, rel=0.04)
    assert stats.mean_input_tokens == pytest.approx(TARGET_INPUT, rel=0.05)
    assert stats.mean_gap_s == pytest.approx(TARGET_GAP_S, rel=0.05)
    assert stats.max_input_tokens <= 450_000  # nothing the context limit would drop


def test_demo_sample_is_close_to_targets():
    stats = describe(generate(0, 512))
    assert stats.requests_per_session == pytest.approx(TARGET_REQUESTS, rel=0.1)
    assert stats.mean_input_tokens == pytest.approx(TARGET_INPUT, rel=0.15)
    assert stats.mean_gap_s == pytest.approx(TARGET_GAP_S, rel=0.2)


def test_sessions_of_one_agent_share_the_system_and_tool_prefix():
    sessions = generate(0, 512)
    firsts = {}
    for s in sessions:
        firsts.setdefault(int(s.requests[0].block_keys[0]), []).append(s)
    profiles = SyntheticConfig().profile_tokens
    assert 1 < len(firsts) <= len(profiles)
    group = max(firsts.values(), key=len)
    prefix_blocks = min(p for p in profiles) // 512
    assert len(group) > 1
    a, b = group[0].requests[0].block_keys, group[1].requests[0].block_keys
    assert np.array_equal(a[:prefix_blocks], b[:prefix_blocks])


def test_history_grows_and_is_sometimes_compacted():
    grow = compacted = 0
    for s in generate(2, 512, max_sessions=200):
        for a, b in zip(s.requests, s.requests[1:]):
            extends = a.block_keys.size <= b.block_keys.size and np.array_equal(a.block_keys, b.block_keys[: a.block_keys.size])
            grow += extends
            compacted += not extends
            assert b.t > a.t and b.idle_before_s > 0
    assert grow > 10 * compacted > 0


def test_block_keys_match_block_tokens():
    for s in generate(4, 1024, max_sessions=5):
        assert all(r.block_keys.size == r.input_tokens // 1024 for r in s.requests)
