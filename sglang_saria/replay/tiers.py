"""The replay's simulated DRAM and SSD tiers, and the write sequencer's view of them.

A tier only records residency (token-capacity accounting, eviction order, byte counters);
it never decides what to admit or evict on its own (the core does, through the eviction
plug-in). ``ReplayTierView`` is the ``TierView`` (``mem_cache/tier_view.py``) the sequencer
reads in the replay: locations are the metadata's bitmasks; the server's is ``hicache/tree_view.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from sglang_saria.mem_cache.eviction import EvictionPolicy, LRUEviction
from sglang_saria.mem_cache.metadata import DRAM, ROOT, SSD, ContextMetadata, ContextNode

TIER_NAMES = {DRAM: "dram", SSD: "ssd"}


class Tier:
    """One storage tier holding context nodes, measured in FA token equivalents."""

    def __init__(self, tier_id: int, capacity_tokens: int, eviction: EvictionPolicy | None = None,
                 capacity_states: int = 0) -> None:
        if capacity_tokens < 0 or capacity_states < 0:
            raise ValueError(f"{TIER_NAMES.get(tier_id, tier_id)} capacity_tokens={capacity_tokens}, "
                             f"capacity_states={capacity_states}: must be >= 0")
        self.tier_id = tier_id
        self.name = TIER_NAMES.get(tier_id, str(tier_id))
        self.capacity_tokens = capacity_tokens
        self.used_tokens = 0
        self.eviction = eviction if eviction is not None else LRUEviction()
        # the plug-in's own method, without a layer: the core asks it once per DRAM eviction
        self.victim: Callable[[], int] = self.eviction.victim  # the next key to evict (the tier must be non-empty)
        self._entries: dict[int, tuple[int, int]] = {}  # key -> (tokens, bytes)
        self._unread: dict[int, int] = {}  # written and not read since (bytes), for writes-never-read
        # a pool of its own for GDN states (0: none; they count in the tokens): keys holding one
        self.capacity_states = capacity_states
        self._states: set[int] = set()
        self.bytes_written = 0
        self.bytes_read = 0
        self.bytes_written_then_read = 0
        self.evictions = 0

    def __contains__(self, key: int) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def free_tokens(self) -> int:
        return self.capacity_tokens - self.used_tokens

    def size_of(self, key: int) -> tuple[int, int]:
        return self._entries[key]

    @property
    def states_full(self) -> bool:
        """The state pool (if any) has no free slot."""
        return 0 < self.capacity_states <= len(self._states)

    def insert(self, key: int, tokens: int, nbytes: int, state: bool = False) -> None:
        """Make ``key`` resident (caller has made room); counts ``nbytes`` as written. ``state``: it
        takes a slot of the state pool (the tier must have one)."""
        entries = self._entries
        if key in entries:
            raise KeyError(f"{self.name}: key {key} already resident")
        used = self.used_tokens + tokens
        if used > self.capacity_tokens:
            raise ValueError(f"{self.name}: inserting {tokens} tokens exceeds free {self.free_tokens}")
        if state:
            if not self.capacity_states or self.states_full:
                raise ValueError(f"{self.name}: no free state slot of {self.capacity_states}")
            self._states.add(key)
        entries[key] = (tokens, nbytes)
        self.used_tokens = used
        self.eviction.insert(key)
        self.bytes_written += nbytes
        self._unread[key] = nbytes

    def grow(self, key: int, tokens: int, nbytes: int) -> None:
        """Resident ``key`` gains an object of ``tokens`` / ``nbytes`` (a GDN state written beside its FA
        block; caller has made room): counted as written, and a touch of the copy, as a rewrite is."""
        size_tokens, size_bytes = self._entries[key]
        if self.used_tokens + tokens > self.capacity_tokens:
            raise ValueError(f"{self.name}: growing {key} by {tokens} tokens exceeds free {self.free_tokens}")
        self._entries[key] = (size_tokens + tokens, size_bytes + nbytes)
        self.used_tokens += tokens
        self.eviction.access(key)
        self.bytes_written += nbytes
        self._unread[key] = self._unread.get(key, 0) + nbytes

    def remove(self, key: int, evicted: bool = True) -> None:
        self.used_tokens -= self._entries.pop(key)[0]
        self._states.discard(key)
        self.eviction.remove(key)
        self._unread.pop(key, None)
        if evicted:
            self.evictions += 1

    def read(self, key: int, nbytes: int) -> None:
        """A reload read ``nbytes`` of ``key`` from this tier (also refreshes its recency)."""
        self.bytes_read += nbytes
        first = self._unread.pop(key, None)
        if first is not None:
            self.bytes_written_then_read += first
        self.eviction.access(key)

    def read_many(self, keys: list[int], nbytes_each: int) -> None:
        """``read`` for a run of same-sized objects, in order."""
        self.count_reads(keys, nbytes_each)
        self.eviction.access_many(keys)

    def count_reads(self, keys: list[int], nbytes_each: int) -> None:
        """The byte counters of ``read_many``, leaving the order to the caller (the SSD order's
        ``touch_prefix``)."""
        unread = self._unread
        for k in keys:
            first = unread.pop(k, None)
            if first is not None:
                self.bytes_written_then_read += first
        self.bytes_read += nbytes_each * len(keys)

    def unread(self, key: int) -> bool:
        """Whether ``key``'s current copy has not been read since it was written."""
        return key in self._unread

    def access(self, key: int) -> None:
        self.eviction.access(key)

    def access_many(self, keys: Iterable[int]) -> None:
        self.eviction.access_many(keys)

    def access_resident(self, keys: list[int]) -> None:
        """``access_many`` for those of ``keys`` resident here, in order."""
        self.eviction.access_many(filter(self._entries.__contains__, keys))  # a C loop: per reused block

    def victims(self) -> Iterator[int]:
        return self.eviction.victims()

    @property
    def writes_never_read_frac(self) -> float:
        if self.bytes_written == 0:
            return 0.0
        return 1.0 - self.bytes_written_then_read / self.bytes_written


