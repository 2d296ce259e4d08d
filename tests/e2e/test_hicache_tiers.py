"""HiCache on CPU with storage backend `saria`: a session prefix evicted from the device is
reloaded from host memory (L2) and from the SSD store (L3) with logprobs exactly equal to a
cold run (`--disable-radix-cache`); equal greedy tokens alone prove little on a random model.

SSD hits go straight into the device KV pool (direct reload, the default); with
`"transfer": {"direct_reload": false}` they take HiCache's prefetch through host memory.
The metrics tell the two apart (store pages read into the device vs into the host pool).
A store whose pages fail their checksum makes the reload fall back to recomputation.
Lazy partial promotion keeps a share of an SSD reload in host memory, and a later reload
of that prefix takes the promoted share from DRAM and the rest from SSD in one plan."""

from __future__ import annotations

import pytest

from sglang_saria.launcher import cached_tokens, logprob_trace, saria_hicache_args, saria_metrics
from sglang_saria.storage.layout import SLAB_NAME

pytestmark = pytest.mark.e2e

SYSTEM_AND_TOOLS = list(range(1, 301))  # an agent's shared prefix: 300 tokens
TURN_2 = SYSTEM_AND_TOOLS + [7, 8, 9] * 10  # next turn: same prefix, more history
OTHER_SESSIONS = [[(k * 300 + j) % 1000 + 5 for j in range(300)] for k in range(1, 6)]
PROMPTS = [SYSTEM_AND_TOOLS, TURN_2, *OTHER_SESSIONS]


def hicache_args(data_dir, direct_reload: bool = True) -> list[str]:
    config = {"data_dirs": [str(data_dir)], "admission": "full-duplicate", "capacity": "64MiB"}
    if not direct_reload:
        config["transfer"] = {"direct_reload": False}
    return saria_hicache_args(config)


@pytest.fixture(scope="module")
def cold_logprobs(start_server) -> dict[tuple, list]:
    with start_server(["--disable-radix-cache"]) as server:
        return {tuple(p): logprob_trace(server.generate(p)) for p in PROMPTS}


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("saria-store")


@pytest.mark.parametrize("direct_reload", [True, False], ids=["direct", "host-staged"])
def test_session_prefix_reloads_from_host_then_storage_exactly(
    start_server, cold_logprobs, store_dir, tmp_path, direct_reload
):
    steps = [
        ("first turn computes everything", SYSTEM_AND_TOOLS, {"device": 0, "host": 0, "storage": 0}),
        ("second turn reuses the prefix on the device", TURN_2, {"device": 288, "host": 0, "storage": 0}),
        ("another session evicts it from the device", OTHER_SESSIONS[0], None),
        ("the prefix comes back from host memory", SYSTEM_AND_TOOLS, {"device": 0, "host": 288, "storage": 0}),
        *[("more sessions push it out of host memory", p, None) for p in OTHER_SESSIONS[1:]],
        ("the whole second turn comes back from storage", TURN_2, {"device": 0, "host": 0, "storage": 320}),
    ]
    data_dir = store_dir if direct_reload else tmp_path
    with start_server(hicache_args(data_dir, direct_reload)) as server:
        for what, prompt, expected_tiers in steps:
            result = server.generate(prompt)
            if expected_tiers is not None:
                assert cached_tokens(result) == expected_tiers, what
                assert result["meta_info"]["cached_tokens"] == sum(expected_tiers.values()), what
            assert logprob_trace(result) == cold_logprobs[tuple(prompt)], what
        metrics = saria_metrics(server.metrics())
    assert any(data_dir.iterdir()), "the saria store holds no pages after the session"
    pages_read = {t: metrics.get(f"sglang:saria_store_pages_read_total/{t}", 0) for t in ("device", "host")}
    if direct_reload:
        # 320 storage tokens = 20 pages of 16, read into the device pool, none into host memory.
        assert pages_read == {"device": 20, "host": 0}
        assert metrics["sglang:saria_reload_tokens_total/ssd"] == 320
        assert metrics["sglang:saria_reload_tokens_total/dram"] == 288
        # Lazy partial promotion: r_eff = min(0.4, 1 - 20/48) of the 20 reused pages -> 8 pages.
        assert metrics["sglang:saria_promoted_tokens_total"] == 128
    else:
        assert pages_read["device"] == 0 and pages_read["host"] >= 20
        assert "sglang:saria_reload_tokens_total/ssd" not in metrics


def test_restarted_server_serves_prefix_from_populated_store(start_server, cold_logprobs, store_dir):
    if not any(store_dir.iterdir()):
        pytest.fail("store is empty: run together with the session test that populates it")
    with start_server(hicache_args(store_dir)) as server:
        result = server.generate(TURN_2)
    assert cached_tokens(result) == {"device": 0, "host": 0, "storage": 320}
    assert logprob_trace(result) == cold_logprobs[tuple(TURN_2)]


def test_corrupt_store_pages_fall_back_to_recomputation(start_server, cold_logprobs, store_dir):
    slabs = list(store_dir.rglob(SLAB_NAME))
    if not slabs:
        pytest.fail("store has no slab file: run together with the session test that populates it")
    for slab in slabs:  # every stored page now fails its checksum on read
        slab.write_bytes(b"\xff" * slab.stat().st_size)
    with start_server(hicache_args(store_dir)) as server:
        result = server.generate(TURN_2)
        metrics = saria_metrics(server.metrics())
    assert cached_tokens(result) == {"device": 0, "host": 0, "storage": 0}
    assert logprob_trace(result) == cold_logprobs[tuple(TURN_2)]
    assert metrics["sglang:saria_reload_fallbacks_total/store_corrupt"] == 1


def test_promoted_share_comes_back_from_dram_with_the_rest_from_ssd_in_one_plan(
    start_server, cold_logprobs, tmp_path
):
    steps = [
        ("the session's second turn is computed", TURN_2, {"device": 0, "host": 0, "storage": 0}),
        *[("other sessions push it out of device and host memory", p, None) for p in OTHER_SESSIONS[:3]],
        # r_eff = min(0.4, 1 - 20/48): 8 of the 18 pages reloaded from SSD are copied to host.
        ("its prefix reloads from SSD into the device pool", SYSTEM_AND_TOOLS, {"device": 0, "host": 0, "storage": 288}),
        *[("more sessions push it out of the device", p, None) for p in OTHER_SESSIONS[3:5]],
        ("promoted pages from DRAM, the rest from SSD", TURN_2, {"device": 0, "host": 128, "storage": 192}),
    ]
    with start_server(hicache_args(tmp_path), env={"SGLANG_SARIA_AUDIT_TIERS": "1"}) as server:
        for what, prompt, expected_tiers in steps:
            result = server.generate(prompt)
            if expected_tiers is not None:
                assert cached_tokens(result) == expected_tiers, what
            assert logprob_trace(result) == cold_logprobs[tuple(prompt)], what
        metrics = saria_metrics(server.metrics())
    assert metrics["sglang:saria_promoted_tokens_total"] == 128
    assert metrics["sglang:saria_reload_tokens_total/dram"] == 128
    assert metrics["sglang:saria_reload_tokens_total/ssd"] == 288 + 192
    assert metrics["sglang:saria_tier_audits_total"] > 0
    assert metrics.get("sglang:saria_tier_audit_errors_total", 0) == 0
