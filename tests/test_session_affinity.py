"""The session-affine, bounded-load core (``sglang_saria/session_affinity.py``) that the fleet replay
and the cluster's session router both run."""

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_saria.session_affinity import AffinityConfig, AffinityError, HeldPrefixes, SessionAffinity


def test_a_session_stays_on_its_node_while_it_is_below_the_bound():
    s = SessionAffinity(4)
    first = {k: s.pick(k, 0.0) for k in range(12)}
    for t in range(1, 30):
        for k in range(12):
            assert s.pick(k, float(t)) == first[k]
    assert s.stats["placed"] == 12 and s.stats["stayed"] == 12 * 29
    assert s.stats["moved_bound"] == s.stats["moved_dead"] == 0


@pytest.mark.parametrize(("nodes", "sessions", "eps"), [(3, 6, 0.25), (4, 40, 0.25), (8, 100, 0.1), (8, 9, 0.5)])
def test_no_node_holds_more_than_the_bound_of_active_sessions(nodes, sessions, eps):
    s = SessionAffinity(nodes, AffinityConfig(eps=eps))
    for k in range(sessions):
        s.pick(f"session-{k}", float(k))
        assert max(s.count) <= math.ceil((1 + eps) * (k + 1) / nodes)
    assert sum(s.count) == sessions


def test_six_sessions_on_three_nodes_spread_two_two_two():
    s = SessionAffinity(3, AffinityConfig(eps=0.25))
    placed = Counter(s.pick(f"agent-{k}", 0.0) for k in range(6))
    assert sorted(placed.values()) == [2, 2, 2]  # ceil(2) + floor(0.25 x 2): 2 each


def test_an_idle_session_stops_counting_and_returns_to_its_node_if_it_is_below_the_bound():
    s = SessionAffinity(2, AffinityConfig(eps=0.5, idle_s=10.0))
    node = s.pick("a", 0.0)
    s.pick("b", 1.0)
    assert sum(s.count) == 2
    s.expire(11.5)  # a idle for 11.5 s, b for 10.5 s
    assert sum(s.count) == 0 and s.home["a"][0] == node
    assert s.pick("a", 12.0) == node and s.stats["stayed"] == 1


def test_a_session_moves_only_when_its_node_is_at_the_bound():
    s = SessionAffinity(3, AffinityConfig(eps=0.1, idle_s=10.0))
    home = s.pick("x", 0.0)
    assert s.pick("x", 5.0) == home  # alone and active: stays
    s.expire(20.0)  # x idle; another session whose ring walk starts at x's node takes it
    other = next(k for k in (f"o{i}" for i in range(500)) if s.preference(k)[0] == home)
    assert s.pick(other, 20.0) == home
    node = s.pick("x", 21.0)  # bound ceil(2 / 3) + floor(0.1 x 2 / 3) = 1, held by the other
    assert node != home and s.stats["moved_bound"] == 1
    assert s.pick("x", 22.0) == node and s.stats["stayed"] == 2


def test_a_dead_nodes_sessions_spread_over_the_others_and_come_back_when_it_returns():
    s = SessionAffinity(4, AffinityConfig(eps=0.25))
    keys = [f"s{k}" for k in range(40)]
    home = {k: s.pick(k, 0.0) for k in keys}
    dead = Counter(home.values()).most_common(1)[0][0]
    alive = [n != dead for n in range(4)]
    victims = [k for k in keys if home[k] == dead]
    moved = {k: s.pick(k, 1.0, alive) for k in victims}
    assert dead not in moved.values() and len(set(moved.values())) >= 2  # spread, not onto one neighbour
    assert s.stats["moved_dead"] == len(victims)
    for k in keys:  # everyone else stayed
        if k not in victims:
            assert s.pick(k, 1.0, alive) == home[k]
    assert max(s.count) <= math.ceil(1.25 * 40 / 3)
    back = {k: s.pick(k, 2.0) for k in victims}  # the node is alive again
    assert all(node == dead for node in back.values()) and s.stats["returned"] == len(victims)


