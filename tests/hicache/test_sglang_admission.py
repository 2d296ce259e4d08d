"""The SGLang admission policy's decisions (paper 4.2), on nodes given as page-hash lists.

The e2e test (tests/e2e/test_admission.py) drives the same policy from a real server; these
cases pin the event semantics: E counts real reclaims only, write-before-reclaim defers the
reclaim, R counts a request once, and the reuse path fires when R reaches theta_R.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

from sglang_saria.config import SariaConfig
from sglang_saria.hicache.policy import SariaHiCachePolicy
from sglang_saria.hicache.tree_view import MAMBA, page_key
from sglang_saria.mem_cache.metadata import bypassed
from sglang_saria.replay.metrics import peak_window_bytes


@dataclass(eq=False)
class Node:
    """The fields of SGLang's UnifiedTreeNode that the policy reads."""

    id: int
    hash_value: list[str]
    parent: "Node | None" = None
    backuped: bool = True  # a host copy (write-through done)


@dataclass
class Tree:
    nodes: dict[int, Node] = field(default_factory=dict)

    def add(self, node_id: int, hashes: list[str], parent: Node | None) -> Node:
        self.nodes[node_id] = Node(node_id, hashes, parent)
        return self.nodes[node_id]

    def node_by_id(self, node_id: int) -> Node:
        return self.nodes[node_id]


def one_node(hashes: list[str] | None = None) -> tuple[Tree, Node]:
    """A tree with one node under the root."""
    tree = Tree()
    return tree, tree.add(1, hashes or PAGES, tree.add(0, [], None))


def insert(policy: SariaHiCachePolicy, tree: Tree, node: Node) -> bool:
    """The write-through ack hook; True if it writes the node."""
    return policy.on_host_insert(tree, node.id) == [node.id]


def evict(policy: SariaHiCachePolicy, node: Node) -> bool:
    """The host eviction gate; True: reclaimed now, False: the node is written first."""
    reclaim, writes = policy.on_host_evict(node)
    assert reclaim == (writes == [])
    return reclaim


def make_policy(name: str, on_ssd: set[str] | None = None) -> SariaHiCachePolicy:
    config = SariaConfig.from_dict({"admission": {"policy": name}})
    stored = on_ssd if on_ssd is not None else set()
    return SariaHiCachePolicy(config, page_size=16, on_ssd=stored.__contains__, clock=lambda: 100.0)


def counters(policy: SariaHiCachePolicy, page: str) -> tuple[int, int]:
    node = policy.metadata.get(page_key(page))
    return node.E, node.R


PAGES = ["a" * 64, "b" * 64]


def test_full_duplicate_writes_every_node_at_insert():
    policy = make_policy("full-duplicate")
    assert insert(policy, *one_node())
    assert policy.admission.admitted["insert"] == 1


def test_none_never_writes_and_reclaims_at_once():
    policy = make_policy("none")
    tree, node = one_node()
    assert not insert(policy, tree, node)
    assert evict(policy, node)
    assert counters(policy, PAGES[0]) == (1, 0)


def test_block_evicted_twice_is_written_before_its_second_reclaim_under_E2():
    on_ssd: set[str] = set()
    policy = make_policy("eviction:E2", on_ssd)
    tree, node = one_node()
    assert not insert(policy, tree, node)
    assert evict(policy, node)  # first eviction: E=1, reclaimed, not written
    assert counters(policy, PAGES[0]) == (1, 0)
    insert(policy, tree, node)  # recomputed later: R += 1
    assert counters(policy, PAGES[0]) == (1, 1)
    assert not evict(policy, node)  # would be E=2: write first, reclaim later
    assert counters(policy, PAGES[0]) == (1, 1), "E counts reclaims, not deferred attempts"
    on_ssd.update(PAGES)  # the write completed
    assert evict(policy, node)
    assert counters(policy, PAGES[0]) == (2, 1)
    assert policy.admission.admitted["evict"] == 1


