"""Agents' hints in the SGLang driver (issue 26), without a server: the hint's rules (what a chat
request may say, `plugin/requests.py`), its way through ``custom_params``, and what a released request's hint
does to the `auto` policy's decisions on its pages. The server-level proof is
tests/e2e/test_loadaware_admission.py."""

from __future__ import annotations

import math

import pytest

from sglang_saria.config import SariaConfig
from sglang_saria.hicache.hints import (HINT_KEY, AgentHint, HintsIntakeMixin, SessionPaths, apply_hint, attach_hint,
                                        entry_bytes, hint_of, parse_hint, validate_field)
from sglang_saria.hicache.policy import SariaHiCachePolicy
from sglang_saria.hicache.tree_view import page_key
from tests.hicache.test_sglang_admission import PAGES, Tree, evict, insert, one_node

BAD_HINTS = {
    # hint: words the error must contain (the field named, then why)
    "not-an-object": ("s1", "saria='s1': must be an object"),
    "no-session": ({"end": True}, "saria.session=None: must be a non-empty string"),
    "empty-session": ({"session": ""}, "saria.session='': must be a non-empty string"),
    "long-session": ({"session": "x" * 257}, "of at most 256 characters"),
    "huge-session": ({"session": "x" * 1_000_000}, "saria.session='xxxxxxxx"),
    "end-not-bool": ({"session": "s", "end": 1}, "saria.end=1: must be true or false"),
    "negative-return": ({"session": "s", "expect_return_s": -1}, "saria.expect_return_s=-1: must be a finite number >= 0"),
    "infinite-return": ({"session": "s", "expect_return_s": math.inf}, "saria.expect_return_s=inf"),
    "bool-return": ({"session": "s", "expect_return_s": True}, "saria.expect_return_s=True"),
    "text-return": ({"session": "s", "expect_return_s": "30"}, "saria.expect_return_s='30'"),
    "end-and-return": ({"session": "s", "end": True, "expect_return_s": 5}, "a session that ends does not return"),
    "unknown-key": ({"session": "s", "ttl": 3}, "saria.ttl: unknown key (known: session, expect_return_s, end)"),
}


@pytest.mark.parametrize("case", list(BAD_HINTS))
def test_a_malformed_hint_is_refused_naming_the_field(case):
    raw, words = BAD_HINTS[case]
    with pytest.raises(ValueError) as err:
        parse_hint(raw)
    assert words in str(err.value)
    assert len(str(err.value)) < 400  # an echoed value is cut short, however large the request's


def test_a_long_echoed_value_says_how_long_it_was():
    with pytest.raises(ValueError, match=r"saria.session='x{40}\.\.\.' \(1000000 characters\)"):
        parse_hint({"session": "x" * 1_000_000})


def test_valid_hints_reach_the_scheduler_through_custom_params_beside_the_clients_own():
    assert parse_hint({"session": "a", "end": True}) == AgentHint("a", None, True)
    assert parse_hint({"session": "a", "expect_return_s": 30}) == AgentHint("a", 30.0, False)
    assert validate_field(None) is None
    sampling = {"custom_params": {"thinking_budget": 8}}
    attach_hint(sampling, validate_field({"session": "a", "expect_return_s": 2.5}))
    assert sampling["custom_params"] == {"thinking_budget": 8,
                                         HINT_KEY: {"session": "a", "end": False, "expect_return_s": 2.5}}
    assert hint_of(sampling["custom_params"]) == AgentHint("a", 2.5, False)
    # /generate passes custom_params unchecked: an invalid hint there is ignored, not applied
    assert hint_of({HINT_KEY: {"session": "", "end": True}}) is None
    assert hint_of(None) is None and hint_of({"other": 1}) is None


