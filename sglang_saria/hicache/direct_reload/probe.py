"""What SGLang's tree and the store hold past a request's match, as the core planner's pages (paper 4.3).

`SariaRadixCache` probes at a request's arrival and plans again when the reload is claimed
(the anchor's device part may have been evicted since). The walks here read the tree's
nodes (host values, mamba values, page hashes) and the store's index, never a pool, and
do no I/O; the plan itself is `reload/plan.py`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.components import ComponentType
from sglang.srt.mem_cache.unified_radix_cache import NodeId

from sglang_saria.hicache.tree_view import page_key
from sglang_saria.mem_cache.metadata import DRAM, SSD
from sglang_saria.mem_cache.planner import ReloadPlan
from sglang_saria.reload.plan import PageObjects, checkpoint_loc, plan_pages


@dataclass(frozen=True)
class DeviceAnchor:
    """The device end of a match whose last ``host_tokens`` only the host pool holds, and the
    page hash before them (None at the root)."""

    node: NodeId
    host_tokens: int
    last_hash: Optional[str]


@dataclass(frozen=True)
class ReloadProbe:
    """The tree core and the saria backend of one radix cache, read for its reload plans."""

    tree: Any  # SGLang's tree core
    backend: Any  # `SariaStorage`: exists, batch_exists, state_exists
    page_size: int
    planner: str  # transfer.planner
    hybrid: bool = False  # a FULL + MAMBA tree: plans end on checkpoints
    checkpoint_grid: int = 0  # tokens between the positions a GDN state can be cached at
    # The reloader moves host-pool pages in the gathers of the SSD pages: a plan's DRAM part
    # goes with its SSD part, paced by the coordinator (False: HiCache's load_back copies it).
    host_tail: bool = False

    def device_anchor(self, anchor: NodeId) -> Optional[DeviceAnchor]:
        """Where a plan with its DRAM part moved by the reloader starts: the deepest device node
        above ``anchor``'s host-only run (None when there is no such run, or the node above it
        has no page hash to chain the run's hashes from). Full-attention trees only: a hybrid
        match's host-only run ends on a node whose GDN state is in the host mamba pool, and
        HiCache's load_back moves it with the run."""
        if self.hybrid:
            return None
        node = self.tree.node_by_id(anchor)
        host_tokens = 0
        while node.parent is not None and node.evicted:
            host_tokens += len(node.key)
            node = node.parent
        if not host_tokens:
            return None
        if node.parent is None:
            return DeviceAnchor(node.id, host_tokens, None)
        hashes = node.hash_value
        return DeviceAnchor(node.id, host_tokens, hashes[-1]) if hashes else None

    def tail_host_pages(self, anchor: NodeId, key: RadixKey) -> list[tuple[NodeId, torch.Tensor]]:
        """The pages of ``key`` (the tokens past ``anchor``) that the tree holds in host memory
        right below ``anchor``: (node holding the page, its host slots), in prefix order, up
        to the first page no host copy holds. SGLang's hybrid match ends on the last node
        with a GDN state, so FA pages past that checkpoint show up here, not in the match;
        below a `device_anchor`, the host-only run of the match does."""
        page = self.page_size
        node = self.tree.node_by_id(anchor)
        pages: list[tuple[NodeId, torch.Tensor]] = []
        offset = 0
        while offset < len(key):
            child = node.children.get(key[offset:].child_key(page))
            if child is None:
                break
            host_value = child.component_data[ComponentType.FULL].host_value
            if host_value is None:
                break
            matched = child.key.match(key[offset:], page_size=page) // page * page
            for p in range(0, matched, page):
                pages.append((child.id, host_value[p : p + page].to(torch.int64)))
            if matched < len(child.key):
                break
            offset += matched
            node = child
        return pages

    def past_match(
        self, anchor: NodeId, key: RadixKey, hashes: list[str], cap_pages: int, agree_min: Callable[[int], int]
    ) -> tuple[list[tuple[NodeId, torch.Tensor]], list[PageObjects]]:
        """The pages of ``key`` (``hashes``: the tokens past ``anchor``) a reload can take,
        with their FA sources, at most ``cap_pages``: where the reloader moves host pages, the
        FA pages the tree holds in host memory right below ``anchor`` (DRAM; returned too, as
        `tail_host_pages`), then the stored ones (SSD). Each count is ``agree_min``-ed over
        the ranks, so every rank plans the same pages and runs the same collectives here."""
        held = self.tail_host_pages(anchor, key) if self.host_tail else []
        n_held = agree_min(min(len(held), cap_pages)) if self.host_tail else 0
        n_lead = agree_min(min(self.backend.batch_exists(hashes), cap_pages))
        n_after = 0
        if n_held > n_lead:  # stored pages right after the held ones
            n_after = agree_min(min(self.backend.batch_exists(hashes[n_held:]), cap_pages - n_held))
        pages = [
            PageObjects(page_key(h), (DRAM if i < n_held else 0) | (SSD if i < n_lead or n_held <= i else 0))
            for i, h in enumerate(hashes[: max(n_lead, n_held + n_after)])
        ]
        return held, pages

    def host_only_tokens(self, anchor: NodeId) -> int:
        """Tokens of the match that only the host pool holds (the nodes just above ``anchor``)."""
        tokens = 0
        node = self.tree.node_by_id(anchor)
        while node is not None and node.parent is not None and node.evicted:
            tokens += len(node.key)
            node = node.parent
        return tokens

    def _host_hashes(self, anchor: NodeId, host_tokens: int) -> list[str]:
        """Page hashes of the host-only part of the match (the pages just above ``anchor``)."""
        pages: list[str] = []
        node = self.tree.node_by_id(anchor)
        while len(pages) * self.page_size < host_tokens and node is not None and node.parent is not None:
            pages[:0] = node.hash_value or []
            node = node.parent
        return pages[len(pages) - host_tokens // self.page_size :] if host_tokens else []

    def _host_states(self, anchor: NodeId, n_pages: int, host_tokens: int, end: int) -> set[int]:
        """Indexes of the host-only pages (of ``n_pages``, ending at token ``end``) that end a
        node with a GDN state (a node's mamba value, device or host)."""
        states: set[int] = set()
        node, node_end = self.tree.node_by_id(anchor), end
        while node is not None and node.parent is not None and node_end > end - host_tokens:
            data = node.component_data[ComponentType.MAMBA]
            if data.value is not None or data.host_value is not None:
                states.add(n_pages - 1 - (end - node_end) // self.page_size)
            node_end -= len(node.key)
            node = node.parent
        return states

    def _host_pages(self, anchor: NodeId, host_tokens: int, end: int) -> list[PageObjects]:
        """The host-only pages of the match (ending at token ``end``, the anchor's end), with
        their FA block in DRAM (and SSD when stored) and, on a hybrid tree, the GDN state of
        each node that ends on one of them."""
        hashes = self._host_hashes(anchor, host_tokens)
        states = self._host_states(anchor, len(hashes), host_tokens, end) if self.hybrid and hashes else set()
        start = end - host_tokens
        pages = []
        for i, h in enumerate(hashes):
            stored = self.backend.exists(h)
            page_end = start + (i + 1) * self.page_size
            ck = checkpoint_loc(page_end, self.checkpoint_grid, i in states, self.hybrid and self.backend.state_exists(h))
            pages.append(PageObjects(page_key(h), DRAM | (SSD if stored else 0), ck))
        return pages

    def with_checkpoints(self, tail: list[PageObjects], hashes: list[str], start: int) -> list[PageObjects]:
        """``tail`` with each page's checkpoint: on a hybrid tree a page ending on the grid
        carries the state the store's sidecar holds there."""
        out = []
        for i, p in enumerate(tail):
            page_end = start + (i + 1) * self.page_size
            in_ssd = self.hybrid and self.backend.state_exists(hashes[i])
            out.append(PageObjects(p.key, p.fa_loc, checkpoint_loc(page_end, self.checkpoint_grid, False, in_ssd)))
        return out

    def plan(self, anchor: NodeId, host_tokens: int, start: int, tail: Sequence[PageObjects]) -> ReloadPlan:
        """The core planner over the pages past the device prefix: DRAM where the host pool
        has them, SSD where only the store does. ``start``: tokens before ``tail``, the
        pages past the match (hybrid: host pages past the last checkpoint, then stored ones).
        On a hybrid tree each page ending on a checkpoint boundary carries the GDN state
        the tiers hold there (`reload/plan.py`), and the plan ends on the last one."""
        pages = self._host_pages(anchor, host_tokens, start) + list(tail)
        plan = plan_pages(pages, self.planner, hybrid=self.hybrid)
        host_pages = host_tokens // self.page_size
        if plan.sources[:host_pages].count(DRAM) != min(host_pages, plan.n_blocks):
            raise RuntimeError(f"saria: planner {self.planner!r} moved host-resident pages off DRAM: {plan}")
        return plan

    def tail_dram_pages(self, plan: ReloadPlan, host_tokens: int, n_tail: int) -> int:
        """How many leading pages past the match the plan takes from DRAM; the rest must be
        SSD pages (the tree's host pages past the match are a leading run, which every
        planner takes from DRAM first or not at all)."""
        first = host_tokens // self.page_size
        sources = plan.sources[first : first + n_tail]
        dram = next((i for i, src in enumerate(sources) if src != DRAM), len(sources))
        if DRAM in sources[dram:]:
            raise RuntimeError(f"saria: plan interleaves DRAM pages after SSD pages past the match: {plan}")
        return dram