def test_a_leaf_joining_pages_evicted_twice_and_once_is_split_after_the_twice_evicted_ones():
    on_ssd: set[str] = set()
    policy = make_policy("eviction:E2", on_ssd)
    tree, old = one_node(["a0", "a1", "a2"])
    insert(policy, tree, old)
    assert evict(policy, old)  # the prefix's first eviction: E = 1, dropped
    joined = tree.add(2, ["a0", "a1", "a2", "b0", "b1"], tree.node_by_id(0))  # recomputed with a new turn
    insert(policy, tree, joined)
    assert policy.admitted_prefix_pages(joined) == 3  # a2 would be at E + 1 = 2; b1 at 1
    on_ssd.update(["a0", "a1", "a2"])
    assert policy.admitted_prefix_pages(joined) == 0  # stored already: nothing to split for
    assert policy.admitted_prefix_pages(tree.add(3, ["a0", "a1", "a2"], None)) == 0  # its last page decides


def test_failed_write_before_reclaim_does_not_pin_host_memory():
    policy = make_policy("eviction:E1")  # the store never gets the pages (full, I/O errors)
    tree, node = one_node()
    insert(policy, tree, node)
    assert not evict(policy, node)  # write first
    assert evict(policy, node), "the write failed: reclaim anyway instead of retrying forever"
    assert counters(policy, PAGES[0]) == (1, 0)


def test_request_reuse_counts_once_and_triggers_write_at_theta_R():
    tree = Tree()
    root = tree.add(0, [], None)
    system = tree.add(1, PAGES, root)
    history = tree.add(2, ["c" * 64], system)
    policy = make_policy("reuse:R2")
    insert(policy, tree, system)
    insert(policy, tree, history)
    assert policy.on_request_match("req-1", tree, history.id) == []
    assert policy.on_request_match("req-1", tree, history.id) == [], "a request counts once"
    assert counters(policy, PAGES[0]) == (0, 1)
    assert sorted(policy.on_request_match("req-2", tree, history.id)) == [system.id, history.id]
    assert policy.admission.admitted["reuse"] == 2


def test_reuse_write_skips_nodes_already_on_ssd():
    tree = Tree()
    node = tree.add(1, PAGES, tree.add(0, [], None))
    policy = make_policy("reuse:R1", on_ssd=set(PAGES))
    insert(policy, tree, node)
    assert policy.on_request_match("req-1", tree, node.id) == []


def test_extra_config_errors_name_the_key_and_value():
    import pytest

    from sglang_saria.config import ConfigError
    from sglang_saria.hicache.backend import policy_config_from_extra

    assert policy_config_from_extra({"admission": "eviction:E3"}).admission.policy == "eviction:E3"
    with pytest.raises(ConfigError, match="E0"):
        policy_config_from_extra({"admission": "eviction:E0"})
    with pytest.raises(ConfigError, match="promotion.ratio"):
        policy_config_from_extra({"promotion": {"ratio": 1.5}})
    with pytest.raises(ConfigError, match="unknown key admission.'bogus'"):
        policy_config_from_extra({"admission": {"bogus": 1}})
    with pytest.raises(ConfigError, match="transfer.planner='gds-only' is a replay baseline"):
        policy_config_from_extra({"transfer": {"planner": "gds-only"}})
    with pytest.raises(ConfigError, match="admission.policy='oracle' is the replay's clairvoyant bound"):
        policy_config_from_extra({"admission": "oracle"})  # it reads the trace's future
    with pytest.raises(ConfigError, match="transfer.direct_reload='yes': expected true/false"):
        policy_config_from_extra({"transfer": {"direct_reload": "yes"}})


