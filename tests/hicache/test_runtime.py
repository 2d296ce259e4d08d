"""The saria runtime (`runtime.py`) and runtime attach/detach, without a server: which attach
requests are refused (`plugin/storage.py`), what `build_runtime` hands each part over a backend
(launch and runtime attach alike: the policy counts the pages the tree already holds in host
memory, the KV audit follows the store and its log, store removals and reloads reach the policy and
the store), and that a replaced runtime's reload worker ends. The e2e version is
tests/e2e/test_runtime_attach.py."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import pytest

from sglang_saria.config import SariaConfig
from sglang_saria.hicache.audit.kv import LOG_NAME, SSD_TO_DEVICE, attach_audit
from sglang_saria.hicache.backend import SariaStorage
from sglang_saria.hicache.policy import SariaHiCachePolicy
from sglang_saria.hicache.runtime import SariaRuntime, build_runtime
from sglang_saria.hicache.runtime_attach import attach_refusal, names_saria
from sglang_saria.hicache.tree_view import page_key
from sglang_saria.reload.device import DeviceReloader
from tests.hicache.sglang_pools import PAGE, fill_random, mha_pools, pages, storage_config
from tests.hicache.test_kv_audit import Counts, backup, kv_audit

DYNAMIC_SARIA = json.dumps({"backend_name": "saria", "module_path": "sglang_saria.hicache.backend", "class_name": "SariaStorage"})


@pytest.mark.parametrize(
    "backend, extra, asks_saria",
    [
        ("saria", None, True),
        ("dynamic", DYNAMIC_SARIA, True),
        ("dynamic", json.dumps({"module_path": "my_store.backend"}), False),
        ("dynamic", "{not json", False),  # SGLang's own parser refuses it, naming the field
        ("file", None, False),
    ],
)
def test_an_attach_asks_for_saria_by_name_or_as_a_dynamic_backend_from_sglang_saria(backend, extra, asks_saria):
    assert names_saria(backend, extra) is asks_saria


class RustTreeCore:
    """Stands in for SGLang's Rust tree core (only its type name is read)."""


@dataclass
class StockTree:
    tree_core: RustTreeCore = field(default_factory=RustTreeCore)


def test_saria_attach_to_another_tree_is_refused_naming_the_launch_flag_and_stock_backends_pass():
    message = attach_refusal(StockTree(), "saria", None)
    assert "StockTree, tree core RustTreeCore" in message
    assert "Launch with --hicache-storage-backend saria" in message
    assert attach_refusal(StockTree(), "dynamic", DYNAMIC_SARIA) == message
    assert attach_refusal(StockTree(), "file", None) is None


@pytest.fixture
def two_stores(tmp_path):
    device, host = mha_pools("page_first_direct")
    fill_random(device.k_buffer + device.v_buffer)
    config = lambda d: storage_config({"data_dirs": [str(tmp_path / d)], "capacity": "32MiB"})  # noqa: E731
    first, second = SariaStorage(config("a"), host), SariaStorage(config("b"), host)
    yield device, host, first, second
    first.close()
    second.close()


def log_lines(store: SariaStorage) -> int:
    path = os.path.join(store.store.config.data_dirs[0], LOG_NAME)
    return len(open(path, "rb").read().splitlines()) if os.path.exists(path) else 0


def test_the_audit_follows_an_attached_store_reading_its_log_and_appending_there(two_stores):
    device, host, first, second = two_stores
    # An earlier server audited a page into the second store.
    earlier = kv_audit(host, Counts(), log_dir=second.store.config.data_dirs[0])
    second.kv_audit = earlier
    backup(device, host, pages(host, 1, 1), pages(device, 1, 1))
    earlier.device_to_host("kv", pages(host, 1, 1), pages(device, 1, 1))
    assert second.batch_set_v1(["old"], pages(host, 1, 1)) == [True]

    counts = Counts()
    audit = kv_audit(host, counts, log_dir=first.store.config.data_dirs[0])
    attach_audit(audit, second)
    assert second.kv_audit is audit
    reloader = DeviceReloader(second.read_page_async, device, host.layout, PAGE, second.page_bytes)
    assert reloader.load(["old"], pages(device, 20, 1)).ok
    audit.store_to_device("kv", ["old"], pages(device, 20, 1))
    assert counts.by_path == {SSD_TO_DEVICE: [1, 0]}  # known from the attached store's log

    backup(device, host, pages(host, 2, 1), pages(device, 2, 1))
    audit.device_to_host("kv", pages(host, 2, 1), pages(device, 2, 1))
    assert second.batch_set_v1(["new"], pages(host, 2, 1)) == [True]
    assert (log_lines(first), log_lines(second)) == (0, 2)


