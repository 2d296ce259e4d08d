"""A full disk degrades cleanly: ENOSPC (slab write or index commit) is counted as ``enospc``,
the store refuses puts without touching the disk while reads go on, retries with back-off and
resumes when a retry succeeds; a capacity above the free space is refused before preallocation."""

from __future__ import annotations

import logging
import os
import sqlite3
import time

import numpy as np
import pytest
from prometheus_client import REGISTRY

from sglang_saria.storage import layout, writes
from sglang_saria.storage.fault_injection import FullDisk
from sglang_saria.storage.index import Entry, SQLiteIndex
from sglang_saria.storage.results import describe, is_enospc
from sglang_saria.storage.store import GetStatus
from sglang_saria.storage.writes import DISK_FULL_FIRST_RETRY_S, DISK_FULL_MAX_RETRY_S, DiskFull

SLOT = 64 * 1024


def disk_full_gauge(store) -> float:
    return REGISTRY.get_sample_value("sglang:saria_store_disk_full", {"store": store.name})


def index_files(store) -> dict[str, tuple[int, int]]:
    """(size, mtime) of the index and its WAL: unchanged means the store did not write them."""
    base = os.path.join(store.layout.data_dirs[0], "saria-index.sqlite")
    return {p: (os.stat(p).st_size, os.stat(p).st_mtime_ns) for p in (base, base + "-wal") if os.path.exists(p)}


def test_enospc_on_a_slab_write_makes_the_store_full_refusing_puts_without_disk_writes(make_store, payload, caplog):
    disk = FullDisk(full=False)
    store = make_store(ndirs=2, fault_injector=disk)
    assert store.put("old", payload("old", 2 * SLOT)).ok and store.disk_full is None
    disk.fill()
    with caplog.at_level(logging.INFO, logger="sglang_saria.storage.store"):
        first = store.put("new", payload("new", 2 * SLOT))
        assert not first.ok and first.error.startswith("ENOSPC") and store.disk_full is not None
        assert store.stats().counts["put_enospc"] == 1 and disk_full_gauge(store) == 1
        tried, files = disk.refused, index_files(store)

        refused = [store.put(f"r{i}", payload(f"r{i}", SLOT)) for i in range(30)]
        assert all(not r.ok and r.error.startswith("ENOSPC: disk full") for r in refused)
        assert store.stats().counts["put_disk_full"] == 30 and disk.refused == tried  # no write tried
        dest = np.zeros(2 * SLOT, np.uint8)
        assert store.get("old", dest) is GetStatus.HIT  # reads go on
        np.testing.assert_array_equal(dest, payload("old", 2 * SLOT))
        time.sleep(DISK_FULL_FIRST_RETRY_S / 2)
        assert index_files(store) == files  # nor index commits (the get's touch waits too)

        disk.free()
        assert not store.put("early", payload("early", SLOT)).ok  # the retry is not due yet
        time.sleep(DISK_FULL_FIRST_RETRY_S)
        assert store.put("retry", payload("retry", SLOT)).ok and store.disk_full is None
        assert disk_full_gauge(store) == 0
        assert all(store.put(f"n{i}", payload(f"n{i}", SLOT)).ok for i in range(5))
    full_lines = [r for r in caplog.records if "disk full" in r.getMessage()]
    assert len(full_lines) == 1 and full_lines[0].levelno == logging.WARNING  # one line for the episode
    assert [r for r in caplog.records if "room again" in r.getMessage()]
    assert store.stats().used_bytes == (2 + 1 + 5) * SLOT  # no slot leaked by the failed puts


def test_a_retry_into_a_still_full_disk_doubles_the_wait(make_store, payload):
    disk = FullDisk()
    store = make_store(fault_injector=disk)
    assert not store.put("a", payload("a", SLOT)).ok
    time.sleep(DISK_FULL_FIRST_RETRY_S * 1.1)
    tried = disk.refused
    retry = store.put("b", payload("b", SLOT))  # the retry: it writes, and fails
    assert retry.error.startswith("ENOSPC") and disk.refused > tried
    assert store._disk_full.retry_in_s == 2 * DISK_FULL_FIRST_RETRY_S
    after_retry = disk.refused
    assert not store.put("c", payload("c", SLOT)).ok and disk.refused == after_retry  # waits again
    counts = store.stats().counts
    assert counts["put_enospc"] == 2 and counts["put_disk_full"] == 1


def test_back_off_doubles_from_one_second_to_a_minute_and_one_put_retries_at_a_time():
    full = DiskFull()
    assert full.admits("a", 0.0)
    assert full.failed(["a"], "ENOSPC: x", 0.0)  # just filled: the one log line
    assert not full.admits("b", 0.5)
    waits, now = [], 0.0
    for _ in range(9):
        now = full.retry_at
        assert full.admits("probe", now) and not full.admits("other", now)  # one retry at a time
        assert not full.failed(["probe"], "ENOSPC: x", now)  # still full: no new log line
        waits.append(full.retry_in_s)
    assert waits == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0, 60.0]
    assert DISK_FULL_FIRST_RETRY_S == 1.0 and DISK_FULL_MAX_RETRY_S == 60.0
    full.settled(["other"])
    assert full.admits("p2", full.retry_at)
    full.settled(["p2"])  # ended without an answer (another error): the next put retries
    assert full.admits("p3", full.retry_at)
    assert full.succeeded(full.retry_at + 1) == pytest.approx(full.retry_at + 1)
    assert full.since is None and full.admits("any", 0.0)


