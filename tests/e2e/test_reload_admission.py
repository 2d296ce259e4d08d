"""Direct reloads under device-memory admission (mem_cache/reload_admission.py) on a real server:
the demo's scenario (agent sessions, 1,280 device tokens, every page in the store), restarted on
the same store; every session's first turn after the restart (`bench/restart_turns.py`).

- 1-4 concurrent sessions (2 and 3 in `make test-slow`), saria and stock HiCache `file` in the
  same test: each session gets at least as many cached tokens from saria as from `file` (after a
  restart device and host memory are empty, so every cached token of the turn came back from the
  store in it: the sessions' shared system prompt is the storage hit of the session whose reload
  read it and a device hit of the others), the sessions together at least as many storage-hit
  tokens, no reloaded token is evicted before its request is admitted
  (`sglang:saria_reload_tokens_wasted_total` 0), the outputs equal a cold server's (tolerance
  oracle) and the KV audit is clean;
- stress (`make test-slow`), 8 sessions (their histories are 5x the device pool): no deadlock
  (every turn is served), no reloaded token wasted, no reload given up except for a measured
  faster prefill (`reload_admission.waiting_pays`), and no turn waits much longer than on a cold
  server: the slowest takes at most ``BOUNDED`` times the slowest turn of a cold server given the
  same 8 prompts at once (that turn floored at ``COLD_FLOOR_S``) (the ratio is measured over 5
  runs by ``saria-restart-turns --stress 8``, docs/data/reload-stress.json; the issue's
  fair-share 2x is reported there against the median).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_saria.bench.restart_turns import (
    BACKENDS,
    DEFAULT_MODEL,
    RestartRun,
    cold_latencies,
    cold_traces,
    matches_cold,
    restart_run,
    stress_markdown,
    stress_ratio,
    stress_record,
    table,
)
from sglang_saria.launcher import AUDIT_ENV, assert_kv_audit_clean

pytestmark = pytest.mark.e2e

WASTED = "sglang:saria_reload_tokens_wasted_total"
FALLBACKS = "sglang:saria_reload_fallbacks_total"
# The restart turn's slowest latency over a cold server's, 8 sessions at once, at most: a bound
# on waiting, not the performance target (2x, reported against the median of the stress
# script's runs, docs/reload-admission.md). Measured so far: 2.44x, 1.38x, 2.01x before reloads
# held back were weighed against the prefill, 0.06x-0.52x after (5 runs, a loaded machine whose
# load moves the cold server's one-at-a-time turns most); 3x is above all of them, while a
# reload that waited out its memory or hold deadline (`transfer.reload_hold_s`, 30 s) would
# exceed it by far. The cold turn is floored at ``COLD_FLOOR_S``: on a quiet moment the cold
# server's slowest turn took 0.15 s while the restart's, under the other test workers' load, took
# 0.50 s (3.25x); a cold turn that fast measures when the machine was idle, not the cold server's
# work (8 prompts of about 707 new tokens, one at a time: 0.5 s each on a quiet machine).
BOUNDED = 3.0
COLD_FLOOR_S = 1.0


def _run(scratch: Path, backend: str, sessions: int) -> RestartRun:
    return restart_run(DEFAULT_MODEL, backend, sessions, 3, scratch, AUDIT_ENV if backend == "saria" else None)


# The end points (one session, four at once) run in `make test`; two and three in `make test-slow`.
SESSION_COUNTS = [1, pytest.param(2, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow), 4]


@pytest.fixture(scope="module", params=SESSION_COUNTS, ids=lambda n: f"{n}-sessions")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, RestartRun]:
    """Both backends' restart runs with ``request.param`` concurrent sessions."""
    scratch = tmp_path_factory.mktemp(f"restart-{request.param}")
    return {backend: _run(scratch, backend, request.param) for backend in BACKENDS}


def test_every_session_gets_at_least_what_file_brings_back(runs):
    print("\n" + table(list(runs.values())))
    saria = {t.session: t for t in runs["saria"].turns}
    stock = {t.session: t for t in runs["file"].turns}
    assert set(saria) == set(stock) and len(saria) == runs["saria"].sessions
    fallbacks = {k: v for k, v in runs["saria"].metrics.items() if k.startswith(FALLBACKS)}  # why a reload gave up
    for name, turn in saria.items():
        assert turn.cached >= stock[name].cached, (name, turn.cached, stock[name].cached, fallbacks)
        assert turn.storage > 0, (name, fallbacks)  # its own history came back from the store
    assert sum(t.storage for t in saria.values()) >= sum(t.storage for t in stock.values())
    assert runs["saria"].metrics.get(WASTED, 0.0) == 0.0


def test_restart_outputs_equal_a_cold_servers(runs, tmp_path):
    turns = runs["saria"].turns
    for turn, cold in zip(turns, cold_traces(DEFAULT_MODEL, turns, tmp_path / "cold.log")):
        assert matches_cold(turn.trace, cold), turn.session


def test_reloads_pass_the_kv_audit(runs):
    assert_kv_audit_clean(runs["saria"].metrics, ("ssd_to_device",))


@pytest.mark.slow
def test_eight_sessions_no_deadlock_no_waste_fair_wait(tmp_path):
    # No KV audit here: its checks would be timed with the turns.
    run = restart_run(DEFAULT_MODEL, "saria", 8, 3, tmp_path)
    assert len(run.turns) == 8  # every turn served: no deadlock
    assert run.metrics.get(WASTED, 0.0) == 0.0
    fallbacks = {k: v for k, v in run.metrics.items() if k.startswith(FALLBACKS) and v}
    # a reload is given up only for a faster prefill; none waited out a deadline
    assert all("read_slower" in k for k in fallbacks), fallbacks
    cold = cold_latencies(DEFAULT_MODEL, [t.messages for t in run.turns], tmp_path / "cold.log")
    record = stress_record(run, cold)
    print("\n" + stress_markdown([record]))
    slowest_cold = max(max(record["cold_latency_s"]), COLD_FLOOR_S)
    assert max(t["latency_s"] for t in record["turns"]) <= BOUNDED * slowest_cold, (stress_ratio(record), record)
