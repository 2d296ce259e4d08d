"""Admission counters survive a restart (issue 30 item 3): R, E and t_reuse per page are saved
in the store's index and restored at start, within the metadata window.

One store, three servers under ``eviction:E2``:

1. prefix P is computed, then pushed out of host memory by other sessions: evicted once
   (E = 1), not admitted; its counters are in the store's index when the server stops;
2. restarted on the same store: P's counters come back, so P recomputed and evicted again
   is at its second eviction and is admitted (write-before-reclaim or prewrite): the store
   holds exactly P's pages, and P's next request reloads all of them from SSD (KV audit clean).
   Without the restored counters this eviction is P's first and nothing is written;
3. restarted with a 1-s metadata window: every counter kept is older than that, so none is
   restored and all are dropped from the index.
"""

from __future__ import annotations

import re
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from sglang_saria.launcher import AUDIT_ENV, assert_kv_audit_clean, cached_tokens, saria_hicache_args, saria_metrics
from sglang_saria.storage.index import INDEX_NAME

pytestmark = pytest.mark.e2e

PAGE = 16
P = list(range(1, 301))  # an agent's shared prefix: 300 tokens, 18 full pages
BEFORE = [[(k * 300 + j) % 1000 + 5 for j in range(300)] for k in range(1, 6)]  # sessions of server 1
AFTER = [[(k * 301 + 7 * j) % 1000 + 5 for j in range(300)] for k in range(11, 16)]  # fresh ones for server 2
WINDOW_S = 1.0


def args(store: Path, window_s: float | None = None) -> list[str]:
    extra = {"data_dirs": [str(store)], "admission": "eviction:E2", "capacity": "64MiB"}
    if window_s is not None:
        extra["metadata"] = {"metadata_window_s": window_s}
    return saria_hicache_args(extra)


@dataclass
class IndexState:
    counters: dict[int, tuple[int, int]]  # page key -> (R, E)
    kv_pages: set[str]  # page hashes of the KV objects stored


def read_index(store: Path) -> IndexState:
    (index,) = store.rglob(INDEX_NAME)
    with sqlite3.connect(index) as db:
        counters = {k & ((1 << 64) - 1): (r, e) for k, r, e in db.execute("SELECT key, r, e FROM counters")}
        keys = [k for (k,) in db.execute("SELECT key FROM objects")]
    return IndexState(counters, {k.split("@")[0] for k in keys if "." not in k.split("@")[0]})


@dataclass
class Runs:
    first: dict[str, float]
    after_first: IndexState
    restarted_at_start: dict[str, float]
    restarted: dict[str, float]
    p_back: dict  # P's request once it was admitted and evicted after the restart
    after_restart: IndexState
    before_windowed: IndexState  # the index just before the third server starts
    windowed: dict[str, float]
    expired_by_earlier_starts: int  # a start that lost its port (launcher retry) ran the restore first
    after_windowed: IndexState


def serve(server, prompts) -> None:
    for prompt in prompts:
        server.generate(prompt)
        server.wait_storage_writes()


@pytest.fixture(scope="module")
def runs(start_server, tmp_path_factory) -> Runs:
    store = tmp_path_factory.mktemp("store")
    with start_server(args(store), env=AUDIT_ENV) as server:
        serve(server, [P, *BEFORE])
        server.wait_counters_saved()
        first = saria_metrics(server.metrics())
    after_first = read_index(store)
    with start_server(args(store), env=AUDIT_ENV) as server:
        at_start = saria_metrics(server.metrics())
        serve(server, [P, *AFTER])
        p_back = server.generate(P)
        server.wait_storage_writes()
        server.wait_counters_saved()
        restarted = saria_metrics(server.metrics())
    stopped = time.monotonic()
    after_restart = read_index(store)
    time.sleep(max(0.0, WINDOW_S + 0.5 - (time.monotonic() - stopped)))  # every row older than the window
    before_windowed = read_index(store)
    with start_server(args(store, window_s=WINDOW_S)) as server:
        windowed = saria_metrics(server.metrics())
        earlier = sum(int(n) for log in server.earlier_logs for n in re.findall(r"(\d+) older dropped", log.read_text()))
    return Runs(first, after_first, at_start, restarted, p_back, after_restart, before_windowed, windowed, earlier,
                read_index(store))


def test_page_evicted_once_is_not_admitted_and_its_counters_are_kept_in_the_store(runs):
    assert "sglang:saria_ssd_admissions_total/evict" not in runs.first
    assert "sglang:saria_ssd_admissions_total/prewrite" not in runs.first
    assert runs.first["sglang:saria_host_evictions_total"] > 0
    assert runs.after_first.kv_pages == set()
    # P's 18 pages and the other sessions' evicted ones: each evicted once, none twice.
    evictions = [e for _, e in runs.after_first.counters.values()]
    assert max(evictions) == 1 and evictions.count(1) >= 18


def test_restarted_server_admits_the_page_at_its_second_eviction(runs):
    m = runs.restarted
    # One node written, P's, at its second eviction (write-before-reclaim or, just before it, prewrite).
    admitted = {k.rsplit("/", 1)[1]: v for k, v in m.items() if k.startswith("sglang:saria_ssd_admissions_total/")}
    assert sum(admitted.get(ev, 0) for ev in ("evict", "prewrite")) == 1 and set(admitted) <= {"evict", "prewrite"}
    # The store holds 18 KV pages and P's 18 come back whole from it: exactly P's, byte-identical
    # to what was computed (KV audit). They are the only pages evicted twice.
    assert len(runs.after_restart.kv_pages) == 18
    assert cached_tokens(runs.p_back) == {"device": 0, "host": 0, "storage": 18 * PAGE}
    assert m["sglang:saria_store_pages_read_total/device"] == 18
    assert [e for _, e in runs.after_restart.counters.values()].count(2) == 18
    assert_kv_audit_clean(m, ("device_to_host", "host_to_ssd", "ssd_to_device"))
    assert m.get("sglang:saria_tier_audit_errors_total", 0) == 0
    # Every counter the first server kept came back at the restart (none was older than the window).
    assert runs.restarted_at_start["sglang:saria_counters_restored_total"] == len(runs.after_first.counters)
    assert runs.restarted_at_start.get("sglang:saria_counters_expired_total", 0) == 0


def test_counters_older_than_the_metadata_window_are_dropped_at_start(runs):
    assert runs.before_windowed.counters == runs.after_restart.counters  # still there when the third server starts
    assert runs.windowed.get("sglang:saria_counters_restored_total", 0) == 0
    expired = runs.windowed.get("sglang:saria_counters_expired_total", 0) + runs.expired_by_earlier_starts
    assert expired == len(runs.after_restart.counters) > 0
    assert runs.after_windowed.counters == {}