def test_bad_settings_and_no_live_node_are_clear_errors():
    with pytest.raises(AffinityError, match="eps 0"):
        SessionAffinity(2, AffinityConfig(eps=0))
    with pytest.raises(AffinityError, match="nodes 0"):
        SessionAffinity(0)
    s = SessionAffinity(2)
    with pytest.raises(AffinityError, match="no live node among 2"):
        s.pick("a", 0.0, [False, False])
    with pytest.raises(AffinityError, match="3 liveness flags for 2 nodes"):
        s.pick("a", 0.0, [True, True, True])


def test_placement_is_the_same_in_every_process():
    a, b = SessionAffinity(8), SessionAffinity(8)
    assert [a.pick(f"k{i}", 0.0) for i in range(50)] == [b.pick(f"k{i}", 0.0) for i in range(50)]
    assert sorted(a.preference("conversation-1")) == list(range(8))  # the walk meets every node once


def test_new_sessions_avoid_the_most_worn_drive_within_the_session_bound():
    s = SessionAffinity(4, AffinityConfig(eps=0.25))
    keys = [k for k in (f"n{i}" for i in range(500)) if s.preference(k)[0] == 2][:3]
    wear = [10.0, 10.0, 100.0, 10.0]  # node 2 wrote 100 against a mean of 32.5: above 1.25 x the mean
    placed = [s.pick(k, float(i), wear=wear) for i, k in enumerate(keys)]
    assert 2 not in placed  # their ring walks start at node 2
    assert s.pick(keys[0], 10.0, wear=[10.0, 10.0, 10.0, 100.0]) == placed[0]  # an active session stays
    # node 1 wrote beyond 1.1 x the mean: node 0, wherever the ring walk starts
    t = SessionAffinity(2, AffinityConfig(eps=0.1))
    assert t.pick("x", 0.0, alive=[True, True], wear=[5.0, 50.0]) == 0


def test_placed_by_tokens_a_new_session_avoids_the_node_whose_active_prompts_are_largest():
    s = SessionAffinity(2, AffinityConfig(eps=0.25, place_by="tokens"))
    big = next(k for k in (f"b{i}" for i in range(500)) if s.preference(k)[0] == 0)
    assert s.pick(big, 0.0, size=100_000.0) == 0
    small = [k for k in (f"s{i}" for i in range(500)) if s.preference(k)[0] == 0][:2]
    # node 0 holds 100k tokens against a mean of 50k: the next sessions go to node 1 although their walks start at 0
    assert [s.pick(k, 1.0, size=1_000.0) for k in small] == [1, 1]
    assert s.pick(big, 2.0, size=120_000.0) == 0  # an active session stays where it is


def test_with_wear_moves_and_no_shrink_only_the_largest_active_session_leaves_a_worn_out_drive():
    s = SessionAffinity(2, AffinityConfig(eps=0.5, wear_moves=True, place_by="wear", wear_shrink=0.0))
    a, b = [k for k in (f"k{i}" for i in range(500)) if s.preference(k)[0] == 0][:2]
    assert s.pick(a, 0.0, wear=[0.0, 0.0], size=50_000.0) == 0
    for i, k in enumerate([k for k in (f"o{i}" for i in range(500)) if s.preference(k)[0] == 1][:2]):
        assert s.pick(k, 0.1 + i / 10, wear=[0.0, 0.0], size=1_000.0) == 1
    assert s.pick(b, 1.0, wear=[0.0, 0.0], size=2_000.0) == 0  # 4 active sessions: at most 2 + 1 per node
    worn = [40.0, 10.0]  # node 0 wrote 40 against a mean of 25: above 1.5 x
    assert s.pick(b, 2.0, wear=worn, size=3_000.0) == 0  # not the largest there: stays
    assert s.pick(a, 3.0, wear=worn, size=60_000.0) == 1 and s.stats["moved_wear"] == 1
    assert s.pick(a, 4.0, wear=worn, size=61_000.0) == 1  # node 1 is not worn out: it stays there
    off = SessionAffinity(2, AffinityConfig(eps=0.5, wear_moves=False))
    off.pick(a, 0.0, wear=[0.0, 0.0], size=50_000.0)
    assert off.pick(a, 1.0, wear=worn, size=60_000.0) == 0


