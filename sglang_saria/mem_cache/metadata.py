"""Unified context metadata (paper 4.3).

A context node is a block-aligned prefix keyed by its chained block key (parent key
+ block content), so the key alone identifies the whole prefix: the radix tree is a
flat ``dict`` from key to node, and walking a request's key list is walking the
tree. Each node holds counters shared by all its objects (``R``, ``E``, ``t_reuse``)
and one location bitmask per object: the FA block and, on checkpoint boundaries of
hybrid models, the GDN checkpoint. Metadata outlives residency and is reclaimed only
after ``metadata_window_s`` without reuse/recomputation while no tier holds it.

Each node also links to the node of its path's first block (``path_first``): a request that used
the first block after the node's last use went around the node (``bypassed``), as an agent does
when it rewrites or compacts its history. Tracking it costs one reference per node and no work per
request beyond the node's creation.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable

# location bits of an object (``fa_loc``, ``ck_loc``): which tiers hold a copy
DRAM = 1
SSD = 2
NO_CHECKPOINT = -1  # ck_loc of nodes that do not end on a checkpoint boundary
ROOT = -1  # parent of a first block (keys are non-negative)
FA_BLOCK = "fa"
GDN_CHECKPOINT = "gdn"


class ContextNode:
    """Counters and object locations of one block-aligned prefix (about 110 bytes)."""

    __slots__ = ("R", "E", "t_reuse", "fa_loc", "ck_loc", "parent", "e_spent", "path_first")

    def __init__(self, now: float, has_checkpoint: bool, parent: int = ROOT) -> None:
        self.R = 0  # request reuses after first computation (hit or recompute)
        self.E = 0  # DRAM evictions across residencies
        self.parent = parent  # key of the previous block (ROOT for a first block): the radix tree's edge
        # E when the node's last SSD copy was evicted: robust admission wants theta_E evictions since then
        self.e_spent = 0
        self.t_reuse = now  # last time a request used (or computed) the block
        self.fa_loc = 0  # bitmask of DRAM | SSD holding the FA block
        self.ck_loc = 0 if has_checkpoint else NO_CHECKPOINT  # same for the GDN checkpoint
        # the node of the first block of the path this node was created on (None: this node, or unknown)
        self.path_first: ContextNode | None = None

    def __repr__(self) -> str:
        return (f"ContextNode(R={self.R}, E={self.E}, t_reuse={self.t_reuse}, fa_loc={self.fa_loc}, "
                f"ck_loc={self.ck_loc}, parent={self.parent}, e_spent={self.e_spent})")


def bypassed(node: ContextNode) -> bool:
    """Whether a request used the node's path after the node's last use but left the node out: it went
    around it (an agent rewrote or compacted its history, or left a branch; or, on a first block
    shared by many sessions, another session came). False when the path's first block is unknown."""
    first = node.path_first
    return first is not None and first.t_reuse > node.t_reuse