def _entries(n: int, start: int = 0) -> list[Entry]:
    return [Entry(f"key-{i:06d}-" + "x" * 200, SLOT, np.array([i], np.int64), (i,), i, 0.0) for i in range(start, start + n)]


def test_index_commit_into_a_full_disk_raises_sqlite_full_not_a_rollback_error(tmp_path):
    index = SQLiteIndex(str(tmp_path / "i.sqlite"), sync_writes=False)
    index.commit(_entries(10), [], [], {})
    (pages,) = index._db.execute("PRAGMA page_count").fetchone()
    index._db.execute(f"PRAGMA max_page_count = {pages}")  # the file system holds no more pages
    with pytest.raises(sqlite3.OperationalError, match="database or disk is full") as e:
        index.commit(_entries(500, 10), [], [], {})
    assert is_enospc(e.value) and describe(e.value).startswith("ENOSPC: index:")
    assert len(index.load()) == 10  # rolled back whole
    index.close()


class FrozenBackOffClock:
    """``writes.time`` with a monotonic clock the test moves: the back-off's retry comes when the
    test says, not when a loaded machine happens to reach it."""

    def __init__(self):
        self.now = time.monotonic()

    def __getattr__(self, name):
        return getattr(time, name)

    def monotonic(self) -> float:
        return self.now


def test_enospc_from_an_index_commit_is_counted_enospc_and_fills_the_store(make_store, payload, monkeypatch, caplog):
    clock = FrozenBackOffClock()
    monkeypatch.setattr(writes, "time", clock)
    store = make_store()
    assert store.put("old", payload("old", SLOT)).ok
    db = store._index._db  # the index's file system fills up: SQLite answers SQLITE_FULL
    (pages,) = db.execute("PRAGMA page_count").fetchone()
    db.execute(f"PRAGMA max_page_count = {pages}")
    with caplog.at_level(logging.WARNING, logger="sglang_saria.storage.store"):
        results = [store.put_async(f"k{i}-" + "y" * 500, payload(f"k{i}", SLOT)) for i in range(40)]
        failed = [r.result() for r in results if not r.result().ok]
    assert failed and all(r.error.startswith("ENOSPC") for r in failed)
    counts = store.stats().counts
    assert counts.get("put_enospc", 0) >= 1 and "put_error" not in counts
    # The episode began with the first failed commit; puts already written when it began may still
    # commit into the index's last free bytes, and a commit that succeeds ends it (correctly).
    assert [r for r in caplog.records if "disk full (ENOSPC: index" in r.getMessage()]
    dest = np.zeros(SLOT, np.uint8)
    assert store.get("old", dest) is GetStatus.HIT
    db.execute("PRAGMA max_page_count = 1073741823")  # space freed
    clock.now += DISK_FULL_FIRST_RETRY_S * 1.1
    assert store.put("after", payload("after", SLOT)).ok and store.disk_full is None


def test_capacity_above_the_free_space_is_refused_before_preallocating(make_store, monkeypatch, store_dirs):
    real = os.statvfs

    class Vfs:
        def __init__(self, st):
            self.f_frsize, self.f_blocks, self.f_bavail = 4096, st.f_blocks, 256  # 1 MiB free
            self.f_flag = st.f_flag  # read-only or not: the store checks it too

    monkeypatch.setattr(layout.os, "statvfs", lambda path: Vfs(real(path)))
    fallocated = []
    monkeypatch.setattr(layout.os, "posix_fallocate", lambda *a: fallocated.append(a))
    with pytest.raises(ValueError) as e:
        make_store(capacity="16MiB")
    msg = str(e.value)
    data_dir = store_dirs(1)[0]
    assert repr(data_dir) in msg and f"{16 << 20} more bytes" in msg and f"{1 << 20} bytes free" in msg
    assert fallocated == [] and not os.path.exists(os.path.join(data_dir, "saria-slab.dat"))


def test_a_disk_full_while_a_file_exists_fills_and_frees_with_it(make_store, payload, tmp_path):
    """The server tests' disk (tests/faults/): the store runs in another process, so the test
    fills and frees it with a file; a put while the file exists fails ENOSPC, and once it is
    gone (and the retry is due) puts commit again."""
    flag = tmp_path / "full"
    disk = FullDisk(while_file=str(flag))
    store = make_store(fault_injector=disk)
    assert store.put("a", payload("a", SLOT)).ok
    flag.touch()
    assert store.put("b", payload("b", SLOT)).error.startswith("ENOSPC")
    flag.unlink()
    time.sleep(DISK_FULL_FIRST_RETRY_S)  # the store's own back-off: one retry after 1 s
    assert store.put("c", payload("c", SLOT)).ok
    assert (disk.refused, disk.written) == (1, 2)
    with pytest.raises(ValueError, match=r"fault_injector.while_file='full': must be an absolute path"):
        FullDisk(while_file="full")