def fleet_with_three_on_node_0(config: AffinityConfig) -> tuple[SessionAffinity, list[str]]:
    """Three sessions (90k, 50k, 10k tokens) on node 0 of 3, three small ones on each of the others."""
    s = SessionAffinity(3, config)
    first = {n: [k for k in (f"k{n}-{i}" for i in range(2000)) if s.preference(k)[0] == n][:3] for n in range(3)}
    for i, size in enumerate((90_000.0, 50_000.0, 10_000.0)):  # one per node in turn, within the session bound
        for node in (1, 2, 0):
            assert s.pick(first[node][i], float(i), wear=[0.0, 0.0, 0.0], size=size if node == 0 else 1_000.0) == node
    return s, first[0]


def test_with_wear_shrink_a_session_leaves_a_worn_out_drive_at_a_prompt_that_does_not_extend_its_last():
    s, (a, b, c) = fleet_with_three_on_node_0(AffinityConfig(eps=0.5, place_by="wear", wear_shrink=0.9))
    worn = [60.0, 10.0, 20.0]  # node 0: 60 against 1.5 x a mean of 30
    assert s.pick(a, 10.0, wear=worn, size=95_000.0) == 0  # the largest, but its prompt grew: it stays
    assert s.pick(c, 11.0, wear=worn, size=9_500.0) == 0  # 0.95 x its last: not below 0.9 x
    assert s.pick(b, 12.0, wear=worn, size=20_000.0) != 0 and s.stats["moved_wear"] == 1  # 0.4 x its last
    assert s.pick(a, 13.0, wear=[60.0, 60.0, 60.0], size=10_000.0) == 0  # no drive worn out: a shrunk prompt stays
    with pytest.raises(AffinityError, match="wear_shrink -1"):
        SessionAffinity(2, AffinityConfig(wear_shrink=-1.0))


def test_an_unknown_placement_signal_is_a_clear_error():
    with pytest.raises(AffinityError, match="place_by 'load': choose one of wear, tokens, both"):
        SessionAffinity(2, AffinityConfig(place_by="load"))


def test_least_placement_takes_the_node_least_loaded_in_tokens_and_requests_within_the_bounds():
    s = SessionAffinity(3, AffinityConfig(eps=0.5))
    keys = [k for k in (f"k{i}" for i in range(2000)) if s.preference(k)[0] == 0]
    assert s.pick(keys[0], 0.0, size=90_000.0) == 0  # nothing loaded: the first of equals on its ring walk
    second = s.pick(keys[1], 0.1, size=10_000.0)
    assert second != 0  # node 0 holds 90k tokens
    for t in range(2, 12):  # the second session sends many requests; its node's requests rise above the mean
        assert s.pick(keys[1], t / 10, size=10_000.0) == second
    third = s.pick(keys[2], 2.0, size=1_000.0)
    assert third not in (0, second)  # the last node: fewest tokens and requests, although its walk starts at 0
    with pytest.raises(AffinityError, match="placement 'x': choose one of least, ring"):
        SessionAffinity(2, AffinityConfig(placement="x"))


def big_idle_then_small_on_node_0(cfg: AffinityConfig) -> tuple[SessionAffinity, str, str]:
    """Two nodes; ``big`` (80k tokens) served by node 0, idle past ``idle_s``, then ``small`` (2k) placed there."""
    s = SessionAffinity(2, cfg)
    on0 = [k for k in (f"k{i}" for i in range(2000)) if s.preference(k)[0] == 0]
    big, small = on0[:2]
    assert s.pick(big, 0.0, size=80_000.0) == 0
    s.expire(11.0)
    assert s.pick(small, 11.0, size=2_000.0) == 0  # big is idle: node 0 is free
    return s, big, small


