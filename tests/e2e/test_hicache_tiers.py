"""HiCache on CPU with storage backend `saria`: a session prefix evicted from the device is
reloaded from host memory (L2) and from the SSD store (L3).

Correctness has two oracles: the KV audit (every page that moves between device, host and
store keeps the bytes that were computed, checked on each path) and the greedy tokens and
logprobs of a cold run (`--disable-radix-cache`), within the tolerance of
`sglang_saria.launcher.LOGPROB_TOLERANCE` (a cached prefix runs other shapes than a cold
one, so bitwise equality holds on some CPUs only).

SSD hits go straight into the device KV pool (direct reload, the default); with
`"transfer": {"direct_reload": false}` they take HiCache's prefetch through host memory.
The metrics tell the two apart (store pages read into the device vs into the host pool).
A store whose pages fail their checksum makes the reload fall back to recomputation.
Lazy partial promotion keeps a share of an SSD reload in host memory, and a later reload
of that prefix takes the promoted share from DRAM and the rest from SSD in one plan.
Each scenario has its own server and store; the restart scenario starts from the store
exactly as the session scenario left it (restored at its own path, which the store's
index records), and then corrupts it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from sglang_saria.launcher import (
    AUDIT_ENV,
    assert_kv_audit_clean,
    assert_matches_cold,
    cached_tokens,
    kv_audit_pages,
    saria_hicache_args,
    saria_metrics,
)
from sglang_saria.storage.layout import SLAB_NAME
from tests.kept_store import KeptStore
from tests.e2e.steps import serve_steps

pytestmark = pytest.mark.e2e

SYSTEM_AND_TOOLS = list(range(1, 301))  # an agent's shared prefix: 300 tokens
TURN_2 = SYSTEM_AND_TOOLS + [7, 8, 9] * 10  # next turn: same prefix, more history
OTHER_SESSIONS = [[(k * 300 + j) % 1000 + 5 for j in range(300)] for k in range(1, 6)]

SESSION = [
    ("first turn computes everything", SYSTEM_AND_TOOLS, {"device": 0, "host": 0, "storage": 0}),
    ("second turn reuses the prefix on the device", TURN_2, {"device": 288, "host": 0, "storage": 0}),
    ("another session evicts it from the device", OTHER_SESSIONS[0], None),
    ("the prefix comes back from host memory", SYSTEM_AND_TOOLS, {"device": 0, "host": 288, "storage": 0}),
    *[("more sessions push it out of host memory", p, None) for p in OTHER_SESSIONS[1:]],
    ("the whole second turn comes back from storage", TURN_2, {"device": 0, "host": 0, "storage": 320}),
]


def hicache_args(data_dir: Path, direct_reload: bool = True) -> list[str]:
    config = {"data_dirs": [str(data_dir)], "admission": "full-duplicate", "capacity": "64MiB"}
    if not direct_reload:
        config["transfer"] = {"direct_reload": False}
    return saria_hicache_args(config)


@dataclass
class Run:
    metrics: dict[str, float]
    store: Path


def run_steps(start_server, cold_run, store: Path, steps, direct_reload: bool = True) -> Run:
    """Serve ``steps`` on one audited server: tiers as expected, output as a cold run's."""
    with start_server(hicache_args(store, direct_reload), env=AUDIT_ENV) as server:
        serve_steps(server, cold_run, steps)
        return Run(saria_metrics(server.metrics()), store)


@pytest.fixture(scope="module")
def direct_session(start_server, cold_run, tmp_path_factory) -> Run:
    return run_steps(start_server, cold_run, tmp_path_factory.mktemp("store-direct"), SESSION)


@pytest.fixture(scope="module")
def direct_session_store(direct_session) -> KeptStore:
    return KeptStore(direct_session.store)


def test_session_prefix_reloads_from_host_then_straight_from_storage(direct_session):
    metrics = direct_session.metrics
    assert any(direct_session.store.iterdir()), "the saria store holds no pages after the session"
    # 320 storage tokens = 20 pages of 16, read into the device pool, none into host memory.
    pages_read = {t: metrics.get(f"sglang:saria_store_pages_read_total/{t}", 0) for t in ("device", "host")}
    assert pages_read == {"device": 20, "host": 0}
    assert metrics["sglang:saria_reload_tokens_total/ssd"] == 320
    assert metrics["sglang:saria_reload_tokens_total/dram"] == 288
    # Lazy partial promotion: r_eff = min(0.4, 1 - 20/48) of the 20 reused pages -> 8 pages.
    assert metrics["sglang:saria_promoted_tokens_total"] == 128
    assert_kv_audit_clean(metrics, ("device_to_host", "host_to_device", "host_to_ssd", "ssd_to_device"))
    assert metrics.get("sglang:saria_tier_audit_errors_total", 0) == 0


def test_host_staged_reload_takes_storage_hits_through_host_memory(start_server, cold_run, tmp_path):
    run = run_steps(start_server, cold_run, tmp_path, SESSION, direct_reload=False)
    metrics = run.metrics
    assert metrics.get("sglang:saria_store_pages_read_total/device", 0) == 0
    assert metrics["sglang:saria_store_pages_read_total/host"] >= 20
    assert "sglang:saria_reload_tokens_total/ssd" not in metrics
    assert_kv_audit_clean(metrics, ("device_to_host", "host_to_device", "host_to_ssd", "ssd_to_host"))


