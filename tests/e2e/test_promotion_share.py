"""Lazy partial promotion on the server: does the promotion share bound what an SSD reload
leaves in host memory (DRAM)?

A 20-page prefix is computed and stored, then dropped from device and host (`/flush_cache`;
the store keeps it), so each of two requests reloads it from SSD straight into the device
pool. The promotion controller picks the leading share to copy to host (r_eff = min(0.4,
1 - 20/48 GB/s GDS/ingress): 8 of the 20 pages), and the tier audit counts the tree's pages
per tier afterwards (`sglang:saria_tree_pages{tier}`; after a flush the tree holds only the
request's own path).

(a) A request with exactly the prefix (nothing computed past the hit but its last partial
page): host memory holds the promotion share, and only it; the rest stays device-only.

(b) The prefix plus 3 new pages: the controller picks the same share, but the request's
insert adds a leaf past the hit whose write-through (SGLang 0.5.23, threshold 1) backs up its
unbacked ancestors with it, ancestors first (`UnifiedTreeCore._build_backup_kv_action`): the
whole reloaded prefix lands in host memory. The promotion share is not a bound once a request
computes a page past its SSD hit. The replay's default flat DRAM (`SariaCore._promote` with
`dram_residency = "flat"`) keeps only the share there, as in (a); its `dram_residency = "tree"`
copies the rest too (`_chain_into_dram`), as this server does (docs/admission.md, "DRAM shaped
as SGLang's host tier").
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from sglang_saria.launcher import AUDIT_ENV, SGLangServer, assert_kv_audit_clean, kv_audit_pages, saria_metrics
from tests.e2e.steps import serve_steps
from tests.e2e.test_hicache_tiers import TURN_2, hicache_args

pytestmark = pytest.mark.e2e

PAGE = 16  # tests/conftest.py's SMALL_POOLS
PREFIX = TURN_2  # 330 tokens: 20 full pages and a partial one
PREFIX_PAGES = 20
SHARE_PAGES = 8  # ceil(0.4 * 20)
PAST_HIT = PREFIX + [11, 12, 13, 14] * 10  # 40 more tokens: 370, and 3 generated -> 23 pages
PAST_PAGES = 3
FROM_SSD = {"device": 0, "host": 0, "storage": PREFIX_PAGES * PAGE}
PROMOTED = "sglang:saria_promoted_tokens_total"


@dataclass(frozen=True)
class AfterReload:
    """The tree after one request whose prefix came from SSD (it holds only that request's path)."""

    promoted_pages: int  # the share the promotion controller chose and copied to host
    copied_pages: int  # pages copied device -> host while the request was served (KV audit)
    host_pages: int  # the tree's pages in host memory
    device_pages: int  # the tree's pages on the device
    metrics: dict[str, float]


def reload_from_ssd(server: SGLangServer, cold_run, what: str, prompt: list[int]) -> AfterReload:
    """Drop device and host tiers, serve ``prompt`` (its prefix reloads from SSD, output as a
    cold run's) and count the tree's pages by tier once its copies and writes have landed."""
    before = saria_metrics(server.metrics())
    server.flush_cache()
    serve_steps(server, cold_run, [(what, prompt, FROM_SSD)])
    metrics = saria_metrics(server.metrics())
    copied = kv_audit_pages(metrics, "device_to_host") - kv_audit_pages(before, "device_to_host")
    return AfterReload(
        promoted_pages=int(metrics.get(PROMOTED, 0) - before.get(PROMOTED, 0)) // PAGE,
        copied_pages=int(copied),
        host_pages=int(metrics["sglang:saria_tree_pages/host"]),
        device_pages=int(metrics["sglang:saria_tree_pages/device"]),
        metrics=metrics,
    )


@pytest.fixture(scope="module")
def reloads(start_server, cold_run, tmp_path_factory) -> dict[str, AfterReload]:
    """One audited server: the prefix computed and stored, then case (a), then case (b)."""
    store = tmp_path_factory.mktemp("store-promotion")
    with start_server(hicache_args(store), env=AUDIT_ENV) as server:
        serve_steps(server, cold_run, [("the prefix is computed and stored", PREFIX, None)])
        return {
            "a": reload_from_ssd(server, cold_run, "(a) the prefix alone reloads from SSD", PREFIX),
            "b": reload_from_ssd(server, cold_run, "(b) the prefix reloads from SSD, 3 pages computed past it", PAST_HIT),
        }


def test_prefix_alone_leaves_only_the_promotion_share_in_host_memory(reloads):
    a = reloads["a"]
    assert a.promoted_pages == SHARE_PAGES
    assert a.device_pages == PREFIX_PAGES
    assert a.host_pages == a.copied_pages == SHARE_PAGES, "host memory holds more than the promotion share"


def test_computing_past_the_hit_copies_the_whole_reloaded_prefix_to_host(reloads):
    b = reloads["b"]
    assert b.promoted_pages == SHARE_PAGES, "the controller chose another share than in (a)"
    assert b.device_pages == PREFIX_PAGES + PAST_PAGES
    # Write-through of the new leaf copies the 12 pages the promotion left out from the device,
    # with the new pages and the promoted share: nothing was read from the store into host memory.
    assert b.host_pages == b.copied_pages == PREFIX_PAGES + PAST_PAGES, "the promotion share bounded host memory"
    assert b.metrics.get("sglang:saria_store_pages_read_total/host", 0) == 0


def test_moved_pages_keep_their_bytes(reloads):
    metrics = reloads["b"].metrics
    assert_kv_audit_clean(metrics, ("device_to_host", "host_to_ssd", "ssd_to_device"))
    assert metrics.get("sglang:saria_tier_audit_errors_total", 0) == 0