def test_the_audit_ignores_a_backend_without_a_saria_store():
    class FileBackend:
        pass

    backend = FileBackend()
    attach_audit(kv_audit(mha_pools("layer_first")[1], Counts()), backend)
    assert not hasattr(backend, "kv_audit")


@dataclass(eq=False)
class Node:
    hash_value: list[str]
    backuped: bool
    children: dict = field(default_factory=dict)


def test_a_new_policy_counts_the_pages_already_in_host_memory_once():
    policy = SariaHiCachePolicy(SariaConfig.from_dict({"admission": {"policy": "full-duplicate"}}), 16, lambda h: False)
    host, device_only = Node(["a1", "a2"], True), Node(["b1"], False)
    policy.adopt([host, device_only])
    assert [policy.metadata.get(page_key(h)) is not None for h in ("a1", "a2", "b1")] == [True, True, False]
    before = policy.metadata.get(page_key("a1")).R
    policy.adopt([host])
    assert policy.metadata.get(page_key("a1")).R == before  # counted once, not a reuse per attach


@dataclass
class TreeCore:
    root_node: Node


@dataclass
class OneRankCache:
    """What `build_runtime` reads of `SariaRadixCache` on one rank, storage not yet enabled (no direct reload)."""

    tree_core: TreeCore
    attn_cp_group: None = None
    attn_tp_group: None = None
    tp_group: None = None
    tp_world_size: int = 1
    enable_storage: bool = False


def test_no_runtime_without_a_saria_backend():
    cache = OneRankCache(TreeCore(Node([], False)))
    assert build_runtime(cache, None, None) is None

    class FileBackend:
        pass

    assert build_runtime(cache, FileBackend(), kv_audit(mha_pools("layer_first")[1], Counts())) is None


def test_a_runtime_over_an_attached_backend_counts_host_pages_follows_the_audit_and_hears_the_store(two_stores):
    device, host, first, second = two_stores
    tree = TreeCore(Node([], False, {1: Node(["a1"], True), 2: Node(["b1"], False)}))
    audit = kv_audit(host, Counts(), log_dir=first.store.config.data_dirs[0])
    runtime = build_runtime(OneRankCache(tree), second, audit)
    policy = runtime.policy
    assert runtime.agreement is None and runtime.direct is None and second.kv_audit is audit
    assert [policy.metadata.get(page_key(h)) is not None for h in ("a1", "b1")] == [True, False]  # host pages only
    backup(device, host, pages(host, 1, 1), pages(device, 1, 1))
    assert second.batch_set_v1(["a1"], pages(host, 1, 1)) == [True]
    assert policy.on_ssd("a1")  # the store's index, on one rank
    policy.metadata.get(page_key("a1")).E = 2  # admitted by its evictions
    second.store.evict([second.storage_key("a1")])
    policy.on_ssd_reload([])  # any event applies the store's removals
    assert not policy.on_ssd("a1") and policy.metadata.get(page_key("a1")).e_spent == 2  # the robust rule
    saved = runtime.counter_log.saved_rows
    second.close()  # detach: the counters changed since the last step go in the store's last commit
    assert runtime.counter_log.saved_rows > saved


class Worker:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_a_replaced_runtime_ends_its_reload_worker():
    worker = Worker()
    runtime = SariaRuntime(backend=None, policy=None, agreement=None, counter_log=None, direct=worker)
    runtime.close()
    assert worker.closed
