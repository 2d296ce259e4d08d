"""kill -9 under traffic, twice, on one store: every restarted server recovers the store
the killed one left and serves the cached prompt from it (straight to the device), with the
bytes that were computed (KV audit: the digests the first server logged beside the store) and
the same output as the first, computed run. At each kill a request is decoding and the
traffic's pages are being written through to the store.

The store-level version (a writer process killed mid-batch) is
tests/storage/test_storage_faults.py::test_kill_9_mid_batch_recovers_completed_objects_and_serves_no_torn_one.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from sglang_saria.launcher import AUDIT_ENV, SGLangServer, assert_kv_audit_clean, cached_tokens, logprob_diff, saria_hicache_args, saria_metrics
from tests.faults.serving import COMPUTED, FROM_STORAGE, PROMPT, STORED, PAGE, other_prompt, store_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

KILLS = 2  # the second restarts on a store that was itself recovered after a kill; each start costs 20-90 s
DECODE = 150  # tokens the request in flight at the kill decodes (300 + 150 fit the 512-token device pool)


@dataclass
class Life:
    """One server between its start and its kill (the last one is stopped, not killed)."""

    tiers: dict[str, int]  # where PROMPT was served from at its start
    matches_first_run: bool
    metrics: dict[str, float]
    log: str
    in_flight_at_kill: bool = False  # a request had streamed tokens and not finished when killed


def stream_until_killed(server: SGLangServer, prompt: list[int], started: threading.Event, outcome: dict) -> None:
    """A long decode the kill interrupts: ``outcome["chunks"]``, the tokens streamed before it."""
    try:
        outcome["chunks"] = len(server.generate_stream(prompt, DECODE, ignore_eos=True, first_chunk=started).chunk_times)
    except Exception as e:  # noqa: BLE001 - the kill may reset the connection: that is the point
        outcome["error"] = repr(e)
    finally:
        started.set()


def kill_under_traffic(server: SGLangServer, life: int) -> bool:
    """Two traffic requests served (their pages written through), a third decoding: kill -9."""
    for k in range(2):
        server.generate(other_prompt(3 * life + k))
    started, outcome = threading.Event(), {}
    stream = threading.Thread(target=stream_until_killed, args=(server, other_prompt(3 * life + 2), started, outcome))
    stream.start()
    started.wait(timeout=300)
    server.kill()
    stream.join(timeout=60)
    return 0 < outcome.get("chunks", 1) < DECODE  # streamed a token, then the kill cut it


@pytest.fixture(scope="module")
def lives(start_server, tmp_path_factory) -> list[Life]:
    store = tmp_path_factory.mktemp("store-killed")
    first, out = None, []
    for life in range(KILLS + 1):
        with start_server(saria_hicache_args(store_config(store)), env=AUDIT_ENV) as server:
            result = server.generate(PROMPT)
            server.wait_storage_writes()
            first = first or result
            record = Life(cached_tokens(result), logprob_diff(result, first).within(), saria_metrics(server.metrics()), "")
            if life < KILLS:
                record.in_flight_at_kill = kill_under_traffic(server, life)
            record.log = server.log_path.read_text(errors="replace")
        out.append(record)
    return out


def test_each_restart_after_a_kill_serves_the_cached_prompt_from_storage(lives):
    assert lives[0].tiers == COMPUTED
    assert [life.tiers for life in lives[1:]] == [FROM_STORAGE] * KILLS
    assert all(life.matches_first_run for life in lives)


def test_every_kill_hit_a_request_being_decoded(lives):
    assert [life.in_flight_at_kill for life in lives[:KILLS]] == [True] * KILLS


def test_what_each_restart_read_back_is_the_bytes_that_were_computed(lives):
    assert_kv_audit_clean(lives[0].metrics, ("device_to_host", "host_to_ssd"))
    for life in lives[1:]:
        assert_kv_audit_clean(life.metrics, ("ssd_to_device",))
        assert life.metrics["sglang:saria_store_pages_read_total/device"] == STORED // PAGE
        assert life.metrics.get("sglang:saria_tier_audit_errors_total", 0) == 0


def test_each_restart_recovered_the_store_the_killed_server_left(lives):
    for life in lives[1:]:
        recovered = [int(line.split(" objects recovered")[0].rsplit(" ", 1)[1])
                     for line in life.log.splitlines() if "objects recovered" in line]
        assert recovered and recovered[0] >= STORED // PAGE, recovered
        assert "Scheduler hit an exception" not in life.log
