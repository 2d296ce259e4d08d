"""Page counters kept with the store (issue 30 item 3, store level): rows saved by one process
are in the index after a restart (same commit as the pages, so a kill after the save resolved
loses nothing), rows older than the window are not returned and leave the index, scopes (model
and page format) are kept apart, and a save on an offline store resolves False."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import textwrap
import time

from sglang_saria.storage.counters import CounterRow
from sglang_saria.storage.index import INDEX_NAME

SCOPE = "@tiny.layer_first.bfloat16"
KEY = (1 << 64) - 5  # above int64: stored with the same bits as a signed integer


def test_counters_saved_before_a_restart_come_back_within_the_window(make_store):
    store = make_store()
    now = time.time()
    rows = [CounterRow(KEY, 3, 2, 1, now - 10.0), CounterRow(7, 0, 1, 0, now - 1.0)]
    assert store.save_counters(SCOPE, rows).result(timeout=10) is True
    store.save_counters(SCOPE, [CounterRow(7, 1, 1, 0, now)]).result(timeout=10)  # newest row wins
    store.close()
    again = make_store(config=store.config)
    loaded, dropped = again.load_counters(SCOPE, since=now - 60.0)
    assert (loaded, dropped) == ([rows[0], CounterRow(7, 1, 1, 0, now)], 0)
    assert again.load_counters("@other-model", since=0.0) == ([], 0)


def test_rows_older_than_the_window_are_dropped_at_load_and_by_expiry(make_store):
    store = make_store()
    now = time.time()
    old, fresh = CounterRow(1, 1, 1, 0, now - 100.0), CounterRow(2, 1, 1, 0, now - 1.0)
    store.save_counters(SCOPE, [old, fresh]).result(timeout=10)
    assert store.load_counters(SCOPE, since=now - 50.0) == ([fresh], 1)
    assert store.load_counters(SCOPE, since=0.0) == ([fresh], 0)  # the old row left the index
    # A save may carry the window's start: rows used before it are deleted in that commit.
    store.save_counters(SCOPE, [CounterRow(3, 0, 0, 0, now)], expire_before=now - 0.5).result(timeout=10)
    assert store.load_counters(SCOPE, since=0.0) == ([CounterRow(3, 0, 0, 0, now)], 0)


def test_a_resolved_save_survives_kill_9(tmp_path):
    """The save resolves after its commit, the durability of the pages' rows: a process killed
    right after it leaves the row in the index."""
    data = tmp_path / "ssd"
    script = textwrap.dedent(f"""
        import os, signal, time
        from sglang_saria.mem_cache.ssd_order import SSDVictimOrder
        from sglang_saria.storage.config import StoreConfig
        from sglang_saria.storage.counters import CounterRow
        from sglang_saria.storage.store import SariaStore
        store = SariaStore(StoreConfig(data_dirs=[{str(data)!r}], capacity="1MiB", slot_bytes="64KiB"),
                           victim_order=SSDVictimOrder())
        assert store.save_counters({SCOPE!r}, [CounterRow(11, 2, 1, 0, time.time())]).result(timeout=10)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, proc.stderr
    with sqlite3.connect(data / INDEX_NAME) as db:
        assert db.execute("SELECT key, r, e FROM counters").fetchall() == [(11, 2, 1)]


def test_save_on_an_offline_store_resolves_false(make_store, store_dirs):
    store = make_store()
    shutil.rmtree(store_dirs(1)[0])
    store._check_data_dirs()  # the committer's once-a-second check, run now
    assert store.save_counters(SCOPE, [CounterRow(1, 1, 1, 0, time.time())]).result(timeout=10) is False
