"""TP consistency: the decisions that change the tree are the same on every attention rank.

Two gloo processes play two ranks (tp_ranks.py): each has its own real SariaStore, rank 1's
writes commit LAG_S late, and both drive the admission policy through the same event sequence
(request matches, host inserts, prewrite, host evictions through the gate). With the
rank-agreed inputs (`RankAgreement`) every decision, clock reading and SSD view is identical and
no host lock leaks; with the old rank-local inputs (store `exists`, wall clock) the same run
splits, which shows the test detects the problem.
"""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from tests.hicache import tp_ranks

LAG_S = 0.6
JOIN_TIMEOUT_S = 150


def run_two_ranks(tmp_path: Path, agreed: bool) -> list[dict]:
    """Spawn both ranks, wait for them, return their logs (rank order)."""
    ctx = multiprocessing.get_context("spawn")
    init = f"file://{tmp_path / 'rendezvous'}"
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    procs = [
        ctx.Process(target=tp_ranks.run_rank, args=(r, 2, init, str(tmp_path), agreed, LAG_S, str(outs[r])))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(JOIN_TIMEOUT_S)
    stuck = [p.pid for p in procs if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    assert not stuck, f"ranks {stuck} did not finish within {JOIN_TIMEOUT_S} s"
    assert [p.exitcode for p in procs] == [0, 0]
    return [json.loads(o.read_text()) for o in outs]


@pytest.fixture(scope="module")
def agreed_logs(tmp_path_factory) -> list[dict]:
    return run_two_ranks(tmp_path_factory.mktemp("agreed"), agreed=True)


def test_ranks_with_skewed_commits_make_identical_tree_decisions(agreed_logs):
    r0, r1 = agreed_logs
    assert r0["writes"], "the scenario must request writes"
    assert any(not reclaim for _, _, reclaim in r0["gate"]), "the scenario must defer a reclaim behind a write"
    assert {why for _, why, _ in r0["writes"]} >= {"reuse", "prewrite", "before_reclaim"}
    assert r0["writes"] == r1["writes"]
    assert r0["gate"] == r1["gate"]
    assert r0["promotions"] == r1["promotions"]


def test_ranks_read_the_same_step_clock_and_ssd_view(agreed_logs):
    r0, r1 = agreed_logs
    assert r0["clocks"] == r1["clocks"]
    assert r0["clocks"] == sorted(r0["clocks"]) and r0["clocks"][0] < r0["clocks"][-1]
    assert r0["views"] == r1["views"]
    assert any(any(view) for view in r0["views"]), "committed writes must reach the agreed view"


def test_no_host_lock_leaks_when_commits_are_skewed(agreed_logs):
    assert [log["leaked_locks"] for log in agreed_logs] == [0, 0]


def test_agreed_view_starts_with_the_pages_every_store_holds(agreed_logs):
    # SHARED_AT_START on both stores; each ONLY_ON_RANK page on one store only
    assert [log["start_view"] for log in agreed_logs] == [[True, True, False, False]] * 2


def test_page_lost_by_one_rank_leaves_every_ranks_view_at_the_next_step(agreed_logs):
    assert [log["lost_page_seen_on_ssd"] for log in agreed_logs] == [False, False]


def test_rank_local_inputs_split_the_same_run(tmp_path):
    """The old inputs (each rank's store `exists`, its own wall clock): the ranks' SSD views differ
    while rank 1 lags, and a page one store lost stays on the other rank's view. (Decisions at
    SPLIT_STEP no longer split: a write the policy ordered counts as on SSD while in flight, on
    every rank, so the lagging rank does not write the chain-0 leaf again.)"""
    r0, r1 = run_two_ranks(tmp_path, agreed=False)
    assert r0["views"] != r1["views"]