def auto_policy(stored: set[str] | None = None, demoted: list[str] | None = None) -> SariaHiCachePolicy:
    config = SariaConfig.from_dict({"admission": {"policy": "loadaware", "loadaware_spend_backlog_s": 0.5}})
    on_ssd = (stored if stored is not None else set()).__contains__
    on_ssd_demote = None if demoted is None else demoted.extend
    return SariaHiCachePolicy(config, page_size=16, on_ssd=on_ssd, clock=lambda: 100.0, on_ssd_demote=on_ssd_demote)


def loaded(policy: SariaHiCachePolicy) -> SariaHiCachePolicy:
    policy.admission.on_load(10.0, 100.0)  # 10 s of prefill queued: a recomputation would wait
    assert policy.admission.theta_E == 1
    return policy


def test_an_ended_sessions_node_is_not_written_even_when_a_loaded_auto_would():
    demoted: list[str] = []
    policy = loaded(auto_policy(demoted=demoted))
    tree, node = one_node()
    assert not insert(policy, tree, node)  # computed, written through to host: not written at insert
    apply_hint(policy, SessionPaths(1 << 20), AgentHint("s", end=True), PAGES)
    assert evict(policy, node)  # reclaimed at once: no write
    assert policy.admission.admitted["evict"] == 0
    assert policy.hints.counts["end"] == 1 and policy.hints.counts["skipped_writes"] == 1
    assert demoted == PAGES  # their SSD copies (if any) go first: the store skips what it does not hold


def test_a_request_reusing_ended_pages_makes_them_live_again():
    policy = loaded(auto_policy())
    tree, node = one_node()
    insert(policy, tree, node)
    apply_hint(policy, SessionPaths(1 << 20), AgentHint("s", end=True), PAGES)
    policy.on_request_match("req-2", tree, node.id)  # another request matched these pages
    assert not evict(policy, node)  # written before its reclaim, as any loaded first eviction
    assert policy.admission.admitted["evict"] == 1


def test_a_returning_sessions_node_is_written_at_its_first_eviction_while_idle():
    policy = auto_policy()
    policy.admission.on_load(0.0, 100.0)  # idle: auto writes at the second eviction
    idle_tree, idle_node = one_node(["c" * 64])
    insert(policy, idle_tree, idle_node)
    assert evict(policy, idle_node)  # no hint: the first eviction is not enough
    assert policy.admission.admitted["evict"] == 0
    tree, node = one_node()
    insert(policy, tree, node)
    apply_hint(policy, SessionPaths(1 << 20), AgentHint("s", expect_return_s=30.0), PAGES)
    assert not evict(policy, node)  # the session comes back after DRAM gives it up: write it
    assert policy.hints.counts["expect_return"] == 1 and policy.hints.counts["hinted_writes"] == 1


def test_pages_a_sessions_next_turn_no_longer_holds_are_left_behind_and_not_written():
    policy = loaded(auto_policy())
    tree, node = one_node()
    insert(policy, tree, node)
    sessions = SessionPaths(1 << 20)
    apply_hint(policy, sessions, AgentHint("s"), PAGES)  # a turn on this path
    apply_hint(policy, sessions, AgentHint("s"), PAGES[:1] + ["z" * 64])  # the next one rewrote its last page
    assert not policy.hints.is_left_behind(page_key(PAGES[0])) and policy.hints.is_left_behind(page_key(PAGES[1]))
    assert evict(policy, node)  # reclaimed without a write, though a loaded auto writes a first eviction
    assert policy.admission.admitted["evict"] == 0 and policy.hints.counts["left_skipped_writes"] == 1
    tree, node = one_node()
    insert(policy, tree, node)
    policy.on_request_match("req-3", tree, node.id)  # a request uses the pages again: live
    assert not evict(policy, node) and policy.admission.admitted["evict"] == 1


