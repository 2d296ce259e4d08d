"""Prewrite (paper 4.2) and promotion headroom (4.4) read the head of HiCache's host eviction
order without a scan of every host leaf; these cases pin that they read the same leaves the
full scan (``heapq.nsmallest`` over the tree's set) reads, on SGLang's real Python tree core
and under random touch/add/discard sequences, and that headroom stops early.
"""

from __future__ import annotations

import heapq
import itertools
from array import array
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_saria.config import SariaConfig
from sglang_saria.hicache.host_leaf_order import HostLeafOrder, eviction_head
from sglang_saria.hicache.policy import SariaHiCachePolicy

_clock = itertools.count(1)


@dataclass(eq=False)
class Leaf:
    """The fields of SGLang's UnifiedTreeNode the order and the policy read (identity-hashed, as nodes are)."""

    id: int
    hash_value: list[str]
    last_access_time: int = field(default_factory=lambda: next(_clock))
    parent: "Leaf | None" = None  # under the root
    backuped: bool = True

    def node_by_id(self, node_id: int) -> "Leaf":  # a one-node tree, for the policy's insert hook
        assert node_id == self.id
        return self


def lru(node: Leaf) -> int:
    return node.last_access_time


def test_head_matches_nsmallest_over_random_touch_add_discard():
    @settings(max_examples=200, deadline=None)
    @given(st.lists(st.tuples(st.sampled_from("atdh"), st.integers(0, 19), st.integers(1, 8)), max_size=120))
    def run(ops):
        nodes = [Leaf(i, [f"{i:064x}"]) for i in range(20)]
        order = HostLeafOrder([], lru, indexed=True)
        for op, i, k in ops:
            if op == "a":
                order.add(nodes[i])
            elif op == "d":
                order.discard(nodes[i])
            elif op == "t":  # a match or insert touched it: LRU priority only grows
                nodes[i].last_access_time = next(_clock)
            else:
                assert order.head(k) == heapq.nsmallest(k, set(order), key=lru)
        assert order.head(len(order)) == sorted(order, key=lru)

    run()


def test_walk_leaves_the_order_intact_after_an_early_stop():
    leaves = [Leaf(i, ["x"]) for i in range(6)]
    order = HostLeafOrder(leaves, lru, indexed=True)
    assert order.head(2) == leaves[:2]
    assert order.head(6) == leaves


def test_prewrite_picks_the_leaves_the_full_scan_picks():
    leaves = [Leaf(i, [f"{i:02x}{p}" + "0" * 61 for p in range(1 + i % 3)]) for i in range(40)]

    def policy_after_one_eviction() -> SariaHiCachePolicy:
        policy = SariaHiCachePolicy(
            SariaConfig.from_dict({"admission": {"policy": "eviction:E2", "prewrite_depth_blocks": 12}}),
            16, lambda h: False, clock=lambda: 100.0,
        )
        for leaf in leaves:
            policy.on_host_insert(leaf, leaf.id)
            if leaf.id % 4 != 1:
                assert policy.on_host_evict(leaf) == (True, [])  # E = 1: qualifies for E2 at its next eviction
                policy.on_host_insert(leaf, leaf.id)
        return policy

    for leaf in leaves[::3]:
        leaf.last_access_time = next(_clock)  # reused: moves away from the eviction end
    order = HostLeafOrder(leaves, lru, indexed=True)
    # two policies: a prewrite marks its writes in flight, so a second scan would skip them
    indexed = [n.id for n in policy_after_one_eviction().prewrite_candidates(order, lru)]
    full = [n.id for n in policy_after_one_eviction().prewrite_candidates(set(leaves), lru)]
    assert indexed == full and indexed, "same leaves, same order as heapq.nsmallest over every leaf"


