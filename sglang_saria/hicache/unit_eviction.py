"""Host eviction for GDN state space that keeps a node's FA pages and its checkpoint one unit
(paper 4.3, unified metadata).

SGLang frees host mamba space (``MambaComponent.drive_host_eviction``) by walking the state
LRU: a host leaf goes whole, but without the storage gate, and an internal node loses its
state while its FA host pages stay. Under Saria a node's DRAM copy is one unit with one set of
counters, as the core's DRAM tier holds it: the admission policy decides on it (a threshold
write starts only at a node holding its checkpoint), and a reload plan ends on it. So with the
saria backend, ``SariaRadixCache.evict_host`` frees state space here instead: host leaves go
whole (FA pages and state), in the order FULL host eviction takes them
(``FullComponent.drive_host_eviction``), each through the tree core's ``host_eviction_gate``
(`tree_core.py`): a leaf the policy admits is written before its reclaim, and each reclaim counts one
eviction of the node (``E += 1``) for both objects. An evicted leaf's parent joins the order
once it is a host leaf, so a state on an internal node leaves with its FA pages when its
subtree has left host memory, never before.

A state is never dropped alone, so state space can run short where SGLang's walk would have
found some: while every host leaf is held (writes before reclaim in flight), or when the states
belong to nodes whose FA pages are still on the device (SGLang's device eviction dropped the
state's device copy there). The allocation then fails, as FULL's does when all its host leaves
are held; such a node's state becomes evictable with its FA pages once the node is a host leaf.
"""

from __future__ import annotations

import heapq
from typing import Any

from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.mem_cache.unified_cache.unified_tree_core_interface import DriveHostEvictionResult


def evict_host_units(tree_core: Any, num_tokens: int) -> DriveHostEvictionResult:
    """Free ``num_tokens`` of host state space by FULL's host-leaf walk (same order; the tree core's host eviction gate asks the policy);
    the caller drains the result (``UnifiedRadixCache._apply_eviction_result``)."""
    result = DriveHostEvictionResult()
    full = tree_core.components_by_type[ComponentType.FULL]
    full._ensure_eviction_strategy()
    priority = full.session_ref_eviction_strategy
    leaves = tree_core.evictable_host_leaves
    heap = [(priority(n), n) for n in leaves]
    heapq.heapify(heap)
    while result.tracker[ComponentType.MAMBA] < num_tokens and heap:
        _, node = heapq.heappop(heap)
        if node not in leaves:
            continue
        parent = node.parent
        tree_core._evict_host_leaf(node, result.tracker, result.device_frees, result.host_frees,
                                   cache_actions=result.cache_actions)
        if parent is not None and parent in leaves:
            heapq.heappush(heap, (priority(parent), parent))
    return result
