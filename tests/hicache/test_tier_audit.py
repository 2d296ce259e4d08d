"""The tier audit (hicache/audit/tiers.py) finds each kind of drift between the tree's
locations and the pools/store, and reports pages per tier, on hand-built trees."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sglang_saria.hicache.audit.tiers import AuxComponent, audit_tiers
from sglang_saria.hicache.tree_view import page_key
from sglang_saria.mem_cache.metadata import ContextMetadata

PAGE = 4


@dataclass
class Full:
    value: torch.Tensor | None = None
    host_value: torch.Tensor | None = None


@dataclass
class Node:
    id: int
    hash_value: list[str]
    component_data: list[Full]
    children: dict = field(default_factory=dict)


def node(node_id: int, hashes: list[str], device_page: int | None, host_slot: int | None) -> Node:
    def slots(first_page: int) -> torch.Tensor:
        return torch.arange(first_page * PAGE, (first_page + len(hashes)) * PAGE)

    return Node(
        node_id,
        hashes,
        [Full(slots(device_page) if device_page is not None else None, slots(host_slot) if host_slot is not None else None)],
    )


def tree(*nodes: Node) -> Node:
    root = Node(0, [], [Full()])
    parent = root
    for n in nodes:
        parent.children[n.id] = n
        parent = n
    return root


def run(root, free_pages=(), host_used=None, ssd=(), counted=None):
    meta = ContextMetadata(PAGE, None, 3600.0)
    for n in ([] if counted is None else counted):
        meta.record_use([page_key(n)], 0.0)
    used = torch.ones(64, dtype=torch.bool) if host_used is None else host_used
    return audit_tiers(root, PAGE, torch.tensor(list(free_pages), dtype=torch.int64), used, set(ssd).__contains__, meta)


HASHES = ["aa01", "aa02", "aa03"]


def test_consistent_tree_reports_pages_per_tier():
    root = tree(node(1, HASHES[:2], device_page=2, host_slot=0), node(2, HASHES[2:], device_page=None, host_slot=2))
    audit = run(root, free_pages=[0, 1], ssd={"aa03"}, counted=HASHES)
    assert audit.errors == []
    assert audit.pages == {"device": 2, "host": 3, "ssd": 1}


def test_device_page_in_the_free_list_is_reported():
    root = tree(node(1, HASHES[:1], device_page=5, host_slot=None))
    assert run(root, free_pages=[5]).errors == ["node 1: device page 5 is in the KV pool's free list"]


def test_device_page_owned_twice_is_reported():
    root = tree(node(1, HASHES[:1], device_page=3, host_slot=None), node(2, HASHES[1:2], device_page=3, host_slot=None))
    assert any("device page 3 also owned" in e for e in run(root).errors)


def test_host_slots_not_allocated_or_owned_twice_are_reported():
    used = torch.zeros(64, dtype=torch.bool)
    root = tree(node(1, HASHES[:1], device_page=None, host_slot=1))
    assert run(root, host_used=used, counted=HASHES).errors == ["node 1: host slots not allocated in the host pool"]
    root = tree(node(1, HASHES[:1], device_page=None, host_slot=1), node(2, HASHES[1:2], device_page=None, host_slot=1))
    assert any("host slot 4 also owned" in e for e in run(root, counted=HASHES).errors)


def test_host_pages_without_counters_are_reported():
    root = tree(node(1, HASHES[:2], device_page=None, host_slot=0), node(2, HASHES[2:], device_page=4, host_slot=3))
    errors = run(root, ssd={"aa03"}, counted=["aa01"]).errors
    assert errors == [
        "node 1: 1 of 2 pages have no R/E/t_reuse counters",
        "node 2: 1 of 1 pages have no R/E/t_reuse counters",
    ]
    # A device-only page has no counters until it reaches host memory, also when the store
    # holds it (SGLang recomputes a prompt's last page even when it is stored).
    assert run(tree(node(1, HASHES[:1], device_page=4, host_slot=None))).errors == []
    assert run(tree(node(1, HASHES[:1], device_page=4, host_slot=None)), ssd={"aa01"}).errors == []


def test_mamba_checkpoint_slots_are_owned_once_and_allocated():
    def hybrid_node(node_id: int, hashes: list[str], mamba_slot: int, host_slot: int) -> Node:
        n = node(node_id, hashes, device_page=None, host_slot=host_slot)
        n.component_data += [Full(), Full(torch.tensor([mamba_slot]), torch.tensor([mamba_slot + 100]))]
        return n

    aux = (AuxComponent("mamba", 2, torch.tensor([7, 8])),)
    meta = ContextMetadata(PAGE, None, 3600.0)
    meta.record_use([page_key(h) for h in HASHES], 0.0)
    used = torch.ones(64, dtype=torch.bool)

    def errors(*nodes):
        return audit_tiers(tree(*nodes), PAGE, None, used, lambda h: False, meta, aux).errors

    assert errors(hybrid_node(1, HASHES[:1], 3, 0), hybrid_node(2, HASHES[1:2], 4, 1)) == []
    assert errors(hybrid_node(1, HASHES[:1], 7, 0)) == ["node 1: mamba slot 7 is in the mamba pool's free list"]
    assert errors(hybrid_node(1, HASHES[:1], 3, 0), hybrid_node(2, HASHES[1:2], 3, 1)) == [
        "node 2: mamba device slot 3 also owned by node 1",
        "node 2: mamba host slot 103 also owned by node 1",
    ]