class ReplayTierView:
    """``TierView`` over the replay's metadata: locations are the nodes' bitmasks, keys are block keys."""

    __slots__ = ("_md", "_nodes", "_sizes", "_ssd", "_block_bytes", "_ckpt_bytes", "hybrid")

    def __init__(self, metadata: ContextMetadata, sizes: tuple[tuple[int, int], tuple[int, int]], ssd: Tier,
                 block_bytes: int, ckpt_bytes: int, hybrid: bool) -> None:
        self._md = metadata
        self._nodes: dict[int, ContextNode] = metadata.nodes
        self._sizes = sizes  # (tokens, bytes) without / with a checkpoint, indexed by bool
        self._ssd = ssd
        self._block_bytes = block_bytes
        self._ckpt_bytes = ckpt_bytes
        self.hybrid = hybrid

    def parent(self, key: int) -> int | None:
        p = self._nodes[key].parent
        return None if p == ROOT else p

    def location(self, key: int) -> int | None:
        node = self._nodes.get(key)
        return None if node is None else node.fa_loc

    def has_checkpoint(self, key: int) -> bool:
        return self._nodes[key].ck_loc >= 0

    def size(self, key: int) -> tuple[int, int]:
        return self._sizes[self._nodes[key].ck_loc >= 0]

    @property
    def ssd_capacity_tokens(self) -> int:
        return self._ssd.capacity_tokens

    def computed_bytes(self) -> int:
        md = self._md
        return md.created * self._block_bytes + md.created_checkpoints * self._ckpt_bytes

    def ssd_victim(self, tokens: int) -> ContextNode | None:
        ssd = self._ssd
        if ssd.free_tokens >= tokens or not ssd.used_tokens:
            return None
        return self._nodes[ssd.victim()]

    def block_key(self, key: int) -> int:
        return key