def test_budget_policy_admits_within_the_drive_rating_only():
    now = [0.0]
    stored: set[str] = set()
    config = SariaConfig.from_dict({"admission": {"policy": "budget:1", "budget_window_s": 10.0}})
    # 1 DWPD of an 86.4 MB drive is 1 KB/s: 10 KB per 10-s window; each node is 2 pages of 512 bytes.
    policy = SariaHiCachePolicy(config, page_size=16, on_ssd=stored.__contains__, page_bytes=512,
                                ssd_capacity_bytes=86_400_000, clock=lambda: now[0])
    # distinct page keys (page_key reads the first 16 hex digits), as SGLang's chained page hashes are
    tree = Tree()
    root = tree.add(0, [], None)
    nodes = [tree.add(n + 1, [f"{n:016x}" + "0" * 48, f"{n + 1000:016x}" + "0" * 48], root) for n in range(400)]
    times, admitted = [], []
    for step in range(2000):  # 2 KB of nodes asking to be written per second: twice the rating
        now[0] = step * 0.05
        node = nodes[step % len(nodes)]
        insert(policy, tree, node)
        if not evict(policy, node):
            stored.update(node.hash_value)  # the write-before-reclaim completed
            assert evict(policy, node)
        times.append(now[0])
        admitted.append(policy.admission.bytes_admitted)
    assert peak_window_bytes(times, admitted, 10.0) <= 10_000 + 2 * 512, "no window past its budget (+ one node)"
    assert admitted[-1] > 0.6 * 1000 * now[0], "and the budget is used (from t = 20 s, when E reaches 2)"
    # the controller's state is exported like SGLang's own gauges
    from prometheus_client import REGISTRY
    assert REGISTRY.get_sample_value("sglang:saria_budget_theta_e") == policy.admission.theta_E
    assert REGISTRY.get_sample_value("sglang:saria_budget_unspent_ratio") == policy.admission.fill


def prewrite_choice(admission: dict) -> tuple[list[int], SariaHiCachePolicy]:
    """Three host leaves; the one next in line was evicted once already, the last one too."""
    tree = Tree()
    root = tree.add(0, [], None)
    once_evicted, fresh, later = (tree.add(i, [c * 64], root) for i, c in ((1, "d"), (2, "e"), (3, "f")))
    policy = SariaHiCachePolicy(SariaConfig.from_dict({"admission": admission}), 16, lambda h: False)
    for node in (once_evicted, fresh, later):
        insert(policy, tree, node)
    for node in (once_evicted, later):
        assert evict(policy, node)  # E = 1
        insert(policy, tree, node)  # back in host memory
    order = {1: 0, 2: 1, 3: 2}  # host eviction priority: lowest goes first
    chosen = policy.prewrite_candidates([later, fresh, once_evicted], lambda n: order[n.id])
    return [n.id for n in chosen], policy


def test_prewrite_starts_writes_for_leaves_next_in_line_that_would_qualify():
    chosen, policy = prewrite_choice({"policy": "eviction:E2", "prewrite_depth_blocks": 2})
    assert chosen == [1], "only the once-evicted leaf within the next 2 pages qualifies with E + 1"
    assert policy.admission.admitted["prewrite"] == 1
    assert prewrite_choice({"policy": "eviction:E2", "prewrite_depth_blocks": 3})[0] == [1, 3]
    assert prewrite_choice({"policy": "eviction:E2", "prewrite": False})[0] == []


def test_threshold_policy_never_admits_more_pages_than_were_computed():
    # E1 rewrites a node at every reclaim while the store keeps losing it (on_ssd stays False)
    policy = make_policy("eviction:E1")
    tree, node = one_node()
    assert insert(policy, tree, node) is False  # 2 pages computed
    assert evict(policy, node) is False  # E+1 = 1 qualifies: write first (2 pages admitted)
    policy.on_store_evict(PAGES)  # the store lost the write (and its evidence: E1 needs 1 new eviction)
    assert evict(policy, node) is True  # the deferred reclaim goes
    insert(policy, tree, node)  # recomputed: no new pages, so no new write allowance
    assert evict(policy, node) is True  # qualifies again, but 2 more pages would pass 2 computed
    assert policy.pages_admitted == 2
    paper = SariaHiCachePolicy(SariaConfig.from_dict({"admission": {"policy": "eviction:E1", "rule": "paper"}}),
                               page_size=16, on_ssd=set().__contains__, clock=lambda: 100.0)
    insert(paper, tree, node)
    assert evict(paper, node) is False
    paper.on_store_evict(PAGES)
    assert evict(paper, node) is True
    insert(paper, tree, node)
    assert evict(paper, node) is False  # the paper rule writes it again


