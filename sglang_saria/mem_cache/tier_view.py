"""What the write sequencer reads of the tiers: one protocol, one implementation per driver.

The sequencer (``sequencer.py``) decides every SSD write of both drivers; it needs a node's
parent, where its KV is (DRAM, SSD), whether it carries a checkpoint (hybrid models), its
size, and the totals its write cap compares. The replay answers from the metadata's location
bitmasks (``ReplayTierView`` in ``replay/tiers.py``); the SGLang adapter from the radix tree's
host copies and the store's index (``hicache/tree_view.py``), so neither keeps a second copy of
the other's state.

A key names one node: a block in the replay, a radix-tree node in SGLang. The sequencer only
hashes and compares keys.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sglang_saria.mem_cache.metadata import ContextNode


class TierView(Protocol):
    """The tiers as the sequencer's decisions read them."""

    #: whether writes may start only at checkpoint nodes (hybrid models: a block is reusable only up to one)
    hybrid: bool

    def parent(self, key: Hashable) -> Hashable | None:
        """The node's parent; None at the top of the tree."""

    def location(self, key: Hashable) -> int | None:
        """``DRAM | SSD`` bits of the node's KV (a write in flight counts as on SSD); None: unknown node."""

    def has_checkpoint(self, key: Hashable) -> bool:
        """Whether the node carries a state checkpoint a reload can resume from."""

    def size(self, key: Hashable) -> tuple[int, int]:
        """(SSD tokens, bytes) a write of the node takes."""

    @property
    def ssd_capacity_tokens(self) -> int:
        """SSD capacity in the units of ``size``."""

    def computed_bytes(self) -> int:
        """Bytes of the distinct KV content computed so far (write-through's minimum)."""

    def ssd_victim(self, tokens: int) -> "ContextNode | None":
        """The node whose SSD copy a write of ``tokens`` would displace first; None while SSD has room."""

    def block_key(self, key: Hashable) -> Hashable:
        """The content key a keyed policy remembers ``key`` by across residencies (its ghost): the
        replay's block key, a tree node's last page."""
