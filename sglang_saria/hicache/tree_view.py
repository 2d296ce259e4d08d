"""The write sequencer's ``TierView`` over SGLang's radix tree and the saria store.

Keys are the tree's nodes (``UnifiedTreeNode``; several pages each). Nothing is copied: a
node's parent is the tree's, DRAM is its host copy (``backuped``), SSD is the store's index
(or the ranks' agreed view of it, ``rank_agreement.py``) for the node's last page, plus the
writes this view was told were ordered and not yet seen in the index (``ordered``): a write
the tree issued is in flight, and a second decision must not write it again. `page_key`: the
core metadata's key of an SGLang page hash (counters and hints are kept by page, nodes read their
last page's).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

from sglang_saria.mem_cache.metadata import DRAM, SSD, ContextMetadata, ContextNode

MAMBA = int(ComponentType.MAMBA)  # index of a node's Mamba state in component_data
_ORDERED_TTL_S = 120.0  # an ordered write not in the index after this long failed (store full, I/O error)


def page_key(page_hash: str) -> int:
    """SGLang page hashes are hex digests; their first 64 bits key the core's metadata."""
    return int(page_hash[:16], 16)


class TreeTierView:
    """``TierView`` over SGLang tree nodes; ``on_ssd`` and ``clock`` are the store's or the ranks' agreed ones."""

    def __init__(self, metadata: ContextMetadata, page_size: int, page_bytes: int, ssd_capacity_bytes: int,
                 on_ssd: Callable[[str], bool], clock: Callable[[], float] = time.monotonic,
                 hybrid: bool = False, ssd_victim_page: Callable[[int], str | None] | None = None) -> None:
        """``ssd_victim_page(nbytes)``: the page hash the store would evict first to make room for
        ``nbytes`` (None: it has room); without it no write is compared with a victim."""
        self.metadata = metadata
        self.page_size = page_size
        # the write cap counts bytes; without a page size in bytes it counts pages
        self.unit = page_bytes or 1
        self._capacity_tokens = ssd_capacity_bytes // self.unit * page_size if ssd_capacity_bytes else 1 << 62
        self.on_ssd = on_ssd
        self.clock = clock
        self.hybrid = hybrid  # a Mamba pool is registered: writes start at nodes holding a state checkpoint
        self._ordered: OrderedDict[str, float] = OrderedDict()  # last page hash -> clock when its write was ordered
        self._ssd_victim_page = ssd_victim_page

    # ------------------------------------------------------------------ TierView
    def parent(self, node: Any) -> Any | None:
        p = node.parent
        return p if p is not None and p.hash_value else None  # the root carries no pages

    def location(self, node: Any) -> int | None:
        hashes = node.hash_value
        if not hashes:
            return None
        loc = DRAM if node.backuped else 0
        if self.page_on_ssd(hashes[-1]):
            loc |= SSD
        return loc

    def page_on_ssd(self, page_hash: str) -> bool:
        """The store holds the page, or a write of a node ending on it was ordered."""
        return self.on_ssd(page_hash) or page_hash in self._ordered

    def has_checkpoint(self, node: Any) -> bool:
        return node.component_data[MAMBA].host_value is not None

    def size(self, node: Any) -> tuple[int, int]:
        pages = len(node.hash_value)
        return pages * self.page_size, pages * self.unit

    @property
    def ssd_capacity_tokens(self) -> int:
        return self._capacity_tokens

    def computed_bytes(self) -> int:
        return self.metadata.created * self.unit

    def ssd_victim(self, tokens: int) -> ContextNode | None:
        """The counters of the page the store would evict first for a write of ``tokens``; None while
        it has room, or when the store cannot say (no victim order given, or the page has no counters)."""
        if self._ssd_victim_page is None:
            return None
        page = self._ssd_victim_page(-(-tokens // self.page_size) * self.unit)
        return None if page is None else self.metadata.get(page_key(page))

    def block_key(self, node: Any) -> int:
        """A node is remembered by its last page (its counters' key)."""
        return page_key(node.hash_value[-1])

    # ------------------------------------------------------------------ writes in flight
    def ordered(self, nodes: Iterable[Any]) -> None:
        """The tree was asked to write these nodes: on SSD for later decisions until the index says otherwise."""
        now = self.clock()
        for node in nodes:
            self._ordered[node.hash_value[-1]] = now
            self._ordered.move_to_end(node.hash_value[-1])
        self._expire(now)

    def forget(self, page_hashes: Iterable[str]) -> None:
        """Pages left the store: an ordered write of them is over."""
        for h in page_hashes:
            self._ordered.pop(h, None)

    def _expire(self, now: float) -> None:
        """Drop the writes the index holds now, and those given up; O(writes in flight)."""
        on_ssd = self.on_ssd
        for h in [h for h, t in self._ordered.items() if now - t >= _ORDERED_TTL_S or on_ssd(h)]:
            del self._ordered[h]