class ContextMetadata:
    """The metadata tree: key -> node, plus a recency list for window reclamation."""

    def __init__(self, block_tokens: int, checkpoint_tokens: int | None, window_s: float,
                 checkpoints_on_grid: bool = True) -> None:
        self.block_tokens = block_tokens
        # checkpoints sit on blocks i (0-based) with (i + 1) % stride == 0; 0 = FA-only model
        self.checkpoint_stride = (checkpoint_tokens // block_tokens) if checkpoint_tokens else 0
        # every grid block carries one from its creation; else the owner places them (`place_checkpoint`)
        self._grid_stride = self.checkpoint_stride if checkpoints_on_grid else 0
        self.window_s = window_s
        self.nodes: dict[int, ContextNode] = {}
        self._recency: OrderedDict[int, None] = OrderedDict()  # by last use; reclamation scans the front
        self.reclaimed = 0
        self.created = 0  # nodes created (first computations, and recomputations after reclamation)
        self.created_checkpoints = 0  # of which on a checkpoint boundary
        # keys whose counters changed since the owner last took them (None: not tracked); a driver
        # that keeps counters across restarts saves these (hicache/counter_log.py)
        self.changed: set[int] | None = None
        self._restored: set[int] = set()  # restored nodes not used since: counted as created at first use

    def __len__(self) -> int:
        return len(self.nodes)

    def get(self, key: int) -> ContextNode | None:
        return self.nodes.get(key)

    def record_use(self, keys: list[int], now: float, r_watch: int = 0,
                   found: list[ContextNode | None] | None = None, path_first: ContextNode | None = None,
                   from_root: bool = True) -> list[int]:
        """A request's input contains ``keys``: count reuse, create first-time nodes.

        Returns the keys whose ``R`` just reached ``r_watch`` (0 = no watch), which the
        reuse-triggered admission path turns into asynchronous writes. ``found``: the keys'
        nodes (None: unknown) if the caller looked them up already. New nodes link to their
        path's first block: ``keys[0]`` when the keys start at the root (``from_root``), else
        ``path_first`` (None: unknown). O(len(keys)), with Python code per block only for the
        counters. The keys of one request are distinct (chained: each names a prefix of its own length).
        """
        if found is None:
            found = list(map(self.nodes.get, keys))
        known = list(filter(None, found))  # a node is always true: a C scan, no comparisons
        for node in known:
            node.R += 1
            node.t_reuse = now
        reached = [k for k, node in zip(keys, found) if node is not None and node.R == r_watch] if r_watch else []
        if len(known) < len(found):  # the unknown blocks are mostly the request's new tail
            self._create(keys, found, found.index(None), now, found[0] if from_root else path_first, from_root)
        deque(map(self._recency.move_to_end, keys), 0)  # all of them most recent, in order (a C loop)
        if self.changed is not None:
            self.changed.update(keys)
        if self._restored:
            self._count_restored(keys)
        return reached

    def _count_restored(self, keys: list[int]) -> None:
        """Restored nodes used for the first time in this process: computed (or reloaded) here, so
        counted as created (the robust rule's write credit: what write-through would write now)."""
        used = self._restored.intersection(keys)
        if used:
            self._restored -= used
            self.created += len(used)

    def note_changed(self, keys: Iterable[int]) -> None:
        """The caller changed these nodes' counters itself (``E``, ``e_spent``)."""
        if self.changed is not None:
            self.changed.update(keys)

    def take_changed(self) -> list[tuple[int, ContextNode]]:
        """The changed nodes still held (reclaimed ones are gone), and tracking starts afresh."""
        if not self.changed:
            return []
        nodes = self.nodes
        taken = [(k, nodes[k]) for k in self.changed if k in nodes]
        self.changed.clear()  # the same set: an owner may have given it a hook
        return taken

    def restore(self, rows: Iterable[tuple[int, int, int, int, float]]) -> int:
        """Counters kept from an earlier process, ``(key, R, E, e_spent, t_reuse)`` oldest first with
        ``t_reuse`` on this clock: a node for each unknown key, before every known one in the
        recency list (they were used earlier). Counted as created at their first use, not here.
        Locations are not restored (the tiers say where copies are). Returns the nodes added."""
        nodes, added = self.nodes, OrderedDict()
        for key, r, e, e_spent, t_reuse in rows:
            if key not in nodes:
                node = nodes[key] = ContextNode(t_reuse, False)
                node.R, node.E, node.e_spent = r, e, e_spent
                added[key] = None
        n = len(added)
        if n:
            self._restored.update(added)
            added.update(self._recency)
            self._recency = added
        return n

    def _create(self, keys: list[int], found: list[ContextNode | None], start: int, now: float,
                path_first: ContextNode | None, from_root: bool) -> None:
        """First computations (or recomputations after reclamation): a node for each key from ``start``
        on that ``found`` has none for, its parent the key before, linked to ``path_first`` (with
        ``from_root`` and none given: the node created for ``keys[0]``)."""
        stride = self._grid_stride
        nodes, recency = self.nodes, self._recency
        created = checkpoints = 0
        for i in range(start, len(keys)):
            if found[i] is None:
                key = keys[i]
                ck = stride > 0 and (i + 1) % stride == 0
                node = nodes[key] = ContextNode(now, ck, keys[i - 1] if i else ROOT)
                if i == 0 and from_root:
                    path_first = node
                elif path_first is not None:
                    node.path_first = path_first
                recency[key] = None
                created += 1
                checkpoints += ck
        self.created += created
        self.created_checkpoints += checkpoints

    def place_checkpoint(self, node: ContextNode) -> None:
        """``node`` now ends on a checkpoint (placed by its owner, not by the grid); no tier holds it yet."""
        if node.ck_loc == NO_CHECKPOINT:
            node.ck_loc = 0
            self.created_checkpoints += 1

    def set_location(self, key: int, obj: str, tier: int, present: bool) -> None:
        """Adapter hook: one object of a node gained/lost a copy in ``tier`` outside the core.

        E.g. SGLang's Mamba pool dropped a checkpoint while the FA block stays resident.
        """
        node = self.nodes[key]
        if obj == FA_BLOCK:
            node.fa_loc = (node.fa_loc | tier) if present else (node.fa_loc & ~tier)
        elif obj == GDN_CHECKPOINT:
            if node.ck_loc == NO_CHECKPOINT:
                raise ValueError(f"node {key} is not on a checkpoint boundary")
            node.ck_loc = (node.ck_loc | tier) if present else (node.ck_loc & ~tier)
        else:
            raise ValueError(f"unknown object {obj!r}; expected {FA_BLOCK!r} or {GDN_CHECKPOINT!r}")

    def reclaim(self, now: float) -> int:
        """Drop nodes unused for a whole window that no tier holds. Amortised O(1) per node.

        A stale node still held by a tier is moved behind the fresh ones and revisited
        once it reaches the front again, so reclamation is late, never early.
        """
        cutoff = now - self.window_s
        nodes = self.nodes
        recency = self._recency
        dropped = 0
        for _ in range(len(recency)):
            k = next(iter(recency))
            node = nodes[k]
            if node.t_reuse >= cutoff:
                break
            if node.fa_loc or node.ck_loc > 0:
                recency.move_to_end(k)
                continue
            del recency[k]
            del nodes[k]
            self._restored.discard(k)
            dropped += 1
        self.reclaimed += dropped
        return dropped


__all__ = ["ContextMetadata", "ContextNode", "bypassed", "NO_CHECKPOINT", "ROOT", "DRAM", "SSD", "FA_BLOCK", "GDN_CHECKPOINT"]
