"""Admission per page on a real server (paper 4.2: each block is decided by its own counters).

A growing agent conversation: turn 1 computes X (18 pages); five other sessions push it out of
host memory (its first eviction, E = 1: not written under `eviction:E2`), so it leaves the tree.
Turn 2 (X + Y) recomputes X with 7 new pages, and SGLang's tree holds all 25 in one node. Five
fresh sessions push that node out of host memory: X's pages are at their second eviction, Y's at
their first. Judged by its last page the node would be dropped and X never written (what the
Figure 10 bench found); decided per page, the leaf is split after X, Y is dropped and X written
before its reclaim. Turn 3 (X + Z) then reads X from the store. Nothing else is evicted twice,
so the store ends with exactly X's 18 pages.
"""

from __future__ import annotations

import pytest

from sglang_saria.launcher import AUDIT_ENV, assert_kv_audit_clean, assert_matches_cold, cached_tokens, saria_hicache_args, saria_metrics
from tests.e2e.test_admission_policies import FIRST_PUSH, SECOND_PUSH, X, reclaims, serve, stored_kv_pages

pytestmark = pytest.mark.e2e

X_PAGES = 18
TURN_2 = X + [(5 * j) % 900 + 13 for j in range(100)]  # X + Y
TURN_3 = X + [(11 * j) % 900 + 17 for j in range(40)]  # X + Z


def test_a_node_joining_pages_evicted_twice_and_once_writes_the_twice_evicted_ones(start_server, cold_run, tmp_path):
    store = tmp_path / "store"
    extra = {"data_dirs": [str(store)], "admission": "eviction:E2", "capacity": "64MiB"}
    with start_server(saria_hicache_args(extra), env=AUDIT_ENV) as server:
        serve(server, [X, *FIRST_PUSH, TURN_2, *SECOND_PUSH])
        assert len(stored_kv_pages(store)) == X_PAGES
        (turn_3,) = serve(server, [TURN_3])
        metrics = saria_metrics(server.metrics())
    assert cached_tokens(turn_3) == {"device": 0, "host": 0, "storage": X_PAGES * 16}
    assert_matches_cold(turn_3, cold_run(TURN_3), "turn 3, X from the store")
    assert metrics["sglang:saria_host_leaf_splits_total"] >= 1
    assert "deferred" in reclaims(metrics) or "stored" in reclaims(metrics)
    assert_kv_audit_clean(metrics, ("device_to_host", "host_to_ssd", "ssd_to_device"))
