"""Unified metadata (paper 4.3, issue 15 item 3): a node's FA pages and its GDN checkpoint leave
host memory as one unit, through the admission gate, counted once.

A real hybrid ``SariaRadixCache`` (FULL + MAMBA, Python TreeCore) on CPU with SGLang's real
HiCache controller, host KV and ``MambaPoolHost`` pools and a saria store in tmp_path, built as
the server builds it (``init_hicache``). Each round computes a 64-token prefix and a 64-token
continuation (each node with its own state), write-through backs both up, and the device is
emptied, so both become host nodes: the prefix internal, the continuation a host leaf. The host
state pool (17 states) fills after eight rounds; from then on every write-through of a state
asks ``evict_host(.., MAMBA)`` for room, as the server does. ``eviction:E1`` without prewrite:
every first eviction is written to the store before its reclaim. The cache's calls are observed
by pass-through wrappers (they record and call the real method).
"""

from __future__ import annotations

import json
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

PAGE = 16
ROUNDS = 14
MAMBA_SLOTS = 8  # device states; the host pool holds 2x + 1

pytestmark = pytest.mark.usefixtures("sglang_plugins")  # saria reaches SGLang through its plugin


@dataclass
class Run:
    """What one scenario did, as the wrappers recorded it."""

    cache: object
    evict_host_calls: list[tuple[int, int]] = field(default_factory=list)  # (tokens asked, freed) for MAMBA
    gate: list[tuple[int, bool]] = field(default_factory=list)  # (node id, reclaim now?)
    writes: list[tuple[str, ...]] = field(default_factory=list)  # page hashes of each storage write
    evicted: list[dict] = field(default_factory=list)  # one per host leaf reclaimed
    split_units: set[int] = field(default_factory=set)  # nodes left with FA host pages, state dropped
    internal: set[int] = field(default_factory=set)  # nodes seen with children and a host state


def _build(cache_class: type, store: Path) -> tuple[object, object]:
    """The hybrid cache as ``create_unified_radix_cache`` builds it for a saria server; returns
    (cache, mamba allocator)."""
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    model = Path(__file__).resolve().parents[2] / "models" / "qwen3.5-tiny-hybrid"
    extra = {"data_dirs": [str(store)], "capacity": "64MiB", "admission": {"policy": "eviction:E1", "prewrite": False}}
    args = ServerArgs(
        model_path=str(model), device="cpu", attention_backend="torch_native", page_size=PAGE,
        enable_hierarchical_cache=True, hicache_ratio=2.0, hicache_storage_backend="saria",
        hicache_storage_backend_extra_config=json.dumps(extra), mamba_radix_cache_strategy="extra_buffer",
        mamba_track_interval=64, max_mamba_cache_size=MAMBA_SLOTS, disable_overlap_schedule=True,
    )
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=0))
    shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=32, n_groups=1, num_heads=2, head_dim=16,
                                    state_size=16, conv_kernel=4)
    req_pool = HybridReqToTokenPool(
        size=4, mamba_size=MAMBA_SLOTS, mamba_spec_state_size=4, max_context_len=1024, device="cpu",
        enable_memory_saver=False, cache_params=Mamba2CacheParams(shape=shape, layers=[0, 2]),
        mamba_layer_ids=[0, 2], enable_mamba_extra_buffer=True, enable_overlap_schedule=False,
    )
    kv = HybridLinearKVPool(size=2048, dtype=torch.bfloat16, page_size=PAGE, head_num=1, head_dim=16,
                            full_attention_layer_ids=[1, 3], device="cpu", mamba_pool=req_pool.mamba_pool)
    alloc = TokenToKVPoolAllocator(size=2048, dtype=torch.bfloat16, device="cpu", kvcache=kv, need_sort=False)
    params = CacheInitParams(
        req_to_token_pool=req_pool, token_to_kv_pool_allocator=alloc, page_size=PAGE, disable=False,
        tree_components=(ComponentType.FULL, ComponentType.MAMBA), eviction_policy="lru",
        tree_core_backend="python", enable_mamba_extra_buffer=True,
    )
    cache = cache_class(params)
    cache.init_hicache(args, params)
    return cache, req_pool.mamba_allocator


def _observe(cache) -> Run:
    """Pass-through wrappers on the calls the scenario checks."""
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    run, tree = Run(cache), cache.tree_core
    evict_host, gate, evict_leaf, write = (cache.evict_host, tree.host_eviction_gate, tree._evict_host_leaf,
                                           cache._write_to_storage)
    store = cache._backend()

    def evict_host_(tokens: int, component_type=ComponentType.FULL) -> int:
        freed = evict_host(tokens, component_type)
        if component_type == ComponentType.MAMBA:
            run.evict_host_calls.append((tokens, freed))
        return freed

    def gate_(node) -> bool:
        reclaim = gate(node)
        run.gate.append((node.id, reclaim))
        return reclaim

    def evict_leaf_(node, *args, **kwargs) -> None:
        hashes = tuple(node.hash_value)
        unit = {
            "id": node.id, "hashes": hashes,
            "state": node.component_data[ComponentType.MAMBA].host_value is not None,
            "written": hashes in run.writes, "stored": all(store.exists(h) for h in hashes),
        }
        asked = len(run.gate)
        evict_leaf(node, *args, **kwargs)  # asks the gate first (SariaTreeCore)
        answers = [r for n, r in run.gate[asked:] if n == node.id]
        if not answers or answers[-1]:  # reclaimed (a refusal keeps the leaf for its write)
            unit["gate"] = answers[-1] if answers else None
            run.evicted.append(unit)

    def write_(node_id) -> None:
        run.writes.append(tuple(tree.get_hash_values(node_id) or ()))
        write(node_id)

    cache.evict_host, tree.host_eviction_gate, tree._evict_host_leaf = evict_host_, gate_, evict_leaf_
    cache._write_to_storage = write_
    return run


