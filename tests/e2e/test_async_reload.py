"""Issue 12: an SSD hit reloads off the scheduler thread while SGLang serves everyone else.

One store, written by a first server (each prefix computed once, written through to the
store), then one restarted server whose store reads are all slowed down by the test-only
fault injector `ReadDelay` named in its extra config (1 s per page read; a 10-page prefix on
the store's 4 read threads takes 3 waves, about 3 s). Its scenarios each use their own stored
prefix:

- acceptance: a streaming decoder S keeps its pace while request C waits for its 3-s
  reload in the queue; D, sent after C, is served first; C's pages go straight into the
  device pool and its output equals a cold server's (tolerance oracle), KV audit clean;
- a page corrupted while its reload is in flight: the pages before it are served from
  SSD, the rest recomputed; the page leaves the store's index;
- a read error (slab cut short under an in-flight reload): the same, and every page that
  failed its read leaves the index (full-duplicate admission may write a recomputed page
  anew, so the index is checked by the reload's own count, not read back later);
- a request aborted while its reload is in flight: its slots go back to the pool (SGLang's
  idle leak check and the reload gauge), and the prefix reloads for the next request;
- one reload per page (issue 30 item 8): three requests at once on one stored prefix, each with
  a stored suffix of its own, read the shared pages once: one request reads them with its
  suffix, the other two wait for that reload and then read only their own suffixes.

`wait_complete` is SGLang's prefetch stop policy here: the default `timeout` policy would
cut a 3-s reload at about 1 s (its point is tested in the unit tests of the worker).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
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
from sglang_saria.storage.index import INDEX_NAME
from sglang_saria.storage.layout import SLAB_NAME, blob_to_slots
from tests.faults.injection import flip_byte

pytestmark = pytest.mark.e2e

PAGE = 16
READ_DELAY_S = 1.0
READ_DELAY = {"class": "sglang_saria.storage.fault_injection:ReadDelay", "read_delay_s": READ_DELAY_S}
PREFIX_PAGES = 10


def _prefix(seed: int) -> list[int]:
    return [(seed * 97 + 13 * j) % 1000 + 5 for j in range(PREFIX_PAGES * PAGE)]


def _prompt(prefix: list[int]) -> list[int]:
    """The stored prefix plus a few tokens: all its pages are a hit (SGLang computes at
    least the last prompt token, so a prompt of exactly the prefix hits one page less)."""
    return prefix + [3, 4, 5]


PREFIX_C, PREFIX_CORRUPT, PREFIX_ABORT, PREFIX_IO, PREFIX_CAP_A, PREFIX_CAP_B = (_prefix(s) for s in range(1, 7))
SHARED_PAGES, OWN_PAGES = 5, 3  # a shared stored prefix, then a stored suffix per request
SHARED = [(101 * 29 + 13 * j) % 1000 + 5 for j in range(SHARED_PAGES * PAGE)]
SHARING = tuple(SHARED + [(k * 131 + 17 * j) % 900 + 40 for j in range(OWN_PAGES * PAGE)] for k in (1, 2, 3))
STORED = (PREFIX_C, PREFIX_CORRUPT, PREFIX_ABORT, PREFIX_IO, PREFIX_CAP_A, PREFIX_CAP_B)
# transfer.max_inflight_reload_tokens of the restarted server: one prefix's pages at a time.
INFLIGHT_CAP = PREFIX_PAGES * PAGE
C_PROMPT = _prompt(PREFIX_C)
S_PROMPT = [(7 * j) % 900 + 50 for j in range(40)]  # cold: never stored
D_PROMPT = [(11 * j) % 900 + 60 for j in range(24)]  # cold, short
S_TOKENS = 1000  # outlasts C's 3-s reload even at 160 tokens/s (a quiet machine)
# S's largest inter-token gap while C reloads. A scheduler blocked by the reload shows the
# whole 3-s read (the synchronous code, measured: 3.17 s). With the reload off the
# scheduler thread: 0.15-0.17 s on a quiet 2-core machine, 0.59 s with two other server
# suites running beside it (C's and D's prefills run in S's steps too), and 1.63 s in a CI run
# whose other two workers were starting servers (S decoded at 10 tokens/s then, 100-180 after);
# the 0.5 s flakes under that load, so the bound is 2 s: two thirds of the 3-s stall it
# rules out (three reads of READ_DELAY_S), which a blocked scheduler shows whatever the load.
MAX_GAP_S = 2.0


def _extra(store: Path) -> dict:
    return {"data_dirs": [str(store)], "admission": "full-duplicate", "capacity": "64MiB"}


RANK_DIR = "rank_tp0of1"  # the backend keeps each TP rank's store in its own subdirectory


def _index(store: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{store / RANK_DIR / INDEX_NAME}?mode=ro", uri=True)


def _slab(store: Path) -> Path:
    return store / RANK_DIR / SLAB_NAME


@dataclass
class StoredPage:
    key: str
    offset: int  # in the slab file (one data dir: slot * slot_bytes)


def stored_pages(store: Path, prompt: list[int]) -> list[StoredPage]:
    """The store objects of ``prompt``'s full pages, in prefix order (by their page hash)."""
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.utils import get_storage_hash_str

    hashes = get_storage_hash_str(RadixKey(prompt[: len(prompt) // PAGE * PAGE]), None, page_size=PAGE)
    with _index(store) as db:
        slot_bytes = int(dict(db.execute("SELECT k, v FROM meta").fetchall())["slot_bytes"])
        rows = {k.split("@")[0]: blob_to_slots(s) for k, s in db.execute("SELECT key, slots FROM objects")}
    return [StoredPage(h, int(rows[h][0]) * slot_bytes) for h in hashes if h in rows]


@pytest.fixture(scope="module")
def store(start_server, tmp_path_factory) -> Path:
    """Every scenario's prefix computed once and written to the store (the last ones when
    two more prompts push them out of the 512-token device pool)."""
    path = tmp_path_factory.mktemp("store-async")
    with start_server(saria_hicache_args(_extra(path)), env=AUDIT_ENV) as server:
        for prefix in SHARING + STORED + (_prefix(7), _prefix(8)):
            server.generate(prefix, max_new_tokens=1)
            server.wait_storage_writes()
    for prefix in STORED:
        assert len(stored_pages(path, prefix)) == PREFIX_PAGES
    return path


@pytest.fixture(scope="module")
def server(start_server, store):
    """The restarted server: every store read takes READ_DELAY_S longer. A 2048-token device
    pool, so S (which reserves its 1000 new tokens) leaves room for C and D."""
    extra = {**_extra(store), "transfer": {"max_inflight_reload_tokens": INFLIGHT_CAP}, "fault_injector": READ_DELAY}
    args = saria_hicache_args(extra) + [
        "--hicache-storage-prefetch-policy", "wait_complete", "--max-total-tokens", "2048",
    ]
    with start_server(args, env=AUDIT_ENV) as srv:
        yield srv


def _delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def test_ssd_hit_reloads_while_a_decoder_keeps_its_pace_and_a_later_request_goes_first(server, cold_run):
    before = saria_metrics(server.metrics())
    started = threading.Event()
    with ThreadPoolExecutor(3) as pool:
        s_future = pool.submit(server.generate_stream, S_PROMPT, S_TOKENS, 0, True, None, started)
        assert started.wait(120), "S produced no token"
        time.sleep(0.5)  # S is decoding
        c_future = pool.submit(server.generate_stream, C_PROMPT)
        time.sleep(0.2)
        d_future = pool.submit(server.generate_stream, D_PROMPT)
        s, c, d = s_future.result(), c_future.result(), d_future.result()
    after = saria_metrics(server.metrics())

    assert c.first_token_at - c.sent >= 2 * READ_DELAY_S, "C's reload did not wait for its reads"
    assert s.chunk_times[-1] > c.first_token_at, "S finished before C's reload did: no overlap measured"
    print(f"S max inter-token gap {s.max_gap_s():.3f} s; C TTFT {c.first_token_at - c.sent:.2f} s, "
          f"D TTFT {d.first_token_at - d.sent:.2f} s")
    assert s.max_gap_s() < MAX_GAP_S, f"S stalled {s.max_gap_s():.2f} s while C reloaded"
    assert d.first_token_at < c.first_token_at, "D waited behind C's reload"
    assert cached_tokens(c.result) == {"device": 0, "host": 0, "storage": PREFIX_PAGES * PAGE}
    assert _delta(before, after, "sglang:saria_store_pages_read_total/device") == PREFIX_PAGES
    assert_matches_cold(c.result, cold_run(C_PROMPT), "C reloaded from SSD")
    assert_matches_cold(d.result, cold_run(D_PROMPT), "D")
    assert _delta(before, after, "sglang:saria_kv_audit_pages_total/ssd_to_device/kv") == PREFIX_PAGES
    assert_kv_audit_clean(after, ("ssd_to_device",))
    assert after.get("sglang:saria_reload_inflight_tokens", 0) == 0


def test_inflight_cap_holds_a_second_reload_back_until_the_first_is_admitted(server, cold_run):
    """Two SSD hits at once under a one-prefix cap: the second gets its slots only when the
    first has left them to the tree, so reload-held slots never exceed the cap."""
    held: list[float] = []
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(server.generate_stream, _prompt(p)) for p in (PREFIX_CAP_A, PREFIX_CAP_B)]
        while not all(f.done() for f in futures):
            held.append(saria_metrics(server.metrics()).get("sglang:saria_reload_inflight_tokens", 0))
            time.sleep(0.1)
        a, b = (f.result() for f in futures)
    assert max(held) == INFLIGHT_CAP, f"reload-held slots over time: {sorted(set(held))}"
    for prefix, run in ((PREFIX_CAP_A, a), (PREFIX_CAP_B, b)):
        assert cached_tokens(run.result)["storage"] == PREFIX_PAGES * PAGE
        assert_matches_cold(run.result, cold_run(_prompt(prefix)), "a reload under the cap")
    # Both reads take ~3 s; the second could not start before the first was admitted.
    first, second = sorted((a, b), key=lambda r: r.first_token_at)
    assert second.first_token_at - second.sent >= first.first_token_at - first.sent + 2 * READ_DELAY_S



def test_requests_on_one_stored_prefix_read_each_page_once(server, cold_run):
    """The issue's case (SGLang's storage tests: requests sharing a prefix after a flush): the
    shared pages are read for one request only; the others match them on the device once that
    reload is published, and read their own stored suffixes in reloads of their own."""
    before = saria_metrics(server.metrics())
    with ThreadPoolExecutor(len(SHARING)) as pool:
        runs = list(pool.map(server.generate, [_prompt(p) for p in SHARING]))
    after = saria_metrics(server.metrics())
    pages = SHARED_PAGES + len(SHARING) * OWN_PAGES
    assert _delta(before, after, "sglang:saria_store_pages_read_total/device") == pages  # not 3 x 8
    assert _delta(before, after, "sglang:saria_reload_followers_total") == len(SHARING) - 1
    tiers = sorted((cached_tokens(r) for r in runs), key=lambda t: t["storage"])
    own, whole = OWN_PAGES * PAGE, (SHARED_PAGES + OWN_PAGES) * PAGE
    assert tiers == [{"device": SHARED_PAGES * PAGE, "host": 0, "storage": own}] * 2 + [
        {"device": 0, "host": 0, "storage": whole}]
    for prompt, run in zip(SHARING, runs):
        assert_matches_cold(run, cold_run(_prompt(prompt)), "a request sharing a stored prefix")
    assert _delta(before, after, "sglang:saria_kv_audit_pages_total/ssd_to_device/kv") == pages
    assert_kv_audit_clean(after, ("ssd_to_device",))


def _served_while(server, prompt: list[int], fault) -> dict:
    """Serve ``prompt``; ``fault()`` runs while its reload's reads are still sleeping."""
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(server.generate, prompt)
        time.sleep(0.3)
        fault()
        return future.result()


def test_page_corrupted_during_reload_serves_the_pages_before_it_and_leaves_the_index(server, store, cold_run):
    pages = stored_pages(store, PREFIX_CORRUPT)
    bad = 4
    before = saria_metrics(server.metrics())
    result = _served_while(server, _prompt(PREFIX_CORRUPT), lambda: flip_byte(_slab(store), pages[bad].offset + 100))
    after = saria_metrics(server.metrics())
    assert cached_tokens(result)["storage"] == bad * PAGE
    assert_matches_cold(result, cold_run(_prompt(PREFIX_CORRUPT)), "pages before the corrupt one from SSD, the rest recomputed")
    assert _delta(before, after, "sglang:saria_reload_fallbacks_total/store_corrupt") == 1
    assert _delta(before, after, "sglang:saria_kv_audit_pages_total/ssd_to_device/kv") == bad
    assert_kv_audit_clean(after, ("ssd_to_device",))
    assert _delta(before, after, "sglang:saria_reload_pages_dropped_total") == 1


def test_aborted_reload_frees_its_slots_and_the_prefix_reloads_next_time(server, cold_run):
    rid = "abort-during-reload"
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(server.generate_stream, _prompt(PREFIX_ABORT), 4, 5, False, rid)
        time.sleep(0.5)
        server.abort(rid)
        aborted = future.result()
    assert aborted.result["meta_info"]["finish_reason"]["type"] == "abort"
    deadline = time.monotonic() + 10 * READ_DELAY_S  # the chunk in flight ends its reads
    while saria_metrics(server.metrics()).get("sglang:saria_reload_inflight_tokens", 0) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert saria_metrics(server.metrics()).get("sglang:saria_reload_inflight_tokens", 0) == 0
    result = server.generate(_prompt(PREFIX_ABORT))
    assert cached_tokens(result)["storage"] == PREFIX_PAGES * PAGE
    assert_matches_cold(result, cold_run(_prompt(PREFIX_ABORT)), "the aborted prefix, reloaded")
    metrics = saria_metrics(server.metrics())
    assert_kv_audit_clean(metrics, ("ssd_to_device",))
    assert "memory leak detected" not in server.log_tail(400)


def test_read_error_during_reload_recomputes_the_rest_and_drops_failed_pages(server, store, cold_run):
    """Runs last: cutting the slab short loses every page stored after the cut."""
    pages = stored_pages(store, PREFIX_IO)
    cut = 4
    # Pages are read in parallel, so every page at or past the cut fails; those before the
    # first such page (in prefix order) are served.
    failing = [p for p in pages if p.offset >= pages[cut].offset]
    served = next(i for i, p in enumerate(pages) if p.offset >= pages[cut].offset)
    before = saria_metrics(server.metrics())
    result = _served_while(server, _prompt(PREFIX_IO), lambda: os.truncate(_slab(store), pages[cut].offset))
    after = saria_metrics(server.metrics())
    assert cached_tokens(result)["storage"] == served * PAGE
    assert_matches_cold(result, cold_run(_prompt(PREFIX_IO)), "pages before the read error from SSD, the rest recomputed")
    assert _delta(before, after, "sglang:saria_reload_fallbacks_total/store_io_error") == 1
    assert_kv_audit_clean(after, ("ssd_to_device",))
    # Each page that failed its read left the index (a recomputed page may be written anew).
    assert _delta(before, after, "sglang:saria_reload_pages_dropped_total") == len(failing)
    again = server.generate(D_PROMPT)  # the server keeps serving
    assert_matches_cold(again, cold_run(D_PROMPT), "a request after the read error")
