"""SGLang's own HiCache storage scenarios (test/srt/hicache/ in sgl-project/sglang), on CPU,
for the stock `file` backend and `saria` alike: whatever stock HiCache does with a storage
backend, saria does too.

Per backend, one server launched with it, then one restarted on what it stored:
- storage hits: a prefix flushed from device and host memory comes back from storage
  (test_hicache_storage_file_backend);
- prefetch policies: `best_effort`, `timeout`, `wait_complete` set at run time (the admin
  API's same-backend attach updates them) all answer with the computed output, and
  `wait_complete` takes the whole stored prefix (test_hicache_storage_prefetch_policies);
- runtime detach and attach of the launch-time backend (the bare-server case, attach to a
  server launched without storage, is tests/e2e/test_runtime_attach.py);
- restart: a new server on the same storage serves the prefix from it (test_hicache_storage_e2e).

- host layouts: the same storage hit and restart with `layer_first` host pages (the default on
  CPU is `page_first_direct`; both with the `direct` io backend), saria's moved pages checked by
  the KV audit (test_hicache_storage_file_backend's layout variants).

Not here: `page_first` (needs GPU kernels); the session-cache scenario
(test_hicache_session_cache_file_backend) tests `--enable-session-cache` and `session_params`
`fresh_kv_cache`/`stored_kv_cache`, which SGLang 0.5.23 does not have.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sglang_saria.launcher import (
    AUDIT_ENV,
    SGLangServer,
    assert_kv_audit_clean,
    cached_tokens,
    hicache_args,
    logprob_diff,
    saria_metrics,
)
from tests.faults.serving import COMPUTED, FROM_STORAGE, PAGE, PROMPT, STORED, store_config
from tests.hicache_admin import ADMIN_ARGS, HiCacheAdmin, Reply, wait_files

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

POLICIES = ("best_effort", "timeout", "wait_complete")


def extra_config(backend: str, path: Path) -> dict:
    return {"file_storage_path": str(path)} if backend == "file" else store_config(path)


def wait_stored(server: SGLangServer, backend: str, path: Path) -> None:
    """Until storage holds what the server asked it to write (`file`: one file per page)."""
    if backend == "file":
        wait_files(path, STORED // PAGE)
    else:
        server.wait_storage_writes()


@dataclass
class Conformance:
    tiers: dict[str, dict[str, int]] = field(default_factory=dict)
    matches: dict[str, bool] = field(default_factory=dict)
    replies: dict[str, Reply] = field(default_factory=dict)


def ask(server: SGLangServer, admin: HiCacheAdmin, c: Conformance, what: str, reference: dict) -> None:
    admin.flush()
    result = server.generate(PROMPT)
    c.tiers[what] = cached_tokens(result)
    c.matches[what] = logprob_diff(result, reference).within()


@pytest.fixture(scope="module", params=["file", "saria"])
def conformance(request, start_server, tmp_path_factory) -> tuple[str, Conformance]:
    backend = request.param
    path, c = tmp_path_factory.mktemp(f"storage-{backend}"), Conformance()
    args = hicache_args(backend, extra_config(backend, path)) + ADMIN_ARGS
    with start_server(args) as server:
        admin = HiCacheAdmin(server)
        reference = server.generate(PROMPT)
        wait_stored(server, backend, path)
        ask(server, admin, c, "storage hit", reference)
        for policy in POLICIES:
            c.replies[policy] = admin.attach(backend, extra_config(backend, path), hicache_storage_prefetch_policy=policy)
            ask(server, admin, c, policy, reference)
        c.replies["detach"] = admin.detach()
        ask(server, admin, c, "detached", reference)
        c.replies["attach"] = admin.attach(backend, extra_config(backend, path), hicache_storage_prefetch_policy="wait_complete")
        ask(server, admin, c, "attached again", reference)
    with start_server(args) as restarted:
        ask(restarted, HiCacheAdmin(restarted), c, "restarted", reference)
    return backend, c


def test_a_flushed_prefix_comes_back_from_storage(conformance):
    _, c = conformance
    assert c.tiers["storage hit"] == FROM_STORAGE
    assert c.matches["storage hit"]


def test_every_prefetch_policy_set_at_run_time_serves_the_computed_output(conformance):
    _, c = conformance
    for policy in POLICIES:
        assert c.replies[policy].status == 200, c.replies[policy].text
        assert c.matches[policy], policy
        assert c.tiers[policy]["storage"] <= STORED and c.tiers[policy]["device"] + c.tiers[policy]["host"] == 0
    assert c.tiers["wait_complete"] == FROM_STORAGE


def test_the_backend_detaches_and_attaches_again_at_run_time(conformance):
    _, c = conformance
    assert c.replies["detach"].status == 200 and c.replies["attach"].status == 200
    assert c.tiers["detached"] == COMPUTED
    assert c.tiers["attached again"] == FROM_STORAGE
    assert c.matches["detached"] and c.matches["attached again"]


def test_a_restarted_server_serves_the_prefix_from_storage(conformance):
    _, c = conformance
    assert c.tiers["restarted"] == FROM_STORAGE
    assert c.matches["restarted"]


LAYER_FIRST = ["--hicache-mem-layout", "layer_first", "--hicache-io-backend", "direct"]


@pytest.fixture(scope="module", params=["file", "saria"])
def layer_first(request, start_server, tmp_path_factory) -> tuple[str, Conformance, dict[str, float]]:
    """A storage hit and a restart with layer_first host pages; saria's run with the KV audit on."""
    backend = request.param
    path, c = tmp_path_factory.mktemp(f"layer-first-{backend}"), Conformance()
    args = hicache_args(backend, extra_config(backend, path)) + ADMIN_ARGS + LAYER_FIRST
    env = AUDIT_ENV if backend == "saria" else {}
    with start_server(args, env=env) as server:
        assert "'hicache_mem_layout': 'layer_first'" in server.log_path.read_text(errors="replace")
        reference = server.generate(PROMPT)
        wait_stored(server, backend, path)
        ask(server, HiCacheAdmin(server), c, "storage hit", reference)
        metrics = saria_metrics(server.metrics())
    with start_server(args, env=env) as restarted:
        ask(restarted, HiCacheAdmin(restarted), c, "restarted", reference)
        metrics_restarted = saria_metrics(restarted.metrics())
    return backend, c, {**metrics, **{f"restarted:{k}": v for k, v in metrics_restarted.items()}}


def test_layer_first_host_pages_come_back_from_storage_and_after_a_restart(layer_first):
    backend, c, metrics = layer_first
    assert c.tiers["storage hit"] == FROM_STORAGE and c.tiers["restarted"] == FROM_STORAGE
    assert c.matches["storage hit"] and c.matches["restarted"]
    if backend == "saria":
        assert_kv_audit_clean(metrics, ("device_to_host", "host_to_ssd"))
        restarted = {k.removeprefix("restarted:"): v for k, v in metrics.items() if k.startswith("restarted:")}
        assert_kv_audit_clean(restarted, ("ssd_to_device",))
