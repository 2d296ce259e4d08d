"""A damaged store never stops the server (it is a cache): an unreadable index is moved aside,
a missing one beside a used slab is reported, objects past the end of a truncated slab are
dropped; each with one warning and counted, and the store starts and serves."""

from __future__ import annotations

import glob
import logging
import os

import numpy as np
import pytest
from prometheus_client import REGISTRY

from sglang_saria.storage.index import index_path
from sglang_saria.storage.store import GetStatus
from tests.store_fixtures import slab_path

SLOT = 64 * 1024


def recovered(store, result: str) -> float:
    """The store's ``recover`` counter for ``result``, as /metrics has it."""
    labels = {"store": store.name, "op": "recover", "result": result}
    return REGISTRY.get_sample_value("sglang:saria_store_ops_total", labels) or 0.0


def fill(store, payload, n: int) -> list[str]:
    keys = [f"k{i}" for i in range(n)]
    assert all(r.ok for r in (store.put(k, payload(k, SLOT)) for k in keys))
    return keys


def warnings_about(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage()]


@pytest.mark.parametrize("where", ["header", "page"])
def test_an_unreadable_index_is_moved_aside_and_the_store_starts_empty(make_store, payload, caplog, where):
    store = make_store()
    fill(store, payload, 40)
    config = store.config
    store.close()
    path = index_path(config.data_dirs[0])
    with open(path, "r+b") as f:  # closed cleanly, so the WAL is checkpointed into this file
        if where == "header":
            f.write(b"not a database at all" * 5)
        else:
            f.seek(4096)
            f.write(b"\xa5" * (os.path.getsize(path) - 4096))
    damaged = open(path, "rb").read()

    with caplog.at_level(logging.WARNING, logger="sglang_saria.storage.store"):
        store = make_store(config=config)
    (aside,) = glob.glob(path + ".damaged-*")
    assert open(aside, "rb").read() == damaged  # kept for a look, not deleted
    (line,) = warnings_about(caplog, "is unreadable")
    assert path in line and aside in line and "starts empty" in line
    assert store.stats().counts["recover_index_unreadable"] == 1 and recovered(store, "index_unreadable") == 1
    assert store.keys() == []
    assert store.put("new", payload("new", SLOT)).ok  # the slab is reused
    store.close()
    again = make_store(config=config)
    assert again.keys() == ["new"] and "recover_index_unreadable" not in again.stats().counts


def test_a_deleted_index_beside_a_used_slab_is_reported_and_the_slab_reused(make_store, payload, caplog):
    store = make_store()
    fill(store, payload, 10)
    config, slab = store.config, slab_path(store)
    store.close()
    size = os.path.getsize(slab)
    for f in glob.glob(index_path(config.data_dirs[0]) + "*"):
        os.remove(f)

    with caplog.at_level(logging.WARNING, logger="sglang_saria.storage.store"):
        store = make_store(config=config)
    (line,) = warnings_about(caplog, "is missing beside slab files")
    assert index_path(config.data_dirs[0]) in line and "reuses the slabs" in line
    assert store.stats().counts["recover_index_missing"] == 1 and recovered(store, "index_missing") == 1
    assert store.keys() == [] and os.path.getsize(slab) == size
    assert store.put("k0", payload("k0", SLOT)).ok


def test_a_fresh_store_reports_no_damage(make_store, caplog):
    with caplog.at_level(logging.WARNING, logger="sglang_saria.storage.store"):
        store = make_store()
    assert not [c for c in store.stats().counts if c.startswith("recover")] and not caplog.records


@pytest.mark.parametrize("ndirs", [1, 2])
def test_objects_past_the_end_of_a_truncated_slab_are_dropped_counted_and_warned(make_store, payload, caplog, ndirs):
    store = make_store(ndirs=ndirs, capacity="16MiB")  # 256 slots, filled lowest first
    keys = fill(store, payload, 200)
    config, slab = store.config, slab_path(store, ndirs - 1)
    store.close()
    full = os.path.getsize(slab)
    os.truncate(slab, full // 4)  # 16 -> 4 MiB of slots: the first 64 objects stay whole

    with caplog.at_level(logging.WARNING, logger="sglang_saria.storage.store"):
        store = make_store(config=config)
    (line,) = warnings_about(caplog, "past their end dropped")
    assert "136 objects" in line and str(full // 4) in line
    assert store.stats().counts["recover_past_slab_end"] == 136 and recovered(store, "past_slab_end") == 136
    assert sorted(store.keys()) == sorted(keys[:64])
    dest = np.zeros(SLOT, np.uint8)
    for k in keys[:64]:
        assert store.get(k, dest) is GetStatus.HIT
        np.testing.assert_array_equal(dest, payload(k, SLOT))
    assert os.path.getsize(slab) == full  # grown back to the layout's size for new puts
    assert store.put("again", payload("again", SLOT)).ok
    store.close()
    reopened = make_store(config=config)  # the drop was committed: nothing more to drop
    assert "recover_past_slab_end" not in reopened.stats().counts and len(reopened.keys()) == 65
