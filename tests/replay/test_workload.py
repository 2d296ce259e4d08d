"""Replay workload construction: session starts, context limit, dense block keys."""

import numpy as np
import pytest

from sglang_saria.replay.trace import TraceRequest, TraceSession
from sglang_saria.replay.workload import (
    apply_limits,
    dense_keys,
    limit_context,
    replicate,
    session_start_times,
    session_starts,
)


def test_starts_are_deterministic_and_inside_the_window():
    a = session_start_times(350, 12 * 3600, seed=3)
    assert np.array_equal(a, session_start_times(350, 12 * 3600, seed=3))
    assert not np.array_equal(a, session_start_times(350, 12 * 3600, seed=4))
    assert a[0] == 0.0 and np.all(np.diff(a) >= 0) and a[-1] < 12 * 3600
    assert a[-1] > 0.9 * 12 * 3600  # spread over the window, not bunched at its start


def test_start_gaps_are_exponential():
    gaps = np.diff(session_start_times(20_000, 7200, seed=1))
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, abs=0.05)  # Gamma(k=1): CV = 1
    assert np.mean(gaps) == pytest.approx(7200 / 20_000, rel=0.02)


def test_start_edge_cases():
    assert session_start_times(0, 10, 0).size == 0
    assert session_start_times(1, 10, 0).tolist() == [0.0]
    with pytest.raises(ValueError):
        session_start_times(3, 0, 0)


def _req(t, n_in, idle=1.0):
    return TraceRequest(t, idle, n_in, 10, np.zeros(n_in // 512, dtype=np.uint64))


def test_children_start_at_parent_start_plus_offset():
    sessions = [TraceSession("a", [_req(0, 512)]),
                TraceSession("a/sub1", [_req(0, 512)], parent_id="a", start_offset_s=30.0),
                TraceSession("b", [_req(0, 512)])]
    starts = session_starts(sessions, 3600, seed=5)
    top = session_start_times(2, 3600, seed=5)
    assert starts.tolist() == [top[0], top[0] + 30.0, top[1]]


def test_requests_over_the_context_limit_are_dropped_and_counted():
    sessions = [TraceSession("a", [_req(0, 500_000, idle=0.0), _req(5, 1000, idle=2.0), _req(9, 460_000)]),
                TraceSession("b", [_req(0, 451_000)]),
                TraceSession("b/sub1", [_req(0, 1000)], parent_id="b"),
                TraceSession("c", [_req(0, 450_000)])]
    kept, dropped = limit_context(sessions)
    assert dropped == 4  # a: 2, b: 1, and b's orphaned child: 1
    assert [s.session_id for s in kept] == ["a", "c"]
    assert [r.t for r in kept[0].requests] == [5]
    assert kept[0].requests[0].idle_before_s == 0.0  # new first request
    assert kept[1] is sessions[3]
    assert [s.session_id for s in apply_limits(sessions, 2_000)] == ["a"]


def test_apply_limits_returns_the_kept_sessions():
    sessions = [TraceSession("a", [_req(0, 3000), _req(1, 1000)])]
    (s,) = apply_limits(sessions, context_limit_tokens=2_000)
    assert [r.input_tokens for r in s.requests] == [1000]
    assert sessions[0].requests[0].input_tokens == 3000  # input untouched


def test_dense_keys_number_each_distinct_key_once_across_sessions():
    a = TraceRequest(0.0, 0.0, 3 * 512, 1, np.array([7, 2**63 + 5, 11], dtype=np.uint64))
    b = TraceRequest(0.0, 0.0, 2 * 512, 1, np.array([7, 99], dtype=np.uint64))
    keys, shared, n = dense_keys([TraceSession("s", [a]), TraceSession("t", [b])])
    assert shared == [[0], [0]]
    (ka,), (kb,) = keys
    assert n == 4 and sorted({*ka.tolist(), *kb.tolist()}) == [0, 1, 2, 3]
    assert ka[0] == kb[0] and len({ka[1], ka[2], kb[1]}) == 3


def test_dense_keys_of_requests_extending_their_predecessor_equal_a_full_renumbering():
    base = np.array([5, 2**63 + 1, 9, 4], dtype=np.uint64)
    reqs = [base[:2], base[:3], np.array([5, 77, 9], dtype=np.uint64), base]  # extend, diverge, come back
    sessions = [TraceSession("s", [TraceRequest(0.0, 0.0, 512 * len(k), 1, k) for k in reqs])]
    keys, shared, n = dense_keys(sessions)
    assert shared == [[0, 2, 1, 1]]  # leading keys equal to the previous request's
    number: dict[int, int] = {}  # the full renumbering, in order of first appearance
    for k in np.concatenate(reqs).tolist():
        number.setdefault(k, len(number))
    assert n == len(number)
    for got, k in zip(keys[0], reqs):
        assert got.tolist() == [number[x] for x in k.tolist()]
    assert keys[0][3].tolist() == [0, 1, 2, 4]  # numbered as first seen: a request's new blocks are consecutive


def _keyed(t, keys):
    return TraceRequest(t, 0.0, 512 * len(keys), 10, np.array(keys, dtype=np.uint64))


def test_replicated_sessions_are_new_conversations_that_keep_cross_group_sharing():
    """A copy keeps its shape, salts the keys only its group has, keeps keys another group shares, and
    its sub-agents follow it; the copies are placed in a seeded random order."""
    sessions = [TraceSession("a", [_keyed(0, [1, 2, 3]), _keyed(5, [1, 2, 3, 4])]),
                TraceSession("a/sub", [_keyed(0, [1, 2, 9])], parent_id="a", start_offset_s=3.0),
                TraceSession("b", [_keyed(0, [1, 7])])]
    assert replicate(sessions, 1, seed=0) is sessions
    out = replicate(sessions, 3, seed=0)
    again = replicate(sessions, 3, seed=0)
    assert [s.session_id for s in again] == [s.session_id for s in out]
    assert all(np.array_equal(r.block_keys, q.block_keys) for s, t in zip(out, again) for r, q in zip(s.requests, t.requests))
    assert [s.session_id for s in out] != [s.session_id for s in replicate(sessions, 3, seed=1)]
    by_id = {s.session_id: s for s in out}
    assert sorted(by_id) == sorted(f"{x}{c}" for x in ("a", "a/sub", "b") for c in ("", "#c1", "#c2"))
    for c in ("#c1", "#c2"):
        a, sub, b = by_id["a" + c], by_id["a/sub" + c], by_id["b" + c]
        assert sub.parent_id == "a" + c and sub.start_offset_s == 3.0
        assert [r.t for r in a.requests] == [0, 5] and [r.input_tokens for r in a.requests] == [1536, 2048]
        k = a.requests[1].block_keys
        assert k[0] == 1  # shared with group b: kept
        assert not set(k[1:].tolist()) & {2, 3, 4}  # private to group a: salted
        assert np.array_equal(a.requests[0].block_keys, k[:3])  # prefix sharing inside the copy stays
        assert sub.requests[0].block_keys[1] == k[1]  # and with its own sub-agent
        assert b.requests[0].block_keys[0] == 1 and b.requests[0].block_keys[1] != 7
    salted = {by_id["a" + c].requests[1].block_keys[3] for c in ("", "#c1", "#c2")}
    assert len(salted) == 3  # each copy its own keys
    # every sub-agent follows its parent in the list (session_starts needs the parent's start)
    seen = set()
    for s in out:
        assert s.parent_id is None or s.parent_id in seen
        seen.add(s.session_id)
    with pytest.raises(ValueError, match="copies must be >= 1"):
        replicate(sessions, 0, seed=0)