@dataclass
class Restart:
    from_store: dict  # turn 2 on a server restarted on the session's store
    from_store_metrics: dict[str, float]
    corrupt: dict  # turn 2 again, device and host flushed, every stored page corrupted
    corrupt_metrics: dict[str, float]


@pytest.fixture(scope="module")
def restart(start_server, direct_session_store) -> Restart:
    """One server restarted on the store the session left: first a warm-SSD hit, then the
    same prefix once every stored page fails its checksum (flushed from device and host
    first, so only the store holds it)."""
    store = direct_session_store.restored()
    with start_server(hicache_args(store), env=AUDIT_ENV) as server:
        from_store = server.generate(TURN_2)
        server.wait_storage_writes()
        from_store_metrics = saria_metrics(server.metrics())
        server.flush_cache()
        slabs = list(store.rglob(SLAB_NAME))
        assert slabs, "the session scenario left no slab file"
        for slab in slabs:  # in place: the running store keeps its open files
            with slab.open("r+b") as f:
                f.write(b"\xff" * slab.stat().st_size)
        corrupt = server.generate(TURN_2)
        return Restart(from_store, from_store_metrics, corrupt, saria_metrics(server.metrics()))


def test_restarted_server_serves_prefix_from_populated_store(cold_run, restart):
    metrics = restart.from_store_metrics
    assert cached_tokens(restart.from_store) == {"device": 0, "host": 0, "storage": 320}
    assert_matches_cold(restart.from_store, cold_run(TURN_2), "turn 2 after a restart")
    # The audit knows the stored pages' digests from the log the first server appended.
    assert_kv_audit_clean(metrics, ("ssd_to_device",))
    assert kv_audit_pages(metrics, "ssd_to_device") == metrics["sglang:saria_store_pages_read_total/device"] == 20


def test_corrupt_store_pages_fall_back_to_recomputation(cold_run, restart):
    metrics = restart.corrupt_metrics
    assert cached_tokens(restart.corrupt) == {"device": 0, "host": 0, "storage": 0}
    assert_matches_cold(restart.corrupt, cold_run(TURN_2), "turn 2 recomputed")
    assert metrics["sglang:saria_reload_fallbacks_total/store_corrupt"] == 1
    no_new_pages = kv_audit_pages(restart.from_store_metrics, "ssd_to_device")
    assert kv_audit_pages(metrics, "ssd_to_device") == no_new_pages, "a corrupt page was loaded"
    assert_kv_audit_clean(metrics, ("ssd_to_device",))  # the restart's pages: none changed since


def test_prefix_past_a_published_reload_comes_from_storage(start_server, cold_run, direct_session_store):
    """A reload's published nodes are device-only (write-through does not fire for them), and
    SGLang prefetches only past a host-backed match end: the next turn, whose match ends on them,
    still gets the pages past them from the store (plugin hook after `_prefetch_kvcache`).
    Promotion off, so no published page is backed up to host meanwhile."""
    store = direct_session_store.restored()
    config = {"data_dirs": [str(store)], "admission": "full-duplicate", "capacity": "64MiB",
              "promotion": {"mode": "zero"}}
    steps = [
        ("a restarted server reloads the prefix from SSD", SYSTEM_AND_TOOLS, {"device": 0, "host": 0, "storage": 288}),
        ("the next turn: the published prefix on the device, the rest from SSD", TURN_2,
         {"device": 288, "host": 0, "storage": 32}),
    ]
    with start_server(saria_hicache_args(config), env=AUDIT_ENV) as server:
        serve_steps(server, cold_run, steps)
        metrics = saria_metrics(server.metrics())
    assert metrics.get("sglang:saria_promoted_tokens_total", 0) == 0
    assert metrics["sglang:saria_reload_tokens_total/ssd"] == 288 + 32
    assert_kv_audit_clean(metrics, ("ssd_to_device",))


def test_promoted_share_comes_back_from_dram_with_the_rest_from_ssd_in_one_plan(start_server, cold_run, tmp_path):
    steps = [
        ("the session's second turn is computed", TURN_2, {"device": 0, "host": 0, "storage": 0}),
        *[("other sessions push it out of device and host memory", p, None) for p in OTHER_SESSIONS[:3]],
        # r_eff = min(0.4, 1 - 20/48): 8 of the 18 pages reloaded from SSD are copied to host.
        ("its prefix reloads from SSD into the device pool", SYSTEM_AND_TOOLS, {"device": 0, "host": 0, "storage": 288}),
        *[("more sessions push it out of the device", p, None) for p in OTHER_SESSIONS[3:5]],
        # The reload runs while the request waits in the queue (issue 12): the DRAM part is
        # loaded to the device then, so SGLang reports it as a device hit.
        ("promoted pages from DRAM, the rest from SSD", TURN_2, {"device": 128, "host": 0, "storage": 192}),
    ]
    metrics = run_steps(start_server, cold_run, tmp_path, steps).metrics
    assert metrics["sglang:saria_promoted_tokens_total"] == 128
    assert metrics["sglang:saria_reload_tokens_total/dram"] == 128
    assert metrics["sglang:saria_reload_tokens_total/ssd"] == 288 + 192
    assert metrics["sglang:saria_tier_audits_total"] > 0
    assert metrics.get("sglang:saria_tier_audit_errors_total", 0) == 0
    # Promotion copies reloaded pages device -> host; the DRAM part of the mixed plan moves
    # host -> device in the same gathers as the SSD part.
    assert_kv_audit_clean(metrics, ("device_to_host", "host_to_device", "ssd_to_device"))
