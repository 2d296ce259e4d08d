"""HiCache's host leaves in eviction order, read from the head without scanning all of them.

SGLang's Python TreeCore keeps its evictable host leaves in a plain set and heapifies all
of them when it evicts. Saria reads the head of that order far more often: prewrite after
every write-through ack (paper 4.2) and promotion headroom at every SSD reload (4.4). A
scan of every leaf per event costs O(host leaves) each time, tens of thousands of leaves
on a full host pool. ``HostLeafOrder`` *is* that set (installed as the tree core's
``evictable_host_leaves``, so the tree core maintains it through its own ``add`` and
``discard``) plus a lazy min-heap keyed by the eviction priority: reading the first ``k``
leaves costs O((k + stale entries) log n), and a stale entry exists only because the tree
touched that node since (a match or insert), so the work follows the events, not the size.

Exact for eviction strategies whose priority never decreases while a node stays a leaf
(LRU, LFU, FIFO, SLRU: access time and hit count only grow): every member then has a heap
entry at or below its current priority, and a popped entry whose priority moved is pushed
back with the current one, so leaves come out in the order ``heapq.nsmallest`` over the
whole set gives. Any other strategy (MRU, FILO, priority, TLRU) is not indexed: reads sort
the whole set.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable
from typing import Any

_SLACK = 64  # garbage entries tolerated beyond one per member before the heap is rebuilt


class HostLeafOrder(set):
    """The tree core's set of evictable host leaves, with its eviction order kept as a lazy heap."""

    def __init__(self, leaves: Iterable[Any], priority: Callable[[Any], Any], indexed: bool) -> None:
        super().__init__()
        self._priority = priority
        self._seq = itertools.count()  # tie-break: heap entries never compare nodes
        self._heap: list[tuple[Any, int, Any]] | None = [] if indexed else None
        for node in leaves:
            self.add(node)

    @classmethod
    def install(cls, tree_core: Any) -> "HostLeafOrder":
        """Replace ``tree_core.evictable_host_leaves`` (after construction or a reset) by an ordered one."""
        # Imported here: the policy module imports this one and must load without SGLang (replay, tests).
        from sglang.srt.mem_cache.evict_policy import FIFOStrategy, LFUStrategy, LRUStrategy, SLRUStrategy

        strategy = tree_core.eviction_strategy
        # Strategies whose get_priority(node) never decreases while the node is a leaf.
        monotone = type(strategy) in (LRUStrategy, LFUStrategy, FIFOStrategy, SLRUStrategy)
        order = cls(tree_core.evictable_host_leaves, strategy.get_priority, monotone)
        tree_core.evictable_host_leaves = order
        return order

    @property
    def indexed(self) -> bool:
        return self._heap is not None

    def add(self, node: Any) -> None:
        # The tree core re-adds members on every leaf-set update: only a new member gets an entry.
        if node in self:
            return
        super().add(node)
        if self._heap is None:
            return
        heapq.heappush(self._heap, (self._priority(node), next(self._seq), node))
        if len(self._heap) > 2 * len(self) + _SLACK:
            self._rebuild()

    def _rebuild(self) -> None:
        """Drop the entries of departed nodes and duplicates: O(n), after at least n discards."""
        self._heap = [(self._priority(n), next(self._seq), n) for n in self]
        heapq.heapify(self._heap)

    def walk(self, visit: Callable[[Any], bool]) -> None:
        """Call ``visit`` on the leaves in eviction order (first to go first) until it returns False."""
        if self._heap is None:
            for node in sorted(self, key=self._priority):
                if not visit(node):
                    return
            return
        heap, seen, popped = self._heap, set(), []
        try:
            while heap:
                key, _, node = heap[0]
                if node not in self or node in seen:
                    heapq.heappop(heap)  # departed, or a duplicate of a leaf already visited
                    continue
                current = self._priority(node)
                if current != key:
                    heapq.heapreplace(heap, (current, next(self._seq), node))  # touched since: re-key
                    continue
                popped.append(heapq.heappop(heap))
                seen.add(node)
                if not visit(node):
                    return
        finally:
            for entry in popped:
                heapq.heappush(heap, entry)

    def head(self, n: int) -> list[Any]:
        """The first ``n`` leaves in eviction order (``heapq.nsmallest(n, leaves, key=priority)``)."""
        out: list[Any] = []

        def take(node: Any) -> bool:
            out.append(node)
            return len(out) < n

        if n > 0:
            self.walk(take)
        return out


def eviction_head(leaves: Iterable[Any], priority: Callable[[Any], Any], n: int) -> list[Any]:
    """The first ``n`` host leaves to be evicted: read off the index when the tree has one.

    ``priority`` orders a plain set; an index orders by the strategy it was installed with,
    which is the one the caller passes (``tree_core.eviction_strategy.get_priority``).
    """
    if isinstance(leaves, HostLeafOrder):
        return leaves.head(n)
    return heapq.nsmallest(n, leaves, key=priority)