def test_with_the_cheap_bound_a_node_at_the_bound_sends_off_its_smallest_session_first():
    cfg = AffinityConfig(eps=0.1, idle_s=10.0, place_by="wear", bound="cheap")
    s, big, small = big_idle_then_small_on_node_0(cfg)
    # 2 active: bound ceil(1) + floor(0.1) = 1 each; node 0 holds small, and big returns to it
    assert s.pick(big, 12.0, size=81_000.0) == 0 and s.stats["moved_bound"] == 0  # small is smaller: big stays
    assert s.pick(small, 13.0, size=2_500.0) == 1 and s.stats["moved_bound"] == 1  # the smallest leaves
    strict = SessionAffinity(2, AffinityConfig(eps=0.1, idle_s=10.0, place_by="wear", bound="strict"))
    strict.pick(big, 0.0, size=80_000.0)
    strict.expire(11.0)
    strict.pick(small, 11.0, size=2_000.0)
    assert strict.pick(big, 12.0, size=81_000.0) == 1  # strict: the returning session moves whatever it holds
    # cheap, and the node holds big's prompt: it stays even as the smallest
    t = SessionAffinity(2, cfg)
    t.pick(small, 0.0, size=2_000.0)
    t.expire(11.0)
    t.pick(big, 11.0, size=80_000.0)
    assert t.pick(small, 12.0, size=2_500.0, extends=True) == 0
    assert t.pick(small, 13.0, size=2_500.0, extends=False) == 1  # the smallest, and its node does not hold it
    with pytest.raises(AffinityError, match="bound 'x': choose one of cheap, strict"):
        SessionAffinity(2, AffinityConfig(bound="x"))


def test_with_extends_a_session_leaves_a_worn_out_drive_at_a_prompt_its_node_does_not_hold():
    s, (a, b, c) = fleet_with_three_on_node_0(AffinityConfig(eps=0.5, place_by="wear", wear_shrink=0.9))
    worn = [60.0, 10.0, 20.0]
    assert s.pick(b, 10.0, wear=worn, size=20_000.0, extends=True) == 0  # shrank, but its node holds it: stays
    assert s.pick(a, 11.0, wear=worn, size=95_000.0, extends=False) != 0  # grew, but not on what its node holds
    assert s.stats["moved_wear"] == 1


def test_held_prefixes_judge_a_prompt_by_the_share_of_it_its_node_was_sent():
    h = HeldPrefixes(0.5)
    assert h.extends("s", [1, 2, 3]) is None  # not seen yet
    h.record("s", 0, [1, 2, 3])
    assert h.extends("s", [1, 2, 3, 4, 5]) is True  # 3 of 5 held
    assert h.extends("s", [1, 7, 8, 9]) is False  # 1 of 4
    assert h.extends("s", [1, 2, 9], weights=[1.0, 1.0, 10.0]) is False  # 2 of 12 by weight
    h.record("s", 1, [1, 7])  # moved: its new node holds only what it was sent
    assert h.extends("s", [1, 2, 3, 4]) is False and h.extends("s", [1, 7, 8]) is True
    assert HeldPrefixes(0.0).extends("s", [1]) is None
    with pytest.raises(AffinityError, match="held_frac 2"):
        SessionAffinity(2, AffinityConfig(held_frac=2.0))


