"""The tiny Qwen3.5-style hybrid (3 GDN + 1 full-attention layers) served by a real CPU
SGLang server through the pure-torch GDN path: prefix caching of mamba states
(extra_buffer), HiCache host (L2) and `saria` storage (L3) tiers, and restarts from the
populated store. Every cached run must return a cold run's greedy tokens with logprobs
within the oracle's tolerance (`--disable-radix-cache`; equal greedy tokens alone prove
little on a random model), and the KV audit checks every FA page and GDN state that moves
between device, host and store byte for byte.

Storage hits reload straight into the device pools (issue 15): the FA pages into the
hybrid pool's full-attention layers and the GDN checkpoint at the plan's end into a mamba
slot, one gather per chunk, no store page read into host memory. HiCache's host-staged
path (`transfer.direct_reload: false`) is the baseline the restart is compared with."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
import torch

from sglang_saria.launcher import (
    AUDIT_ENV,
    assert_kv_audit_clean,
    assert_matches_cold,
    cached_tokens,
    kv_audit_pages,
    saria_hicache_args,
    saria_metrics,
)
from sglang_saria.hicache.backend import SariaStorage
from sglang_saria.storage.index import INDEX_NAME, SQLiteIndex
from tests.kept_store import KeptStore
from tests.e2e.steps import serve_steps

pytestmark = pytest.mark.e2e

# Mamba states are checkpointed every 64 tokens (the GDN chunk size): a prefix is
# reusable up to the last checkpoint it covers.
TRACK_INTERVAL = 64
PREFIX_CACHE = ["--mamba-radix-cache-strategy", "extra_buffer",
                "--mamba-track-interval", str(TRACK_INTERVAL)]

SYSTEM_AND_TOOLS = list(range(1, 301))  # 300-token shared prefix
TURN_2 = SYSTEM_AND_TOOLS + [7, 8, 9] * 10  # 330 tokens
OTHER_SESSIONS = [[(k * 300 + j) % 1000 + 5 for j in range(300)] for k in range(1, 6)]

# The first turn (300 tokens) ends between the checkpoints at 256 and 320: the second
# turn reuses 256 tokens, although the full-attention KV alone would cover 288.
LAST_CHECKPOINT_OF_TURN_1 = (len(SYSTEM_AND_TOOLS) // TRACK_INTERVAL) * TRACK_INTERVAL
# The second turn (330 tokens plus 4 generated) is checkpointed at 320.
LAST_CHECKPOINT_OF_TURN_2 = (len(TURN_2) // TRACK_INTERVAL) * TRACK_INTERVAL


def hicache_args(data_dir, **sections) -> list[str]:
    # full-duplicate admission writes every host page to the store, so the tiers test
    # moves mamba states deterministically; Saria's own admission is tested elsewhere.
    extra = {"data_dirs": [str(data_dir)], "admission": "full-duplicate", "capacity": "64MiB", **sections}
    return PREFIX_CACHE + saria_hicache_args(extra)


# The turn-2 prefix's store pages (KV) and the GDN checkpoint at its end (one sidecar page).
TURN_2_PAGES = LAST_CHECKPOINT_OF_TURN_2 // 16


def assert_no_store_page_in_host_memory(metrics: dict[str, float], device_pages: int) -> None:
    """Every store read went to the device pools: FA pages and the checkpoint sidecar."""
    assert metrics.get("sglang:saria_store_pages_read_total/host", 0) == 0, "a store page was staged in host memory"
    assert metrics["sglang:saria_store_pages_read_total/device"] == device_pages


def stored_pools(store_dir) -> set[str]:
    """Pool names of the objects in the saria store's index: "kv" pages and sidecars."""
    pools: set[str] = set()
    for index_file in store_dir.rglob(INDEX_NAME):
        index = SQLiteIndex(str(index_file), sync_writes=False)
        try:
            pools |= {SariaStorage.split_storage_key(entry.key)[1] for entry in index.load()}
        finally:
            index.close()
    return pools


