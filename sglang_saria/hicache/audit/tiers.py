"""Tier audit of SGLang's radix tree under Saria (paper 4.1, "unified node metadata").

Saria keeps no copy of where a node lives: DRAM is the node's `host_value` (host pool
slots), the device is its `value` (KV pool slots), SSD is the store's index, and the
shared counters (R, E, t_reuse) are the core's `ContextMetadata`, keyed by page hash so
they survive evictions. This audit walks the tree and checks that view against the pools
and the store, so a reload, promotion or eviction that leaks or double-owns a slot is
caught where it happens:

- every device page of a node is allocated in the KV pool and owned by one node only;
- every host slot of a node is allocated in the host pool and owned by one node only;
- every page of a node held by host memory or SSD has its counters in the metadata;
- for hybrid models, every MAMBA checkpoint slot of a node (device and host) is owned
  by that node only, and its device slot is allocated in the mamba pool.

Enabled with `SGLANG_SARIA_AUDIT_TIERS=1` (each scheduler step; O(tree)), results on the
metrics endpoint (`sglang:saria_tier_audits_total`, `sglang:saria_tier_audit_errors_total`,
`sglang:saria_tree_pages{tier}`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from sglang_saria.hicache.tree_view import page_key
from sglang_saria.mem_cache.metadata import ContextMetadata

TIERS = ("device", "host", "ssd")
FULL = 0  # ComponentType.FULL indexes a node's component_data list


@dataclass(frozen=True)
class AuxComponent:
    """A state component next to FULL KV (MAMBA): its index in component_data and free slots."""

    name: str
    index: int
    free_slots: torch.Tensor | None = None


@dataclass
class TierAudit:
    """Pages of the tree by tier, and every inconsistency found."""

    pages: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    errors: list[str] = field(default_factory=list)


def tree_nodes(root: Any) -> Iterator[Any]:
    """Every node below ``root`` (depth first, root left out)."""
    stack = list(root.children.values())
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())


def audit_tiers(
    root: Any,
    page_size: int,
    free_device_pages: torch.Tensor | None,
    host_slot_used: torch.Tensor | None,
    on_ssd: Callable[[str], bool],
    metadata: ContextMetadata,
    aux: tuple[AuxComponent, ...] = (),
) -> TierAudit:
    """Walk the tree from ``root`` and check every node's locations and counters."""
    audit = TierAudit()
    aux_free = {a.name: set(a.free_slots.tolist()) if a.free_slots is not None else set() for a in aux}
    aux_owner: dict[tuple[str, str, int], int] = {}
    free_pages = set(free_device_pages.tolist()) if free_device_pages is not None else set()
    device_owner: dict[int, int] = {}
    host_owner: dict[int, int] = {}
    for node in tree_nodes(root):
        full = node.component_data[FULL]
        hashes = node.hash_value or []
        if full.value is not None:
            for p in (full.value // page_size).unique().tolist():
                if p in free_pages:
                    audit.errors.append(f"node {node.id}: device page {p} is in the KV pool's free list")
                if device_owner.setdefault(p, node.id) != node.id:
                    audit.errors.append(f"node {node.id}: device page {p} also owned by node {device_owner[p]}")
            audit.pages["device"] += len(hashes)
        if full.host_value is not None:
            slots = full.host_value.to(torch.int64)
            if host_slot_used is not None and not bool(host_slot_used[slots].all()):
                audit.errors.append(f"node {node.id}: host slots not allocated in the host pool")
            for s in slots[::page_size].tolist():
                if host_owner.setdefault(s, node.id) != node.id:
                    audit.errors.append(f"node {node.id}: host slot {s} also owned by node {host_owner[s]}")
            audit.pages["host"] += len(hashes)
        ssd = [on_ssd(h) for h in hashes]
        audit.pages["ssd"] += sum(ssd)
        # Counters exist from the moment a page reaches host memory (policy.on_host_insert) or
        # comes back from SSD (on_ssd_reload). A device-only page has none yet, even when the
        # store holds it: SGLang recomputes a prompt's last page, and a reload cut short
        # leaves stored pages to recompute; they are counted when they reach host memory.
        kept = hashes if full.host_value is not None else []
        missing = [h for h in kept if metadata.get(page_key(h)) is None]
        if missing:
            audit.errors.append(f"node {node.id}: {len(missing)} of {len(hashes)} pages have no R/E/t_reuse counters")
        for a in aux:
            data = node.component_data[a.index]
            for where, slots in (("device", data.value), ("host", data.host_value)):
                for slot in ([] if slots is None else slots.reshape(-1).tolist()):
                    if where == "device" and slot in aux_free[a.name]:
                        audit.errors.append(f"node {node.id}: {a.name} slot {slot} is in the {a.name} pool's free list")
                    if aux_owner.setdefault((a.name, where, slot), node.id) != node.id:
                        owner = aux_owner[(a.name, where, slot)]
                        audit.errors.append(f"node {node.id}: {a.name} {where} slot {slot} also owned by node {owner}")
    return audit