def _scenario(cache_class: type, store: Path) -> Run:
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    cache, mamba_alloc = _build(cache_class, store)
    run = _observe(cache)
    tree, alloc = cache.tree_core, cache.token_to_kv_pool_allocator
    had_state: set[int] = set()

    def settle() -> None:
        """Acks drained (write-through and storage writes), then the device emptied; units checked."""
        for _ in range(500):  # the backup thread writes the store; no step waits on a clock
            cache.check_hicache_events()
            if not (cache.ongoing_write_through or cache.ongoing_backup):
                break
            time.sleep(0.01)
        assert not (cache.ongoing_write_through or cache.ongoing_backup), "HiCache's writes never acked"
        cache.evict(EvictParams(num_tokens=alloc.size, mamba_num=MAMBA_SLOTS))
        cache.check_hicache_events()
        stack = list(tree.root_node.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            full, state = (node.component_data[c] for c in (ComponentType.FULL, ComponentType.MAMBA))
            if state.host_value is not None:
                had_state.add(node.id)
                if node.children:
                    run.internal.add(node.id)
            elif node.id in had_state and full.host_value is not None:
                run.split_units.add(node.id)

    for r in range(ROUNDS):
        prefix = [10000 * r + i for i in range(64)]
        for tokens in (prefix, prefix + [10000 * r + 5000 + i for i in range(64)]):
            cache.insert(InsertParams(key=RadixKey(array("q", tokens)), value=alloc.alloc(len(tokens)),
                                      mamba_value=mamba_alloc.alloc(1)))
            settle()
    return run


@pytest.fixture(scope="module")
def saria_run(tmp_path_factory, hybrid_model) -> Run:
    from sglang_saria.hicache.radix_cache import SariaRadixCache

    return _scenario(SariaRadixCache, tmp_path_factory.mktemp("unit-evict-store"))


def test_state_space_is_freed_by_evicting_whole_host_units(saria_run):
    assert saria_run.evict_host_calls, "the host state pool never filled: the scenario did not run mamba host eviction"
    units = [e for e in saria_run.evicted if e["state"]]
    # every state slot freed came with its node's FA pages (the KV host pool never filled)
    assert sum(freed for _, freed in saria_run.evict_host_calls) == len(units) > 0
    assert saria_run.split_units == set(), "a node kept its FA host pages while its checkpoint was dropped"
    assert {e["id"] for e in units} & saria_run.internal, "no internal checkpoint left with its FA pages"
    assert len({e["id"] for e in saria_run.evicted}) == len(saria_run.evicted), "a node was reclaimed twice"


def test_every_reclaimed_unit_passed_the_gate_and_admitted_ones_were_written_first(saria_run):
    deferred = {node for node, reclaim in saria_run.gate if not reclaim}
    assert deferred, "eviction:E1 admits every first eviction: some reclaim must have waited for a write"
    for e in saria_run.evicted:
        assert e["gate"] is True, f"node {e['id']} reclaimed without the gate's consent"
        if e["id"] in deferred:
            assert e["written"] and e["stored"], f"node {e['id']} reclaimed before its write reached the store"


def test_one_set_of_counters_per_unit(saria_run):
    from sglang_saria.hicache.tree_view import page_key

    policy = saria_run.cache._policy()
    assert policy.stats.host_evictions == len(saria_run.evicted), "one eviction counted per unit, not per object"
    assert policy.stats.deferred_evictions == sum(1 for _, reclaim in saria_run.gate if not reclaim)
    for e in saria_run.evicted:
        assert {policy.metadata.get(page_key(h)).E for h in e["hashes"]} == {1}, f"node {e['id']}: E counted per object"


def test_tier_audit_of_full_and_mamba_is_clean(saria_run):
    audit = saria_run.cache.audit_tiers()
    assert audit.errors == []
    assert audit.pages["host"] > 0 and audit.pages["ssd"] > 0


def test_stock_mamba_host_eviction_splits_units(tmp_path, hybrid_model):
    """The defect, on the same scenario with SGLang's own walk: internal checkpoints dropped
    apart from their FA pages (its host leaves pass the tree core's gate as every walk's do)."""
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    from sglang_saria.hicache.radix_cache import SariaRadixCache

    class StockMambaEviction(SariaRadixCache):
        evict_host = UnifiedRadixCache.evict_host

    run = _scenario(StockMambaEviction, tmp_path / "store")
    assert run.split_units, "SGLang's walk kept every unit whole: this scenario does not show the defect"
