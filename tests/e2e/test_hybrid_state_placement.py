"""The replay's GDN state placement (`checkpoint_placement = "sglang"`) against a real server.

The tiny hybrid model is served with SGLang 0.5.23's `extra_buffer` strategy, 16-token pages
(a 64-token state grid), chunked prefill of 128 tokens, and HiCache with the saria store under
full duplicate (a stored state is a "mamba" sidecar page keyed by its node's last page hash).
A scripted session exercises each rule of the placement:

- A (300 tokens): prefill chunks [0, 128), [128, 256), [256, 300): states at the first two
  chunk ends; the last chunk is shorter than a grid step and adds nothing.
- B (A's first 200 tokens, then its own): resumes at A's state at 128; its full-attention hit
  runs to 192, past that state: the branching point, tracked instead of B's own chunk end.
- B again: resumes at 192, one chunk to 300, state at 256 on B's path.
- C (A, then 100 more tokens): resumes at A's 256, state at 384 (chunk end).

The same requests go through the replay core (16-token blocks, the same chunk): each request's
cached tokens must be the replay's reused prefix, the states the server's tree holds (read by
probes) the replay's, node for node, and the states in the store those the replay puts on SSD.
"""

from __future__ import annotations

import pytest
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.utils import get_storage_hash_str

from sglang_saria.config import SariaConfig
from sglang_saria.hicache.backend import SariaStorage
from sglang_saria.launcher import (AUDIT_ENV, assert_kv_audit_clean, assert_matches_cold, cached_tokens,
                                   saria_hicache_args, saria_metrics)
from sglang_saria.mem_cache.metadata import NO_CHECKPOINT, SSD
from sglang_saria.model_specs import get_model_spec
from sglang_saria.replay.core import SariaCore
from sglang_saria.storage.index import INDEX_NAME, SQLiteIndex

pytestmark = pytest.mark.e2e

PAGE = 16
CHUNK = 128
PLACEMENT_ARGS = [
    "--mamba-radix-cache-strategy", "extra_buffer",
    "--mamba-track-interval", "64",
    "--chunked-prefill-size", str(CHUNK),
]
SERVER_ARGS = PLACEMENT_ARGS + [
    "--max-total-tokens", "4096",  # nothing leaves the device: every state stays in the tree
    "--max-mamba-cache-size", "64",
]

A = list(range(1, 301))
B = A[:200] + [(7 * j) % 900 + 50 for j in range(100)]
C = A + [(11 * j) % 900 + 20 for j in range(100)]
SESSION = [A, B, B, C]
# cached tokens of each request as SGLang 0.5.23 places states (see the module docstring)
EXPECTED_CACHED = [0, 128, 192, 256]


def page_hashes(tokens: list[int]) -> list[str]:
    """SGLang's storage hash of each full page of ``tokens`` (the chain HiCache keys pages by)."""
    whole = len(tokens) // PAGE * PAGE
    return get_storage_hash_str(RadixKey(tokens[:whole]), None, page_size=PAGE)


def stored_state_hashes(store_dir) -> set[str]:
    """Page hashes of the "mamba" sidecars in the saria store: the nodes whose state was stored."""
    hashes: set[str] = set()
    for index_file in store_dir.rglob(INDEX_NAME):
        index = SQLiteIndex(str(index_file), sync_writes=False)
        try:
            for entry in index.load():
                page_hash, pool = SariaStorage.split_storage_key(entry.key)
                if pool == "mamba":
                    hashes.add(page_hash)
        finally:
            index.close()
    return hashes


def replay_session() -> tuple[dict[str, list[int]], dict[str, list[int]], list[int]]:
    """The session through the replay core (its keys the pages' hashes, so both sides name nodes
    alike): (depths of the nodes that carry a state, of those whose state is on SSD, cached
    tokens per request)."""
    cfg = SariaConfig.from_dict({
        "admission": {"policy": "full-duplicate"},
        "metadata": {"block_tokens": PAGE, "checkpoint_placement": "sglang", "prefill_chunk_tokens": CHUNK},
        "capacity": {"dram_tokens": 1_000_000, "ssd_tokens": 10_000_000},
    }, source="test")
    core = SariaCore(cfg, get_model_spec("qwen3.5-9b"))  # any hybrid: placement does not depend on sizes
    key_of: dict[int, str] = {}
    cached = []
    for i, tokens in enumerate(SESSION):
        hashes = page_hashes(tokens)
        keys = [int(h[:15], 16) for h in hashes]
        key_of.update(zip(keys, hashes))
        plan, _ = core.begin_request(keys, float(i))
        core.finish_request(keys, plan, float(i))
        cached.append(plan.n_blocks * PAGE)
    nodes = core.metadata.nodes.items()
    states = {key_of[k] for k, node in nodes if node.ck_loc != NO_CHECKPOINT}
    stored = {key_of[k] for k, node in nodes if node.ck_loc != NO_CHECKPOINT and node.ck_loc & SSD}
    return depths(states), depths(stored), cached


