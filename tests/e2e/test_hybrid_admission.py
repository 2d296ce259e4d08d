"""The hybrid model (GDN + full attention) under ``eviction:E2`` on a real CPU server (issue 30
item 4): a session's prefix evicted from host memory once is not written (its chain and the GDN
checkpoint it starts from stay off the SSD), comes back recomputed, and at its second host
eviction is written, pages and checkpoint together, so its next turn reloads from storage with
the cold run's tokens and a clean KV audit. Written at the first eviction (E1), the second turn
would be a storage hit; not written at all, the third would recompute: both fail the test."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from sglang_saria.launcher import AUDIT_ENV, assert_kv_audit_clean, assert_matches_cold, cached_tokens, saria_hicache_args, saria_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TRACK_INTERVAL = 64  # GDN checkpoint spacing: a prefix is reusable up to its last checkpoint
PREFIX_CACHE = ["--mamba-radix-cache-strategy", "extra_buffer", "--mamba-track-interval", str(TRACK_INTERVAL)]
SESSION = list(range(1, 301)) + [7, 8, 9] * 10  # 330 tokens: checkpointed at 320
LAST_CHECKPOINT = (len(SESSION) // TRACK_INTERVAL) * TRACK_INTERVAL


def fillers(first: int) -> list[list[int]]:
    """Five 300-token sessions of their own: 1,500 tokens push anything older out of the device
    pool (512 tokens) and the host pool (twice that)."""
    return [[(k * 300 + j) % 1000 + 5 for j in range(300)] for k in range(first, first + 5)]


@dataclass
class Run:
    tiers: list[dict[str, int]]  # the session's cached tokens by tier, per turn
    metrics: dict[str, float]


def run_scenario(start_hybrid_server, cold_hybrid_run, store, admission: str | dict) -> Run:
    extra = {"data_dirs": [str(store)], "admission": admission, "capacity": "64MiB"}
    tiers = []
    with start_hybrid_server(PREFIX_CACHE + saria_hicache_args(extra), env=AUDIT_ENV) as server:
        for round_fillers in (fillers(1), fillers(6), None):
            result = server.generate(SESSION)
            server.wait_storage_writes()
            assert_matches_cold(result, cold_hybrid_run(SESSION), f"{admission}: turn {len(tiers) + 1}")
            tiers.append(cached_tokens(result))
            for prompt in round_fillers or ():
                server.generate(prompt)
                server.wait_storage_writes()
        metrics = saria_metrics(server.metrics())
    return Run(tiers, metrics)


@pytest.fixture(scope="module")
def e2(start_hybrid_server, cold_hybrid_run, tmp_path_factory) -> Run:
    return run_scenario(start_hybrid_server, cold_hybrid_run, tmp_path_factory.mktemp("hybrid-e2"), "eviction:E2")


def test_evicted_once_recomputes_evicted_twice_reloads_from_storage(e2):
    nothing = {"device": 0, "host": 0, "storage": 0}
    assert e2.tiers[0] == nothing
    assert e2.tiers[1] == nothing, "a prefix evicted once was written under E2"
    assert e2.tiers[2] == {"device": 0, "host": 0, "storage": LAST_CHECKPOINT}
    assert e2.metrics.get("sglang:saria_ssd_admissions_total/insert", 0) == 0
    evicted_twice = (e2.metrics.get("sglang:saria_ssd_admissions_total/evict", 0)
                     + e2.metrics.get("sglang:saria_ssd_admissions_total/prewrite", 0))
    assert evicted_twice > 0
    assert e2.metrics["sglang:saria_reload_tokens_total/ssd"] >= LAST_CHECKPOINT
    assert_kv_audit_clean(e2.metrics, ("ssd_to_device",))



def test_auto_closes_lazily_on_the_hybrid_and_the_next_turn_reloads_from_storage(start_hybrid_server, cold_hybrid_run,
                                                                                 tmp_path):
    """`auto` with its defaults for hybrid models (lazy closure): with a bar every class passes, each
    node is written alone at its own host eviction, leaves first, while its parent still has a
    copy, so what reaches the store must still add up to a prefix with its checkpoint. The next turn
    reloads the whole checkpointed prefix from storage, with the cold run's tokens and a clean KV
    audit. (An ancestor written because a stored descendant needs it, whatever its own class says,
    is `tests/mem_cache/test_auto.py`'s lazy-hybrid case.)"""
    run = run_scenario(start_hybrid_server, cold_hybrid_run, tmp_path / "store",
                       {"policy": "auto", "auto_odds": 1e-6})
    assert run.tiers[0] == {"device": 0, "host": 0, "storage": 0}
    assert run.tiers[1] == {"device": 0, "host": 0, "storage": LAST_CHECKPOINT}
    assert run.metrics.get("sglang:saria_auto_decisions_total/admit", 0) > 0
    assert run.metrics.get("sglang:saria_ssd_admissions_total/insert", 0) == 0  # auto writes at evictions only
    assert_kv_audit_clean(run.metrics, ("ssd_to_device",))


def test_a_hybrid_ssd_hit_reloads_into_both_ranks_on_tp2(start_hybrid_server, cold_hybrid_run, tmp_path):
    """``--tp 2``: each rank holds half of every GDN state and FA page; the session's second turn
    comes back from the ranks' stores (pages and checkpoint), rank-agreed, with the single-rank
    cold run's greedy tokens and logprobs within the oracle's tolerance."""
    extra = {"data_dirs": [str(tmp_path / "store")], "admission": "full-duplicate", "capacity": "64MiB"}
    tp2 = ["--tp", "2", "--mem-fraction-static", "0.5"]
    env = {**AUDIT_ENV, "SGLANG_CPU_OMP_THREADS_BIND": "0|1"}
    with start_hybrid_server(PREFIX_CACHE + saria_hicache_args(extra) + tp2, env=env) as server:
        server.generate(SESSION)
        server.wait_storage_writes()
        for prompt in fillers(1):
            server.generate(prompt)
            server.wait_storage_writes()
        result = server.generate(SESSION)
        metrics = saria_metrics(server.metrics())
    assert cached_tokens(result) == {"device": 0, "host": 0, "storage": LAST_CHECKPOINT}
    assert_matches_cold(result, cold_hybrid_run(SESSION), "tp2 hybrid SSD hit")
    assert sorted(p.name for p in (tmp_path / "store").iterdir() if p.name.startswith("rank_")) == ["rank_tp0of2", "rank_tp1of2"]
    assert_kv_audit_clean(metrics, ("ssd_to_device",))
