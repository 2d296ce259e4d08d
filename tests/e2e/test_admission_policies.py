"""Reuse and combined admission, prewrite, and one reload per page, on real servers (issue 30
items 1, 2 and 8), with the writes named in advance and asserted exactly.

An agent session's system prompt S (10 pages) is reused by turns 2 and 3 (S + A, S + B, S + C):
R reaches 2 at turn 3's match, so `reuse:R2` and `combined:E2R2` write S then (event `reuse`) and
nothing else of the session. Under `combined:E2R2` another prefix X (18 pages) is evicted from host
memory twice: computed, pushed out by five other sessions, recomputed, pushed out by five fresh
ones. Its second eviction qualifies it, and prewrite writes it while it is next in line, before
host eviction asks for its space (event `prewrite`; the reclaim finds it stored and never waits:
no `deferred` reclaim). No other page is reused twice or evicted twice, so the store ends with
exactly S's and X's pages: 28 KV pages, and S and X come back whole from SSD (28 pages read; KV
audit clean on every path).

One reload per page (the `reuse:R2` server, once S is stored): device and host flushed, four
requests S + D_i arrive together (store reads slowed, so all four arrive while S is being read).
One reads S's pages from the store; the other three wait for that reload and match the published
pages as device hits: 10 pages read, not 40.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

import pytest

from sglang_saria.launcher import AUDIT_ENV, assert_kv_audit_clean, cached_tokens, saria_hicache_args, saria_metrics
from sglang_saria.storage.index import INDEX_NAME

pytestmark = pytest.mark.e2e

PAGE = 16
S = [(7 * j) % 900 + 11 for j in range(10 * PAGE)]  # 10 pages
SESSION = [S + [(k * 37 + j) % 900 + 11 for j in range(40)] for k in (1, 2, 3)]  # S + A, S + B, S + C
X = list(range(1, 301))  # 18 full pages
FIRST_PUSH = [[(k * 300 + j) % 1000 + 5 for j in range(300)] for k in range(1, 6)]
SECOND_PUSH = [[(k * 301 + 7 * j) % 1000 + 5 for j in range(300)] for k in range(11, 16)]
CONCURRENT = [S + [(k * 53 + j) % 900 + 11 for j in range(20)] for k in (4, 5, 6, 7)]  # S + D_i


def stored_kv_pages(store: Path) -> set[str]:
    (index,) = store.rglob(INDEX_NAME)
    with sqlite3.connect(index) as db:
        stems = [k.split("@")[0] for (k,) in db.execute("SELECT key FROM objects")]
    return {s for s in stems if "." not in s}  # KV pages (sidecars carry ".pool")


def admissions(metrics: dict[str, float]) -> dict[str, float]:
    prefix = "sglang:saria_ssd_admissions_total/"
    return {k[len(prefix):]: v for k, v in metrics.items() if k.startswith(prefix) and v}


def reclaims(metrics: dict[str, float]) -> dict[str, float]:
    prefix = "sglang:saria_host_reclaims_total/"
    return {k[len(prefix):]: v for k, v in metrics.items() if k.startswith(prefix) and v}


def serve(server, prompts) -> list[dict]:
    results = []
    for prompt in prompts:
        results.append(server.generate(prompt))
        server.wait_storage_writes()
    return results


@dataclass
class Run:
    metrics: dict[str, float]
    stored: set[str]
    results: dict[str, object]


@pytest.fixture(scope="module")
def reuse_r2(start_server, tmp_path_factory) -> Run:
    store = tmp_path_factory.mktemp("reuse-r2")
    # Store reads slowed (test-only injector) so the four requests surely arrive while S is being read.
    delay = {"class": "sglang_saria.storage.fault_injection:ReadDelay", "read_delay_s": 0.3}
    extra = {"data_dirs": [str(store)], "admission": "reuse:R2", "capacity": "64MiB", "fault_injector": delay}
    with start_server(saria_hicache_args(extra), env=AUDIT_ENV) as server:
        serve(server, SESSION)
        session = saria_metrics(server.metrics())
        server.flush_cache()  # S is only in the store now
        together = server.post("/generate", {
            "input_ids": CONCURRENT,
            "sampling_params": {"max_new_tokens": 4, "temperature": 0.0},
        })
        server.wait_storage_writes()
        metrics = saria_metrics(server.metrics())
    return Run(metrics, stored_kv_pages(store), {"session": session, "together": together})


@pytest.fixture(scope="module")
def combined(start_server, tmp_path_factory) -> Run:
    store = tmp_path_factory.mktemp("combined")
    extra = {"data_dirs": [str(store)], "admission": "combined:E2R2", "capacity": "64MiB"}
    with start_server(saria_hicache_args(extra), env=AUDIT_ENV) as server:
        serve(server, [*SESSION, X, *FIRST_PUSH, X, *SECOND_PUSH])
        before_reload = saria_metrics(server.metrics())
        server.flush_cache()
        s_back, x_back = serve(server, [SESSION[0], X])  # both straight from SSD
        metrics = saria_metrics(server.metrics())
    return Run(metrics, stored_kv_pages(store), {"before": before_reload, "s_back": s_back, "x_back": x_back})


def test_reuse_r2_writes_exactly_the_prefix_reused_twice(reuse_r2):
    session = reuse_r2.results["session"]
    assert admissions(session) == {"reuse": 1}  # node S, at turn 3's match; A, B, C never reused
    assert len(reuse_r2.stored) == 10  # S's pages: the four requests below read all of them from the store


def test_concurrent_requests_on_a_stored_prefix_read_each_page_once(reuse_r2):
    m = reuse_r2.metrics
    assert m["sglang:saria_store_pages_read_total/device"] == 10 == len(reuse_r2.stored)
    assert m["sglang:saria_reload_followers_total"] == 3
    tiers = [cached_tokens(r) for r in reuse_r2.results["together"]]
    assert all(t["device"] + t["host"] + t["storage"] == 10 * PAGE for t in tiers), tiers
    assert sorted(t["storage"] for t in tiers) == [0, 0, 0, 10 * PAGE]
    assert admissions(m) == {"reuse": 1}  # S is on SSD already: nothing new written
    assert_kv_audit_clean(m, ("device_to_host", "host_to_ssd", "ssd_to_device"))


def test_combined_e2r2_writes_the_prefix_reused_twice_and_the_one_evicted_twice(combined):
    before = combined.results["before"]
    assert admissions(before) == {"reuse": 1, "prewrite": 1}  # S at turn 3's match, X before its 2nd eviction
    # The store holds 28 KV pages and S (10) and X (18) are read back whole from it: exactly theirs.
    assert len(combined.stored) == 28
    assert cached_tokens(combined.results["s_back"])["storage"] == 10 * PAGE
    assert cached_tokens(combined.results["x_back"])["storage"] == 18 * PAGE
    assert combined.metrics["sglang:saria_store_pages_read_total/device"] == 28
    assert admissions(combined.metrics) == admissions(before)  # the reloads wrote nothing
    assert_kv_audit_clean(combined.metrics, ("device_to_host", "host_to_ssd", "ssd_to_device"))
    assert combined.metrics.get("sglang:saria_tier_audit_errors_total", 0) == 0


def test_prewrite_finishes_before_the_reclaim_asks_and_no_reclaim_waits(combined):
    gate = reclaims(combined.results["before"])
    assert "deferred" not in gate and "after_write" not in gate and "in_flight" not in gate
    # Two reclaims found their node in the store already: X's second (prewritten) and S's (written at reuse).
    assert gate["stored"] == 2 and gate["dropped"] > 0
