"""Runtime attach/detach of the storage backend (SGLang's admin API, `PUT`/`DELETE
/hicache/storage-backend`) with saria, as SGLang's own
test/srt/hicache/test_hicache_storage_runtime_attach_detach.py does with stock backends.

- A server launched with saria detaches it (requests then recompute, the scheduler stays
  up), attaches it again (the same store's pages come back as storage hits, straight to
  the device), takes a same-backend attach as a policy update, and attaches a fresh store
  that fills and serves in turn. The KV audit follows each attached store.
- A server launched without a storage backend refuses saria with a 400 naming
  `--hicache-storage-backend saria` (its tree has neither the admission hooks nor the
  direct reload; `plugin/storage.py`) and keeps serving; a stock backend (`file`) still attaches
  there and serves storage hits.

The reference output is each server's own first, computed run of the prompt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sglang_saria.launcher import AUDIT_ENV, assert_kv_audit_clean, cached_tokens, logprob_diff, saria_hicache_args, saria_metrics
from tests.hicache_admin import ADMIN_ARGS, HiCacheAdmin, Reply, wait_files

pytestmark = pytest.mark.e2e

PROMPT = list(range(1, 301))  # 18 full pages of 16 tokens
OTHER = [(3 * i) % 997 + 2 for i in range(300)]
STORED = 288
COMPUTED = {"device": 0, "host": 0, "storage": 0}
FROM_STORAGE = {"device": 0, "host": 0, "storage": STORED}


def store_config(path: Path) -> dict:
    return {"data_dirs": [str(path)], "admission": "full-duplicate", "capacity": "64MiB"}


@dataclass
class Scenario:
    replies: dict[str, Reply] = field(default_factory=dict)
    tiers: dict[str, dict[str, int]] = field(default_factory=dict)
    matches_reference: dict[str, bool] = field(default_factory=dict)
    status: dict[str, dict] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    log: str = ""
    audit_log_lines: int = 0


def run(server, scenario: Scenario, what: str, prompt: list[int], reference: dict) -> None:
    result = server.generate(prompt)
    scenario.tiers[what] = cached_tokens(result)
    scenario.matches_reference[what] = logprob_diff(result, reference).within()


@pytest.fixture(scope="module")
def launched_with_saria(start_server, tmp_path_factory) -> Scenario:
    first, fresh = tmp_path_factory.mktemp("store-a"), tmp_path_factory.mktemp("store-b")
    s = Scenario()
    with start_server(saria_hicache_args(store_config(first)) + ADMIN_ARGS, env=AUDIT_ENV) as server:
        admin = HiCacheAdmin(server)
        reference = server.generate(PROMPT)
        server.wait_storage_writes()
        s.replies["detach"] = admin.detach()
        s.status["detached"] = admin.status()
        admin.flush()
        run(server, s, "detached", PROMPT, reference)
        s.replies["attach"] = admin.attach("saria", store_config(first))
        s.status["attached"] = admin.status()
        admin.flush()
        run(server, s, "re-attached", PROMPT, reference)
        s.replies["same-backend"] = admin.attach("saria", store_config(first), hicache_storage_prefetch_policy="wait_complete")
        admin.flush()
        run(server, s, "after a policy update", PROMPT, reference)
        admin.detach()
        s.replies["attach-fresh"] = admin.attach("saria", store_config(fresh))
        admin.flush()
        run(server, s, "fresh store", PROMPT, reference)
        server.wait_storage_writes()
        admin.flush()
        run(server, s, "fresh store filled", PROMPT, reference)
        s.metrics = saria_metrics(server.metrics())
        s.log = server.log_path.read_text(errors="replace")
        audit_logs = list(fresh.rglob("kv_audit.log"))
        s.audit_log_lines = sum(len(p.read_text().splitlines()) for p in audit_logs)
    return s


def test_detached_saria_leaves_a_serving_server_without_storage(launched_with_saria):
    s = launched_with_saria
    assert s.replies["detach"].status == 200, s.replies["detach"].text
    assert s.status["detached"]["hicache_storage_backend"] is None
    assert s.tiers["detached"] == COMPUTED
    assert s.matches_reference["detached"]


def test_reattached_saria_serves_its_store_straight_to_the_device(launched_with_saria):
    s = launched_with_saria
    assert s.replies["attach"].status == 200, s.replies["attach"].text
    assert s.status["attached"]["hicache_storage_backend"] == "saria"
    assert s.tiers["re-attached"] == FROM_STORAGE
    assert s.matches_reference["re-attached"]


def test_same_backend_attach_updates_policies_and_keeps_serving_hits(launched_with_saria):
    s = launched_with_saria
    assert s.replies["same-backend"].status == 200
    assert "policies updated" in s.replies["same-backend"].text
    assert s.tiers["after a policy update"] == FROM_STORAGE
    assert s.matches_reference["after a policy update"]


def test_saria_attached_on_a_fresh_store_fills_it_and_serves_from_it(launched_with_saria):
    s = launched_with_saria
    assert s.replies["attach-fresh"].status == 200, s.replies["attach-fresh"].text
    assert s.tiers["fresh store"] == COMPUTED
    assert s.tiers["fresh store filled"] == FROM_STORAGE
    assert s.matches_reference["fresh store filled"]
    # The KV audit followed the attached store: its pages' digests are logged beside it.
    assert s.audit_log_lines == STORED // 16


def test_every_attach_is_audited_clean_and_nothing_failed(launched_with_saria):
    s = launched_with_saria
    # 3 reloads of 18 pages (re-attached, after the policy update, the fresh store).
    assert s.metrics["sglang:saria_store_pages_read_total/device"] == 3 * STORED // 16
    assert_kv_audit_clean(s.metrics, ("device_to_host", "host_to_ssd", "ssd_to_device"))
    assert s.metrics.get("sglang:saria_tier_audit_errors_total", 0) == 0
    assert "Scheduler hit an exception" not in s.log


@dataclass
class Bare:
    refused: Reply
    refused_dynamic: Reply
    status: dict
    tiers_after_refusal: dict[str, int]
    file_attach: Reply
    file_tiers: dict[str, int]
    file_matches: bool
    file_detach: Reply


@pytest.fixture(scope="module")
def launched_bare(start_server, tmp_path_factory) -> Bare:
    store, files = tmp_path_factory.mktemp("store-bare"), tmp_path_factory.mktemp("file-backend")
    args = ["--enable-hierarchical-cache", "--hicache-ratio", "2", "--enable-metrics", *ADMIN_ARGS]
    with start_server(args) as server:
        admin = HiCacheAdmin(server)
        refused = admin.attach("saria", store_config(store))
        dynamic = {**store_config(store), "backend_name": "saria", "module_path": "sglang_saria.hicache.backend",
                   "class_name": "SariaStorage"}
        refused_dynamic = admin.attach("dynamic", dynamic)
        status = admin.status()
        tiers = cached_tokens(server.generate(PROMPT))
        file_attach = admin.attach("file", {"file_storage_path": str(files)}, hicache_storage_prefetch_policy="wait_complete")
        reference = server.generate(OTHER)
        wait_files(files, STORED // 16)
        admin.flush()
        result = server.generate(OTHER)
        return Bare(refused, refused_dynamic, status, tiers, file_attach, cached_tokens(result),
                    logprob_diff(result, reference).within(), admin.detach())


def test_saria_attach_to_a_server_launched_without_it_is_refused_naming_the_flag(launched_bare):
    for reply in (launched_bare.refused, launched_bare.refused_dynamic):
        assert reply.status == 400
        assert re.search(r"saria cannot be attached .*Launch with --hicache-storage-backend saria", reply.text), reply.text
    assert launched_bare.status["hicache_storage_backend"] is None
    assert launched_bare.tiers_after_refusal == COMPUTED  # the scheduler serves on


def test_stock_backend_still_attaches_and_serves_hits_after_the_refusal(launched_bare):
    assert launched_bare.file_attach.status == 200, launched_bare.file_attach.text
    assert launched_bare.file_tiers == FROM_STORAGE
    assert launched_bare.file_matches
    assert launched_bare.file_detach.status == 200
