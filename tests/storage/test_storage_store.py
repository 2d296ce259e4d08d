"""SariaStore behaviour: round trips, striping, LRU eviction, restart, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sglang_saria.mem_cache.ssd_order import SSDVictimOrder
from sglang_saria.storage.config import StoreConfig
from sglang_saria.storage.store import GetStatus, SariaStore

SLOT = 64 * 1024

# Object kinds: tiny unaligned, exactly one slot, an FA page, a multi-slot GDN checkpoint.
SIZES = {"tiny": 1000, "one_slot": SLOT, "fa_page": 48 * 1024 + 7, "gdn_checkpoint": 3 * SLOT + 12345}


@pytest.mark.parametrize("ndirs", [1, 2])
@pytest.mark.parametrize("o_direct", ["on", "off"])
def test_round_trip_every_object_kind(payload, make_store, ndirs, o_direct):
    store = make_store(ndirs=ndirs, o_direct=o_direct)
    assert store.stats().o_direct == [o_direct == "on"] * ndirs
    futs = store.put_batch([(k, payload(k, n)) for k, n in SIZES.items()])
    assert all(f.result().ok for f in futs)
    for k, n in SIZES.items():
        dest = np.zeros(n, dtype=np.uint8)
        assert store.get(k, dest) is GetStatus.HIT
        np.testing.assert_array_equal(dest, payload(k, n))


def test_destinations_tensor_bytearray_and_scatter_list(payload, make_store):
    store = make_store(ndirs=2)
    src = torch.randn(3, 4096, dtype=torch.bfloat16)
    assert store.put("t", src).ok
    out = torch.empty_like(src)
    assert store.get("t", out).ok and torch.equal(out, src)

    data = payload("s", 70_000)
    assert store.put("s", bytes(data)).ok
    ba = bytearray(70_000)
    assert store.get("s", ba).ok and bytes(ba) == bytes(data)
    # Scatter list with unaligned pieces (host pool pages look like this).
    buf = np.zeros(70_000 + 3, dtype=np.uint8)
    pieces = [buf[1:10_001], buf[10_001:50_002], buf[50_002:70_001]]
    assert store.get("s", pieces).ok
    np.testing.assert_array_equal(buf[1:70_001], data)


def test_object_is_striped_over_every_dir(payload, make_store):
    store = make_store(ndirs=2)
    assert store.put("big", payload("big", 4 * SLOT)).ok
    written = [d.bytes_written for d in store.endurance()]
    assert written == [2 * SLOT, 2 * SLOT]
    dest = np.zeros(4 * SLOT, dtype=np.uint8)
    assert store.get("big", dest).ok
    assert [d.bytes_read for d in store.endurance()] == [2 * SLOT, 2 * SLOT]


def test_lru_eviction_reports_evicted_keys(payload, make_store):
    evicted = []
    store = make_store(capacity=8 * SLOT, on_evict=evicted.extend)
    for i in range(8):
        assert store.put(f"k{i}", payload(f"k{i}", SLOT)).ok
    assert store.get("k0", np.zeros(SLOT, np.uint8)).ok  # k0 becomes most recent
    res = store.put("new", payload("new", 2 * SLOT))
    assert res.ok and res.evicted == ["k1", "k2"] and evicted == ["k1", "k2"]
    assert store.exists("k0") and not store.exists("k1")
    assert store.get("k1", np.zeros(SLOT, np.uint8)) is GetStatus.MISS


def test_caller_eviction_and_existing_key(payload, make_store):
    evicted = []
    store = make_store(on_evict=evicted.extend)
    assert store.put("a", payload("a", 5000)).ok
    again = store.put("a", payload("a", 5000))
    assert again.ok and again.already_present
    assert store.evict(["a", "missing"]) == ["a"]
    assert evicted == ["a"], "every removal is reported, not only LRU evictions"
    assert not store.exists("a") and store.prefix_hits(["a"]) == 0


def test_overwrite_replaces_object(payload, make_store):
    store = make_store()
    assert store.put("a", payload("a", 5000)).ok
    assert store.put("a", payload("b", 9000), overwrite=True).ok
    dest = np.zeros(9000, np.uint8)
    assert store.get("a", dest).ok
    np.testing.assert_array_equal(dest, payload("b", 9000))


def test_object_larger_than_store_is_refused(payload, make_store):
    store = make_store(capacity=4 * SLOT)
    res = store.put("huge", payload("huge", 5 * SLOT))
    assert not res.ok and "store full" in res.error


def test_bad_input_is_a_clear_error_or_counted_miss(payload, make_store):
    store = make_store()
    for bad in ["", None, "x" * 2000, "a\x00b"]:
        with pytest.raises(ValueError, match="invalid key"):
            store.put(bad, b"abc")
    assert store.put("k", payload("k", 4096)).ok
    assert store.get("k", np.zeros(4095, np.uint8)) is GetStatus.SIZE_MISMATCH
    assert store.stats().counts["get_size_mismatch"] == 1
    with pytest.raises(ValueError, match="read-only"):
        store.get("k", b"\x00" * 4096)
    with pytest.raises(ValueError, match="empty"):
        store.put("e", b"")


def test_restart_keeps_data_lru_order_and_device_counters(payload, make_store):
    store = make_store(ndirs=2)
    for k in ["a", "b", "c"]:
        assert store.put(k, payload(k, 100_000)).ok
    assert store.get("a", np.zeros(100_000, np.uint8)).ok
    written = [d.bytes_written for d in store.endurance()]
    store.close()
    reopened = make_store(config=store.config)
    assert reopened.keys() == ["b", "c", "a"]
    assert [d.bytes_written for d in reopened.endurance()] == written
    for k in ["a", "b", "c"]:
        dest = np.zeros(100_000, np.uint8)
        assert reopened.get(k, dest).ok
        np.testing.assert_array_equal(dest, payload(k, 100_000))


def test_reopen_with_other_slot_size_is_refused(make_store, store_dirs):
    store = make_store()
    store.close()
    with pytest.raises(ValueError, match="slot_bytes"):
        SariaStore(StoreConfig(data_dirs=store_dirs(1), capacity="16MiB", slot_bytes="128KiB"), victim_order=SSDVictimOrder())


def test_capacity_shrink_drops_objects_beyond_new_end(payload, make_store):
    store = make_store(capacity=8 * SLOT)
    for i in range(8):
        assert store.put(f"k{i}", payload(f"k{i}", SLOT)).ok
    store.close()
    small = make_store(config=StoreConfig(**{**store.config.__dict__, "capacity": 4 * SLOT}))
    assert sorted(small.keys()) == ["k0", "k1", "k2", "k3"]


def test_missing_or_unusable_data_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="cannot be created"):
        SariaStore(StoreConfig(data_dirs=[str(blocker / "sub")], capacity="1MiB", slot_bytes="64KiB"), victim_order=SSDVictimOrder())
    with pytest.raises(ValueError, match="not a directory"):
        SariaStore(StoreConfig(data_dirs=[str(blocker)], capacity="1MiB", slot_bytes="64KiB"), victim_order=SSDVictimOrder())


def test_async_api_overlaps_many_objects(payload, make_store):
    store = make_store(ndirs=2, read_threads=4, write_threads=4)
    keys = [f"p{i}" for i in range(64)]
    put_futs = store.put_batch([(k, payload(k, 20_000)) for k in keys])
    assert all(f.result().ok for f in put_futs)
    dests = [np.zeros(20_000, np.uint8) for _ in keys]
    get_futs = store.get_batch(keys, dests)
    assert all(f.result() is GetStatus.HIT for f in get_futs)
    for k, d in zip(keys, dests):
        np.testing.assert_array_equal(d, payload(k, 20_000))