def test_head_reads_only_the_leaves_asked_for():
    """Prewrite and promotion read the next ``n`` leaves in eviction order: the index stops there."""
    leaves = [Leaf(i, ["p", "q"]) for i in range(1000)]
    seen = []

    def priority(leaf: Leaf) -> int:
        seen.append(leaf.id)
        return leaf.id

    order = HostLeafOrder(leaves, priority, indexed=True)
    seen.clear()
    assert [leaf.id for leaf in order.head(3)] == [0, 1, 2]
    assert len(seen) <= 3, "no priority is recomputed for the 997 other leaves"


def test_unindexed_strategy_reads_the_same_order_by_sorting():
    leaves = [Leaf(i, ["p"]) for i in range(8)]
    mru = lambda n: -n.last_access_time  # noqa: E731  priority that falls when touched: not indexable
    order = HostLeafOrder(leaves, mru, indexed=False)
    assert not order.indexed
    assert eviction_head(order, mru, 3) == heapq.nsmallest(3, leaves, key=mru)


def _python_tree_cache(kv_tokens: int):
    """A FULL-attention UnifiedRadixCache on SGLang's Python TreeCore, on CPU (no server)."""
    import torch
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", page_size=1))
    kv_pool = MHATokenToKVPool(size=kv_tokens, page_size=1, dtype=torch.bfloat16, head_num=1, head_dim=8,
                               layer_num=1, device="cpu", enable_memory_saver=False)
    allocator = TokenToKVPoolAllocator(size=kv_tokens, dtype=torch.bfloat16, device="cpu", kvcache=kv_pool,
                                       need_sort=False)
    return UnifiedRadixCache(params=CacheInitParams(
        req_to_token_pool=ReqToTokenPool(size=4, max_context_len=16, device="cpu", enable_memory_saver=False),
        token_to_kv_pool_allocator=allocator, page_size=1, disable=False,
        tree_components=(ComponentType.FULL,), eviction_policy="lru", tree_core_backend="python",
    ))


@pytest.fixture
def sglang_tree():
    """SGLang's Python TreeCore (FULL, page 1) with every node backed up to host memory."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    cache = _python_tree_cache(2048)
    allocator = cache.token_to_kv_pool_allocator
    tree = cache.tree_core
    tree.set_hicache_enabled()
    order = HostLeafOrder.install(tree)
    for s in range(24):
        tokens = [1, 2, 3, 4] + [100 * s + i for i in range(1, 9 + s % 5)]
        cache.insert(InsertParams(key=RadixKey(array("q", tokens)), value=allocator.alloc(len(tokens))))
    stack = list(tree.root_node.children.values())
    while stack:  # a write-through backup of every node, as the HiCache ack leaves it
        node = stack.pop()
        stack.extend(node.children.values())
        data = node.component_data[ComponentType.FULL]
        data.host_value = data.value.clone()
        tree._update_duplicate_tracking(node)

    def evict(tokens: int) -> None:
        cache.evict(EvictParams(num_tokens=tokens))

    def touch(s: int) -> None:
        key = RadixKey(array("q", [1, 2, 3, 4] + [100 * s + i for i in range(1, 4)]))
        cache.match_prefix(MatchPrefixParams(key=key))

    return cache, order, evict, touch


def test_index_follows_sglang_tree_core_through_device_and_host_eviction(sglang_tree):
    cache, order, evict, touch = sglang_tree
    tree = cache.tree_core
    priority = tree.eviction_strategy.get_priority

    def same_as_full_scan() -> None:
        assert tree.evictable_host_leaves is order
        assert order.head(len(order) + 1) == heapq.nsmallest(len(order) + 1, set(order), key=priority)

    evict(120)  # device leaves demoted: they become host leaves
    assert len(order) > 5
    same_as_full_scan()
    for s in (0, 5, 7):
        touch(s)
    evict(80)
    same_as_full_scan()
    before = set(order)
    cache.evict_host(30)  # SGLang's own host eviction removes leaves and exposes parents
    assert set(order) != before
    same_as_full_scan()
