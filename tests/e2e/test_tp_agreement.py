"""A real `--tp 2` CPU server with the saria store: two attention ranks, two stores (one rank
subdirectory each), the admission policy deciding on rank-agreed inputs (`RankAgreement`,
connected by `SariaRadixCache`; its collectives run at construction and once per step).

Agent sessions with small pools push prefixes out of device and host memory, so eviction:E2
writes at host evictions and prewrites. The server must serve them (a collective entered by
one rank only would hang it), pass the tier and KV audits on every rank, and leave the same
pages in both ranks' stores: every write was decided identically on both. A server restarted
on those stores then reloads a stored prefix from SSD straight into both ranks' device pools
(the reload worker's leading run agreed by the ranks): KV audit clean on the SSD -> device
path, logprobs within the oracle's tolerance of a cold `--tp 2` server.

SGLang on CPU runs one rank per NUMA node unless SGLANG_CPU_OMP_THREADS_BIND gives each rank
its cores; this machine has one node, so the test binds rank 0 and rank 1 to a core each.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sglang_saria.launcher import (
    AUDIT_ENV,
    assert_kv_audit_clean,
    assert_matches_cold,
    cached_tokens,
    saria_hicache_args,
    saria_metrics,
)
from sglang_saria.replay.agent_prompts import agent_requests
from sglang_saria.storage.index import SQLiteIndex, index_path

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TP2_ENV = {**AUDIT_ENV, "SGLANG_CPU_OMP_THREADS_BIND": "0|1"}
# Two ranks profile the machine's free memory around their weight loads at once (and other
# processes allocate meanwhile): the launcher's 5% budget check fails spuriously. The pools
# are capped by --max-total-tokens either way.
TP2_ARGS = ["--tp", "2", "--mem-fraction-static", "0.5"]
PAGE = 16  # conftest's SMALL_POOLS


def _extra(data_dir: Path) -> dict:
    return {"data_dirs": [str(data_dir)], "admission": "eviction:E2", "capacity": "64MiB"}


def stored_keys(rank_dir: Path) -> set[str]:
    index = SQLiteIndex(index_path(str(rank_dir)), sync_writes=False)
    try:
        return {entry.key for entry in index.load()}
    finally:
        index.close()


@pytest.fixture(scope="module")
def tp2_run(start_server, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("tp2")
    with start_server(saria_hicache_args(_extra(data_dir)) + TP2_ARGS, env=TP2_ENV) as server:
        results = []
        for prompt in agent_requests():
            results.append(server.generate(prompt))
            server.wait_storage_writes()
        metrics = saria_metrics(server.metrics())
        log = server.log_path.read_text(errors="replace")
    return results, metrics, data_dir, log


def test_tp2_server_serves_with_saria_admission_and_clean_audits(tp2_run):
    results, metrics, _, log = tp2_run
    assert log.count("decide on rank-agreed inputs") == 2, "each rank's radix cache connects the agreement"
    assert all(r["meta_info"]["completion_tokens"] > 0 for r in results)
    written = metrics.get("sglang:saria_ssd_admissions_total/evict", 0) + metrics.get(
        "sglang:saria_ssd_admissions_total/prewrite", 0
    )
    assert written > 0, "the run must write nodes evicted twice"
    assert metrics.get("sglang:saria_tier_audit_errors_total", 0) == 0
    assert_kv_audit_clean(metrics, ("device_to_host", "host_to_device", "host_to_ssd"))


def test_tp2_ranks_write_the_same_pages_to_their_stores(tp2_run):
    _, _, data_dir, _ = tp2_run
    ranks = sorted(os.listdir(data_dir))
    assert ranks == ["rank_tp0of2", "rank_tp1of2"]
    keys = [stored_keys(data_dir / r) for r in ranks]
    assert keys[0], "the run must persist pages"
    assert keys[0] == keys[1]


def stored_prefix_pages(keys: set[str], prompt: list[int]) -> int:
    """How many of ``prompt``'s leading pages the store holds (a storage hit needs a prefix)."""
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    stored = {k.split("@")[0] for k in keys}
    hashes = get_storage_hash_str(RadixKey(prompt[: len(prompt) // PAGE * PAGE]), None, page_size=PAGE)
    run = 0
    while run < len(hashes) and hashes[run] in stored:
        run += 1
    return run


@pytest.fixture(scope="module")
def tp2_reload(start_server, tp2_run):
    """A `--tp 2` server restarted on the first run's stores serves the agent prompt with the
    longest stored prefix (its device and host pools start empty: the hit is SSD only), and a
    cold `--tp 2` server serves the same prompt."""
    _, _, data_dir, _ = tp2_run
    keys = stored_keys(data_dir / "rank_tp0of2")
    prompt = max(agent_requests(), key=lambda p: stored_prefix_pages(keys, p))
    pages = stored_prefix_pages(keys, prompt)
    with start_server(saria_hicache_args(_extra(data_dir)) + TP2_ARGS, env=TP2_ENV) as server:
        result = server.generate(prompt)
        metrics = saria_metrics(server.metrics())
    with start_server(TP2_ARGS + ["--disable-radix-cache"], env=TP2_ENV) as server:
        cold = server.generate(prompt)
    return pages, result, metrics, cold


def test_tp2_restart_reloads_a_stored_prefix_into_both_ranks_device_pools(tp2_reload):
    pages, result, metrics, cold = tp2_reload
    assert pages >= 2, "the first run must have stored a prefix of some agent prompt"
    # SGLang computes at least the last prompt token: a prefix of exactly the prompt hits one page less.
    assert cached_tokens(result)["storage"] >= (pages - 1) * PAGE
    assert metrics.get("sglang:saria_store_pages_read_total/device", 0) >= 2 * (pages - 1), "both ranks read"
    assert metrics.get("sglang:saria_store_pages_read_total/host", 0) == 0, "no page staged in host memory"
    assert metrics.get("sglang:saria_tier_audit_errors_total", 0) == 0
    assert_kv_audit_clean(metrics, ("ssd_to_device",))
    assert_matches_cold(result, cold, "tp2 SSD reload")