def test_stored_pages_reaching_host_are_counted_once_and_not_rewritten():
    """A page the store holds reaches host memory: reloaded and promoted (counted at its
    reload: not again), or recomputed (SGLang computes a prompt's last page; a store
    recovered at restart): counted now, so the tier audit finds counters for it."""
    policy = make_policy("full-duplicate", on_ssd=set(PAGES))
    tree = Tree()
    node = tree.add(1, PAGES, None)
    policy.on_ssd_reload(PAGES[:1])
    policy.on_ssd_reload(PAGES[:1])
    assert counters(policy, PAGES[0]) == (0, 1)
    assert not insert(policy, tree, node), "a stored page is not written again"
    assert counters(policy, PAGES[0]) == (0, 1), "the reloads counted it; its promotion does not"
    assert policy.metadata.get(page_key(PAGES[1])) is not None, "the recomputed page has counters"
    assert policy.admission.admitted.get("insert", 0) == 0


@dataclass(eq=False)
class HybridNode(Node):
    """A hybrid node: its Mamba component's host value is its GDN state in host memory."""

    component_data: dict = field(default_factory=dict)


def test_a_state_the_store_lacks_beside_stored_pages_is_written_before_the_reclaim():
    """The node's pages are stored (written with a longer node) but its GDN state, placed later, is
    not: the node is written before its reclaim (the store touches the pages, writes the state),
    asked of no admission; its next ask reclaims it, stored or not (a failed write never pins it)."""
    stored, states = set(PAGES), set()
    config = SariaConfig.from_dict({"admission": {"policy": "eviction:E3"}})
    policy = SariaHiCachePolicy(config, page_size=16, on_ssd=stored.__contains__, clock=lambda: 100.0, hybrid=True,
                                state_on_ssd=states.__contains__)
    node = HybridNode(1, PAGES, None, component_data={MAMBA: SimpleNamespace(host_value=object())})
    policy.on_host_insert(Tree({1: node}), 1)
    written = policy.sequencer.written_bytes
    assert policy.on_host_evict(node) == (False, [1])
    # the write credit counts pages (the content computed is counted in pages): a state spends none of it
    assert policy.sequencer.written_bytes == written and policy.stats.state_writes == 1
    assert evict(policy, node), "asked again after the write: reclaimed"
    states.add(PAGES[-1])
    assert evict(policy, node), "the state is stored: nothing to write"
    node.component_data[MAMBA].host_value = None
    states.clear()
    assert evict(policy, node), "no state in host memory: nothing to write"
    blind = SariaHiCachePolicy(config, page_size=16, on_ssd=stored.__contains__, clock=lambda: 100.0, hybrid=True)
    node.component_data[MAMBA].host_value = object()
    blind.on_host_insert(Tree({1: node}), 1)
    assert evict(blind, node), "without a sidecar probe (several ranks) stored pages count as the node stored"
    assert policy.stats.state_writes == 1



def test_pages_link_to_their_paths_first_page_as_the_replay_does():
    """A request down another branch goes around the pages of the first (``metadata.bypassed``): the
    server links pages to their path's first page from SGLang's tree, as the replay does from a request."""
    clock = [0.0]
    policy = SariaHiCachePolicy(SariaConfig.from_dict({"admission": {"policy": "auto"}}), page_size=16,
                                on_ssd=set().__contains__, clock=lambda: clock[0])
    tree = Tree()
    root = tree.add(0, [], None)
    system = tree.add(1, PAGES, root)
    old = tree.add(2, ["c" * 64, "d" * 64], system)
    insert(policy, tree, system)
    insert(policy, tree, old)
    policy.on_request_match("req-1", tree, old.id)
    first = policy.metadata.get(page_key(PAGES[0]))
    assert all(policy.metadata.get(page_key(h)).path_first is first for h in PAGES[1:] + old.hash_value)
    clock[0] = 10.0
    rewritten = tree.add(3, ["e" * 64], system)
    insert(policy, tree, rewritten)
    policy.on_request_match("req-2", tree, rewritten.id)
    assert [bypassed(policy.metadata.get(page_key(h))) for h in old.hash_value + rewritten.hash_value] == \
        [True, True, False]
