"""Replay workload construction: session starts, context limit, dense block keys."""

import numpy as np
import pytest

from sglang_saria.replay.trace import TraceRequest, TraceSession
from sglang_saria.replay.workload import (
    apply_limits,
    dense_keys,
    limit_context,
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