def test_an_end_covers_the_sessions_earlier_hinted_branch_and_sessions_are_bounded():
    demoted: list[str] = []
    policy = auto_policy(demoted=demoted)
    sessions = SessionPaths(2 * entry_bytes("a", ("p",)))
    apply_hint(policy, sessions, AgentHint("s"), ["a0", "b1"])  # a turn on a branch, only registered
    assert policy.hints.counts == {"end": 0, "expect_return": 0, "left_behind": 0, "dropped": 0, "skipped_writes": 0,
                                   "hinted_writes": 0, "left_skipped_writes": 0}
    apply_hint(policy, sessions, AgentHint("s", end=True), ["a0", "c1", "c2"])
    assert demoted == ["b1", "a0", "c1", "c2"]  # the earlier branch, then this path: its tail goes first
    assert all(policy.hints.ended(page_key(h)) for h in demoted)
    assert len(sessions) == 0  # an ended session is forgotten
    for name in ("a", "b", "c"):
        sessions.record(name, ["p"])
    assert len(sessions) == 2 and sessions.record("a", ["q"]) == ()  # "a", the oldest, was forgotten


def test_session_paths_are_bounded_in_bytes_at_page_1_as_at_page_64():
    """128K-token contexts: 2,000 hashes a session at page 64, 128,000 at page 1."""
    hashes = [f"{i:064x}" for i in range(128_000)]
    bound = 4 << 20
    for page in (64, 1):
        sessions = SessionPaths(bound)
        path = hashes[: 128_000 // page]
        for n in range(40):
            sessions.record(f"session-{n:02d}", path)
            assert sessions.nbytes <= bound
        kept = bound // entry_bytes("session-00", tuple(path))
        assert len(sessions) == kept  # 17 sessions at page 64, none at page 1: one path is over the bound
        assert sessions.nbytes == kept * entry_bytes("session-00", tuple(path))
    assert SessionPaths(bound).record("s", hashes) == ()  # not kept, and nothing earlier to return


def test_the_default_bound_is_64_mib_and_a_negative_one_is_named():
    assert SariaConfig().admission.hint_sessions_max_bytes == 64 << 20
    with pytest.raises(ValueError, match="admission.hint_sessions_max_bytes=-1: must be >= 0"):
        SariaConfig.from_dict({"admission": {"hint_sessions_max_bytes": -1}})


class _Base:
    """The part of UnifiedRadixCache the intake mixin calls."""

    def on_release(self, req, *, checkpointed):
        self.released = (req.rid, checkpointed)


class _Cache(HintsIntakeMixin, _Base):
    def __init__(self, policy, tree):
        self.policy, self.tree_core = policy, tree

    def _policy(self):
        return self.policy


class _TreeCore(Tree):
    def get_prefix_hash_values(self, node_id):
        node, chunks = self.nodes[node_id].parent, []
        while node is not None:
            chunks.append(node.hash_value)
            node = node.parent
        return [h for chunk in reversed(chunks) for h in chunk]

    def get_hash_values(self, node_id):
        return self.nodes[node_id].hash_value


class _Params:
    def __init__(self, custom_params):
        self.custom_params = custom_params


class _Req:
    def __init__(self, rid, last_node, custom_params):
        self.rid, self.last_node, self.sampling_params = rid, last_node, _Params(custom_params)


def test_a_released_requests_hint_applies_to_its_whole_path_from_the_root():
    demoted: list[str] = []
    policy = auto_policy(demoted=demoted)
    tree = _TreeCore()
    system = tree.add(1, ["a" * 64], tree.add(0, [], None))
    turn = tree.add(2, ["b" * 64, "c" * 64], system)
    cache = _Cache(policy, tree)
    hint = {HINT_KEY: {"session": "s", "end": True}}
    cache.on_release(_Req("r0", turn.id, hint), checkpointed=False)  # aborted: nothing went into the tree
    assert demoted == [] and cache.released == ("r0", False)
    cache.on_release(_Req("r1", turn.id, {"other": 1}), checkpointed=True)  # no hint
    assert demoted == []
    cache.on_release(_Req("r2", turn.id, hint), checkpointed=True)
    assert demoted == ["a" * 64, "b" * 64, "c" * 64] and cache.released == ("r2", True)
    assert all(policy.hints.ended(page_key(h)) for h in demoted)
