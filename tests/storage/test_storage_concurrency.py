"""Concurrent readers and writers against a reference model of what must be stored."""

from __future__ import annotations

import random
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from sglang_saria.storage.store import GetStatus

SLOT = 64 * 1024


def _size(key: str) -> int:
    return 1000 + (zlib.crc32(key.encode()) % 5) * 30_000


def test_threads_put_get_evict_match_reference_model(make_store, payload):
    lock = threading.Lock()
    evicted: list[str] = []

    def on_evict(keys):
        with lock:
            evicted.extend(keys)

    # Small capacity so LRU eviction runs concurrently with everything else.
    store = make_store(ndirs=2, capacity=40 * SLOT, on_evict=on_evict, read_threads=3, write_threads=2)
    # Reference model: the ordered history of successful puts and removals per key.
    history: list[tuple[str, str]] = []
    served_wrong: list[str] = []
    keys = [f"w{t}-{i}" for t in range(3) for i in range(60)]

    def writer(t: int) -> None:
        rng = random.Random(t)
        mine = [k for k in keys if k.startswith(f"w{t}-")]
        for k in mine:
            r = store.put(k, payload(k, _size(k)))
            with lock:
                if r.ok and not r.already_present:
                    history.append(("put", k))
            if rng.random() < 0.15:
                victim = rng.choice(mine)
                for gone in store.evict([victim]):
                    with lock:
                        history.append(("evict", gone))

    def reader(t: int) -> list:
        """Statuses other than HIT/MISS this reader saw (collected: a Thread's assert is lost)."""
        rng = random.Random(100 + t)
        unexpected = []
        for _ in range(250):
            k = rng.choice(keys)
            dest = np.zeros(_size(k), np.uint8)
            status = store.get(k, dest)
            if status is GetStatus.HIT and not np.array_equal(dest, payload(k, _size(k))):
                served_wrong.append(k)
            if status not in (GetStatus.HIT, GetStatus.MISS):
                unexpected.append((k, status))
        return unexpected

    with ThreadPoolExecutor(max_workers=6) as pool:
        writers = [pool.submit(writer, t) for t in range(3)]
        readers = [pool.submit(reader, t) for t in range(3)]
        for future in writers:
            future.result()  # re-raises a writer's exception here
        unexpected = [item for future in readers for item in future.result()]
    store.flush()

    assert unexpected == []
    assert served_wrong == []
    expected = set()
    for op, k in history:
        (expected.add if op == "put" else expected.discard)(k)
    expected -= set(evicted)  # LRU evictions reported through the callback
    # An LRU eviction reported before a later re-put of the same key cannot happen
    # here: every key is put by exactly one writer, once.
    assert set(store.keys()) == expected
    stats = store.stats()
    assert stats.used_bytes == sum(store.layout.slots_for(_size(k)) for k in expected) * SLOT
    for k in expected:
        dest = np.zeros(_size(k), np.uint8)
        assert store.get(k, dest).ok
        np.testing.assert_array_equal(dest, payload(k, _size(k)))