def test_cold_server_matches_transformers(cold_hybrid_run, hybrid_model):
    """The patched serving path (torch GDN ops, SGLang's attention and sampler) agrees
    with transformers' own Qwen3.5 implementation of the same weights (fp32 reference):
    same greedy tokens, logprobs within fp16 rounding of a 4-layer model."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hybrid_model, dtype=torch.float32)
    for prompt in (SYSTEM_AND_TOOLS, TURN_2):
        served = cold_hybrid_run(prompt)
        ids = list(prompt) + served["output_ids"][:-1]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, len(prompt) - 1 :]
        expected = torch.log_softmax(logits.float(), dim=-1)
        assert logits.argmax(-1).tolist() == served["output_ids"]
        got = [lp for lp, _tok, _ in served["meta_info"]["output_token_logprobs"]]
        want = [expected[i, tok].item() for i, tok in enumerate(served["output_ids"])]
        assert got == pytest.approx(want, abs=5e-3)


@dataclass
class Session:
    metrics: dict[str, float]
    store: KeptStore


@pytest.fixture(scope="module")
def tiers_session(start_hybrid_server, cold_hybrid_run, tmp_path_factory) -> Session:
    steps = [
        ("first turn computes everything", SYSTEM_AND_TOOLS,
         {"device": 0, "host": 0, "storage": 0}),
        ("second turn reuses the prefix up to the last mamba checkpoint", TURN_2,
         {"device": LAST_CHECKPOINT_OF_TURN_1, "host": 0, "storage": 0}),
        ("another session evicts it from the device", OTHER_SESSIONS[0], None),
        ("the prefix and its mamba state come back from host memory", SYSTEM_AND_TOOLS,
         {"device": 0, "host": LAST_CHECKPOINT_OF_TURN_1, "storage": 0}),
        *[("more sessions push it out of host memory", p, None) for p in OTHER_SESSIONS[1:]],
        ("the second turn comes back from storage", TURN_2,
         {"device": 0, "host": 0, "storage": LAST_CHECKPOINT_OF_TURN_2}),
    ]
    store = tmp_path_factory.mktemp("saria-hybrid-store")
    # The tier audit checks FULL and MAMBA slots of every node against the pools as it goes.
    with start_hybrid_server(hicache_args(store), env=AUDIT_ENV) as server:
        serve_steps(server, cold_hybrid_run, steps)
        metrics = saria_metrics(server.metrics())
    return Session(metrics, KeptStore(store))


def test_mamba_prefix_reuse_across_device_host_and_storage(tiers_session):
    metrics = tiers_session.metrics
    assert stored_pools(tiers_session.store.path) == {"kv", "mamba"}, "the store lacks KV pages or mamba sidecars"
    assert metrics["sglang:saria_tier_audits_total"] > 0
    assert metrics.get("sglang:saria_tier_audit_errors_total", 0) == 0
    assert metrics["sglang:saria_tree_pages/host"] > 0
    # FA pages and GDN states alike: device -> host, host -> device, host -> store, store -> device.
    assert_kv_audit_clean(metrics, ("device_to_host", "host_to_device", "host_to_ssd", "ssd_to_device"))
    for path in ("device_to_host", "host_to_device", "ssd_to_device"):
        assert kv_audit_pages(metrics, path, "mamba") > 0, f"no mamba state audited on {path}"
    assert_no_store_page_in_host_memory(metrics, TURN_2_PAGES + 1)


def test_restarted_server_reloads_ssd_hit_into_device_pools(start_hybrid_server, cold_hybrid_run, tiers_session):
    """SSD only: a fresh server has no device or host state, so the FA pages and the GDN
    state at the end of the prefix all come from the store, straight into the device pools."""
    store = tiers_session.store.restored()
    with start_hybrid_server(hicache_args(store), env=AUDIT_ENV) as server:
        result = server.generate(TURN_2)
        metrics = saria_metrics(server.metrics())
        log = server.log_path.read_text(errors="replace")
    assert cached_tokens(result) == {"device": 0, "host": 0, "storage": LAST_CHECKPOINT_OF_TURN_2}
    assert_matches_cold(result, cold_hybrid_run(TURN_2), "turn 2 after a restart")
    # The plugin hook on config_from_budget took the reloader's staging (FA pages, GDN checkpoint) off the KV budget.
    reserved = re.findall(r"saria: (\d+) bytes \S+ MiB\) of the KV budget reserved", log)
    staging = re.findall(
        r"direct reload staging (\d+) bytes \S+ MiB\): FA pages \d+ \+ GDN checkpoint [1-9]\d* on \S+, reserved", log
    )
    assert staging and set(staging) == set(reserved), f"staging {staging} vs reserved {reserved}"
    assert "comes out of the runtime slack" not in log
    assert_no_store_page_in_host_memory(metrics, TURN_2_PAGES + 1)
    assert_kv_audit_clean(metrics, ("ssd_to_device",))
    assert kv_audit_pages(metrics, "ssd_to_device", "kv") == TURN_2_PAGES
    assert kv_audit_pages(metrics, "ssd_to_device", "mamba") == 1
    assert metrics["sglang:saria_tier_audits_total"] > 0
    assert metrics.get("sglang:saria_tier_audit_errors_total", 0) == 0


def test_restarted_server_host_staged_baseline_resumes_mamba_state(start_hybrid_server, cold_hybrid_run, tiers_session):
    """HiCache's own path (direct reload off): the store's pages and the GDN state go
    through the host pool first; same hit, same logprobs."""
    store = tiers_session.store.restored()
    with start_hybrid_server(hicache_args(store, transfer={"direct_reload": False}), env=AUDIT_ENV) as server:
        result = server.generate(TURN_2)
        metrics = saria_metrics(server.metrics())
    assert cached_tokens(result) == {"device": 0, "host": 0, "storage": LAST_CHECKPOINT_OF_TURN_2}
    assert_matches_cold(result, cold_hybrid_run(TURN_2), "turn 2 after a restart, host-staged")
    assert_kv_audit_clean(metrics, ("ssd_to_host", "host_to_device"))
    assert kv_audit_pages(metrics, "ssd_to_host", "mamba") > 0
    assert metrics.get("sglang:saria_store_pages_read_total/device", 0) == 0


def turn_2_after_a_pushed_off_prompt(start_hybrid_server, tiers_session, prompt: list[int]):
    """On a server restarted on the session's store (promotion mode full): ``prompt``, whose
    prefix to turn 1's checkpoint comes from SSD and is promoted to host memory; two other
    sessions push it off the 512-token device pool, not out of host memory; then turn 2.
    Returns (prompt's result, metrics before turn 2, turn 2's result, metrics after)."""
    args = hicache_args(tiers_session.store.restored(), promotion={"mode": "full"})
    with start_hybrid_server(args, env=AUDIT_ENV) as server:
        first = server.generate(prompt)
        assert cached_tokens(first) == {"device": 0, "host": 0, "storage": LAST_CHECKPOINT_OF_TURN_1}
        server.wait_storage_writes()
        for other in OTHER_SESSIONS[:2]:
            server.generate(other)
            server.wait_storage_writes()
        before = saria_metrics(server.metrics())  # the other sessions reloaded their own prefixes from SSD
        result = server.generate(TURN_2)
        return first, before, result, saria_metrics(server.metrics())


def test_dram_prefix_and_ssd_tail_with_state_reload_in_one_plan(start_hybrid_server, cold_hybrid_run, tiers_session):
    """DRAM + SSD: turn 1's prefix (up to its checkpoint at 256) reloads from SSD and is
    promoted to host memory with its GDN state as one unit (promotion mode full); pushed
    off the device, it comes back from DRAM (with its state, HiCache's load-back) while the
    rest of turn 2 (pages to 320) and the state at 320 come from the store into the device
    pools, in one plan."""
    first, before, result, metrics = turn_2_after_a_pushed_off_prompt(start_hybrid_server, tiers_session, SYSTEM_AND_TOOLS)
    assert_matches_cold(first, cold_hybrid_run(SYSTEM_AND_TOOLS), "turn 1 from SSD")
    # The reload runs while the request waits in the queue: its DRAM part is loaded to the
    # device then (HiCache's load-back), so SGLang reports it as a device hit; the reload
    # counters say where it came from.
    assert cached_tokens(result) == {
        "device": LAST_CHECKPOINT_OF_TURN_1,
        "host": 0,
        "storage": LAST_CHECKPOINT_OF_TURN_2 - LAST_CHECKPOINT_OF_TURN_1,
    }
    assert_matches_cold(result, cold_hybrid_run(TURN_2), "turn 2 from DRAM + SSD")
    def turn_2(name: str) -> float:
        return metrics.get(name, 0) - before.get(name, 0)

    assert turn_2("sglang:saria_reload_tokens_total/dram") == LAST_CHECKPOINT_OF_TURN_1
    assert turn_2("sglang:saria_reload_tokens_total/ssd") == LAST_CHECKPOINT_OF_TURN_2 - LAST_CHECKPOINT_OF_TURN_1
    assert metrics["sglang:saria_promoted_tokens_total"] >= LAST_CHECKPOINT_OF_TURN_1
    # Turn 2 read 4 pages and the state at 320 from the store, into the device pools.
    assert turn_2("sglang:saria_store_pages_read_total/device") == (LAST_CHECKPOINT_OF_TURN_2 - LAST_CHECKPOINT_OF_TURN_1) // 16 + 1
    assert metrics.get("sglang:saria_store_pages_read_total/host", 0) == 0, "a store page was staged in host memory"
    assert_kv_audit_clean(metrics, ("ssd_to_device", "device_to_host", "host_to_device"))
    for path in ("ssd_to_device", "device_to_host", "host_to_device"):
        assert kv_audit_pages(metrics, path, "mamba") > 0, f"no mamba state audited on {path}"
    assert metrics.get("sglang:saria_tier_audit_errors_total", 0) == 0


# Another conversation on the same system prompt and tools: it leaves turn 2 at token 300,
# inside the page 288-304, so its pages 256-288 (past turn 1's checkpoint at 256) are turn
# 2's too. SGLang inserts a request's KV only up to its last mamba checkpoint (`extra_buffer`
# truncates the insert there), so FA pages past a checkpoint reach the tree only inside a
# longer branch like this one: the leading pages of a node whose state lies further on (384).
OTHER_BRANCH = SYSTEM_AND_TOOLS + [4, 5, 6] * 30  # 390 tokens
SHARED_PAGES_END = len(SYSTEM_AND_TOOLS) // 16 * 16  # 288: the last page both turns share ends here


def test_host_fa_pages_past_the_last_checkpoint_come_from_dram_with_the_state_from_ssd(
    start_hybrid_server, cold_hybrid_run, tiers_session
):
    """DRAM FA pages past the tree's last checkpoint (issue 15): after the other branch is
    pushed off the device, host memory holds turn 2's prefix to 256 with its state and FA
    pages 256-288 without one (the branch's state is at 384), so SGLang's hybrid match stops
    at 256. Turn 2 takes 256-288 from DRAM too, gathered host -> device with the store's
    pages 288-320 and the state at 320 from the store's sidecar, into the device pools."""
    branch, before, result, metrics = turn_2_after_a_pushed_off_prompt(start_hybrid_server, tiers_session, OTHER_BRANCH)
    assert_matches_cold(branch, cold_hybrid_run(OTHER_BRANCH), "the other branch, its prefix from SSD")
    from_dram = SHARED_PAGES_END  # the prefix with its state (HiCache's load-back) and the FA pages past it
    from_ssd = LAST_CHECKPOINT_OF_TURN_2 - SHARED_PAGES_END
    # Both DRAM parts are on the device before admission (a device hit); the SSD pages are the storage hit.
    assert cached_tokens(result) == {"device": from_dram, "host": 0, "storage": from_ssd}
    assert_matches_cold(result, cold_hybrid_run(TURN_2), "turn 2 from DRAM (to and past the checkpoint) + SSD")

    def turn_2(name: str) -> float:
        return metrics.get(name, 0) - before.get(name, 0)

    assert turn_2("sglang:saria_reload_tokens_total/dram") == from_dram
    assert turn_2("sglang:saria_reload_tokens_total/ssd") == from_ssd
    # Two FA pages and the state at 320 from the store, into the device pools; none into host memory.
    assert turn_2("sglang:saria_store_pages_read_total/device") == from_ssd // 16 + 1
    assert metrics.get("sglang:saria_store_pages_read_total/host", 0) == 0, "a store page was staged in host memory"
    # Every page of the DRAM part was checked host -> device against what left the device.
    assert turn_2_pages(metrics, before, "host_to_device", "kv") >= from_dram // 16
    assert turn_2_pages(metrics, before, "host_to_device", "mamba") >= 1
    assert_kv_audit_clean(metrics, ("ssd_to_device", "device_to_host", "host_to_device"))
    for path in ("ssd_to_device", "device_to_host", "host_to_device"):
        assert kv_audit_pages(metrics, path, "kv") > 0, f"no FA page audited on {path}"
        assert kv_audit_pages(metrics, path, "mamba") > 0, f"no mamba state audited on {path}"
    assert metrics["sglang:saria_tier_audits_total"] > 0
    assert metrics.get("sglang:saria_tier_audit_errors_total", 0) == 0


def turn_2_pages(metrics: dict[str, float], before: dict[str, float], path: str, pool: str) -> int:
    """Pages the KV audit checked on ``path`` for ``pool`` between ``before`` and ``metrics``."""
    return kv_audit_pages(metrics, path, pool) - kv_audit_pages(before, path, pool)