def depths(hashes: set[str]) -> dict[str, list[int]]:
    """Where the nodes of ``hashes`` are on each path of the session, in tokens."""
    found: dict[str, list[int]] = {}
    for name, tokens in zip("ABC", (A, B, C)):
        at = [(i + 1) * PAGE for i, h in enumerate(page_hashes(tokens)) if h in hashes]
        if at:
            found[name] = at
    return found


def probe_states(server) -> dict[str, list[int]]:
    """The states the server's tree holds on the session's paths, read by probes: a probe is a
    path's first ``d`` tokens (d on the 64-token grid) and a tail of its own, and its cached
    tokens are the deepest state at or above ``d``; so a state sits at ``d`` iff the probe caches
    ``d``. A probe may leave a branching state at its own ``d``: probes run deepest first, so
    that touches no later probe's answer (the deepest state at or above a shallower depth)."""
    prefixes = {tuple(tokens[:d]) for tokens in (A, B, C) for d in range(64, len(tokens) + 1, 64)}
    held = set()
    for n, prefix in enumerate(sorted(prefixes, key=len, reverse=True)):
        tail = [1000 + n] + [(13 * j + n) % 900 + 30 for j in range(69)]
        result = server.generate(list(prefix) + tail, max_new_tokens=1)
        if sum(cached_tokens(result).values()) == len(prefix):
            held.add(page_hashes(list(prefix))[-1])
    return depths(held)


def test_replay_places_states_where_the_server_keeps_them(start_hybrid_server, tmp_path):
    store = tmp_path / "store"
    extra = {"data_dirs": [str(store)], "admission": "full-duplicate", "capacity": "64MiB"}
    served = []
    with start_hybrid_server(SERVER_ARGS + saria_hicache_args(extra)) as server:
        for tokens in SESSION:
            result = server.generate(tokens, max_new_tokens=1)  # no decode step: no decode-time state
            server.wait_storage_writes()
            served.append(sum(cached_tokens(result).values()))
        server_states = probe_states(server)
        server.wait_storage_writes()
    replay_states, replay_stored, replay_cached = replay_session()
    assert served == EXPECTED_CACHED
    assert replay_cached == served
    # B's branching state at 192 sits on the node A and C share with B there
    assert server_states == {"A": [128, 192, 256], "B": [128, 192, 256], "C": [128, 192, 256, 384]}
    assert replay_states == server_states
    # States reach the store with their node's page: a branching state on a page stored before
    # (B's at 192, A's page) stays in host memory, in the replay as on the server.
    assert depths(stored_state_hashes(store)) == replay_stored == {"A": [128, 256], "B": [128, 256], "C": [128, 256, 384]}


@pytest.mark.slow
def test_a_branching_state_on_stored_pages_is_stored_when_its_node_leaves_host_memory(
        start_hybrid_server, cold_hybrid_run, tmp_path):
    """B's branching state at 192 sits on A's pages, stored with A's node before the state existed.
    Fillers push the session out of the device and host pools (512 and 1,024 tokens): at the
    node's host eviction the state alone is written (the pages are touches in the store). A
    request sharing A's first 192 tokens then reloads all 192 from storage, with the cold run's
    tokens and a clean KV audit; lost, the state would leave it the 128 of A's first state."""
    store = tmp_path / "store"
    extra = {"data_dirs": [str(store)], "admission": "full-duplicate", "capacity": "64MiB"}
    d = A[:192] + [(17 * j) % 900 + 40 for j in range(100)]
    fillers = [[(k * 300 + j) % 1000 + 5 for j in range(300)] for k in range(1, 6)]
    with start_hybrid_server(PLACEMENT_ARGS + saria_hicache_args(extra), env=AUDIT_ENV) as server:
        for tokens in (A, B):
            server.generate(tokens, max_new_tokens=1)
            server.wait_storage_writes()
        assert depths(stored_state_hashes(store))["B"] == [128], "B's branching state is not stored yet"
        for prompt in fillers:
            server.generate(prompt, max_new_tokens=1)
            server.wait_storage_writes()
        result = server.generate(d)
        server.wait_storage_writes()
        metrics = saria_metrics(server.metrics())
    assert depths(stored_state_hashes(store))["B"] == [128, 192]
    assert cached_tokens(result) == {"device": 0, "host": 0, "storage": 192}
    assert_matches_cold(result, cold_hybrid_run(d), "the request resuming at the branching state")
    assert metrics["sglang:saria_ssd_admissions_total/state"] >= 1
    assert_kv_audit_clean(metrics, ("ssd_to_device",))