@settings(max_examples=100, deadline=None)
@given(
    nodes=st.integers(2, 6),
    requests=st.lists(st.tuples(st.integers(0, 8), st.floats(0.0, 30.0), st.floats(100.0, 200_000.0),
                                st.sampled_from([None, True, False])), min_size=1, max_size=200),
    dead=st.integers(-1, 5),
)
def test_the_shed_bound_holds_every_live_node_to_it_after_every_pick(nodes, requests, dead):
    """``shed``: after each pick no live node holds more than the bound of active sessions (the session
    bound of bounded-load hashing at every moment, not only at placement), whatever the arrivals, idle
    times, prompt sizes and a dead node; every active session counts on exactly one node."""
    s = SessionAffinity(nodes, AffinityConfig(eps=0.25, idle_s=20.0, bound="shed"))
    alive = [n != dead for n in range(nodes)] if dead < nodes - 1 else [True] * nodes
    now = 0.0
    for session, gap, size, extends in requests:
        now += gap
        node = s.pick(f"s{session}", now, alive=alive, size=size, extends=extends)
        assert alive[node]
        mean = len(s.active) / sum(alive)
        cap = math.ceil(mean) + math.floor(0.25 * mean)
        counts = Counter(n for n, _, _ in s.active.values())
        assert all(counts[n] <= cap for n in range(nodes) if alive[n]), (counts, cap)
        assert [counts[n] for n in range(nodes)] == s.count
        assert s.active[f"s{session}"][0] == node


def test_with_the_shed_bound_a_node_at_the_bound_moves_its_cheapest_session_at_once():
    cfg = AffinityConfig(eps=0.1, idle_s=10.0, place_by="wear", bound="shed")
    s, big, small = big_idle_then_small_on_node_0(cfg)
    # 2 active: bound 1 each; big returns to node 0, which holds small (cheaper): small goes to node 1 now
    assert s.pick(big, 12.0, size=81_000.0) == 0 and s.count == [1, 1] and s.stats["shed"] == 1
    assert s.pick(small, 13.0, size=2_500.0, extends=True) == 1  # its next request goes to its new node
    # the returning session is the cheapest to move when its node does not hold its prompt
    assert s.pick(big, 14.0, size=500.0, extends=False) == 0  # node 0 below the bound: it stays
    t = SessionAffinity(2, cfg)
    t.pick(small, 0.0, size=2_000.0)
    t.expire(11.0)
    t.pick(big, 11.0, size=80_000.0)
    assert t.pick(small, 12.0, size=2_500.0, extends=False) == 1 and t.stats["shed"] == 0


def test_a_session_sent_off_while_idle_goes_back_to_the_node_holding_its_context_if_it_has_room_then():
    s, big, small = big_idle_then_small_on_node_0(AffinityConfig(eps=0.1, idle_s=10.0, place_by="wear"))
    assert s.pick(big, 12.0, size=81_000.0) == 0 and s.active[small][0] == 1  # small counts on node 1 now
    s.expire(23.0)  # both idle: node 0 has room again
    assert s.pick(small, 23.0, size=2_500.0, extends=True) == 0  # back where its context is: no move
    assert s.stats["shed"] == 1 and s.stats["moved_bound"] == 0 and s.stats["stayed"] == 2


def test_with_the_shed_bound_a_revived_node_gets_its_own_sessions_back_first():
    s = SessionAffinity(3, AffinityConfig(eps=0.25))
    first = {f"agent-{k}": s.pick(f"agent-{k}", 0.0) for k in range(6)}
    orphans = [k for k, n in first.items() if n == 0]
    down = [False, True, True]
    hosts = {k: s.pick(k, 1.0, alive=down) for k in orphans}
    assert sorted(hosts.values()) == [1, 2] and s.stats["moved_dead"] == 2
    native = next(k for k, n in first.items() if n == 1)
    assert s.pick(native, 2.0) == 1  # node 1 is over the bound of 2: it sends its guest home, not a native
    assert s.pick(native, 3.0) == 1 and s.stats["returned"] == 2  # node 2's guest too, after that pick
    assert s.count == [2, 2, 2] and s.stats["shed"] == 0
    assert all(s.pick(k, 4.0) == 0 for k in orphans)
