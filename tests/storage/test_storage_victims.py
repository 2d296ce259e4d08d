"""The store's victims come from the shared SSD victim order (mem_cache/ssd_order.py), on real files."""

from __future__ import annotations

import numpy as np

from sglang_saria.mem_cache.ssd_order import SSDVictimOrder
from sglang_saria.storage.config import StoreConfig
from sglang_saria.storage.store import GetStatus, SariaStore

SLOT = 4096


def _store(tmp_path, slots, order=None, on_evict=None):
    cfg = StoreConfig(data_dirs=[str(tmp_path / "ssd")], capacity=str(slots * SLOT), slot_bytes=str(SLOT),
                      sync_writes=False)
    return SariaStore(cfg, victim_order=order if order is not None else SSDVictimOrder(), on_evict=on_evict)


def _data(i):
    return np.full(SLOT, i % 251, np.uint8)


def test_default_order_is_lru_over_puts_and_gets(tmp_path):
    evicted = []
    with _store(tmp_path, 3, on_evict=evicted.extend) as store:
        assert store.order.name == "lru"
        for i, k in enumerate("abc"):
            assert store.put(k, _data(i)).ok
        assert store.get("a", np.empty(SLOT, np.uint8)) is GetStatus.HIT  # a read touches
        assert store.put("b", _data(1)).already_present  # so does a put of a held key
        assert store.keys() == ["c", "a", "b"]
        assert store.put("d", _data(3)).evicted == ["c"]
        assert evicted == ["c"]


def test_touch_prefix_keeps_a_prefix_head_longest(tmp_path):
    evicted = []
    with _store(tmp_path, 4, on_evict=evicted.extend) as store:
        for i, k in enumerate(["p0", "p1", "p2", "x"]):
            assert store.put(k, _data(i)).ok
        for k in ("p0", "p1", "p2"):  # a reload reads the prefix head first
            assert store.get(k, np.empty(SLOT, np.uint8)) is GetStatus.HIT
        store.touch_prefix(["p0", "p1", "p2", "gone"])  # the reload's report: absent keys are skipped
        assert store.keys() == ["x", "p2", "p1", "p0"]
        assert store.put("y", _data(5)).evicted == ["x"]
        assert store.put("z", _data(6)).evicted == ["p2"]  # the tail goes before the head
        assert evicted == ["x", "p2"] and store.exists("p0")


def test_injected_order_decides_victims_and_survives_reopen(tmp_path):
    order = SSDVictimOrder("fifo")
    with _store(tmp_path, 2, order=order) as store:
        assert store.put("a", _data(0)).ok and store.put("b", _data(1)).ok
        store.get("a", np.empty(SLOT, np.uint8))  # fifo: reads do not reorder
        assert store.put("c", _data(2)).evicted == ["a"]
        assert order.order() == ["b", "c"]
    # reopened: the recovered objects enter the (new) order in the index's recency order
    with _store(tmp_path, 2) as again:
        assert sorted(again.keys()) == ["b", "c"] and len(again.order) == 2
        first = again.keys()[0]
        assert again.put("d", _data(3)).evicted == [first]


def test_removals_leave_the_order(tmp_path):
    with _store(tmp_path, 3) as store:
        for i, k in enumerate("abc"):
            store.put(k, _data(i))
        assert store.evict(["b"]) == ["b"]
        assert store.keys() == ["a", "c"] and "b" not in store.order
        assert store.put("b", _data(1), overwrite=False).ok
        assert store.put("a", _data(7), overwrite=True).ok  # an overwrite is a write: most recent
        assert store.keys() == ["c", "b", "a"]


def test_demoted_objects_are_the_next_victims_tail_first_and_stay_first_after_reopen(tmp_path):
    """An agent's session ended (issue 26): its objects go before older ones, the tail before the
    head; the demotion is kept in the index, so a reopened store evicts them first too."""
    evicted = []
    with _store(tmp_path, 5, on_evict=evicted.extend) as store:
        for i, k in enumerate(["old", "s0", "s1", "s2", "new"]):
            assert store.put(k, _data(i)).ok
        assert store.demote(["s0", "s1", "s2", "gone"]) == 3  # absent keys are skipped
        assert store.keys()[:3] == ["s2", "s1", "s0"] and store.keys()[3:] == ["old", "new"]
        assert store.put("x", _data(5)).evicted == ["s2"]
        store.flush()  # the demotion is in the index now
    with _store(tmp_path, 5, on_evict=evicted.extend) as again:
        assert again.keys()[:2] == ["s0", "s1"]  # recovered at the eviction end (write order among them)
        assert again.put("y", _data(6)).evicted == ["s0"]
