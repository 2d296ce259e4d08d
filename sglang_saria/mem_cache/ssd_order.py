"""The SSD victim order of both drivers: which stored objects go when SSD is full.

One order, one notion of recency, for the replay's SSD tier (``core.py``) and the server's store
(``storage/store.py``, which keeps its victims in this object instead of a private LRU):

- **what touches an SSD copy**: a write of it (``written``) and a read of it from SSD
  (``touch_prefix`` after a reload, ``access`` per object). A reuse served from DRAM or the GPU
  does not, nor does a recomputation: SSD is the capacity tier and its order follows its own
  traffic (paper 4.1; the replay has always done so, its pinned outputs are unchanged);
- **a prefix is touched deepest first**: the objects one reload reads, or one write stores, are a
  prefix's run (head first); they are touched from the deepest one back, so the head is the most
  recent and a prefix's tail leaves SSD before its head, the leaf-first order of a radix tree
  (a missing head makes everything behind it unusable). The replay's write chains are deepest
  first already (node, then ancestors), so each ``written`` in turn gives the same order;
- **the victim** is the eviction end of the order (LRU by default, ``fifo`` ignores touches),
  skipping ``pinned`` objects (the replay: blocks the current request reads, a chain's own prefix;
  the store defers freeing the slots of objects being read instead). O(1) per operation, no scan.

Victims are reported to ``WriteSequencer.ssd_lost`` by each driver as before (the replay at once,
the server through the store's ``on_evict`` listener). Not thread-safe: the store calls it under
its own lock.
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Iterable, Sequence

from sglang_saria.mem_cache.eviction import EvictionPolicy, make_eviction


class SSDVictimOrder:
    """Recency of SSD copies (any hashable keys); the replay's SSD ``Tier`` takes it as its eviction plug-in."""

    __slots__ = ("eviction", "insert", "access", "access_many", "remove", "victims")

    def __init__(self, eviction: str | EvictionPolicy = "lru") -> None:
        ev = make_eviction(eviction) if isinstance(eviction, str) else eviction
        self.eviction = ev
        # the plug-in's own bound methods: the replay's tier calls them per block, without a layer
        self.insert = ev.insert  # a new copy is the most recent
        self.access = ev.access  # one object read (or re-written)
        self.access_many = ev.access_many
        self.remove = ev.remove
        self.victims = ev.victims  # () -> keys from the eviction end

    @property
    def name(self) -> str:
        return self.eviction.name

    def __contains__(self, key: Hashable) -> bool:
        return key in self.eviction

    def __len__(self) -> int:
        return len(self.eviction)

    def written(self, key: Hashable) -> None:
        """A write of ``key`` committed: a new copy enters at the recent end, a rewrite is a touch."""
        if key in self.eviction:
            self.eviction.access(key)
        else:
            self.eviction.insert(key)

    def touch_prefix(self, keys: Sequence[Hashable]) -> None:
        """Objects of one prefix (``keys`` head first, all held) were read or written together:
        touched deepest first, so the head is the most recent."""
        self.eviction.access_many(reversed(keys))

    def demote(self, keys: Iterable[Hashable]) -> int:
        """Held objects of ``keys`` become the first victims (their session ended); returns how many."""
        ev = self.eviction
        held = [k for k in keys if k in ev]
        for k in held:  # each in front of the one before: the tail goes first, the head last, as everywhere
            ev.demote(k)
        return len(held)

    def victim(self, pinned: Container = ()) -> Hashable | None:
        """The next object to evict, passing over ``pinned`` ones; None when none is left."""
        if not pinned:
            return next(iter(self.eviction.victims()), None)
        return next((k for k in self.eviction.victims() if k not in pinned), None)

    def order(self) -> list:
        """Held keys from the eviction end (O(n): for listings and tests)."""
        return list(self.eviction.victims())

