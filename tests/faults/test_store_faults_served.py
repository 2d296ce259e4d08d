"""A damaged index and a full disk, on a serving server (one server, one store):

- the server starts on a store whose index is not a database: the index is moved aside
  (named in the log with its new path), the store starts empty and then stores and serves;
- the disk fills while serving (the test-only FullDisk injector, full while a file exists):
  the next store write fails ENOSPC, later ones are refused without disk I/O (counted), requests
  are answered (recomputed) and stored pages are still read; once space is freed a retry
  commits, writes resume and the next prompt comes back from storage.

The store-level versions: tests/storage/test_storage_damage.py, test_storage_disk_full.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest

from sglang_saria.launcher import AUDIT_ENV, SGLangServer, assert_kv_audit_clean, cached_tokens, saria_hicache_args, saria_metrics
from sglang_saria.storage.index import INDEX_NAME
from tests.faults.serving import COMPUTED, FROM_STORAGE, PROMPT, other_prompt, sample, store_config
from tests.hicache_admin import ADMIN_ARGS, HiCacheAdmin

pytestmark = pytest.mark.e2e

RANK = "rank_tp0of1"
OPS = "sglang:saria_store_ops_total"
RESUME_ATTEMPTS = 40  # prompts sent after freeing space until a retry commits (back-off: 1 s, then 2 s, ...)


@dataclass
class Served:
    start_log: str = ""
    damaged: list[str] = field(default_factory=list)  # files the index was moved to
    objects_at_start: float = -1
    tiers: dict[str, dict[str, int]] = field(default_factory=dict)
    full_metrics: str = ""
    resumed_after: int = -1  # prompts it took for writes to resume once space was freed
    metrics: dict[str, float] = field(default_factory=dict)
    metrics_text: str = ""
    log: str = ""


def serve(server: SGLangServer, admin: HiCacheAdmin, served: Served, what: str, prompt: list[int], flush: bool = False) -> None:
    if flush:
        admin.flush()
    served.tiers[what] = cached_tokens(server.generate(prompt))
    server.wait_storage_writes()


@pytest.fixture(scope="module")
def served(start_server, tmp_path_factory) -> Served:
    store, flags = tmp_path_factory.mktemp("store-damaged"), tmp_path_factory.mktemp("disk")
    rank_dir = store / RANK
    rank_dir.mkdir(mode=0o700)
    (rank_dir / INDEX_NAME).write_bytes(b"this is not an SQLite database" * 100)
    full = flags / "full"
    injector = {"class": "sglang_saria.storage.fault_injection:FullDisk", "while_file": str(full)}
    s = Served()
    with start_server(saria_hicache_args(store_config(store, fault_injector=injector)) + ADMIN_ARGS, env=AUDIT_ENV) as server:
        admin = HiCacheAdmin(server)
        s.start_log = server.log_path.read_text(errors="replace")
        s.damaged = sorted(p.name for p in rank_dir.iterdir() if p.name.startswith(INDEX_NAME + ".damaged-"))
        s.objects_at_start = sample(server.metrics(), "sglang:saria_store_objects")
        serve(server, admin, s, "computed on the recovered store", PROMPT)
        serve(server, admin, s, "served from the recovered store", PROMPT, flush=True)

        full.touch()
        serve(server, admin, s, "computed while the disk is full", other_prompt(0))
        serve(server, admin, s, "another one while full", other_prompt(1))
        serve(server, admin, s, "stored pages read while full", PROMPT, flush=True)
        s.full_metrics = server.metrics()

        full.unlink()
        for attempt in range(RESUME_ATTEMPTS):
            serve(server, admin, s, "after freeing space", other_prompt(2 + attempt))
            if sample(server.metrics(), "sglang:saria_store_disk_full") == 0:
                s.resumed_after = attempt + 1
                break
        serve(server, admin, s, "computed once writes resumed", other_prompt(100))
        serve(server, admin, s, "served from storage once writes resumed", other_prompt(100), flush=True)
        s.metrics_text = server.metrics()
        s.metrics = saria_metrics(s.metrics_text)
        s.log = server.log_path.read_text(errors="replace")
    return s


def test_an_unreadable_index_is_moved_aside_named_in_the_log_and_the_store_starts_empty(served):
    assert len(served.damaged) == 1
    warning = [line for line in served.start_log.splitlines() if "is unreadable" in line]
    assert len(warning) == 1 and INDEX_NAME in warning[0] and served.damaged[0] in warning[0]
    assert served.objects_at_start == 0
    assert sample(served.metrics_text, OPS, op="recover", result="index_unreadable") == 1


def test_the_recovered_store_stores_and_serves(served):
    assert served.tiers["computed on the recovered store"] == COMPUTED
    assert served.tiers["served from the recovered store"] == FROM_STORAGE


def test_a_full_disk_fails_one_write_refuses_the_rest_and_requests_are_answered(served):
    assert served.tiers["computed while the disk is full"] == COMPUTED
    assert served.tiers["another one while full"] == COMPUTED
    assert sample(served.full_metrics, "sglang:saria_store_disk_full") == 1
    assert sample(served.full_metrics, OPS, op="put", result="enospc") >= 1
    assert sample(served.full_metrics, OPS, op="put", result="disk_full") >= 1  # refused, no disk I/O
    assert served.tiers["stored pages read while full"] == FROM_STORAGE  # reads go on
    assert sum(": disk full (" in line for line in served.log.splitlines()) == 1  # one warning, not one per put


def test_writes_resume_once_space_is_freed_and_their_pages_are_served(served):
    assert 0 < served.resumed_after <= RESUME_ATTEMPTS
    assert "the disk has room again" in served.log
    assert served.tiers["computed once writes resumed"] == COMPUTED
    assert served.tiers["served from storage once writes resumed"] == FROM_STORAGE


def test_every_page_moved_kept_its_bytes_through_the_faults(served):
    assert_kv_audit_clean(served.metrics, ("device_to_host", "host_to_ssd", "ssd_to_device"))
    assert served.metrics.get("sglang:saria_tier_audit_errors_total", 0) == 0
    assert "Scheduler hit an exception" not in served.log
