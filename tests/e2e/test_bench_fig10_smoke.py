"""`saria-fig10` end to end on the tiny model: three configurations, one run each,
a short workload (3 WEKA sessions, 4 turns, think times), the replay comparison.

What it proves: SGLang's own client (with the think-time hook) completes every request against
stock HiCache and saria; stock `file` writes pages, within the store's capacity (SGLang's
`max_size`), and DRAM-only writes none; no configuration ran the KV audit (it cannot run on the
stock ones; the audited runs are the other e2e tests); the JSON carries the server and replay numbers the doc's
tables are rendered from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_saria.bench import fig10

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def bench(tiny_model, tmp_path_factory) -> tuple[int, list[dict], Path]:
    work = tmp_path_factory.mktemp("fig10")
    out = work / "fig10.json"
    code = fig10.main([
        "--model", str(tiny_model), "--repeats", "1", "--sessions", "3", "--turns", "4", "--store-tokens", "256",
        "--configs", "dram-only", "hicache-file", "eviction:E2",
        "--json", str(out), "--plot", str(work / "fig10.png"), "--work-dir", str(work / "runs"),
    ])
    return code, json.loads(out.read_text()), work


def test_every_request_succeeds_and_no_configuration_ran_the_audit(bench):
    code, data, _ = bench
    assert code == 0
    (entry,) = data
    for name, runs in entry["runs"].items():
        (run,) = runs
        assert run["failed"] == 0 and run["requests"] == entry["workload"]["requests"], name
        assert run["audit_pages"] == 0, name


def test_stock_file_writes_and_dram_only_does_not(bench):
    _, (entry,), _ = bench
    stock = entry["medians"]["hicache-file"]
    assert stock["ssd_bytes"] > 0
    # bounded as saria's store (256 tokens of qwen3-tiny's 256-byte KV): it wrote past the cap,
    # deleted pages, and held no more than the cap (counted as written, not as left on disk)
    assert entry["store_cap_bytes"] == 256 * 256
    assert stock["ssd_bytes"] > entry["store_cap_bytes"] >= stock["store_bytes_held"] > 0
    assert entry["medians"]["dram-only"]["ssd_bytes"] == 0
    # SGLang's cache report came back through the client: every configuration reused its prefixes
    for name, r in entry["medians"].items():
        assert r["device_tokens"] + r["host_tokens"] + r["storage_tokens"] > 0, name


def test_the_replay_served_the_same_requests_at_the_measured_rate(bench):
    _, (entry,), work = bench
    assert entry["prefill"]["prefill_tps"] > 0
    assert {r["requests"] for r in entry["replay"].values()} == {entry["workload"]["requests"]}
    assert (work / "fig10.png").stat().st_size > 0
